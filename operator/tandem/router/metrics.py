"""The router's Prometheus metrics and the listener that serves them with ``/health`` and ``/ready``.

Owns the metric names (``tandem_router_*``) and their labels: ``pool`` is ``namespace/pool``, ``pair`` the
pair id, ``revision`` the pair's revision. Outcomes and reject reasons are the constants below.

The health/metrics listener runs its own event loop in a daemon thread: a request storm that keeps the
main loop busy delays it only by the GIL's switch interval, never by the main loop's backlog, so liveness
and scrapes do not fail under load.

Must not: decide anything; it records.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tandem.router.scrape import EngineScraper, Target
from tandem.router.tables import TableStore

OUTCOME_OK = "ok"
OUTCOME_REJECTED = "rejected"
OUTCOME_PREFILL_ERROR = "prefill_error"
OUTCOME_DECODE_ERROR = "decode_error"
OUTCOME_STREAM_BROKEN = "stream_broken"
OUTCOME_CLIENT_GONE = "client_gone"
OUTCOME_NO_POOL = "no_pool"
OUTCOME_BAD_REQUEST = "bad_request"
MIRROR_FULL = "skipped_full"
"""A mirror copy not sent: the canary pair was full by the table's admission limits (copies never queue)."""
MIRROR_NOT_TAKEN = "not_taken"
"""A mirror copy the canary pair's prefill refused (429/503), could not be reached for, or timed out on."""

# Reject reasons: the algorithm's SkipReason values plus the prefill-leg failures that make the router walk.
REASON_PREFILL_429 = "Prefill429"
REASON_PREFILL_503 = "Prefill503"
REASON_PREFILL_CONNECT = "PrefillConnectError"
REASON_PREFILL_TIMEOUT = "PrefillTimeout"
REASON_NO_ADDRESS = "NoAddress"

# Why a client got the table's reject status (or 503): labels of tandem_router_client_rejects_total.
REJECT_ALL_FULL = "all_pairs_full"
REJECT_NO_SERVING_PAIR = "no_serving_pair"

SLO_METRIC: Final = "tandem_router_slo_requests"
"""Exposed as ``tandem_router_slo_requests_total`` (what ``tandem.core.scalemetrics.ROUTER_SLO_METRIC`` reads)."""

LEG_PREFILL = "prefill"
LEG_DECODE = "decode"

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
WALK_BUCKETS: Final = (1, 2, 3, 4, 6, 8, 16)


class _TableCollector(Collector):
    """Table fingerprint (info-style gauge) and age, read from the store at scrape time."""

    def __init__(self, store: TableStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "tandem_router_table_info",
            "Live routing table (value 1) and its fingerprint.",
            labels=["pool", "source", "fingerprint"],
        )
        age = GaugeMetricFamily(
            "tandem_router_table_age_seconds", "Seconds since the live table changed.", labels=["pool"]
        )
        now = self._clock()
        for loaded in self._store.snapshot:
            pool = f"{loaded.table.namespace}/{loaded.table.pool}"
            info.add_metric([pool, loaded.source, loaded.fingerprint], 1.0)
            age.add_metric([pool], max(0.0, now - loaded.loaded_at))
        yield info
        yield age


class _ScrapeCollector(Collector):
    """Seconds since each engine instance's last good scrape (+Inf: never), read at scrape time."""

    def __init__(self, scraper: EngineScraper) -> None:
        self._scraper = scraper

    def collect(self) -> Iterator[GaugeMetricFamily]:
        age = GaugeMetricFamily(
            "tandem_router_engine_scrape_age_seconds",
            "Seconds since the engine instance's metrics were last read (+Inf: never); older than the stale "
            "limit means admission uses the router's own counts for it.",
            labels=["pool", "pair", "role", "pod"],
        )
        for target, seconds in self._scraper.ages():
            age.add_metric([target.pool, target.pair, target.role, target.pod], seconds)
        yield age


class RouterMetrics:
    """All router metrics in one registry (one per router, so tests can run several)."""

    def __init__(self, store: TableStore, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tandem_router_requests", "Client requests by outcome.", ["pool", "pair", "revision", "outcome"], registry=r
        )
        self.ttft = Histogram(
            "tandem_router_ttft_seconds",
            "Time to the first decode byte relayed to the client.",
            ["pool", "pair", "revision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tandem_router_request_duration_seconds",
            "Client request time, arrival to last byte.",
            ["pool", "pair", "revision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.leg = Histogram(
            "tandem_router_leg_duration_seconds",
            "Prefill leg (to its response) and decode leg (to its last byte) time.",
            ["pool", "pair", "revision", "leg"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.walk = Histogram(
            "tandem_router_walk_length",
            "Pairs tried per routed or rejected request.",
            ["pool"],
            buckets=WALK_BUCKETS,
            registry=r,
        )
        self.rejects = Counter(
            "tandem_router_fast_rejects",
            "Pairs skipped during a walk, by reason.",
            ["pool", "pair", "reason"],
            registry=r,
        )
        self.client_rejects = Counter(
            "tandem_router_client_rejects",
            "Requests answered with the reject status, by reason (all_pairs_full, no_serving_pair).",
            ["pool", "reason"],
            registry=r,
        )
        self.scrape_errors = Counter(
            "tandem_router_engine_scrape_errors",
            "Failed engine /metrics reads by reason (Timeout, ConnectError, HttpStatus, NoMetrics).",
            ["pool", "pair", "pod", "reason"],
            registry=r,
        )
        self.slo = Counter(
            SLO_METRIC,
            "Requests by SLO (ttft, tpot) and result (met, missed, rejected, timeout, error): each judged against "
            "its own budget by prompt size (tandem.core.capacity.judge_request).",
            ["pool", "revision", "slo", "result"],
            registry=r,
        )
        self.mirrors = Counter(
            "tandem_router_mirror_requests",
            "Copies of client requests sent to a mirrored canary pair (setMirrorPairs), by outcome (ok, prefill_error, "
            "decode_error, skipped_full, not_taken). Their answers are discarded; they are not in requests_total.",
            ["pool", "pair", "revision", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge("tandem_router_in_flight", "Requests in flight per pair.", ["pool", "pair"], registry=r)
        self.table_offers = Counter(
            "tandem_router_table_offers",
            "Table loads by result (ok or a refusal reason).",
            ["source", "result"],
            registry=r,
        )
        self.source_errors = Counter(
            "tandem_router_table_source_errors",
            "Table source failures (watch expired, API errors) by origin (a namespace or file) and reason.",
            ["origin", "reason"],
            registry=r,
        )
        r.register(_TableCollector(store, clock))
        store.listeners.append(self._on_offer)
        store.error_listeners.append(self._on_source_error)

    def record_slo(self, pool: str, revision: str, results: Mapping[str, str]) -> None:
        """Count one request's SLO results (labels: pool and revision only, so the series stay bounded)."""
        for slo, result in results.items():
            self.slo.labels(pool, revision, slo, result).inc()

    def watch_scraper(self, scraper: EngineScraper) -> None:
        """Export ``scraper``'s instance ages and count its failures."""
        self.registry.register(_ScrapeCollector(scraper))
        scraper.error_listeners.append(self._on_scrape_error)

    def _on_scrape_error(self, target: Target, reason: str) -> None:
        self.scrape_errors.labels(target.pool, target.pair, target.pod, reason).inc()

    def _on_source_error(self, origin: str, reason: str) -> None:
        self.source_errors.labels(origin, reason).inc()

    def _on_offer(self, source: str, reason: str | None, _live: object) -> None:
        self.table_offers.labels(source, reason or "ok").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def build_health_app(metrics: RouterMetrics, store: TableStore) -> web.Application:
    """``/health`` (the process answers), ``/ready`` (a table is live) and ``/metrics``."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(_: web.Request) -> web.Response:
        n = len(store.snapshot)
        return web.json_response({"ready": n > 0, "tables": n}, status=200 if n else 503)

    async def render(_: web.Request) -> web.Response:
        body = metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", render)
    return app


class HealthListener:
    """Runs :func:`build_health_app` on its own event loop in a daemon thread."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = port
        self._thread = threading.Thread(target=self._main, name="tandem-router-health", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:
            self.port = int(address[1])
            break

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
