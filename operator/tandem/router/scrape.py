"""Engine-metric scraping for admission: what each pair's engines say about their load.

vLLM never answers 429, so a pair is full by the table's admission limits; the router's own in-flight
counts see only this replica's requests. Every ``interval`` the scraper reads ``GET /metrics`` of each
engine instance of every serving pair (concurrently, at most :data:`SCRAPE_CONCURRENCY` at once, each
bounded by ``timeout``), keeps three vLLM gauges per instance (names from :mod:`tandem.routing`) and
publishes, per pool, the engine view of each pair as a :class:`~tandem.routing.PairLoad`:

- ``in_flight`` = Σ ``num_requests_running`` over the pair's instances (prefill and decode: a request is
  counted where it is; a handover counted twice for a moment errs towards full),
- ``queued`` = Σ ``num_requests_waiting`` over its instances,
- ``kv_utilization_percent`` = max ``kv_cache_usage_perc`` × 100 over its instances (one full instance
  is enough to stall the pair: a full prefill cannot hold new KV until decode pulls it).

Engines running data parallel report one series per ``engine`` label: running and waiting are summed
over them, KV usage is the max.

**Freshness.** Only instances scraped successfully within ``stale_after`` (``stale_intervals`` ×
``interval``) count. A pair with no fresh instance has no engine view, so admission falls back to the
router's own counts; a view not recomputed within ``stale_after`` (the loop itself stalled) is dropped
the same way. ``tandem_router_engine_scrape_age_seconds`` shows each instance's age (+Inf: never scraped).

**Off the request path.** The loop runs as its own task; a request only reads :meth:`EngineScraper.view`,
an immutable snapshot replaced once per round (one assignment, so the health thread reading it for
``/metrics`` never sees half a round).

Must not: decide admission (that is :func:`tandem.routing.select`; :mod:`.admission` combines this view
with the router's own counts), or block the loop on a slow engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp

from tandem import enginemetrics as em
from tandem.router.tables import TableStore
from tandem.routing import (
    PairLoad,
    PairState,
)

log = logging.getLogger(__name__)

DEFAULT_SCRAPE_INTERVAL_S: Final = 1.0
"""Seconds between rounds: admission reacts to other replicas' load within about one interval, and 100
pairs x 2 instances cost the engines 200 small renders a second (vLLM's own /metrics)."""
DEFAULT_SCRAPE_TIMEOUT_S: Final = 0.5
"""Per-instance bound: below the interval, so a round never overlaps the next."""
DEFAULT_STALE_INTERVALS: Final = 3
"""A sample older than this many intervals is not used (two missed rounds are tolerated)."""
SCRAPE_CONCURRENCY: Final = 32
"""Scrapes in flight at once: bounds sockets and the loop's burst of parsing per round."""

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"

SCRAPE_ERROR_TIMEOUT = "Timeout"
SCRAPE_ERROR_CONNECT = "ConnectError"
SCRAPE_ERROR_STATUS = "HttpStatus"
SCRAPE_ERROR_NO_METRICS = "NoMetrics"

_WANTED: Final = (em.RUNNING, em.WAITING, em.KV_USAGE)


@dataclass(frozen=True)
class EngineSample:
    """One instance's scraped gauges (sums over data-parallel engines; KV usage 0-1, the max)."""

    running: float
    waiting: float
    kv_usage: float


class NoEngineMetrics(ValueError):
    """The page has none of the gauges admission needs (not a vLLM engine, or an incompatible version)."""


def parse_engine_metrics(text: str) -> EngineSample:
    """The admission gauges of a Prometheus text page; :class:`NoEngineMetrics` when all three are absent.

    Reads only lines starting with the three names (a name must end at ``{`` or a space, so
    ``vllm:num_requests_waiting_by_reason`` is not ``vllm:num_requests_waiting``); NaN and non-finite values
    are ignored. Example (vLLM 0.32, ``/work/shared/reference``): ``vllm:num_requests_running{engine="0",
    model_name="tiny"} 3.0`` → running 3.
    """
    running = waiting = kv = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith(em.PREFIX):
            continue
        for name in _WANTED:
            if not line.startswith(name):
                continue
            rest = line[len(name) :]
            if not rest or rest[0] not in "{ ":
                continue
            value_part = rest[rest.rindex("}") + 1 :] if rest[0] == "{" and "}" in rest else rest
            fields = value_part.split()
            if not fields:
                continue
            try:
                value = float(fields[0])
            except ValueError:
                continue
            if not math.isfinite(value):
                continue
            seen = True
            if name == em.RUNNING:
                running += value
            elif name == em.WAITING:
                waiting += value
            else:
                kv = max(kv, value)
    if not seen:
        raise NoEngineMetrics("no vLLM admission gauges on the metrics page")
    return EngineSample(running, waiting, kv)


@dataclass(frozen=True)
class Target:
    """One engine instance to scrape and where it belongs."""

    address: str
    pool: str
    pair: str
    role: str
    pod: str


def targets_of(store: TableStore) -> tuple[Target, ...]:
    """Instances with an address of every serving pair of every live table (warming and draining pairs
    get no new requests, so their load decides nothing)."""
    out: list[Target] = []
    for loaded in store.snapshot:
        table = loaded.table
        pool = f"{table.namespace}/{table.pool}"
        for pair in table.pairs:
            if pair.state is not PairState.SERVING:
                continue
            for role, endpoints in ((ROLE_PREFILL, pair.prefill), (ROLE_DECODE, pair.decode)):
                for endpoint in endpoints:
                    if endpoint.address is not None:
                        out.append(Target(endpoint.address, pool, pair.id, role, endpoint.pod))
    return tuple(out)


def pair_loads(
    targets: tuple[Target, ...], samples: Mapping[str, tuple[float, EngineSample]], now: float, stale_after: float
) -> dict[str, dict[str, PairLoad]]:
    """``pool → pair id → PairLoad`` from the fresh samples (rules in the module docstring); pairs without
    a fresh instance are absent. Pure."""
    acc: dict[tuple[str, str], list[float]] = {}
    for target in targets:
        got = samples.get(target.address)
        if got is None or now - got[0] > stale_after:
            continue
        sample = got[1]
        entry = acc.setdefault((target.pool, target.pair), [0.0, 0.0, 0.0])
        entry[0] += sample.running
        entry[1] += sample.waiting
        entry[2] = max(entry[2], sample.kv_usage)
    out: dict[str, dict[str, PairLoad]] = {}
    for (pool, pair), (running, waiting, kv) in acc.items():
        out.setdefault(pool, {})[pair] = PairLoad(
            in_flight=round(running), queued=round(waiting), kv_utilization_percent=100.0 * kv
        )
    return out


@dataclass(frozen=True)
class EngineView:
    """What one round published: the per-pool pair loads and when they were computed."""

    at: float
    loads: Mapping[str, Mapping[str, PairLoad]]
    targets: tuple[Target, ...]
    samples: Mapping[str, tuple[float, EngineSample]]


_EMPTY = EngineView(at=-math.inf, loads={}, targets=(), samples={})

ErrorListener = Callable[[Target, str], None]


class EngineScraper:
    """Scrapes the engines of the live tables' serving pairs and publishes an :class:`EngineView`."""

    def __init__(
        self,
        store: TableStore,
        *,
        interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
        timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S,
        stale_intervals: int = DEFAULT_STALE_INTERVALS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_intervals * interval_s
        self.clock = clock
        self.published: EngineView = _EMPTY
        """The last round's view (replaced, never mutated)."""
        self.error_listeners: list[ErrorListener] = []
        self._session: aiohttp.ClientSession | None = None

    def view(self, pool: str) -> Mapping[str, PairLoad]:
        """``pair id → PairLoad`` of ``pool`` (``namespace/pool``) as the engines report it; empty when the
        view is stale (no round completed within ``stale_after``) or no instance of the pool is fresh."""
        published = self.published
        if self.clock() - published.at > self.stale_after_s:
            return {}
        return published.loads.get(pool, {})

    def ages(self) -> Iterator[tuple[Target, float]]:
        """(instance, seconds since its last good scrape; +Inf if never) for the last round's targets."""
        published = self.published
        now = self.clock()
        for target in published.targets:
            got = published.samples.get(target.address)
            yield target, (math.inf if got is None else max(0.0, now - got[0]))

    async def scrape_once(self) -> None:
        """One round over the current targets; publishes a new view when done."""
        targets = targets_of(self.store)
        previous = self.published.samples
        session = self._open_session()
        semaphore = asyncio.Semaphore(SCRAPE_CONCURRENCY)
        unique = {t.address: t for t in targets}
        results = await asyncio.gather(*(self._scrape(session, semaphore, t) for t in unique.values()))
        samples = {a: previous[a] for a in unique if a in previous}  # keep old samples; freshness decides
        for address, sample in zip(unique, results, strict=True):
            if sample is not None:
                samples[address] = sample
        now = self.clock()
        self.published = EngineView(
            at=now, loads=pair_loads(targets, samples, now, self.stale_after_s), targets=targets, samples=samples
        )

    async def _scrape(
        self, session: aiohttp.ClientSession, semaphore: asyncio.Semaphore, target: Target
    ) -> tuple[float, EngineSample] | None:
        reason: str
        async with semaphore:
            try:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with session.get(f"http://{target.address}/metrics", timeout=timeout) as resp:
                    if resp.status != 200:
                        reason = SCRAPE_ERROR_STATUS
                    else:
                        text = await resp.text()
                        try:
                            return self.clock(), parse_engine_metrics(text)
                        except NoEngineMetrics:
                            reason = SCRAPE_ERROR_NO_METRICS
            except TimeoutError:
                reason = SCRAPE_ERROR_TIMEOUT
            except (aiohttp.ClientError, OSError):
                reason = SCRAPE_ERROR_CONNECT
        log.debug("engine scrape of %s (%s %s) failed: %s", target.address, target.pool, target.pair, reason)
        for listener in self.error_listeners:
            listener(target, reason)
        return None

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=SCRAPE_CONCURRENCY, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def run(self) -> None:
        """Rounds every ``interval`` until cancelled (the first round is the caller's :meth:`scrape_once`)."""
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    await self.scrape_once()
                except Exception:  # a bug in one round must not end admission by engine metrics for good
                    log.exception("engine scrape round failed")
        finally:
            await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
