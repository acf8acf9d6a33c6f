"""The request path: decide with :mod:`tandem.routing`, walk on fast rejects, drive the legs, relay.

Steps per request (the code follows them):

1. Parse the body (:mod:`.request`); keep the tables serving its ``model`` (tables without a served model
   name take any); :func:`tandem.routing.classify` picks the pool; :func:`tandem.routing.routing_key` keys it.
2. :func:`tandem.routing.select_for_table` walks the candidates with this replica's in-flight counts
   joined with the scraped engine view (:mod:`.admission`, :mod:`.scrape`). Pairs full by the table's
   admission limits are skipped by the algorithm itself.
3. The prefill leg runs on the chosen pair. A prefill that answers 429 or 503, cannot be connected to,
   or times out puts the pair in the walk's ``exclude`` set and step 2 runs again: the algorithm walks
   past it (its place and its try kept, its load untouched) to the next candidate in the same walk
   order, within the same ``maxWalk``. Any other prefill failure is the client's error (4xx relayed) or a
   502; no walk.
4. The decode leg runs on the same pair and is relayed to the client. Nothing is retried once the decode
   leg has started: the first decode byte may already be with the client, and the KV sits on this pair.
5. Every tried pair full: the table's ``rejectStatus`` with ``Retry-After``.

A request with ``X-Tandem-Revision`` (:mod:`tandem.routing.pin`; honoured only with
``RouterConfig.allow_revision_pin``, else 403) is walked the same way over that revision's serving pairs
only (``select_for_table(..., revision=)``); ``<namespace>/<pool>/<revision>`` also names the pool instead
of classifying. That revision without a serving pair: 503 ``revision_not_serving``.

Every request that reaches a pool is judged once for its SLO (``tandem_router_slo_requests_total``) by
:func:`tandem.core.capacity.judge_request`: served requests on their own TTFT and TPOT, rejects (step 5),
timeouts and the pool's failures as such, so the autoscaler sees the demand the engines never served.
A 4xx the engine gives the client's own request is not judged (the client's mistake, not the pool's).

MooncakeConnector and MoRIIOConnector in Write mode send the decode leg concurrently with the prefill (the
decode waits for the KV on the engine side) and abort it, by closing its connection, when the prefill fails;
otherwise vLLM would hold the decode for ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` (480 s) or MoRIIO's
``recv_abort_timeout`` (120 s). Its bytes reach the client only after the prefill succeeded, so the walk rule
above holds for every connector. NixlConnector and MoRIIOConnector in Read mode run the legs in sequence.

A table with ``revisions.canaryMirror`` (a ``setMirrorPairs`` rollout step) also copies each unpinned request
whose key :func:`tandem.routing.mirror_pair` walks to a canary pair (the by-count walk, with this replica's
loads, the load bound and admission): the copy (its own request id, ``stream`` off) runs the same legs on that
pair in a task of its own, its answer is read and dropped, and it is counted only in
``tandem_router_mirror_requests_total``. The user's request never waits for it or sees it: a copy is not sent
when the walk passes the canary pair by (full or over its bound: ``skipped_full``), and a refused copy is not
walked.
The engines' own metrics count the copies, which is what the canary's gates read.

Must not: re-implement any routing decision, or retry after a decode leg started.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tandem.core.capacity import RESULT_ERROR, RESULT_REJECTED, RESULT_TIMEOUT, SLO_TPOT, judge_request
from tandem.router import errors, legs
from tandem.router.admission import Loads
from tandem.router.metrics import (
    LEG_DECODE,
    LEG_PREFILL,
    MIRROR_FULL,
    MIRROR_NOT_TAKEN,
    OUTCOME_BAD_REQUEST,
    OUTCOME_CLIENT_GONE,
    OUTCOME_DECODE_ERROR,
    OUTCOME_NO_POOL,
    OUTCOME_OK,
    OUTCOME_PREFILL_ERROR,
    OUTCOME_REJECTED,
    OUTCOME_STREAM_BROKEN,
    REASON_NO_ADDRESS,
    REASON_PREFILL_429,
    REASON_PREFILL_503,
    REASON_PREFILL_CONNECT,
    REASON_PREFILL_TIMEOUT,
    REJECT_ALL_FULL,
    REJECT_NO_SERVING_PAIR,
    RouterMetrics,
)
from tandem.router.request import (
    KIND_CHAT,
    KIND_COMPLETION,
    MIRROR_ID_SUFFIX,
    BadRequest,
    ClientRequest,
    mirror_request,
    parse_request,
)
from tandem.router.scrape import (
    DEFAULT_SCRAPE_INTERVAL_S,
    DEFAULT_SCRAPE_TIMEOUT_S,
    DEFAULT_STALE_INTERVALS,
    EngineScraper,
)
from tandem.router.slo import StreamTokens, usage_count
from tandem.router.tables import TableStore
from tandem.routing import (
    HEADER_REVISION,
    Outcome,
    Pair,
    PinError,
    RevisionPin,
    RoutingTable,
    SkipReason,
    classify,
    mirror_pair,
    parse_revision_pin,
    routing_key,
    select_for_table,
)
from tandem.routing.table import DEFAULT_LOAD_BOUND_PERCENT

log = logging.getLogger(__name__)

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("tandem_request_id", default="-")
"""The request id of the request this task serves (``-`` outside one); :class:`RequestIdFilter` puts it on
every log record, so any line logged while serving a request carries its ``X-Request-Id``."""


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (the :data:`REQUEST_ID` of the emitting task) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


HEADER_PAIR = "X-Tandem-Pair"
PATHS = {KIND_COMPLETION: "/v1/completions", KIND_CHAT: "/v1/chat/completions"}
_WALK_STATUSES = {429: REASON_PREFILL_429, 503: REASON_PREFILL_503}
_PASS_THROUGH = ("x-request-id", "authorization")


@dataclass(frozen=True)
class RouterConfig:
    """Timeouts and reject hints. Every wait is bounded."""

    connect_timeout_s: float = 2.0
    prefill_timeout_s: float = 60.0
    """Whole prefill leg (a prefill computes one token, so this bounds a stalled engine)."""
    decode_idle_timeout_s: float = 60.0
    """Longest gap between two decode reads (a stalled stream fails after this)."""
    retry_after_s: int = 1
    bootstrap_cache_s: float = 60.0
    """How long a prefill's Mooncake ``/query`` answer is reused."""
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    """Seconds between engine-metric rounds (:mod:`.scrape`); 0 turns engine-metric admission off."""
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S
    """Bound of one instance's ``/metrics`` read."""
    scrape_stale_intervals: int = DEFAULT_STALE_INTERVALS
    """Engine samples older than this many intervals are not used (own counts only)."""
    allow_revision_pin: bool = False
    """Honour ``X-Tandem-Revision`` (``tandem router --allow-revision-header``). Off: a request carrying the
    header is refused (403), never routed as if it had none: an eval that asked for the canary must not be
    scored on the stable revision."""


@dataclass(frozen=True)
class _Walk:
    """The prefill leg said "full" (or could not be reached): try the next candidate."""

    reason: str


class _Request:
    """One client request as it moves through the walk (labels, ids, timings)."""

    def __init__(self, creq: ClientRequest, request_id: str, started: float) -> None:
        self.creq = creq
        self.request_id = request_id
        self.started = started
        self.labels: tuple[str, str, str] = ("", "", "")
        self.prompt_tokens = creq.prompt_tokens
        """The SLO budget's prompt size: the router's estimate until the prefill leg reports its usage."""
        self.prefill_done: float | None = None
        self.timed_out = False
        """A prefill leg of this request's walk timed out (a walk that then ends rejected is a timeout)."""
        self.mirror = False
        """A copy for a mirrored canary pair: counted in the mirror metric only, its answer dropped."""
        self.key = 0
        """The routing key (``tandem.routing.routing_key``): it picks the pair, and the prefill instance inside it."""
        self.load_bound_percent = DEFAULT_LOAD_BOUND_PERCENT
        """The table's load bound, for the prefill instance inside the pair."""


class Router:
    """The aiohttp application of the data plane. One per process; stateless apart from in-flight counts."""

    def __init__(
        self,
        store: TableStore,
        metrics: RouterMetrics,
        config: RouterConfig | None = None,
        loads: Loads | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.config = config or RouterConfig()
        self.loads = loads or Loads()
        self.scraper = EngineScraper(
            store,
            interval_s=self.config.scrape_interval_s,
            timeout_s=self.config.scrape_timeout_s,
            stale_intervals=self.config.scrape_stale_intervals,
        )
        """Engine view for admission; :func:`tandem.router.server.start_router` runs its loop when enabled."""
        metrics.watch_scraper(self.scraper)
        self._session: aiohttp.ClientSession | None = None
        self._bootstrap: dict[str, tuple[float, Any]] = {}
        self._dp_counter = itertools.count()
        self._mirrors: set[asyncio.Task[None]] = set()
        """Mirror copies in flight (a reference keeps each task alive until it ends)."""

    # --- application ---------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(PATHS[KIND_COMPLETION], self._completions)
        app.router.add_post(PATHS[KIND_CHAT], self._chat)
        app.router.add_get("/v1/models", self._models)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector)

    async def _close(self, _: web.Application) -> None:
        for task in list(self._mirrors):
            task.cancel()
        if self._mirrors:
            await asyncio.gather(*self._mirrors, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("router application not started")
        return self._session

    async def _models(self, _: web.Request) -> web.Response:
        names = sorted({t.table.served_model_name for t in self.store.snapshot if t.table.served_model_name})
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "tandem"} for name in names]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, KIND_COMPLETION)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, KIND_CHAT)

    # --- step 1: parse and classify --------------------------------------------------------------

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = request.headers.get(legs.HEADER_REQUEST_ID) or f"tandem-{uuid.uuid4().hex}"
        REQUEST_ID.set(request_id)  # aiohttp serves each request in its own task: the value stays with it
        try:
            creq = parse_request(kind, json.loads(await request.read()))
        except (BadRequest, ValueError) as exc:
            self.metrics.requests.labels("", "", "", OUTCOME_BAD_REQUEST).inc()
            return errors.error_response(f"invalid request: {exc}", status=400)
        pin: RevisionPin | None = None
        pin_value = request.headers.get(HEADER_REVISION)
        if pin_value is not None:
            refused = self._read_pin(pin_value)
            if isinstance(refused, web.Response):
                return refused
            pin = refused
        snapshot = self.store.snapshot
        if not snapshot:
            self.metrics.requests.labels("", "", "", OUTCOME_NO_POOL).inc()
            return errors.error_response("no routing table is loaded", status=503, code=errors.CODE_NO_TABLE)
        tables = [t.table for t in snapshot if _serves(t.table, creq.model)]
        if not tables:
            self.metrics.requests.labels("", "", "", OUTCOME_NO_POOL).inc()
            return errors.error_response(
                f"model {creq.model!r} is not served here", status=404, code=errors.CODE_MODEL_NOT_FOUND
            )
        if pin is not None and pin.pool_key is not None:
            table = next((t for t in tables if f"{t.namespace}/{t.pool}" == pin.pool_key), None)
            if table is None:
                self.metrics.requests.labels("", "", "", OUTCOME_NO_POOL).inc()
                return errors.error_response(
                    f"pool {pin.pool_key} serving model {creq.model!r} is not routed here",
                    status=404,
                    code=errors.CODE_POOL_NOT_FOUND,
                )
        else:
            table = classify(creq.features(request.headers), tables)
        if table is None:
            self.metrics.requests.labels("", "", "", OUTCOME_NO_POOL).inc()
            return errors.error_response("no pool takes this request", status=400, code=errors.CODE_NO_POOL)
        key = routing_key(creq.routing_text, table.hash.prefix_chars)
        state = _Request(creq, request_id, started)
        state.key, state.load_bound_percent = key, table.hash.load_bound_percent
        if pin is not None:
            log.info("request %s pinned to revision %s of %s/%s", request_id, pin.revision, table.namespace, table.pool)
        else:
            self._mirror(request, table, key, state)
        return await self._walk(request, table, key, state, None if pin is None else pin.revision)

    def _read_pin(self, value: str) -> RevisionPin | web.Response:
        """The parsed pin, or the error answer when pinning is off or the value is malformed."""
        if not self.config.allow_revision_pin:
            self.metrics.requests.labels("", "", "", OUTCOME_BAD_REQUEST).inc()
            return errors.error_response(
                f"{HEADER_REVISION} is not honoured by this router (start it with --allow-revision-header)",
                status=403,
                code=errors.CODE_PIN_DISABLED,
            )
        try:
            return parse_revision_pin(value)
        except PinError as exc:
            self.metrics.requests.labels("", "", "", OUTCOME_BAD_REQUEST).inc()
            return errors.error_response(str(exc), status=400, code=errors.CODE_BAD_PIN)

    # --- steps 2, 3 and 5: the walk ----------------------------------------------------------------

    async def _walk(
        self, request: web.Request, table: RoutingTable, key: int, state: _Request, revision: str | None = None
    ) -> web.StreamResponse:
        """Steps 2, 3 and 5; ``revision`` pins the walk to that revision's serving pairs."""
        pool = f"{table.namespace}/{table.pool}"
        engine = self.scraper.view(pool)
        tried: set[str] = set()  # pairs whose prefill said "full" in this request: excluded from the walk
        counted: set[str] = set()
        while True:
            decision = select_for_table(
                table, key, self.loads.for_table(table, engine), exclude=tried, revision=revision
            )
            for skip in decision.skips:
                # An excluded pair was counted under the router's own reason when it was tried.
                if skip.reason is not SkipReason.EXCLUDED and skip.pair_id not in counted:
                    counted.add(skip.pair_id)
                    self.metrics.rejects.labels(pool, skip.pair_id, str(skip.reason)).inc()
            if decision.outcome is Outcome.REJECTED or decision.pair is None:
                self.metrics.walk.labels(pool).observe(decision.walk_length)
                self.metrics.requests.labels(pool, "", "", OUTCOME_REJECTED).inc()
                failure = RESULT_TIMEOUT if state.timed_out else RESULT_REJECTED
                self.metrics.record_slo(pool, "", judge_request(state.prompt_tokens, failure=failure))
                status = decision.status or 503
                no_pair = decision.walk_length == 0  # no serving pair at all: an outage, not overload
                self.metrics.client_rejects.labels(pool, REJECT_NO_SERVING_PAIR if no_pair else REJECT_ALL_FULL).inc()
                log.info("request %s rejected by %s after %d pair(s)", state.request_id, pool, decision.walk_length)
                if no_pair and revision is not None:
                    message, code = f"revision {revision} of pool {pool} has no serving pair", errors.CODE_NO_REVISION
                elif no_pair:
                    message, code = f"pool {pool} has no serving pair", errors.CODE_NO_PAIR
                else:
                    which = "" if revision is None else f" (revision {revision})"
                    message, code = f"every pair of pool {pool}{which} tried is full; retry later", errors.CODE_ALL_FULL
                return errors.error_response(
                    message,
                    status=status,
                    code=code,
                    headers={"Retry-After": str(self.config.retry_after_s), legs.HEADER_REQUEST_ID: state.request_id},
                )
            pair = decision.pair
            state.labels = (pool, pair.id, pair.revision)
            with self.loads.hold_pair(table, pair.id):
                gauge = self.metrics.in_flight.labels(pool, pair.id)
                gauge.inc()
                try:
                    result = await self._serve_pair(request, pair, state)
                finally:
                    gauge.dec()
            if isinstance(result, _Walk):
                log.info("request %s: pair %s %s; walking on", state.request_id, pair.id, result.reason)
                tried.add(pair.id)
                counted.add(pair.id)
                state.timed_out |= result.reason == REASON_PREFILL_TIMEOUT
                self.metrics.rejects.labels(pool, pair.id, result.reason).inc()
                continue
            self.metrics.walk.labels(pool).observe(decision.walk_length)
            log.debug("request %s served by %s (walk %d)", state.request_id, pair.id, decision.walk_length)
            return result

    # --- mirror copies -------------------------------------------------------------------------------

    def _mirror(self, request: web.Request, table: RoutingTable, key: int, state: _Request) -> None:
        """Start the copy of this request for a mirrored canary pair, if the by-count walk takes its key there."""
        if not table.revisions.canary_mirror:
            return
        pool = f"{table.namespace}/{table.pool}"
        choice = mirror_pair(table, key, self.loads.for_table(table, self.scraper.view(pool)))
        pair = choice.pair
        if pair is None:
            if choice.skipped is not None:
                self.metrics.mirrors.labels(pool, choice.skipped.id, choice.skipped.revision, MIRROR_FULL).inc()
            return
        copy = _Request(mirror_request(state.creq), state.request_id + MIRROR_ID_SUFFIX, time.perf_counter())
        copy.mirror = True
        copy.key, copy.load_bound_percent = key, table.hash.load_bound_percent
        copy.labels = (pool, pair.id, pair.revision)
        task = asyncio.ensure_future(self._run_mirror(request, table, pair, copy))
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _run_mirror(self, request: web.Request, table: RoutingTable, pair: Pair, copy: _Request) -> None:
        """Drive the copy's legs on ``pair`` and drop the answer; nothing of it reaches the client."""
        try:
            with self.loads.hold_pair(table, pair.id):
                result = await self._serve_pair(request, pair, copy)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("mirror copy %s on %s failed", copy.request_id, pair.id)
            self.metrics.mirrors.labels(*copy.labels, OUTCOME_PREFILL_ERROR).inc()
            return
        if isinstance(result, _Walk):
            self.metrics.mirrors.labels(*copy.labels, MIRROR_NOT_TAKEN).inc()

    # --- steps 3 and 4: the legs of one pair ---------------------------------------------------------

    async def _serve_pair(self, request: web.Request, pair: Pair, state: _Request) -> web.StreamResponse | _Walk:
        prefill_addr = self.loads.pick_for_key(state.key, pair.prefill, state.load_bound_percent)
        decode_addr = self.loads.pick(pair.decode)
        if prefill_addr is None or decode_addr is None:
            return _Walk(REASON_NO_ADDRESS)
        transfer = pair.transfer
        if transfer.connector not in legs.SUPPORTED_CONNECTORS:
            return self._finish_error(
                state, OUTCOME_PREFILL_ERROR, f"connector {transfer.connector} is not supported", 501
            )
        headers = {legs.HEADER_REQUEST_ID: state.request_id, "Content-Type": "application/json"}
        if "authorization" in request.headers:
            headers["Authorization"] = request.headers["authorization"]
        with self.loads.hold_instance(decode_addr):  # the prefill instance is held by its leg only
            if transfer.connector == legs.MOONCAKE:
                return await self._mooncake(request, pair, prefill_addr, decode_addr, headers, state)
            if transfer.connector == legs.MORIIO:
                return await self._moriio(request, pair, prefill_addr, decode_addr, headers, state)
            body = legs.build_prefill_body(state.creq.body, legs.nixl_prefill_params())
            return await self._sequential(
                request, prefill_addr, body, headers, decode_addr, headers, state, legs.nixl_decode_params
            )

    async def _sequential(
        self,
        request: web.Request,
        prefill_addr: str,
        prefill_body: dict[str, Any],
        prefill_headers: dict[str, str],
        decode_addr: str,
        headers: dict[str, str],
        state: _Request,
        decode_params: Callable[[dict[str, Any]], Any],
    ) -> web.StreamResponse | _Walk:
        """Prefill, then a decode whose ``kv_transfer_params`` come from the prefill's answer."""
        outcome = await self._prefill(prefill_addr, prefill_body, prefill_headers, state)
        if not isinstance(outcome, dict):
            return outcome
        try:
            kv = decode_params(outcome)
        except legs.LegProtocolError as exc:
            return self._finish_error(state, OUTCOME_PREFILL_ERROR, str(exc), 502, errors.CODE_PREFILL_FAILED)
        decode_body = legs.build_decode_body(state.creq.body, kv)
        try:
            response = await self._open_decode(decode_addr, decode_body, headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._finish_error(
                state,
                OUTCOME_DECODE_ERROR,
                f"decode leg failed: {_describe(exc)}",
                502,
                errors.CODE_DECODE_FAILED,
                failure=_failure(exc),
            )
        return await self._relay(request, response, state)

    async def _mooncake(
        self,
        request: web.Request,
        pair: Pair,
        prefill_addr: str,
        decode_addr: str,
        headers: dict[str, str],
        state: _Request,
    ) -> web.StreamResponse | _Walk:
        transfer = pair.transfer
        bootstrap = legs.bootstrap_addr(prefill_addr, transfer.bootstrap_port)
        dp_rank = next(self._dp_counter) % transfer.data_parallel_size
        try:
            engine_id = legs.engine_id_for_rank(await self._query(bootstrap), dp_rank)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("request %s: bootstrap %s unreachable: %s", state.request_id, bootstrap, _describe(exc))
            return _Walk(REASON_PREFILL_CONNECT)
        except legs.LegProtocolError as exc:
            return self._finish_error(state, OUTCOME_PREFILL_ERROR, str(exc), 502, errors.CODE_PREFILL_FAILED)
        transfer_id = f"xfer-{uuid.uuid4()}"
        prefill_headers = dict(headers)
        if transfer.data_parallel_size > 1:
            prefill_headers[legs.HEADER_DP_RANK] = str(dp_rank)
        dp = dp_rank if transfer.data_parallel_size > 1 else None
        decode_body = legs.build_decode_body(
            state.creq.body, legs.mooncake_decode_params(transfer_id, bootstrap, engine_id, dp)
        )
        prefill_body = legs.build_prefill_body(state.creq.body, legs.mooncake_prefill_params(transfer_id))
        return await self._concurrent(
            request, prefill_addr, prefill_body, prefill_headers, decode_addr, decode_body, headers, state
        )

    async def _moriio(
        self,
        request: web.Request,
        pair: Pair,
        prefill_addr: str,
        decode_addr: str,
        headers: dict[str, str],
        state: _Request,
    ) -> web.StreamResponse | _Walk:
        """MoRIIOConnector: each leg gets the other's MoRIIO address and one ``transfer_id``; Write mode runs the
        legs at once (the decode announces its blocks, the prefill writes into them), Read mode in sequence (the
        decode reads what the prefill's answer points to)."""
        transfer = pair.transfer
        transfer_id = f"xfer-{uuid.uuid4()}"
        prefill_headers = dict(headers)
        dp_rank: int | None = None
        if transfer.data_parallel_size > 1:
            dp_rank = next(self._dp_counter) % transfer.data_parallel_size
            prefill_headers[legs.HEADER_DP_RANK] = str(dp_rank)
        ports = (transfer.handshake_port, transfer.notify_port)
        prefill_params = legs.moriio_prefill_params(transfer_id, legs.address_host(decode_addr), *ports)
        prefill_body = legs.build_prefill_body(state.creq.body, prefill_params)
        decode_params = legs.moriio_decode_params(
            transfer_id, legs.address_host(prefill_addr), *ports, transfer.data_parallel_size, dp_rank
        )
        if transfer.moriio_mode == "Read":
            return await self._sequential(
                request,
                prefill_addr,
                prefill_body,
                prefill_headers,
                decode_addr,
                headers,
                state,
                lambda answer: legs.moriio_read_decode_params(answer, decode_params),
            )
        decode_body = legs.build_decode_body(state.creq.body, decode_params)
        return await self._concurrent(
            request, prefill_addr, prefill_body, prefill_headers, decode_addr, decode_body, headers, state
        )

    async def _concurrent(
        self,
        request: web.Request,
        prefill_addr: str,
        prefill_body: dict[str, Any],
        prefill_headers: dict[str, str],
        decode_addr: str,
        decode_body: dict[str, Any],
        headers: dict[str, str],
        state: _Request,
    ) -> web.StreamResponse | _Walk:
        """Decode sent while the prefill runs (the engine waits for the KV); relayed only after the prefill
        succeeded, and aborted when it did not."""
        decode_task = asyncio.ensure_future(self._open_decode(decode_addr, decode_body, headers))
        try:
            outcome = await self._prefill(prefill_addr, prefill_body, prefill_headers, state)
        except BaseException:
            await _abort(decode_task)
            raise
        if not isinstance(outcome, dict):
            await _abort(decode_task)  # the hazard of dataplane.md §1.4: never leave D waiting for a dead P
            return outcome
        try:
            response = await decode_task
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._finish_error(
                state,
                OUTCOME_DECODE_ERROR,
                f"decode leg failed: {_describe(exc)}",
                502,
                errors.CODE_DECODE_FAILED,
                failure=_failure(exc),
            )
        return await self._relay(request, response, state)

    async def _query(self, bootstrap: str) -> Any:
        cached = self._bootstrap.get(bootstrap)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.config.bootstrap_cache_s:
            return cached[1]
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s * 2, connect=self.config.connect_timeout_s)
        async with self.session.get(f"{bootstrap}/query", timeout=timeout) as resp:
            resp.raise_for_status()
            answer = await resp.json(content_type=None)
        self._bootstrap[bootstrap] = (now, answer)
        return answer

    async def _prefill(
        self, address: str, body: dict[str, Any], headers: Mapping[str, str], state: _Request
    ) -> dict[str, Any] | _Walk | web.StreamResponse:
        """Run the prefill leg: its JSON answer, a :class:`_Walk`, or the error response for the client."""
        url = f"http://{address}{PATHS[state.creq.kind]}"
        timeout = aiohttp.ClientTimeout(total=self.config.prefill_timeout_s, connect=self.config.connect_timeout_s)
        t0 = time.perf_counter()
        try:
            with self.loads.hold_instance(address):
                async with self.session.post(
                    url, data=json.dumps(body).encode(), headers=headers, timeout=timeout
                ) as resp:
                    if resp.status in _WALK_STATUSES:
                        return _Walk(_WALK_STATUSES[resp.status])
                    payload = await resp.read()
                    if resp.status != 200:
                        if 400 <= resp.status < 500:
                            return self._relay_error(state, resp.status, payload)
                        return self._finish_error(
                            state,
                            OUTCOME_PREFILL_ERROR,
                            f"prefill leg answered {resp.status}",
                            502,
                            errors.CODE_PREFILL_FAILED,
                            upstream=payload,
                        )
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError):
            return _Walk(REASON_PREFILL_CONNECT)
        except TimeoutError:
            return _Walk(REASON_PREFILL_TIMEOUT)
        except aiohttp.ClientError as exc:
            return self._finish_error(
                state, OUTCOME_PREFILL_ERROR, f"prefill leg failed: {_describe(exc)}", 502, errors.CODE_PREFILL_FAILED
            )
        state.prefill_done = time.perf_counter()
        if not state.mirror:
            self.metrics.leg.labels(*state.labels, LEG_PREFILL).observe(state.prefill_done - t0)
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        prompt_tokens = usage_count(answer, "prompt_tokens")
        if prompt_tokens:
            state.prompt_tokens = prompt_tokens
        if not isinstance(answer, dict):
            return self._finish_error(
                state, OUTCOME_PREFILL_ERROR, "prefill leg answered no JSON object", 502, errors.CODE_PREFILL_FAILED
            )
        return answer

    async def _open_decode(
        self, address: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        url_path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.config.connect_timeout_s, sock_read=self.config.decode_idle_timeout_s
        )
        return await self.session.post(
            f"http://{address}{url_path}", data=json.dumps(body).encode(), headers=headers, timeout=timeout
        )

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, state: _Request
    ) -> web.StreamResponse:
        """Step 4: hand the decode leg to the client; never retried from here on."""
        t0 = time.perf_counter()
        try:
            if upstream.status != 200:
                payload = await upstream.read()
                if 400 <= upstream.status < 500:
                    return self._relay_error(state, upstream.status, payload, OUTCOME_DECODE_ERROR)
                return self._finish_error(
                    state,
                    OUTCOME_DECODE_ERROR,
                    f"decode leg answered {upstream.status}",
                    502,
                    errors.CODE_DECODE_FAILED,
                    upstream=payload,
                )
            if not state.creq.stream:  # a mirror copy is never streamed: it ends here, its answer dropped
                try:
                    payload = await upstream.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    return self._finish_error(
                        state,
                        OUTCOME_STREAM_BROKEN,
                        f"decode leg broke: {_describe(exc)}",
                        502,
                        errors.CODE_STREAM_BROKEN,
                        failure=_failure(exc),
                    )
                self._observe_done(state, t0, ttft=True)
                self._judge_whole(state, payload)
                return web.Response(body=payload, content_type="application/json", headers=self._headers(state))
            return await self._stream(request, upstream, state, t0)
        finally:
            upstream.release()

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, state: _Request, t0: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=self._headers(state))
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        first = True
        tokens = StreamTokens()
        first_at = last_at = 0.0
        try:
            async for chunk in upstream.content.iter_any():
                last_at = time.perf_counter()
                if first:
                    first_at = last_at
                    self.metrics.ttft.labels(*state.labels).observe(first_at - state.started)
                    first = False
                tokens.feed(chunk)
                await response.write(chunk)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            TimeoutError,
        ) as exc:
            log.warning("request %s: decode stream on %s broke: %s", state.request_id, state.labels[1], _describe(exc))
            self.metrics.requests.labels(*state.labels, OUTCOME_STREAM_BROKEN).inc()
            self._record_slo(state, judge_request(state.prompt_tokens, failure=_failure(exc)))
            upstream.close()
            try:
                await response.write(
                    errors.sse_error_event(f"decode stream broke: {_describe(exc)}", errors.CODE_STREAM_BROKEN)
                )
                await response.write_eof()
            except (ConnectionError, RuntimeError):
                pass
            return response
        except (ConnectionError, RuntimeError):
            # The client went away: close the decode connection so the engine aborts the request.
            upstream.close()
            self.metrics.requests.labels(*state.labels, OUTCOME_CLIENT_GONE).inc()
            gone = judge_request(
                state.prompt_tokens,
                ttft_s=None if first else first_at - state.started,
                abandoned_after_s=time.perf_counter() - state.started,
            )
            self._record_slo(state, gone)
            return response
        await response.write_eof()
        self._observe_done(state, t0, ttft=first)
        if first:  # an empty stream: its end is its first token
            first_at = last_at = time.perf_counter()
        n = tokens.tokens
        done = judge_request(
            state.prompt_tokens, ttft_s=first_at - state.started, output_tokens=n, decode_s=last_at - first_at
        )
        self._record_slo(state, done)
        return response

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _headers(self, state: _Request) -> dict[str, str]:
        return {legs.HEADER_REQUEST_ID: state.request_id, HEADER_PAIR: state.labels[1]}

    def _count(self, state: _Request, outcome: str) -> None:
        """One request's outcome: a client request in ``requests_total``, a mirror copy in the mirror metric."""
        (self.metrics.mirrors if state.mirror else self.metrics.requests).labels(*state.labels, outcome).inc()

    def _observe_done(self, state: _Request, decode_started: float, *, ttft: bool) -> None:
        if state.mirror:
            self._count(state, OUTCOME_OK)
            return
        now = time.perf_counter()
        if ttft:
            self.metrics.ttft.labels(*state.labels).observe(now - state.started)
        self.metrics.e2e.labels(*state.labels).observe(now - state.started)
        self.metrics.leg.labels(*state.labels, LEG_DECODE).observe(now - decode_started)
        self._count(state, OUTCOME_OK)

    def _record_slo(self, state: _Request, results: Mapping[str, str]) -> None:
        if not state.mirror:  # a copy answers no user: no SLO outcome, or the autoscaler would count it twice
            self.metrics.record_slo(state.labels[0], state.labels[2], results)

    def _judge_whole(self, state: _Request, payload: bytes) -> None:
        """SLO results of a whole (not streamed) answer. Its first token is not seen by the client before the
        end, so TTFT is the prefill leg's answer (the first token exists then; only the KV transfer and one
        decode step are left) and TPOT the decode time after it over ``usage.completion_tokens`` − 1 (slightly
        high: it includes the transfer). Without a usage count, TPOT is not judged."""
        now = time.perf_counter()
        first = state.prefill_done if state.prefill_done is not None else now
        try:
            output = usage_count(json.loads(payload), "completion_tokens")
        except ValueError:
            output = None
        results = judge_request(
            state.prompt_tokens, ttft_s=first - state.started, output_tokens=output or 0, decode_s=now - first
        )
        if output is None:
            results.pop(SLO_TPOT, None)
        self._record_slo(state, results)

    def _finish_error(
        self,
        state: _Request,
        outcome: str,
        message: str,
        status: int,
        code: str | None = None,
        *,
        failure: str = RESULT_ERROR,
        upstream: bytes = b"",
    ) -> web.Response:
        """Answer the client with an error the pool caused: counted as the request's outcome and SLO result.

        ``upstream`` is the engine's own error body: its message goes to the log (an operator needs the engine's
        reason to tell an overloaded engine from a failed KV transfer), not to the client (it may name internal
        addresses)."""
        said = upstream_message(upstream)
        log.log(
            logging.INFO if state.mirror else logging.WARNING,
            "request %s on %s: %s%s",
            state.request_id,
            state.labels[1],
            message,
            f" (engine: {said})" if said else "",
        )
        self._count(state, outcome)
        self._record_slo(state, judge_request(state.prompt_tokens, failure=failure))
        return errors.error_response(message, status=status, code=code, headers=self._headers(state))

    def _relay_error(
        self, state: _Request, status: int, payload: bytes, outcome: str = OUTCOME_PREFILL_ERROR
    ) -> web.Response:
        """An engine's 4xx (the client's mistake, e.g. a prompt over max-model-len) goes to the client as is."""
        self._count(state, outcome)
        try:
            json.loads(payload)
        except ValueError:
            return errors.error_response(
                payload.decode("utf-8", "replace")[:500], status=status, headers=self._headers(state)
            )
        return web.Response(status=status, body=payload, content_type="application/json", headers=self._headers(state))


def _serves(table: RoutingTable, model: str | None) -> bool:
    return table.served_model_name is None or model is None or table.served_model_name == model


def _failure(exc: BaseException) -> str:
    """The SLO result of a leg's exception: a timeout, or an error."""
    return RESULT_TIMEOUT if isinstance(exc, TimeoutError) else RESULT_ERROR


UPSTREAM_MESSAGE_CHARS = 300
"""How much of an engine's error message a log line carries."""


def upstream_message(payload: bytes) -> str:
    """An engine's error body as one short printable line: vLLM's ``{"error": {"message": …}}`` (or a bare
    ``{"message": …}``) when it is JSON, else the text itself; at most :data:`UPSTREAM_MESSAGE_CHARS` characters.
    Example: ``b'{"error": {"message": "KV transfer failed", "code": 500}}'`` → ``KV transfer failed``."""
    text = payload.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        inner = body.get("error")
        found = inner.get("message") if isinstance(inner, dict) else body.get("message", inner)
        if isinstance(found, str):
            text = found
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= UPSTREAM_MESSAGE_CHARS else line[: UPSTREAM_MESSAGE_CHARS - 1] + "…"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _abort(task: asyncio.Future[aiohttp.ClientResponse]) -> None:
    """Cancel a decode leg; if it already has a response, close its connection (vLLM aborts on disconnect)."""
    if not task.done():
        task.cancel()
    try:
        response = await task
    except (asyncio.CancelledError, aiohttp.ClientError, TimeoutError):
        return
    response.close()
