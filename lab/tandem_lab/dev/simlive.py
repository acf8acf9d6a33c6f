"""``tandem sim live``: trace-driven vLLM metrics for a cluster's engine pods (the I/O around ``sim.live``).

What it owns: polling a cluster (kubectl, one call per namespace and poll) for the routing-table
ConfigMaps (``<pool>-routing``) and the Ready engine pods, feeding :class:`tandem_lab.sim.live.LiveFleet`
(which replays a trace through those tables in real time), serving each pod's metrics on loopback
(``/metrics/<namespace>/<pod>``, one port, vLLM's names, labels and buckets in prometheus_client's
text format), registering every pod with Prometheus through file_sd with the series label contract
(``namespace``, ``pool``, ``revision``, ``role``, ``pair``, ``pod``; ``PrometheusServer.add_target``,
as ``tandem_lab.dev.podmetrics`` does), a control API, and progress output.

It replaces the test exporter + ``PodMetricsBridge`` pair where real request dynamics matter:
:class:`LiveMetrics` has the same shape (``set_revision(rev, **behaviour)``, ``start()``, ``stop()``)
plus ``set_rate``. Behaviour fields: ``prefill_multiplier`` (alias ``ttft_multiplier``),
``tpot_multiplier``, ``error_rate``.

Control API (HTTP, JSON): ``GET /metrics/<ns>/<pod>``; ``GET /-/pods``; ``GET /-/stats``;
``POST /-/revisions/<rev>`` with ``{"ttft_multiplier": 1.5, "error_rate": 0.05}``; ``POST /-/load`` with
``{"rate": 80}``; ``GET /-/healthy``.

What it must not do: bind anything but loopback, or write to the cluster (it only reads). Dev tooling:
the operator never imports it. The model's thread safety is this module's job: one lock around the
fleet model, held by the ticker, the poller and the HTTP handlers, never across a kubectl call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from tandem.api.labels import (
    COMPONENT_ENGINE,
    COMPONENT_ROUTING,
    LABEL_COMPONENT,
    LABEL_PAIR,
    LABEL_POOL,
    LABEL_REVISION,
    LABEL_ROLE,
)
from tandem.routing import CONFIGMAP_KEY, RoutingTable
from tandem_lab.dev.exporter import TargetRegistry
from tandem_lab.dev.kube import Kubectl, KubectlError
from tandem_lab.sim.config import SimParams, load_params
from tandem_lab.sim.live import (
    DECODE_TIME,
    E2E,
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    GENERATION_TOKENS,
    GENERATION_TOKENS_HIST,
    ITL,
    KV_USAGE,
    PREFILL_TIME,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_HIST,
    QUEUE_TIME,
    REQUEST_SUCCESS,
    RUNNING,
    TPOT,
    TTFT,
    WAITING,
    Arrival,
    Behaviour,
    FleetStats,
    LiveFleet,
    LiveOptions,
    LivePod,
    PodMetrics,
    live_agentic_workload,
)
from tandem_lab.sim.workload import Workload

LOOPBACK: Final = "127.0.0.1"
TRACES: Final = ("conversation", "synthetic", "agentic")
DEFAULT_KEY_BLOCKS: Final = {"conversation": 2, "synthetic": 1, "agentic": 1}
"""Block 0 of the conversation trace is shared by every request: its key needs two blocks."""

_HELP: Final[Mapping[str, str]] = {
    TTFT: "Histogram of time to first token in seconds.",
    ITL: "Histogram of inter-token latency in seconds.",
    TPOT: "Histogram of time_per_output_token_seconds per request.",
    E2E: "Histogram of e2e request latency in seconds.",
    QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    PROMPT_TOKENS_HIST: "Number of prefill tokens processed.",
    GENERATION_TOKENS_HIST: "Number of generation tokens processed.",
    PROMPT_TOKENS: "Number of prefill tokens processed.",
    GENERATION_TOKENS: "Number of generation tokens processed.",
    PREFIX_QUERIES: "Prefix cache queries, in terms of number of queried tokens.",
    PREFIX_HITS: "Prefix cache hits, in terms of number of cached tokens.",
    EXTERNAL_QUERIES: "External prefix cache queries (KV connector), in terms of number of queried tokens.",
    EXTERNAL_HITS: "External prefix cache hits (KV connector), in terms of number of cached tokens.",
    REQUEST_SUCCESS: "Count of successfully processed requests.",
    RUNNING: "Number of requests in model execution batches.",
    WAITING: "Number of requests waiting to be processed.",
    KV_USAGE: "KV-cache usage. 1 means 100 percent usage.",
}


def say(message: str) -> None:
    print(f"[sim live {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- workloads -----------------------------------------------------------------------------------


def load_workload(trace: str, params: SimParams, seed: int, trace_file: Path | None = None) -> Workload:
    """The workload to replay: a Mooncake trace from ``../shared/traces`` (or ``trace_file``), or a
    generated hour of agentic sessions (flat envelope, 128 k contexts). The conversation trace's 3 s
    ticks are spread by seeded uniform offsets, as the offline simulator does (``traces.jitter_ticks``)."""
    import numpy as np  # noqa: PLC0415

    from tandem_lab.sim.traces import CONVERSATION, SYNTHETIC, jitter_ticks, load_trace, trace_path  # noqa: PLC0415

    if trace_file is not None:
        return load_trace(trace_file)
    if trace == "conversation":
        raw = load_trace(trace_path(CONVERSATION), name="conversation")
        return jitter_ticks(raw, np.random.default_rng(seed))
    if trace == "synthetic":
        return load_trace(trace_path(SYNTHETIC), name="synthetic")
    if trace == "agentic":
        return live_agentic_workload(params, seed)
    raise ValueError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")


# --- observing the cluster -----------------------------------------------------------------------


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def parse_objects(namespace: str, items: Sequence[Mapping[str, Any]]) -> tuple[list[RoutingTable], list[LivePod]]:
    """Routing tables and Ready engine pods from a ``kubectl get pods,configmaps`` list (pure).

    A table that does not parse is skipped (the previous one is kept by nobody: a broken table routes
    nothing, as a router that refuses it would).
    """
    tables: list[RoutingTable] = []
    pods: list[LivePod] = []
    for obj in items:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if obj.get("kind") == "ConfigMap":
            if labels.get(LABEL_COMPONENT) != COMPONENT_ROUTING:
                continue
            raw = (obj.get("data") or {}).get(CONFIGMAP_KEY)
            if raw is None:
                continue
            with contextlib.suppress(ValidationError, ValueError):
                tables.append(RoutingTable.from_json(raw))
        elif obj.get("kind") == "Pod":
            role = labels.get(LABEL_ROLE)
            if labels.get(LABEL_COMPONENT) != COMPONENT_ENGINE or role not in ("prefill", "decode"):
                continue
            if meta.get("deletionTimestamp") or not _ready(obj):
                continue
            pods.append(
                LivePod(
                    namespace=namespace,
                    name=meta["name"],
                    pool=labels.get(LABEL_POOL, ""),
                    revision=labels.get(LABEL_REVISION, ""),
                    role=role,
                    pair=labels.get(LABEL_PAIR, ""),
                    uid=meta.get("uid", ""),
                )
            )
    return tables, pods


def observe_cluster(kube: Kubectl, namespaces: Sequence[str]) -> tuple[list[RoutingTable], list[LivePod]]:
    """One kubectl call per namespace: the routing-table ConfigMaps and the engine pods."""
    selector = f"{LABEL_COMPONENT} in ({COMPONENT_ENGINE},{COMPONENT_ROUTING})"
    tables: list[RoutingTable] = []
    pods: list[LivePod] = []
    for ns in namespaces:
        data = kube.json("get", "pods,configmaps", "-n", ns, "-l", selector, timeout_s=20)
        t, p = parse_objects(ns, data.get("items") or [])
        tables += t
        pods += p
    return tables, pods


# --- exposition ----------------------------------------------------------------------------------


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def render(metrics: PodMetrics, model_name: str) -> bytes:
    """One pod's ``/metrics`` body in the Prometheus text format, as vLLM serves it (labels
    ``model_name``, ``engine``; counters with ``_total``; cumulative ``le`` buckets)."""
    names = ["model_name", "engine"]
    base = [model_name, "0"]
    families: list[Metric] = []
    for name, hist in metrics.histograms.items():
        fam = HistogramMetricFamily(name, _HELP.get(name, name), labels=names)
        buckets = [("+Inf" if math.isinf(b) else repr(float(b)), float(c)) for b, c in hist.cumulative()]
        fam.add_metric(base, buckets=buckets, sum_value=hist.total)
        families.append(fam)
    success = CounterMetricFamily(REQUEST_SUCCESS, _HELP[REQUEST_SUCCESS], labels=[*names, "finished_reason"])
    for reason, count in metrics.success.items():
        success.add_metric([*base, reason], float(count))
    families.append(success)
    for name, value in metrics.counters.items():
        counter = CounterMetricFamily(name, _HELP.get(name, name), labels=names)
        counter.add_metric(base, float(value))
        families.append(counter)
    for name, value in metrics.gauges.items():
        gauge = GaugeMetricFamily(name, _HELP.get(name, name), labels=names)
        gauge.add_metric(base, float(value))
        families.append(gauge)
    return generate_latest(_Families(families))


class FileSdRegistry:
    """A :class:`~tandem_lab.dev.exporter.TargetRegistry` that keeps every group in one file_sd JSON file
    (for a Prometheus whose targets directory this process does not manage)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._groups: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def add_target(self, name: str, targets: Sequence[str], labels: Mapping[str, str] | None = None) -> Path:
        with self._lock:
            self._groups[name] = {"targets": list(targets), "labels": dict(labels or {})}
            self._write()
        return self.path

    def remove_target(self, name: str) -> None:
        with self._lock:
            if self._groups.pop(name, None) is not None:
                self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(list(self._groups.values()), indent=1))
        tmp.replace(self.path)


# --- the service ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Rates between two :class:`FleetStats` snapshots (what a progress line shows)."""

    seconds: float
    arrivals_per_s: float
    completed_per_s: float
    rejects_per_s: float
    fast_rejects_per_s: float
    unmatched: int
    failed: int
    hit_ratio: float

    @classmethod
    def between(cls, a: FleetStats, b: FleetStats) -> Window:
        dt = max(1e-9, b.now - a.now)
        dq = b.prefix_queries - a.prefix_queries
        return cls(
            seconds=dt,
            arrivals_per_s=(b.arrivals - a.arrivals) / dt,
            completed_per_s=(b.completed - a.completed) / dt,
            rejects_per_s=(b.rejected - a.rejected) / dt,
            fast_rejects_per_s=(b.fast_rejects - a.fast_rejects) / dt,
            unmatched=b.unmatched - a.unmatched,
            failed=b.failed - a.failed,
            hit_ratio=(b.prefix_hits - a.prefix_hits) / dq if dq > 0 else math.nan,
        )


def progress_line(w: Window, stats: FleetStats, cpu_percent: float, max_tick_ms: float) -> str:
    pools = ", ".join(
        f"{p.namespace}/{p.pool} {p.candidates}/{p.pairs} pairs in-flight {p.in_flight} "
        f"(prefill {p.in_prefill}, decode {p.in_decode})"
        for p in stats.pools
    )
    hit = "-" if math.isnan(w.hit_ratio) else f"{100 * w.hit_ratio:.0f}%"
    return (
        f"{w.arrivals_per_s:6.1f} req/s (offered {stats.rate:g}), done {w.completed_per_s:.1f}/s, hit {hit}, "
        f"rejects {w.rejects_per_s:.1f}/s, fast rejects {w.fast_rejects_per_s:.1f}/s"
        f"{f', unmatched {w.unmatched}' if w.unmatched else ''}{f', failed {w.failed}' if w.failed else ''} | "
        f"{pools or 'no routing tables yet'} | cpu avg {cpu_percent:.0f}%, slowest tick {max_tick_ms:.1f} ms"
    )


class LiveMetrics:
    """Live mode as a service: poll the cluster, advance the model in real time, serve and register.

    Drop-in for the demo and the cluster tests in place of ``Exporter`` + ``PodMetricsBridge``::

        live = LiveMetrics(kube, ["fleet"], prometheus, workload=load_workload("conversation", params, 1),
                           options=LiveOptions(rate=8, capacity_scale=4), prefix="demo").start()
        live.set_revision(bad_revision, ttft_multiplier=1.5)
        live.set_rate(20)
        live.stop()
    """

    def __init__(
        self,
        kube: Kubectl,
        namespaces: Sequence[str],
        registry: TargetRegistry | None,
        *,
        workload: Workload,
        options: LiveOptions,
        params: SimParams | None = None,
        prefix: str = "simlive",
        model_name: str = "tandem-sim",
        poll_interval_s: float = 1.0,
        tick_s: float = 0.1,
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[str], None] | None = None,
        progress_every_s: float = 5.0,
    ) -> None:
        self.kube = kube
        self.namespaces = list(namespaces)
        self.registry = registry
        self.prefix = prefix
        self.model_name = model_name
        self.poll_interval_s = poll_interval_s
        self.tick_s = tick_s
        self.port = port
        self.progress = progress
        self.progress_every_s = progress_every_s
        # Arrivals start with the first poll (start()): until then no table exists to route them by.
        self._rate = options.rate
        self.fleet = LiveFleet(params or load_params(), workload, replace(options, rate=0.0), clock)
        self._lock = threading.Lock()
        self._registered: dict[tuple[str, str], LivePod] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: ThreadingHTTPServer | None = None
        self.poll_errors = 0
        self.last_poll_error = ""
        self.max_tick_s = 0.0
        self._first = self.stats()
        self._last = self._first
        self._cpu0 = time.process_time()
        self._wall0 = time.monotonic()
        self.table_listeners: list[Callable[[Sequence[RoutingTable]], None]] = []
        """Called after every poll with the tables read (the data plane starts its engine doubles)."""

    # -- control (the exporter's shape) --

    def set_revision(self, revision: str, **changes: Any) -> Behaviour:
        """Change a revision's behaviour from now on: ``prefill_multiplier`` (alias ``ttft_multiplier``),
        ``tpot_multiplier``, ``error_rate``."""
        with self._lock:
            return self.fleet.set_behaviour(revision, **changes)

    def set_rate(self, rate: float) -> None:
        """Offer ``rate`` requests/s from now on (from the first poll when not started yet)."""
        with self._lock:
            if self._server is not None:
                self.fleet.set_rate(rate)
            self._rate = rate

    def stats(self) -> FleetStats:
        with self._lock:
            return self.fleet.stats()

    def pods(self) -> list[LivePod]:
        with self._lock:
            return self.fleet.pods()

    def behaviours(self) -> dict[str, Behaviour]:
        with self._lock:
            return self.fleet.behaviours()

    # -- external routing (LiveOptions.external_routing; tandem_lab.dev.livefront) --

    def take_arrivals(self) -> list[tuple[int, Arrival]]:
        """The arrivals due by now that a client must send through the router, oldest first."""
        with self._lock:
            self.fleet.advance()
            box = self.fleet.outbox
            taken = list(box)
            box.clear()
            return taken

    def enter_prefill(
        self, sid: int, namespace: str, pod: str, on_done: Callable[[bool], None], *, mirror: bool = False
    ) -> str | None:
        with self._lock:
            return self.fleet.enter_prefill(sid, namespace, pod, on_done, mirror=mirror)

    def enter_decode(
        self,
        sid: int,
        namespace: str,
        pod: str,
        on_first: Callable[[float], None],
        on_done: Callable[[int | None], None],
        *,
        mirror: bool = False,
    ) -> str | None:
        with self._lock:
            return self.fleet.enter_decode(sid, namespace, pod, on_first, on_done, mirror=mirror)

    def release(self, sid: int, *, rejected: bool) -> None:
        with self._lock:
            self.fleet.release(sid, rejected=rejected)

    # -- cluster --

    def sync(self) -> int:
        """One poll: read the cluster, update the model and the scrape targets; returns the pod count."""
        tables, pods = observe_cluster(self.kube, self.namespaces)
        with self._lock:
            self.fleet.sync(tables, pods)
        for listener in self.table_listeners:
            listener(tables)
        wanted = {(p.namespace, p.name): p for p in pods}
        if self.registry is not None and self._server is not None:
            for key, pod in list(self._registered.items()):
                if wanted.get(key) != pod:
                    self.registry.remove_target(self._target_name(pod))
                    del self._registered[key]
            for key, pod in wanted.items():
                if key not in self._registered:
                    labels = {**pod.target_labels(), "__metrics_path__": self.metrics_path(pod)}
                    self.registry.add_target(self._target_name(pod), [self.address], labels)
                    self._registered[key] = pod
        return len(wanted)

    def _target_name(self, pod: LivePod) -> str:
        return f"{self.prefix}-{pod.namespace}-{pod.name}"

    def metrics_path(self, pod: LivePod) -> str:
        return f"/metrics/{pod.namespace}/{pod.name}"

    # -- serving --

    def render(self, namespace: str, name: str) -> tuple[int, bytes]:
        with self._lock:
            metrics = self.fleet.pod_metrics(namespace, name)
        if metrics is None:
            return 404, b"unknown pod\n"
        return 200, render(metrics, self.model_name)

    @property
    def address(self) -> str:
        if self._server is None:
            raise RuntimeError("live metrics are not started")
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> LiveMetrics:
        """Serve on 127.0.0.1, poll once, then poll and tick from daemon threads."""
        if self._server is not None:
            return self
        server = ThreadingHTTPServer((LOOPBACK, self.port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._stop.clear()
        self._threads = [
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="simlive-http"),
            threading.Thread(target=self._poll_loop, name="simlive-poll"),
            threading.Thread(target=self._tick_loop, name="simlive-tick"),
        ]
        try:
            self.sync()
        except KubectlError as exc:
            self.poll_errors += 1
            self.last_poll_error = str(exc)
        with self._lock:
            self.fleet.set_rate(self._rate)
        self._first = self._last = self.stats()
        self._cpu0, self._wall0 = time.process_time(), time.monotonic()
        for thread in self._threads:
            thread.daemon = True
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []
        self._server = None
        if self.registry is not None:
            for pod in self._registered.values():
                self.registry.remove_target(self._target_name(pod))
        self._registered.clear()

    def __enter__(self) -> LiveMetrics:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.sync()
            except (KubectlError, json.JSONDecodeError) as exc:
                self.poll_errors += 1
                self.last_poll_error = str(exc)

    def _tick_loop(self) -> None:
        next_progress = time.monotonic() + self.progress_every_s
        while not self._stop.wait(self.tick_s):
            started = time.perf_counter()
            with self._lock:
                self.fleet.advance()
            self.max_tick_s = max(self.max_tick_s, time.perf_counter() - started)
            if self.progress is not None and time.monotonic() >= next_progress:
                next_progress += self.progress_every_s
                self.progress(self.progress_line())

    def cpu_percent(self) -> float:
        """Process CPU (every thread: model, HTTP, kubectl's parent side) per wall time since start."""
        wall = time.monotonic() - self._wall0
        return 100.0 * (time.process_time() - self._cpu0) / wall if wall > 0 else 0.0

    def progress_line(self) -> str:
        stats = self.stats()
        window = Window.between(self._last, stats)
        self._last = stats
        line = progress_line(window, stats, self.cpu_percent(), 1000 * self.max_tick_s)
        self.max_tick_s = 0.0
        if self.poll_errors:
            line += f" | poll errors {self.poll_errors} (last: {self.last_poll_error[:120]})"
        return line

    def summary(self) -> dict[str, Any]:
        stats = self.stats()
        window = Window.between(self._first, stats)
        return {
            "seconds": round(window.seconds, 1),
            "arrivals": stats.arrivals,
            "arrivals_per_s": round(window.arrivals_per_s, 2),
            "completed": stats.completed,
            "routed": stats.routed,
            "queued_walks": stats.queued_walks,
            "rejected": stats.rejected,
            "fast_rejects": stats.fast_rejects,
            "unmatched": stats.unmatched,
            "failed": stats.failed,
            "errors": stats.errors,
            "hit_ratio": None if math.isnan(stats.hit_ratio) else round(stats.hit_ratio, 4),
            "walk_lengths": dict(stats.walk_lengths),
            "cpu_percent": round(self.cpu_percent(), 1),
            "pools": [asdict(p) for p in stats.pools],
        }


def _handler_for(live: LiveMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "tandem-sim-live"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode(), "application/json")

        def do_GET(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            if path.startswith("/metrics/"):
                ns, _, name = path.removeprefix("/metrics/").partition("/")
                status, body = live.render(ns, name)
                self._send(status, body, CONTENT_TYPE_LATEST if status == 200 else "text/plain; charset=utf-8")
            elif path == "/-/healthy":
                self._send(200, b"ok\n")
            elif path == "/-/pods":
                behaviours = live.behaviours()
                pods = [
                    {**asdict(p), "behaviour": asdict(behaviours.get(p.revision, Behaviour()))} for p in live.pods()
                ]
                self._json(200, pods)
            elif path == "/-/stats":
                self._json(200, live.summary())
            else:
                self._send(404, b"not found\n")

        def do_POST(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(min(length, 65536)) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                if path.startswith("/-/revisions/"):
                    new = live.set_revision(path.removeprefix("/-/revisions/"), **body)
                    self._json(200, asdict(new))
                elif path == "/-/load":
                    if set(body) != {"rate"}:
                        raise ValueError('the body must be {"rate": <requests per second>}')
                    live.set_rate(float(body["rate"]))
                    self._json(200, {"rate": live.stats().rate})
                else:
                    self._send(404, b"not found\n")
            except (ValueError, TypeError) as exc:
                self._send(400, f"{exc}\n".encode())

    return Handler


# --- command line --------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``live`` under ``tandem sim`` (creating ``sim`` if ``tandem_lab.sim.cli`` did not)."""
    sim = subparsers.choices.get("sim")
    if sim is None:
        sim = subparsers.add_parser("sim", help="fleet simulator")
    sub = next((a for a in sim._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        sub = sim.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    live = sub.add_parser(
        "live",
        help="replay a trace through a cluster's routing tables; serve vLLM metrics per engine pod",
        description=(__doc__ or "").split("\n\n")[0],
    )
    target = live.add_mutually_exclusive_group()
    target.add_argument("--cluster", help="a `tandem dev cluster` by name: its kubeconfig and Prometheus")
    target.add_argument("--prometheus-url", help="a Prometheus to register with (a dev cluster's, or use --file-sd)")
    live.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: the --cluster's)")
    live.add_argument("--namespace", "-n", action="append", required=True, help="namespace to watch (repeatable)")
    live.add_argument("--file-sd", type=Path, help="write every target into this one file_sd JSON file")
    live.add_argument("--trace", choices=TRACES, default="conversation", help="arrivals (default: conversation)")
    live.add_argument("--trace-file", type=Path, help="a Mooncake-format JSONL trace instead of --trace")
    live.add_argument("--rate", type=float, default=50.0, help="offered requests/s (default: 50)")
    live.add_argument("--speedup", type=float, default=1.0, help="trace time per wall second (default: 1)")
    live.add_argument(
        "--capacity-scale",
        type=float,
        default=1.0,
        help="instances compute this many times faster than the physics (default: 1)",
    )
    live.add_argument("--kv-capacity-tokens", type=float, help="KV capacity per instance, tokens (default: physics)")
    live.add_argument("--key-blocks", type=int, help="routing key blocks (default: 2 conversation, else 1)")
    live.add_argument("--images-share", type=float, default=0.0, help="share of requests with images (default: 0)")
    live.add_argument("--seed", type=int, default=1)
    live.add_argument("--params", type=Path, help="YAML deep-merged over the simulator's params.yaml")
    live.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1 (default: any free port)")
    live.add_argument("--poll-interval", type=float, default=1.0, help="seconds between cluster polls")
    live.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    live.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")
    live.add_argument("--model-name", default="tandem-sim", help="the model_name label")
    live.set_defaults(func=cmd_live)


def _resolve(args: argparse.Namespace) -> tuple[Kubectl, TargetRegistry | None, str]:
    from tandem_lab.dev import cluster as devcluster  # noqa: PLC0415
    from tandem_lab.dev.testenv import locate  # noqa: PLC0415

    registry: TargetRegistry | None = None
    where = ""
    if args.cluster:
        state = devcluster.load_state(args.cluster)
        if state is None:
            raise ValueError(f"no dev cluster named {args.cluster!r} (tandem dev cluster up --name {args.cluster})")
        kube = Kubectl(Path(state.kubectl), args.kubeconfig or Path(state.kubeconfig))
        registry = state.prometheus_server()
        where = f"Prometheus {state.prometheus_url}"
    else:
        if args.kubeconfig is None:
            raise ValueError("pass --cluster NAME or --kubeconfig PATH")
        kube = Kubectl(locate().kubectl, args.kubeconfig)
        if args.prometheus_url:
            url = args.prometheus_url.rstrip("/")
            state = next((s for s in devcluster.list_states() if s.prometheus_url == url), None)
            if state is not None:
                registry = state.prometheus_server()
                where = f"Prometheus {url} (dev cluster {state.name})"
    if args.file_sd is not None:
        registry = FileSdRegistry(args.file_sd)
        where = f"file_sd {args.file_sd}"
    elif args.prometheus_url and registry is None:
        raise ValueError(f"{args.prometheus_url} is not a dev cluster's Prometheus: pass --file-sd PATH")
    return kube, registry, where


def cmd_live(args: argparse.Namespace) -> int:
    try:
        kube, registry, where = _resolve(args)
        overrides = None
        if args.params is not None:
            import yaml  # noqa: PLC0415

            overrides = yaml.safe_load(args.params.read_text(encoding="utf-8"))
        params = load_params(overrides=overrides)
        workload = load_workload(args.trace, params, args.seed, args.trace_file)
        key_blocks = args.key_blocks or DEFAULT_KEY_BLOCKS.get(args.trace, 1)
        options = LiveOptions(
            rate=args.rate,
            speedup=args.speedup,
            seed=args.seed,
            key_blocks=key_blocks,
            images_share=args.images_share,
            kv_capacity_tokens=args.kv_capacity_tokens,
            capacity_scale=args.capacity_scale,
        ).validated()
    except (ValueError, OSError) as exc:
        print(f"tandem sim live: {exc}", file=sys.stderr)
        return 2
    live = LiveMetrics(
        kube,
        args.namespace,
        registry,
        workload=workload,
        options=options,
        params=params,
        model_name=args.model_name,
        poll_interval_s=args.poll_interval,
        port=args.port,
        progress=say,
        progress_every_s=args.progress_every,
    )
    native = len(workload) / max(workload.duration_s, 1e-9)
    live.start()
    say(
        f"replaying {workload.name} ({len(workload)} requests, {native:.2f} req/s native) at {options.rate:g} req/s, "
        f"speedup {options.speedup:g}, key blocks {key_blocks}; namespaces {', '.join(args.namespace)}; "
        f"metrics on {live.url}/metrics/<ns>/<pod>, control {live.url}/-/ ; targets: {where or 'not registered'}"
    )
    try:
        if args.duration > 0:
            time.sleep(args.duration)
        else:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
    say("summary " + json.dumps(live.summary(), sort_keys=True))
    return 0


__all__ = [
    "DEFAULT_KEY_BLOCKS",
    "TRACES",
    "FileSdRegistry",
    "LiveMetrics",
    "Window",
    "load_workload",
    "observe_cluster",
    "parse_objects",
    "progress_line",
    "register",
    "render",
]
