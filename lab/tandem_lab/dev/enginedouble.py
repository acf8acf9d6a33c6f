"""An engine double: a loopback stand-in for one vLLM OpenAI server in a P/D pair (lab code, not product).

What it owns: vLLM's OpenAI surface as the router uses it (``POST /v1/completions`` and
``/v1/chat/completions``, streamed SSE or not, ``GET /v1/models``, ``/health``, ``/metrics`` with vLLM's
load gauges), both connectors' handshakes, and scripted misbehaviour, so router tests and demos run
without GPUs.

- **Text** is a pure function of the prompt: output token ``i`` is ``" t" + hex(blake2b(prompt, i))[:6]``
  (the prompt as the request gives it: a completion's ``prompt`` value, a chat's ``messages``, in
  canonical JSON). A P/D pair therefore returns exactly what one engine returns for the same body, and
  tests compare the two.
- **NixlConnector**: a request with ``kv_transfer_params.do_remote_decode`` is a prefill; it returns one
  token and NIXL pull-mode ``kv_transfer_params`` (``do_remote_prefill``, ``remote_engine_id``,
  ``remote_block_ids``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ...). A
  request with ``do_remote_prefill`` is a decode and produces the whole output (vLLM recomputes the first
  token). **MooncakeConnector**: a ``transfer_id`` in the params; ``GET /query`` on the bootstrap
  listener answers ``{"<dp_rank>": {"engine_id", "worker_addr"}}``. **MoRIIOConnector**
  (``moriio_mode`` set): a prefill returns what vLLM's ``request_finished`` returns (engine id
  ``host:handshake_port``, block ids, its address and ports, its DP rank, ``transfer_id``); a leg missing
  a field vLLM's connector indexes fails with a 500, as the engine's step would (Write-mode prefill: the
  decode's address, ``remote_engine_id``/``remote_block_ids`` keys; Write-mode decode: the prefill's host
  and notify port; Read-mode decode with block ids: the prefill's address).
- **Validation** as vLLM does it: ``stream_options`` without ``stream`` and ``min_tokens > max_tokens``
  are 400s; so the router's leg construction is checked by the double, not only by assertions.
- **Behaviour** (:class:`Behaviour`, changeable while running): answer a status (429/503/500) to every
  completion, stall before answering, pace tokens at a rate, or die mid-stream after N tokens (the
  connection is cut with no final chunk and no ``[DONE]``).
- **Metrics** (``GET /metrics``, the three gauges the router's admission reads, names from
  :mod:`tandem.routing`, lines shaped like vLLM 0.32's): ``num_requests_running`` counts completions being
  answered, ``num_requests_waiting`` those waiting for a slot when ``max_num_seqs`` is set (as vLLM's
  scheduler holds requests beyond ``--max-num-seqs``), ``kv_cache_usage_perc`` is running /
  ``max_num_seqs`` (each running request holds an equal share; 0 without a limit) unless
  :attr:`Behaviour.kv_usage` pins it. :attr:`Behaviour.metrics_status` / ``metrics_stall_s`` break the
  page for scrape-failure tests.
- Every completion request is recorded (:attr:`EngineDouble.requests`: path, headers, JSON body).
- **Pacing** (:attr:`EngineDouble.pacer`): a model can decide when each leg answers instead (the demo's
  live fleet model, :mod:`tandem_lab.dev.livefront`): a prefill answers when the model's prefill is done;
  a decode sends its first token when the model's first token is due and ends, with ``usage`` carrying
  the model's output token count, when the model's decode is done (two token events, not hundreds: the
  router counts tokens from ``usage``). A leg the model fails is cut or answered 500.

Must not: bind anything but loopback by default, or talk to Kubernetes.
Run one: ``python -m tandem_lab.dev.enginedouble --port 8100`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from tandem import enginemetrics as em
from tandem.routing import KvTransfer

DEFAULT_MODEL = "double-model"
NIXL_SIDE_CHANNEL_PORT = 5600
MORIIO_HANDSHAKE_PORT = 6301
MORIIO_NOTIFY_PORT = 61005
BLOCK_TOKENS = 16


@dataclass
class Behaviour:
    """How the double misbehaves; fields can be changed while it serves."""

    status: int | None = None
    """Answer every completion with this HTTP status (429, 503, 500...) and a vLLM-shaped error."""
    stall_s: float = 0.0
    """Wait this long before answering a completion."""
    tokens_per_s: float = 0.0
    """Pace streamed tokens at this rate; 0 sends them back to back."""
    die_after_tokens: int | None = None
    """Cut the connection after this many streamed tokens (or, not streamed, before any answer)."""
    kv_usage: float | None = None
    """Report this ``kv_cache_usage_perc`` (0-1) instead of the derived value."""
    metrics_status: int | None = None
    """Answer ``/metrics`` with this status (a broken scrape)."""
    metrics_stall_s: float = 0.0
    """Wait this long before answering ``/metrics`` (a scrape timeout)."""


@dataclass(frozen=True)
class Paced:
    """A model's answer to one leg (module docstring, Pacing)."""

    status: int | None = None
    """Answer this HTTP status at once (the model cannot take the leg); ``message`` says why."""
    message: str = ""
    first: Awaitable[bool] | None = None
    """Decode: resolves True when the first token is due, False when the request failed before it."""
    done: Awaitable[int | None] | None = None
    """Resolves with the output token count when the leg is done (a prefill: any int), None if it failed."""


class Pacer(Protocol):
    """Decides when a double's legs answer; called once per completion request, on the double's loop."""

    def pace(self, double: EngineDouble, request_id: str, prefill: bool) -> Paced: ...


@dataclass(frozen=True)
class Recorded:
    """One completion request as the double received it."""

    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    @property
    def kv_transfer_params(self) -> Any:
        return self.body.get("kv_transfer_params")

    @property
    def request_id(self) -> str | None:
        return self.headers.get("x-request-id")


def output_tokens(prompt_key: str, n: int) -> list[str]:
    """The ``n`` output tokens for a prompt (pure; equal prompts give equal tokens in any process)."""
    seed = prompt_key.encode("utf-8", "surrogatepass")
    return [" t" + hashlib.blake2b(seed + b"\0" + str(i).encode(), digest_size=3).hexdigest() for i in range(n)]


def prompt_key(body: Mapping[str, Any]) -> str:
    """What the output is derived from: the completion prompt or the chat messages, as canonical JSON."""
    source = body.get("messages") if "messages" in body else body.get("prompt")
    return json.dumps(source, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def connector_options(transfer: KvTransfer, role: str) -> dict[str, Any]:
    """The double's connector arguments for one endpoint of a pair with ``transfer`` (a table's
    ``kvTransfer``): a MooncakeConnector prefill serves the bootstrap ``/query`` on the table's port, a
    MoRIIOConnector instance speaks the table's mode."""
    mooncake = transfer.connector == "MooncakeConnector" and role == "prefill"
    return {
        "bootstrap_port": transfer.bootstrap_port if mooncake else None,
        "moriio_mode": transfer.moriio_mode if transfer.connector == "MoRIIOConnector" else None,
    }


def _error(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError"
    )
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class EngineDouble:
    """One double engine on 127.0.0.1 (``port=0``: an ephemeral port)."""

    name: str = "double"
    host: str = "127.0.0.1"
    port: int = 0
    bootstrap_port: int | None = None
    """Serve the Mooncake bootstrap ``/query`` on this port (0: ephemeral); ``None``: no bootstrap."""
    model: str = DEFAULT_MODEL
    data_parallel_size: int = 1
    moriio_mode: str | None = None
    """Speak MoRIIOConnector in this mode ("Write" or "Read", as the routing table names it); ``None``: not."""
    max_num_seqs: int | None = None
    """Completions answered at once (vLLM ``--max-num-seqs``); more wait (``num_requests_waiting``)."""
    behaviour: Behaviour = field(default_factory=Behaviour)
    pacer: Pacer | None = None
    """A model that decides when legs answer (module docstring, Pacing); None: answer at once."""
    record: bool = True
    """Keep every completion request in :attr:`requests` (off for long runs: bodies add up)."""
    metrics_page: Callable[[], bytes] | None = None
    """Serve this page at ``/metrics`` instead of the double's own gauges (a model's view of the pod)."""
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    requests: list[Recorded] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    """Completions waiting for a slot (only with ``max_num_seqs``)."""
    max_running: int = 0
    """Most completions this double served at once (tests check admission bounds with it)."""
    aborted: int = 0
    """Requests whose client closed the connection while the double stalled (a router abort)."""
    _runners: list[web.AppRunner] = field(default_factory=list)
    _slots: asyncio.Condition | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def completions(self) -> list[Recorded]:
        return list(self.requests)

    async def start(self) -> EngineDouble:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self.port = await self._listen(app, self.port)
        if self.bootstrap_port is not None:
            boot = web.Application()
            boot.router.add_get("/query", self._query)
            self.bootstrap_port = await self._listen(boot, self.bootstrap_port)
        return self

    async def _listen(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, port)
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # --- handlers --------------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm"}]}
        )

    @property
    def kv_usage(self) -> float:
        """The ``kv_cache_usage_perc`` the double reports (module docstring)."""
        if self.behaviour.kv_usage is not None:
            return self.behaviour.kv_usage
        if not self.max_num_seqs:
            return 0.0
        return min(1.0, self.running / self.max_num_seqs)

    def metrics_text(self) -> str:
        """The ``/metrics`` page: vLLM 0.32's names, types and labels for the admission gauges."""
        labels = f'{{engine="0",model_name="{self.model}"}}'
        gauges = (
            (em.RUNNING, "Number of requests in model execution batches.", float(self.running)),
            (em.WAITING, "Number of requests waiting to be processed.", float(self.waiting)),
            (em.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", self.kv_usage),
        )
        return "".join(
            f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name}{labels} {value}\n"
            for name, help_text, value in gauges
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        b = self.behaviour
        if b.metrics_stall_s:
            await asyncio.sleep(b.metrics_stall_s)
        if b.metrics_status is not None:
            return web.Response(status=b.metrics_status, text="scripted failure")
        if self.metrics_page is not None:
            return web.Response(body=self.metrics_page(), content_type="text/plain")
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    async def _query(self, _: web.Request) -> web.Response:
        answer = {
            str(rank): {
                "engine_id": f"{self.engine_id}-dp{rank}" if rank else self.engine_id,
                "worker_addr": {"0": {"0": f"{self.host}:{(self.bootstrap_port or 0) + 1 + rank}"}},
            }
            for rank in range(self.data_parallel_size)
        }
        return web.json_response(answer)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be an object")
        if self.record:
            self.requests.append(Recorded(request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        b = self.behaviour
        if b.stall_s and await self._stall(request, b.stall_s):
            self.aborted += 1
            return web.Response(status=499)
        if b.status is not None:
            return _error(b.status, f"{self.name} answers {b.status} (scripted)")
        stream = bool(body.get("stream", False))
        if body.get("stream_options") is not None and not stream:
            return _error(400, "Stream options can only be defined when `stream=True`.")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer")
        min_tokens = body.get("min_tokens") or 0
        if isinstance(min_tokens, int) and min_tokens > max_tokens:
            return _error(400, "min_tokens must be less than or equal to max_tokens")
        if b.die_after_tokens is not None and not stream and request.transport is not None:
            request.transport.close()
            return web.Response(status=500)
        kv = body.get("kv_transfer_params")
        out_params: Any = None
        chat = request.path.endswith("/chat/completions")
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        prefill = isinstance(kv, dict) and bool(kv.get("do_remote_decode"))
        if isinstance(kv, dict) and prefill:
            max_tokens = 1
            rank = int(request.headers.get("X-data-parallel-rank") or 0)
            out_params = self._prefill_params(kv, request_id, rank)
        elif isinstance(kv, dict) and kv.get("do_remote_prefill") and self.moriio_mode is not None:
            _moriio_check_decode(kv, self.moriio_mode)
        if self.pacer is not None:
            paced = self.pacer.pace(self, request_id, prefill)
            if paced.status is not None:
                return _error(paced.status, paced.message)
            if not prefill:
                return await self._paced_decode(request, paced, chat, request_id, body, stream)
            if paced.done is not None and await paced.done is None:
                return _error(500, f"{self.name}: the prefill failed")
        tokens = output_tokens(prompt_key(body), max_tokens)
        await self._take_slot()
        self.max_running = max(self.max_running, self.running)
        try:
            if stream:
                return await self._stream(request, tokens, chat, request_id, out_params)
            return web.json_response(self._whole(tokens, chat, request_id, out_params, body))
        finally:
            await self._release_slot()

    async def _paced_decode(
        self, request: web.Request, paced: Paced, chat: bool, request_id: str, body: Mapping[str, Any], stream: bool
    ) -> web.StreamResponse:
        """A decode leg timed by the pacer: first token when due, the rest (in one event, counted by
        ``usage``) when done; a failure cuts the stream (or answers 500 when not streamed)."""
        tokens = output_tokens(prompt_key(body), 2)
        self.running += 1
        try:
            if not stream:
                n = await paced.done if paced.done is not None else 2
                if n is None:
                    return _error(500, f"{self.name}: the request failed")
                whole = self._whole(tokens, chat, request_id, None, body)
                whole["usage"]["completion_tokens"] = n
                return web.json_response(whole)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            try:
                await response.prepare(request)
                ok = await paced.first if paced.first is not None else True
                if ok:
                    await response.write(self._chunk(tokens[0], 0, chat, request_id, last=False))
                n = await paced.done if ok and paced.done is not None else (2 if ok else None)
                if n is None:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                usage = {"prompt_tokens": len(prompt_key(body)) // 4, "completion_tokens": n}
                await response.write(self._chunk(tokens[1], 1, chat, request_id, last=True, usage=usage))
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
            except ConnectionError:  # the router closed the leg (its client left, or it aborted the decode)
                self.aborted += 1
            return response
        finally:
            self.running -= 1

    def _chunk(
        self, token: str, i: int, chat: bool, request_id: str, *, last: bool, usage: Any = None, params: Any = None
    ) -> bytes:
        """One SSE event of a streamed answer, shaped as vLLM's."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
        if chat:
            choice["delta"] = {"role": "assistant", "content": token} if i == 0 else {"content": token}
        else:
            choice |= {"text": token, "logprobs": None}
        chunk: dict[str, Any] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 0,
            "model": self.model,
            "choices": [choice],
        }
        if last and params is not None:
            chunk["kv_transfer_params"] = params
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def _take_slot(self) -> None:
        """Become running, waiting first while ``max_num_seqs`` completions run."""
        if self.max_num_seqs is None:
            self.running += 1
            return
        if self._slots is None:
            self._slots = asyncio.Condition()
        async with self._slots:
            self.waiting += 1
            try:
                await self._slots.wait_for(lambda: self.max_num_seqs is None or self.running < self.max_num_seqs)
            finally:
                self.waiting -= 1
            self.running += 1

    async def _release_slot(self) -> None:
        self.running -= 1
        if self._slots is not None:
            async with self._slots:
                self._slots.notify()

    async def _stall(self, request: web.Request, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client has closed the connection (vLLM aborts then)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return True
            await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        return False

    def _prefill_params(self, kv: Mapping[str, Any], request_id: str, dp_rank: int = 0) -> dict[str, Any] | None:
        if self.moriio_mode is not None:
            return self._moriio_prefill_params(kv, request_id, dp_rank)
        if "transfer_id" in kv:  # MooncakeConnector: nothing to hand over in the body
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[int(hashlib.blake2b(request_id.encode(), digest_size=2).hexdigest(), 16), 7]],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.host,
            "remote_port": NIXL_SIDE_CHANNEL_PORT,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": BLOCK_TOKENS,
            "remote_blocks_expiry_time": 30.0,
            "transfer_mode": "pull",
        }

    def _moriio_prefill_params(self, kv: Mapping[str, Any], request_id: str, dp_rank: int) -> dict[str, Any]:
        """vLLM's ``MoRIIOConnectorScheduler.request_finished`` answer (both modes). A missing ``transfer_id`` is
        made up from the request id, as vLLM does for sidecars that send none."""
        if self.moriio_mode == "Write":
            _moriio_require_peer(kv, "prefill")
            for key in ("remote_engine_id", "remote_block_ids"):
                if key not in kv:
                    raise _moriio_failure(f"prefill: kv_transfer_params has no {key!r}")
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[int(hashlib.blake2b(request_id.encode(), digest_size=2).hexdigest(), 16), 7]],
            "remote_engine_id": f"{self.host}:{MORIIO_HANDSHAKE_PORT}",
            "remote_host": self.host,
            "remote_handshake_port": MORIIO_HANDSHAKE_PORT,
            "remote_notify_port": MORIIO_NOTIFY_PORT,
            "remote_dp_rank": dp_rank,
            "remote_dp_rank_override": True,
            "remote_dp_size": self.data_parallel_size,
            "remote_dp_size_local": self.data_parallel_size,
            "tp_size": 1,
            "transfer_id": kv.get("transfer_id") or f"sidecar-{request_id}",
        }

    def _whole(
        self, tokens: list[str], chat: bool, request_id: str, params: Any, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        text = "".join(tokens)
        choice: dict[str, Any]
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_key(body)) // 4, "completion_tokens": len(tokens)},
            "kv_transfer_params": params,
        }

    async def _stream(
        self, request: web.Request, tokens: list[str], chat: bool, request_id: str, params: Any
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        b = self.behaviour
        for i, token in enumerate(tokens):
            if b.die_after_tokens is not None and i >= b.die_after_tokens:
                if request.transport is not None:
                    request.transport.abort()
                return response
            if b.tokens_per_s and i:
                await asyncio.sleep(1.0 / b.tokens_per_s)
            last = i == len(tokens) - 1
            await response.write(self._chunk(token, i, chat, request_id, last=last, params=params))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _moriio_failure(message: str) -> web.HTTPException:
    """What a MoRIIO leg vLLM's connector cannot use becomes: the engine step raises, the request fails."""
    body = {"error": {"message": f"MoRIIOConnector: {message}", "type": "InternalServerError", "param": None}}
    return web.HTTPInternalServerError(text=json.dumps(body), content_type="application/json")


def _moriio_require_peer(kv: Mapping[str, Any], leg: str, keys: tuple[str, ...] = ()) -> None:
    """The peer address vLLM's ``add_new_req`` needs when the request id embeds none (Tandem's never do)."""
    for key in keys or ("remote_host", "remote_handshake_port", "remote_notify_port"):
        value = kv.get(key)
        usable = bool(value)
        if usable and key != "remote_host":  # vLLM takes int(value): "6301" works, "x" or a list does not
            try:
                int(str(value))
            except ValueError:
                usable = False
        if not usable:
            raise _moriio_failure(f"{leg}: kv_transfer_params has no usable {key!r} ({value!r})")


def _moriio_check_decode(kv: Mapping[str, Any], mode: str) -> None:
    """A MoRIIO decode leg as vLLM's scheduler takes it: Write mode notifies the prefill at its host and notify
    port; Read mode with block ids and an engine id reads from the prefill's address (without them vLLM
    recomputes the prompt, which the double does not flag)."""
    if mode == "Write":
        _moriio_require_peer(kv, "decode", ("remote_host", "remote_notify_port"))
    elif kv.get("remote_block_ids") and "remote_engine_id" in kv:
        _moriio_require_peer(kv, "decode")


async def _main(args: argparse.Namespace) -> None:
    behaviour = Behaviour(status=args.status, tokens_per_s=args.tokens_per_s, stall_s=args.stall)
    double = EngineDouble(
        name=args.name,
        host=args.host,
        port=args.port,
        bootstrap_port=args.bootstrap_port,
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        behaviour=behaviour,
    )
    await double.start()
    print(f"engine double {args.name} on {double.address} (bootstrap {double.bootstrap_port})", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem_lab.dev.enginedouble", description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="double")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--bootstrap-port", type=int, default=None, help="serve Mooncake /query on this port")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens-per-s", type=float, default=0.0)
    parser.add_argument("--stall", type=float, default=0.0, help="seconds to wait before answering")
    parser.add_argument("--status", type=int, default=None, help="answer every completion with this status")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="completions at once; more wait")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
