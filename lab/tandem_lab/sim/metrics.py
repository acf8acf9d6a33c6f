"""The observation path: what policies may see of the fleet — scraped metrics, late, over a window.

What it owns: :class:`Scrape` (one Prometheus scrape of every instance, aggregated per role and per
revision), :class:`ScrapeStore` (the time series) and :class:`Observation`, the only view of load a
scaling or rollout policy gets (benchmarks.md §3.4: scrape interval, rate window, lag; equal for
every policy). Fleet *state* (instances per role and lifecycle state) is not a metric: a controller
reads it from the API server, so it is exact.

Metric names follow vLLM (benchmarks.md §9); each :class:`Observation` field names its source:

- gauges (sum over ready + draining instances of a role): ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``; mean ``vllm:kv_cache_usage_perc`` over decode instances;
- counters, as ``rate()`` over the window: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:request_success_total``, prefill busy seconds (a GPU-utilisation exporter), the router's
  requests and errors, ``vllm:prefix_cache_{queries,hits}_total`` (local) and the external
  (Mooncake) pair;
- histograms with vLLM's bucket bounds, quantiles by linear interpolation inside a bucket as
  ``histogram_quantile`` does (so a 16.7 ms threshold is read coarsely, as in production):
  router-side TTFT and per-request TPOT (``vllm:request_time_per_output_token_seconds``), per revision.

A policy deciding at time ``now`` sees the newest scrape taken at or before ``now − lag`` and rates
between it and the scrape one window earlier. ``None`` means no data (not enough scrapes yet, or no
requests in the window) — a policy must treat it as "unknown", never as zero.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tandem import enginemetrics as em

TTFT_BUCKETS: tuple[float, ...] = em.TTFT_BUCKETS
"""vLLM ``vllm:time_to_first_token_seconds`` bucket upper bounds (+Inf implied)."""
TPOT_BUCKETS: tuple[float, ...] = em.TPOT_BUCKETS
"""vLLM per-token/per-request TPOT bucket upper bounds (+Inf implied)."""

PREFILL = 0
DECODE = 1
ROLE_NAMES = ("prefill", "decode")

COUNTERS = (
    "requests",  # router: requests answered (any outcome)
    "errors",  # router: rejected, failed or engine error
    "success",  # vllm:request_success_total
    "prompt_tokens",  # vllm:prompt_tokens_total
    "generation_tokens",  # vllm:generation_tokens_total
    "prefill_busy_s",  # prefill GPU busy seconds
    "decode_busy_s",
    "local_queries",  # vllm:prefix_cache_queries_total (tokens)
    "local_hits",  # vllm:prefix_cache_hits_total (tokens)
    "external_queries",
    "external_hits",
    "isl_sum",  # sum of prompt lengths of finished requests (vllm:request_prompt_tokens_sum)
    "osl_sum",  # sum of output lengths of finished requests
    "finished",  # count of finished requests (histogram _count)
    "ttft_sum",  # vllm:time_to_first_token_seconds_sum (router-side)
    "ttft_count",
    "tpot_sum",  # vllm:request_time_per_output_token_seconds_sum
    "tpot_count",
    "slo_outcomes",  # router: requests with an SLO outcome (finished, rejected, failed, timed out)
    "ttft_met",  # router: of those, within their TTFT budget by prompt size
    "ttft_service_bound",  # router: missed, but the request's own prefill leg already exceeded its budget
    "tpot_met",  # router: of those, within the TPOT target
    "unserved",  # router: of those, rejected because every pair walked was full (tandem_router_slo_requests_total
    # result="rejected"; the simulator has no leg timeouts before the horizon)
)


def bucket_index(buckets: tuple[float, ...], value: float) -> int:
    """Index of the first bucket whose upper bound is ≥ value (len(buckets) = +Inf)."""
    return bisect.bisect_left(buckets, value)


def histogram_quantile(q: float, buckets: tuple[float, ...], counts: npt.NDArray[np.float64]) -> float | None:
    """Prometheus ``histogram_quantile`` over non-cumulative bucket ``counts`` (last = +Inf)."""
    total = float(counts.sum())
    if total <= 0:
        return None
    rank = q * total
    cum = 0.0
    values: list[float] = counts.tolist()
    for i, c in enumerate(values):
        if cum + c >= rank and c > 0:
            if i >= len(buckets):
                return buckets[-1]
            lo = 0.0 if i == 0 else buckets[i - 1]
            return lo + (buckets[i] - lo) * (rank - cum) / c
        cum += c
    return buckets[-1]


PAIR_COLUMNS = 7
"""``RevisionSeries.pairs`` columns."""


@dataclass
class RevisionSeries:
    """Cumulative per-revision counters and histograms (router-side)."""

    requests: float = 0.0
    errors: float = 0.0
    ttft: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(len(TTFT_BUCKETS) + 1))
    tpot: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(len(TPOT_BUCKETS) + 1))
    finished: float = 0.0
    """``vllm:request_success_total`` (every finished reason, errors included)."""
    engine_errors: float = 0.0
    """``vllm:request_success_total{finished_reason="error"}``."""
    local_queries: float = 0.0
    """``vllm:prefix_cache_queries_total`` (tokens, prefill instances of the revision)."""
    local_hits: float = 0.0
    """``vllm:prefix_cache_hits_total``."""
    ttft_sum: float = 0.0
    """``vllm:time_to_first_token_seconds_sum`` (the histogram's ``_count`` is ``ttft.sum()``)."""
    tpot_sum: float = 0.0
    """``vllm:request_time_per_output_token_seconds_sum``."""
    external_hits: float = 0.0
    """``vllm:external_prefix_cache_hits_total``: tokens the shared tier (Mooncake, via the KV connector) supplied
    to the revision's prefill instances after a local miss — fetched, not computed."""
    pairs: dict[str, list[float]] = field(default_factory=dict)
    """Per pair (the engine pods' ``pair`` label): ``[ttft _count, ttft _sum, tpot _count, tpot _sum, prefix-cache
    queries, prefix-cache hits, external hits]``, what ``sum by (pair)`` of the histograms' ``_count``/``_sum`` and
    of the prefill instances' cache counters reads (the latency gates' pairs and their uncached work, design
    note 009)."""

    def add_latency(self, pair: str, ttft: float, tpot: float | None) -> None:
        """Count one finished request's TTFT (and TPOT, when it has one) on the revision and on its pair."""
        self.ttft[bisect.bisect_left(TTFT_BUCKETS, ttft)] += 1
        self.ttft_sum += ttft
        per_pair = self.pairs.setdefault(pair, [0.0] * PAIR_COLUMNS)
        per_pair[0] += 1
        per_pair[1] += ttft
        if tpot is not None:
            self.tpot[bisect.bisect_left(TPOT_BUCKETS, tpot)] += 1
            self.tpot_sum += tpot
            per_pair[2] += 1
            per_pair[3] += tpot

    def add_prefix(self, pair: str, queries: float, hits: float, external: float = 0.0) -> None:
        """Count one prefill's prefix-cache lookup (tokens: looked up, found locally, then found in the shared
        tier) on the revision and on its pair."""
        self.local_queries += queries
        self.local_hits += hits
        self.external_hits += external
        per_pair = self.pairs.setdefault(pair, [0.0] * PAIR_COLUMNS)
        per_pair[4] += queries
        per_pair[5] += hits
        per_pair[6] += external

    def copy(self) -> RevisionSeries:
        return RevisionSeries(
            self.requests,
            self.errors,
            self.ttft.copy(),
            self.tpot.copy(),
            self.finished,
            self.engine_errors,
            self.local_queries,
            self.local_hits,
            self.ttft_sum,
            self.tpot_sum,
            self.external_hits,
            {pair: values.copy() for pair, values in self.pairs.items()},
        )


@dataclass(frozen=True, slots=True)
class InstanceGauge:
    """One instance's gauges in one scrape (target labels ``pair`` and ``role``)."""

    pair: str
    role: int
    running: float
    """``vllm:num_requests_running``."""
    waiting: float
    """``vllm:num_requests_waiting``."""
    kv_usage: float
    """``vllm:kv_cache_usage_perc`` (0–1)."""


@dataclass
class Scrape:
    """One scrape: role gauges, cumulative counters, per-revision histograms, per-instance gauges."""

    t: float
    ready: tuple[int, int]
    running: tuple[float, float]
    waiting: tuple[float, float]
    kv_usage_mean: float
    counters: dict[str, float]
    revisions: dict[str, RevisionSeries]
    instances: tuple[InstanceGauge, ...] = ()
    """Gauges of the instances of serving pairs (kept for recent scrapes only, to bound memory)."""
    serving_pairs: int = 0
    serving_instances: tuple[int, int] = (0, 0)


class ScrapeStore:
    """Scrapes in time order; lookups by time are binary searches. Per-instance detail is dropped from
    scrapes older than ``keep_detail_s`` (policies only read the newest visible scrape)."""

    def __init__(self, keep_detail_s: float = 3600.0) -> None:
        self.scrapes: list[Scrape] = []
        self._times: list[float] = []
        self.keep_detail_s = keep_detail_s
        self._pruned = 0

    def add(self, scrape: Scrape) -> None:
        self.scrapes.append(scrape)
        self._times.append(scrape.t)
        limit = scrape.t - self.keep_detail_s
        while self._pruned < len(self.scrapes) and self.scrapes[self._pruned].t < limit:
            old = self.scrapes[self._pruned]
            old.instances = ()
            old.revisions = {}
            self._pruned += 1

    def at_or_before(self, t: float) -> Scrape | None:
        i = bisect.bisect_right(self._times, t + 1e-9) - 1
        return self.scrapes[i] if i >= 0 else None


@dataclass(frozen=True)
class RoleState:
    """Instances of one role by lifecycle state, from the API server (exact, not scraped)."""

    desired: int
    pending: int
    loading: int
    ready: int
    draining: int

    @property
    def current(self) -> int:
        """Instances counted by a ReplicaSet/HPA as current replicas (not draining)."""
        return self.pending + self.loading + self.ready


@dataclass(frozen=True)
class RevisionView:
    """Scraped per-revision signals over the window (canary analysis)."""

    requests_rate: float
    error_rate: float | None
    ttft_p90: float | None
    ttft_p95: float | None
    tpot_p90: float | None
    requests_in_window: float


@dataclass(frozen=True)
class Observation:
    """Everything a policy may know at ``now``: fleet state (exact) and scraped metrics (late, windowed)."""

    now: float
    prefill: RoleState
    decode: RoleState
    pairs: int
    """Pair groups (not draining) when the fleet runs pairs; 0 otherwise."""
    scrape_time: float | None
    """Time of the newest visible scrape (now − lag or older); None before the first one."""
    ready_scraped: tuple[int, int]
    running: tuple[float, float] | None
    """Sum of ``vllm:num_requests_running`` per role."""
    waiting: tuple[float, float] | None
    """Sum of ``vllm:num_requests_waiting`` per role."""
    kv_usage: float | None
    """Mean ``vllm:kv_cache_usage_perc`` of decode instances (0–1)."""
    prefill_busy: float | None
    """Mean busy fraction of prefill instances over the window."""
    request_rate: float | None
    prompt_token_rate: float | None
    generation_token_rate: float | None
    isl_mean: float | None
    osl_mean: float | None
    ttft_p90: float | None
    ttft_p95: float | None
    tpot_p90: float | None
    tpot_mean: float | None
    ttft_mean: float | None
    error_rate: float | None
    local_hit_ratio: float | None
    external_hit_ratio: float | None
    revisions: dict[str, RevisionView]
    instances: tuple[InstanceGauge, ...] = ()
    """Per-instance gauges of serving pairs in the visible scrape."""
    serving_pairs_scraped: int = 0
    """Serving pair groups when the visible scrape was taken (the capacity behind the metrics)."""
    serving_instances_scraped: tuple[int, int] = (0, 0)
    shape_rollout: bool = False
    """Groups off the target P:D remain and are being replaced (``tandem.core.reshape``): the operator chooses no
    new P:D meanwhile."""
    group_shapes: tuple[tuple[int, int], ...] = ()
    """The live groups' (prefill, decode) in the order a scale-down keeps them; () while all have the target."""
    ttft_attainment: float | None = None
    """Router: share of requests with an outcome in the window that met their TTFT budget (misses: rejects,
    failures, timeouts and late first tokens), leaving out service-bound misses (the request's own prefill
    leg took longer than its budget: a long uncached prompt no added capacity would speed up)."""
    tpot_attainment: float | None = None
    """Router: same for the TPOT target."""
    cache_hit_ratio: float | None = None
    """(local + external hit tokens) / prompt tokens queried: the share of prompt tokens not computed."""
    unserved_share: float | None = None
    """Router: share of requests with an outcome in the window that no pair had room for (rejected), as the
    operator's ``unserved_share`` query reads it (work planning counts it as queueing for its correction)."""

    def role(self, role: int) -> RoleState:
        return self.prefill if role == PREFILL else self.decode


def _rate(new: float, old: float, dt: float) -> float:
    return (new - old) / dt if dt > 0 else 0.0


def _div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def observe(
    store: ScrapeStore, now: float, lag_s: float, window_s: float, prefill: RoleState, decode: RoleState, pairs: int
) -> Observation:
    """Build the :class:`Observation` a policy sees at ``now`` (see module docstring)."""
    new = store.at_or_before(now - lag_s)
    if new is None:
        return Observation(
            now,
            prefill,
            decode,
            pairs,
            None,
            (0, 0),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            {},
        )
    old = store.at_or_before(new.t - window_s)
    dt = new.t - old.t if old is not None else 0.0
    c_new = new.counters
    c_old = old.counters if old is not None else None

    def rate(name: str) -> float | None:
        if c_old is None or dt <= 0:
            return None
        return _rate(c_new[name], c_old[name], dt)

    def delta(name: str) -> float:
        return c_new[name] - (c_old[name] if c_old is not None else 0.0)

    ttft_counts = np.zeros(len(TTFT_BUCKETS) + 1)
    tpot_counts = np.zeros(len(TPOT_BUCKETS) + 1)
    revisions: dict[str, RevisionView] = {}
    for rev, series in new.revisions.items():
        before = old.revisions.get(rev) if old is not None else None
        d_ttft = series.ttft - (before.ttft if before is not None else 0.0)
        d_tpot = series.tpot - (before.tpot if before is not None else 0.0)
        d_req = series.requests - (before.requests if before is not None else 0.0)
        d_err = series.errors - (before.errors if before is not None else 0.0)
        ttft_counts += d_ttft
        tpot_counts += d_tpot
        revisions[rev] = RevisionView(
            requests_rate=d_req / dt if dt > 0 else 0.0,
            error_rate=_div(d_err, d_req),
            ttft_p90=histogram_quantile(0.90, TTFT_BUCKETS, d_ttft),
            ttft_p95=histogram_quantile(0.95, TTFT_BUCKETS, d_ttft),
            tpot_p90=histogram_quantile(0.90, TPOT_BUCKETS, d_tpot),
            requests_in_window=d_req,
        )
    busy = rate("prefill_busy_s")
    ready_p = new.ready[PREFILL]
    finished = delta("finished")
    return Observation(
        now=now,
        prefill=prefill,
        decode=decode,
        pairs=pairs,
        scrape_time=new.t,
        ready_scraped=new.ready,
        running=new.running,
        waiting=new.waiting,
        kv_usage=new.kv_usage_mean if new.ready[DECODE] > 0 else None,
        prefill_busy=(busy / ready_p) if busy is not None and ready_p > 0 else None,
        request_rate=rate("requests"),
        prompt_token_rate=rate("prompt_tokens"),
        generation_token_rate=rate("generation_tokens"),
        isl_mean=_div(delta("isl_sum"), finished),
        osl_mean=_div(delta("osl_sum"), finished),
        ttft_p90=histogram_quantile(0.90, TTFT_BUCKETS, ttft_counts),
        ttft_p95=histogram_quantile(0.95, TTFT_BUCKETS, ttft_counts),
        tpot_p90=histogram_quantile(0.90, TPOT_BUCKETS, tpot_counts),
        tpot_mean=_div(delta("tpot_sum"), delta("tpot_count")),
        ttft_mean=_div(delta("ttft_sum"), delta("ttft_count")),
        error_rate=_div(delta("errors"), delta("requests")),
        local_hit_ratio=_div(delta("local_hits"), delta("local_queries")),
        external_hit_ratio=_div(delta("external_hits"), delta("external_queries")),
        revisions=revisions,
        instances=new.instances,
        serving_pairs_scraped=new.serving_pairs,
        serving_instances_scraped=new.serving_instances,
        ttft_attainment=_div(delta("ttft_met"), delta("slo_outcomes") - delta("ttft_service_bound"))
        if "slo_outcomes" in c_new
        else None,
        tpot_attainment=_div(delta("tpot_met"), delta("slo_outcomes")) if "slo_outcomes" in c_new else None,
        cache_hit_ratio=_div(delta("local_hits") + delta("external_hits"), delta("local_queries")),
        unserved_share=_div(delta("unserved"), delta("slo_outcomes")) if "unserved" in c_new else None,
    )
