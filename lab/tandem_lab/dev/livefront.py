"""The live fleet's data plane: the demo's traffic goes through `tandem router` (issue 15 item 8).

What it owns, on one asyncio loop in a thread:

- **Engine doubles on the pods' addresses.** After every poll of :class:`~tandem_lab.dev.simlive.LiveMetrics`
  one :class:`~tandem_lab.dev.enginedouble.EngineDouble` listens on each endpoint address the operator
  published in a routing table (KWOK pod addresses inside 127.0.0.0/8: the cluster's nodes need loopback
  pod CIDRs), with the Mooncake bootstrap ``/query`` on a prefill's table port. Each double is *paced* by
  the live fleet model (:class:`~tandem_lab.sim.live.LiveFleet` with ``external_routing``): a prefill leg
  answers when the model's prefill on that pod is done, a decode leg sends its first token when the
  model's first token is due and ends when the model's decode is done (``usage`` carries the output
  tokens). Its ``/metrics`` is the model's page for that pod, so the router's admission reads the same
  running/waiting/KV the operator's Prometheus does.
- **The client.** Every arrival the model emits is sent to the router as a streamed completion
  (``X-Request-Id: live-<serial>``; a chat with an image part when the arrival carries images), and read
  to the end; the router classifies it, hashes its prefix onto a pair, walks on fast rejects and drives
  both legs. Prompts encode the request's trace blocks (:func:`prompt_text`).

So the router's decisions (pool, pair, walk, canary keys, drain) are the ones the model's engines see,
and the operator's gates and autoscaler judge traffic that went through the router. What the model still
decides: when engines finish (queues, prefix caches, batching), as before.

Must not: bind anything but loopback, or write to the cluster. Dev tooling: the operator never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import aiohttp

from tandem.router.request import BYTES_PER_TOKEN, MIRROR_ID_SUFFIX
from tandem.routing import RoutingTable
from tandem_lab.dev.enginedouble import EngineDouble, Paced, connector_options
from tandem_lab.dev.simlive import LiveMetrics
from tandem_lab.sim.live import Arrival

T = TypeVar("T")
REQUEST_ID_PREFIX: Final = "live-"
BLOCK_CHARS: Final = 500
"""Characters per trace block at the start of a prompt. The example speed pool hashes ``prefixChars: 1000``,
so its key is the first two blocks — as the live model's ``key_blocks=2`` (block 0 of the conversation
trace is shared by every request, so a one-block key would put every request on one pair)."""
_SEND_EVERY_S: Final = 0.02
_IMAGE: Final = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def block_word(block: int) -> str:
    """Block ``block`` as :data:`BLOCK_CHARS` characters: a 64-bit hash of its id in hex, then padding (ids of
    copies and laps exceed 64 bits, so the id is hashed, not truncated)."""
    return hashlib.blake2b(str(block).encode(), digest_size=8).hexdigest().ljust(BLOCK_CHARS, ".")


def prompt_text(serial: int, arrival: Arrival) -> str:
    """The prompt a router sees for one arrival (pure).

    Its blocks in order (:func:`block_word`), so a shared block prefix is a shared character prefix; then a
    tag with the serial; then spaces up to ``input_tokens × 4`` bytes, so the router's token estimate
    (``ceil(bytes / 4)``) is the arrival's prompt length and classifies it into the pool the model would.
    (Every block but the last holds 512 tokens, 2,048 bytes, more than its word; so the estimate exceeds the
    prompt length only for a last block of under 125 tokens, by at most one word.)
    """
    text = "".join(block_word(b) for b in arrival.blocks) + f"#r{serial}"
    need = arrival.input_tokens * BYTES_PER_TOKEN
    return text + " " * (need - len(text)) if len(text) < need else text


def request_body(serial: int, arrival: Arrival, model: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of one arrival's request: a completion, or a chat with an image part."""
    text = prompt_text(serial, arrival)
    common = {"model": model, "max_tokens": max(1, arrival.output_tokens), "stream": True}
    if arrival.has_images:
        content = [{"type": "text", "text": text}, _IMAGE]
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": content}]}
    return "/v1/completions", {**common, "prompt": text}


def leg_of(request_id: str) -> tuple[int, bool] | None:
    """(serial, is a mirror copy) of a ``live-<serial>`` id or of the router's copy of it,
    ``live-<serial>-mirror`` (:data:`tandem.router.request.MIRROR_ID_SUFFIX`); None for any other id."""
    if not request_id.startswith(REQUEST_ID_PREFIX):
        return None
    tail = request_id[len(REQUEST_ID_PREFIX) :]
    mirror = tail.endswith(MIRROR_ID_SUFFIX)
    if mirror:
        tail = tail[: -len(MIRROR_ID_SUFFIX)]
    return (int(tail), mirror) if tail.isdigit() else None


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


@dataclass
class _PodPacer:
    """Paces one pod's double by the live model (the :class:`~tandem_lab.dev.enginedouble.Pacer` protocol)."""

    live: LiveMetrics
    namespace: str
    pod: str
    loop: asyncio.AbstractEventLoop

    def pace(self, double: EngineDouble, request_id: str, prefill: bool) -> Paced:
        leg = leg_of(request_id)
        if leg is None:
            return Paced(status=400, message=f"{self.pod}: not a live request id: {request_id!r}")
        serial, mirror = leg
        loop = self.loop
        done: asyncio.Future[int | None] = loop.create_future()
        if prefill:

            def prefilled(ok: bool) -> None:
                loop.call_soon_threadsafe(_resolve, done, 1 if ok else None)

            why = self.live.enter_prefill(serial, self.namespace, self.pod, prefilled, mirror=mirror)
            return Paced(status=503, message=why) if why else Paced(done=done)
        first: asyncio.Future[bool] = loop.create_future()

        def first_due(at: float) -> None:
            # The model's clock is time.monotonic, as the loop's: the first token goes out when it is due.
            loop.call_soon_threadsafe(loop.call_at, at, _resolve, first, True)

        def finished(n: int | None) -> None:
            loop.call_soon_threadsafe(_resolve, done, n)
            if n is None:
                loop.call_soon_threadsafe(_resolve, first, False)

        why = self.live.enter_decode(serial, self.namespace, self.pod, first_due, finished, mirror=mirror)
        return Paced(status=503, message=why) if why else Paced(first=first, done=done)


@dataclass
class LiveFront:
    """The data plane around a :class:`LiveMetrics` whose options set ``external_routing`` (module docstring)."""

    live: LiveMetrics
    router_url: str
    model: str = "tandem-sim"
    timeout_s: float = 120.0
    outcomes: Counter[str] = field(default_factory=Counter)
    """Client outcomes: ``ok``, ``http-<status>``, ``broken`` (the stream ended without ``[DONE]``),
    ``error-<exception>`` (the client's exception class: ``ServerDisconnectedError``, ``TimeoutError``...), or
    ``cancelled`` (still in flight when the client stopped)."""
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _doubles: dict[str, EngineDouble] = field(default_factory=dict)
    _owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None
    _sender: asyncio.Task[None] | None = None
    _inflight: set[asyncio.Task[None]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> LiveFront:
        if not self.live.fleet.external:
            raise ValueError("the live model must run with LiveOptions(external_routing=True)")
        self._thread = threading.Thread(target=self._loop.run_forever, name="livefront", daemon=True)
        self._thread.start()
        self._run(self._start())
        self.live.table_listeners.append(self.serve_tables)
        self.live.sync()  # doubles before the first arrivals: the model's first poll ran before this listener
        return self

    async def _start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10)
        )
        self._sender = asyncio.create_task(self._send_loop())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    # -- engine doubles --

    def serve_tables(self, tables: Sequence[RoutingTable]) -> None:
        """Make the doubles equal to the tables' endpoints (called after every poll, from its thread)."""
        wanted: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for table in tables:
            for pair in table.pairs:
                for role, endpoints in (("prefill", pair.prefill), ("decode", pair.decode)):
                    for endpoint in endpoints:
                        if endpoint.address is None:
                            continue
                        options = connector_options(pair.transfer, role)
                        wanted[endpoint.address] = (table.namespace, endpoint.pod, options)
        self._run(self._serve(wanted))

    async def _serve(self, wanted: Mapping[str, tuple[str, str, dict[str, Any]]]) -> None:
        for address, double in list(self._doubles.items()):
            owner = wanted.get(address)
            if owner is None or self._owners.get(address) != owner[:2]:
                await double.stop()
                del self._doubles[address]
                self._owners.pop(address, None)
        for address, (namespace, pod, options) in wanted.items():
            if address in self._doubles:
                continue
            host, _, port = address.rpartition(":")
            if not host.startswith("127."):
                raise ValueError(f"{namespace}/{pod} at {address}: not loopback (nodes need loopback pod CIDRs)")
            double = EngineDouble(
                name=pod,
                host=host,
                port=int(port),
                model=self.model,
                record=False,
                pacer=_PodPacer(self.live, namespace, pod, self._loop),
                metrics_page=self._page(namespace, pod),
                **options,
            )
            try:
                await double.start()
            except OSError as exc:
                self.outcomes["double-bind-error"] += 1
                print(f"[live front] cannot serve {namespace}/{pod} on {address}: {exc}", flush=True)
                continue
            self._doubles[address] = double
            self._owners[address] = (namespace, pod)

    def _page(self, namespace: str, pod: str) -> Callable[[], bytes]:
        return lambda: self.live.render(namespace, pod)[1]

    def doubles(self) -> int:
        return len(self._doubles)

    # -- the client --

    async def _send_loop(self) -> None:
        while True:
            for serial, arrival in await asyncio.to_thread(self.live.take_arrivals):
                task = asyncio.create_task(self._send(serial, arrival))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            await asyncio.sleep(_SEND_EVERY_S)

    async def _send(self, serial: int, arrival: Arrival) -> None:
        assert self._session is not None
        path, body = request_body(serial, arrival, self.model)
        status = 0
        outcome = "error"
        try:
            async with self._session.post(
                self.router_url + path,
                data=json.dumps(body),
                headers={"Content-Type": "application/json", "X-Request-Id": f"{REQUEST_ID_PREFIX}{serial}"},
            ) as resp:
                status = resp.status
                if status != 200:
                    await resp.read()
                    outcome = f"http-{status}"
                else:
                    tail = b""
                    async for chunk in resp.content.iter_any():
                        tail = (tail + chunk)[-64:]
                    outcome = "ok" if b"[DONE]" in tail else "broken"
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome = f"error-{type(exc).__name__}"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            with self._lock:
                self.outcomes[outcome] += 1
            self.live.release(serial, rejected=status in (429, 503))

    def outcome_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.outcomes)

    def in_flight(self) -> int:
        return len(self._inflight)

    def stop(self) -> None:
        if self.serve_tables in self.live.table_listeners:
            self.live.table_listeners.remove(self.serve_tables)
        if self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    async def _stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        for double in self._doubles.values():
            with contextlib.suppress(Exception):
                await double.stop()
        self._doubles.clear()
