"""A test metrics exporter: vLLM-named Prometheus metrics for simulated engine pods, on loopback.

What it owns: a seeded simulation of request traffic per pod (requests, TTFT, TPOT, errors, prefix
cache, load gauges), its exposition in vLLM's names, labels and bucket bounds (prometheus_client's text
format, as vLLM itself serves it), one HTTP port with a path per pod (``/metrics/<pod>``), the
file_sd target groups that attach the series label contract (``tandem.core.promql``) as target
labels, and a control API to change a revision's (or one pod's) behaviour while it runs, so a test can
make a canary slow, failing, idle, NaN or unscraped.

What it must not do: bind anything but loopback, talk to Kubernetes, or sleep: time comes from an
injected clock (``time.monotonic`` by default).

Invariants:

- **Deterministic given the seed** and the sequence of clock readings and control calls: time is cut
  into ticks of ``tick_s``; tick ``k`` of pod ``p`` draws from ``Random(f"{seed}/{p}/{k}")``. Ticks are
  simulated lazily when a pod is scraped, and every control call first brings all pods up to the
  current tick, so a change never rewrites the past.
- Counters only grow; histograms are cumulative with vLLM's bounds (TTFT ``…0.25, 0.5, 0.75, 1.0,
  2.5…``; TPOT/ITL ``0.01, 0.025, 0.05, 0.075, 0.1…``); every ``finished_reason`` series exists from the
  start (vLLM creates them all), so an error rate of zero reads 0, not "no series".

Per request (median × multiplier × lognormal(σ)): decode TTFT ``ttft_s`` (prefill TTFT is 0.8 × that),
TPOT ``tpot_s`` on decode only (a prefill instance emits one token), ``error_rate`` of requests end
with ``finished_reason="error"``. Zero ``request_rate`` leaves every histogram flat, so quantiles and
ratios read NaN (0/0), as on an idle vLLM.

Modes per pod: ``normal``; ``nan`` (every sample value NaN); ``empty`` (HTTP 200, no series: the target
is up but has nothing); ``down`` (HTTP 503: the scrape fails and Prometheus marks the series stale).

Control API (HTTP, JSON): ``GET /metrics/<pod>``; ``GET /-/pods``; ``POST /-/revisions/<rev>`` and
``POST /-/pods/<pod>`` with ``{"ttft_multiplier": 1.5, "error_rate": 0.05, "mode": "nan", ...}``
(fields of :class:`Behaviour`); ``GET /-/healthy``.

Example::

    exp = Exporter(seed=7)
    exp.add_pods(make_pair_pods(namespace="ml", pool="speed", revision="r2", pairs=2))
    exp.set_revision("r2", ttft_multiplier=1.5)
    exp.start()
    for group in exp.file_sd_groups():   # or exp.register(prometheus_server)
        ...
"""

from __future__ import annotations

import argparse
import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, Literal, Protocol
from urllib.parse import unquote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tandem import enginemetrics as em

Role = Literal["prefill", "decode"]
Mode = Literal["normal", "nan", "empty", "down"]
MODES: Final = ("normal", "nan", "empty", "down")

# vLLM's vocabulary is tandem.enginemetrics's (re-exported: tests and the podmetrics bridge import these).
TTFT_BUCKETS: Final = em.TTFT_BUCKETS
TPOT_BUCKETS: Final = em.TPOT_BUCKETS
LATENCY_BUCKETS: Final = em.LATENCY_BUCKETS
FINISHED_REASONS: Final = em.FINISHED_REASONS
LOOPBACK: Final = "127.0.0.1"


# --- model ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnginePod:
    """One simulated engine instance and its target labels (the series label contract)."""

    name: str
    namespace: str
    pool: str
    revision: str
    role: Role
    pair: str

    def target_labels(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "pool": self.pool,
            "revision": self.revision,
            "role": self.role,
            "pair": self.pair,
            "pod": self.name,
        }


def make_pair_pods(*, namespace: str, pool: str, revision: str, pairs: int, start: int = 0) -> list[EnginePod]:
    """1P+1D pods for ``pairs`` pair groups, named like Tandem names them (``speed-p0-decode-0``)."""
    out: list[EnginePod] = []
    for i in range(start, start + pairs):
        pair = f"{pool}-p{i}"
        for role in ("prefill", "decode"):
            out.append(EnginePod(f"{pair}-{role}-0", namespace, pool, revision, role, pair))
    return out


@dataclass(frozen=True)
class Behaviour:
    """How a revision's (or a pod's) engines behave. Medians are in seconds."""

    request_rate: float = 10.0
    """Finished requests per second per pod (0 = idle: quantiles and ratios read NaN)."""
    ttft_s: float = 0.35
    ttft_multiplier: float = 1.0
    tpot_s: float = 0.012
    tpot_multiplier: float = 1.0
    error_rate: float = 0.0
    """Share of requests that end with finished_reason="error" (0-1)."""
    kv_usage: float = 0.4
    """vllm:kv_cache_usage_perc (0-1)."""
    prefix_hit_ratio: float = 0.6
    """Share of prompt tokens found in the local prefix cache (prefill)."""
    shared_hit_ratio: float = 0.0
    """Share of prompt tokens a prefill instance fetched from the shared tier after a local miss
    (``vllm:external_prefix_cache_hits``); at most ``1 − prefix_hit_ratio``."""
    connector: bool = True
    """Whether the engine exports the KV connector's ``external_prefix_cache_*`` counters at all."""
    waiting: float = 0.0
    prompt_tokens: int = 2000
    output_tokens: int = 200
    sigma: float = 0.1
    """Spread (lognormal σ) of latencies around their medians."""
    mode: Mode = "normal"

    def validated(self) -> Behaviour:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        for name in ("request_rate", "ttft_s", "ttft_multiplier", "tpot_s", "tpot_multiplier", "waiting", "sigma"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number ≥ 0")
        for name in ("error_rate", "kv_usage", "prefix_hit_ratio", "shared_hit_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not 0 <= v <= 1:
                raise ValueError(f"{name} must be within 0..1")
        if self.prefix_hit_ratio + self.shared_hit_ratio > 1:
            raise ValueError("prefix_hit_ratio + shared_hit_ratio must be ≤ 1")
        if self.prompt_tokens < 1 or self.output_tokens < 2:
            raise ValueError("prompt_tokens must be ≥ 1 and output_tokens ≥ 2")
        return self


BEHAVIOUR_FIELDS: Final = frozenset(f.name for f in fields(Behaviour))


def _check_changes(changes: Mapping[str, Any]) -> None:
    unknown = set(changes) - BEHAVIOUR_FIELDS
    if unknown:
        raise ValueError(f"unknown behaviour fields {sorted(unknown)}; known: {sorted(BEHAVIOUR_FIELDS)}")


class _Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket (not cumulative); last is +Inf
        self.total = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += weight
                break
        else:
            self.counts[-1] += weight
        self.total += value * weight

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += count
            out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(acc)))
        return out


@dataclass
class _PodState:
    pod: EnginePod
    tick: int = 0  # next tick to simulate
    ttft: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS))
    tpot: _Histogram = field(default_factory=lambda: _Histogram(TPOT_BUCKETS))
    itl: _Histogram = field(default_factory=lambda: _Histogram(TPOT_BUCKETS))
    e2e: _Histogram = field(default_factory=lambda: _Histogram(LATENCY_BUCKETS))
    success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0


# --- exporter -------------------------------------------------------------------------------------


class TargetRegistry(Protocol):
    """Anything that registers file_sd targets (``tandem_lab.dev.prometheus.PrometheusServer``)."""

    def add_target(self, name: str, targets: Sequence[str], labels: Mapping[str, str] | None = None) -> Path: ...

    def remove_target(self, name: str) -> None: ...


class Exporter:
    """Simulated engine pods behind one loopback HTTP port (``/metrics/<pod>``)."""

    def __init__(
        self,
        *,
        seed: int = 0,
        model_name: str = "tandem-test",
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.5,
        default: Behaviour | None = None,
    ) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be > 0")
        self.seed = seed
        self.model_name = model_name
        self.tick_s = tick_s
        self._clock = clock
        self._t0 = clock()
        self._default = (default or Behaviour()).validated()
        self._revisions: dict[str, Behaviour] = {}
        self._pod_overrides: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, _PodState] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- pods and behaviour --

    def add_pods(self, pods: Iterable[EnginePod]) -> None:
        with self._lock:
            now_tick = self._now_tick()
            for pod in pods:
                if "/" in pod.name or not pod.name:
                    raise ValueError(f"bad pod name {pod.name!r}")
                self._pods[pod.name] = _PodState(pod, tick=now_tick)

    def remove_pod(self, name: str) -> None:
        with self._lock:
            self._pods.pop(name, None)
            self._pod_overrides.pop(name, None)

    @property
    def pods(self) -> list[EnginePod]:
        with self._lock:
            return [s.pod for s in self._pods.values()]

    def behaviour(self, pod_name: str) -> Behaviour:
        """The behaviour in force for one pod: default ← revision ← pod overrides."""
        with self._lock:
            state = self._pods[pod_name]
            base = self._revisions.get(state.pod.revision, self._default)
            return replace(base, **self._pod_overrides.get(pod_name, {})).validated()

    def set_revision(self, revision: str, **changes: Any) -> Behaviour:
        """Change a revision's behaviour from now on (e.g. ``ttft_multiplier=1.5``, ``error_rate=0.05``)."""
        _check_changes(changes)
        with self._lock:
            new = replace(self._revisions.get(revision, self._default), **changes).validated()
            self._advance_all()
            self._revisions[revision] = new
            return new

    def set_pod(self, pod_name: str, **changes: Any) -> Behaviour:
        """Override one pod's behaviour from now on (e.g. ``mode="nan"``)."""
        _check_changes(changes)
        with self._lock:
            if pod_name not in self._pods:
                raise KeyError(pod_name)
            merged = {**self._pod_overrides.get(pod_name, {}), **changes}
            base = self._revisions.get(self._pods[pod_name].pod.revision, self._default)
            replace(base, **merged).validated()
            self._advance_all()
            self._pod_overrides[pod_name] = merged
            return self.behaviour(pod_name)

    # -- simulation --

    def _now_tick(self) -> int:
        return int((self._clock() - self._t0) // self.tick_s)

    def _advance_all(self) -> None:
        target = self._now_tick()
        for name in self._pods:
            self._advance(name, target)

    def _advance(self, name: str, target: int) -> None:
        state = self._pods[name]
        if state.tick >= target:
            return
        b = self.behaviour(name)
        for k in range(state.tick, target):
            if b.mode in ("normal", "nan"):
                self._simulate_tick(state, b, k)
        state.tick = target

    def _simulate_tick(self, s: _PodState, b: Behaviour, k: int) -> None:
        rng = random.Random(f"{self.seed}/{s.pod.name}/{k}")
        expected = b.request_rate * self.tick_s
        n = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
        decode = s.pod.role == "decode"
        for _ in range(n):
            ttft = b.ttft_s * b.ttft_multiplier * math.exp(rng.gauss(0.0, b.sigma)) * (1.0 if decode else 0.8)
            s.ttft.observe(ttft)
            s.prompt_tokens += b.prompt_tokens
            if decode:
                out = b.output_tokens
                tpot = b.tpot_s * b.tpot_multiplier * math.exp(rng.gauss(0.0, b.sigma))
                s.tpot.observe(tpot)
                s.itl.observe(tpot, weight=out - 1)
                s.e2e.observe(ttft + tpot * (out - 1))
                s.generation_tokens += out
                s.external_queries += b.prompt_tokens
                s.external_hits += b.prompt_tokens  # the KV arrives from the prefill instance
            else:
                s.e2e.observe(ttft)
                s.generation_tokens += 1
                s.prefix_queries += b.prompt_tokens
                local = round(b.prompt_tokens * b.prefix_hit_ratio)
                s.prefix_hits += local
                s.external_queries += b.prompt_tokens - local
                s.external_hits += round(b.prompt_tokens * b.shared_hit_ratio)
            if rng.random() < b.error_rate:
                s.success["error"] += 1
            else:
                s.success["length" if rng.random() < 0.1 else "stop"] += 1

    # -- exposition --

    def render(self, pod_name: str) -> tuple[int, bytes]:
        """(HTTP status, body) of one pod's ``/metrics`` now."""
        with self._lock:
            if pod_name not in self._pods:
                return 404, b"unknown pod\n"
            self._advance(pod_name, self._now_tick())
            b = self.behaviour(pod_name)
            if b.mode == "down":
                return 503, b"engine down\n"
            if b.mode == "empty":
                return 200, b""
            families = list(self._families(self._pods[pod_name], b))
        return 200, generate_latest(_Families(families))

    def _families(self, s: _PodState, b: Behaviour) -> Iterator[Metric]:
        nan = b.mode == "nan"
        base = [self.model_name, "0"]
        names = ["model_name", "engine"]

        def num(v: float) -> float:
            return math.nan if nan else float(v)

        def hist(name: str, doc: str, h: _Histogram) -> HistogramMetricFamily:
            fam = HistogramMetricFamily(name, doc, labels=names)
            buckets = [(le, num(c)) for le, c in h.cumulative()]
            fam.add_metric(base, buckets=buckets, sum_value=num(h.total))
            return fam

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=names)
            fam.add_metric(base, num(v))
            return fam

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=names)
            fam.add_metric(base, num(v))
            return fam

        yield hist(em.TTFT, "Histogram of time to first token in seconds.", s.ttft)
        yield hist(em.ITL, "Histogram of inter-token latency in seconds.", s.itl)
        yield hist(
            em.TPOT,
            "Histogram of time_per_output_token_seconds per request.",
            s.tpot,
        )
        yield hist(em.E2E, "Histogram of e2e request latency in seconds.", s.e2e)
        success = CounterMetricFamily(
            em.REQUEST_SUCCESS, "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason in FINISHED_REASONS:
            success.add_metric([*base, reason], num(s.success[reason]))
        yield success
        yield counter(em.PROMPT_TOKENS, "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter(em.GENERATION_TOKENS, "Number of generation tokens processed.", s.generation_tokens)
        yield counter(
            em.PREFIX_QUERIES, "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries
        )
        yield counter(em.PREFIX_HITS, "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits)
        if b.connector:
            yield counter(em.EXTERNAL_QUERIES, "External prefix cache queries (KV connector).", s.external_queries)
            yield counter(em.EXTERNAL_HITS, "External prefix cache hits (KV connector).", s.external_hits)
        in_flight = b.request_rate * (b.ttft_s * b.ttft_multiplier + b.tpot_s * b.tpot_multiplier * b.output_tokens)
        yield gauge(em.RUNNING, "Number of requests in model execution batches.", round(in_flight))
        yield gauge(em.WAITING, "Number of requests waiting to be processed.", b.waiting)
        yield gauge(em.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", b.kv_usage)

    # -- serving --

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` once started."""
        if self._server is None:
            raise RuntimeError("the exporter is not started")
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def metrics_path(self, pod_name: str) -> str:
        return f"/metrics/{pod_name}"

    def start(self, port: int = 0) -> None:
        """Serve on 127.0.0.1 (``port`` 0 = any free port) from a daemon thread."""
        if self._server is not None:
            return
        server = ThreadingHTTPServer((LOOPBACK, port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="tandem-exporter", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Exporter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- discovery --

    def target(self, pod_name: str) -> tuple[list[str], dict[str, str]]:
        """(targets, labels) of one pod for a file_sd group: the label contract plus ``__metrics_path__``."""
        with self._lock:
            pod = self._pods[pod_name].pod
        return [self.address], {**pod.target_labels(), "__metrics_path__": self.metrics_path(pod_name)}

    def file_sd_groups(self) -> list[dict[str, Any]]:
        """One file_sd group per pod (write them as one JSON list, or register each)."""
        groups = []
        for pod in self.pods:
            targets, labels = self.target(pod.name)
            groups.append({"targets": targets, "labels": labels})
        return groups

    def write_file_sd(self, path: Path) -> Path:
        """Write every pod's group to ``path`` atomically (temp file + rename)."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.file_sd_groups(), indent=1))
        tmp.replace(path)
        return path

    def register(self, registry: TargetRegistry, prefix: str = "exporter") -> list[str]:
        """Register every pod with ``registry.add_target`` (one file per pod); returns the names."""
        names = []
        for pod in self.pods:
            targets, labels = self.target(pod.name)
            name = f"{prefix}-{pod.name}"
            registry.add_target(name, targets, labels)
            names.append(name)
        return names


class _Families:
    """A one-shot collector for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _handler_for(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "tandem-exporter"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            if path.startswith("/metrics/"):
                status, body = exporter.render(path.removeprefix("/metrics/"))
                self._send(status, body, CONTENT_TYPE_LATEST if status == 200 else "text/plain; charset=utf-8")
            elif path == "/-/healthy":
                self._send(200, b"ok\n")
            elif path == "/-/pods":
                pods = [{**asdict(p), "behaviour": asdict(exporter.behaviour(p.name))} for p in exporter.pods]
                self._send(200, json.dumps(pods).encode(), "application/json")
            else:
                self._send(404, b"not found\n")

        def do_POST(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            try:
                length = int(self.headers.get("Content-Length") or 0)
                changes = json.loads(self.rfile.read(min(length, 65536)) or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("the body must be a JSON object")
                if path.startswith("/-/revisions/"):
                    new = exporter.set_revision(path.removeprefix("/-/revisions/"), **changes)
                elif path.startswith("/-/pods/"):
                    new = exporter.set_pod(path.removeprefix("/-/pods/"), **changes)
                else:
                    self._send(404, b"not found\n")
                    return
            except KeyError as exc:
                self._send(404, f"unknown pod {exc}\n".encode())
                return
            except (ValueError, TypeError) as exc:
                self._send(400, f"{exc}\n".encode())
                return
            self._send(200, json.dumps(asdict(new)).encode(), "application/json")

    return Handler


# --- command line ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tandem_lab.dev.exporter --pool speed --revision r1:2 --revision r2:1 --file-sd out.json``."""
    parser = argparse.ArgumentParser(
        prog="tandem_lab.dev.exporter", description=__doc__.split("\n")[0] if __doc__ else ""
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--pool", required=True)
    parser.add_argument("--revision", action="append", required=True, help="REVISION:PAIRS, repeatable")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--file-sd", type=Path, help="write the file_sd groups here")
    args = parser.parse_args(argv)
    exporter = Exporter(seed=args.seed)
    start = 0
    for item in args.revision:
        revision, _, pairs = item.partition(":")
        n = int(pairs or 1)
        exporter.add_pods(
            make_pair_pods(namespace=args.namespace, pool=args.pool, revision=revision, pairs=n, start=start)
        )
        start += n
    exporter.start(args.port)
    if args.file_sd:
        exporter.write_file_sd(args.file_sd)
    print(f"serving {len(exporter.pods)} pods on {exporter.url} (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        exporter.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "BEHAVIOUR_FIELDS",
    "FINISHED_REASONS",
    "LATENCY_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "Behaviour",
    "EnginePod",
    "Exporter",
    "TargetRegistry",
    "make_pair_pods",
]
