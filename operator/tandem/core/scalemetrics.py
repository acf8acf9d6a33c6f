"""Autoscaling inputs from Prometheus: the queries, and their results turned into a `MetricsSnapshot`.

What it owns: the PromQL the autoscaler reads (vLLM metric names, the series label contract of
`tandem.core.promql`: `namespace`, `pool`, `revision`, `role`, `pair`, `pod`) and the pure parsing of
query results. Only instances of *serving* pairs count, and each must report exactly one finite sample;
anything else is missing, so the autoscaler sees partial data (scale-up allowed, scale-down never)
or no data (hold). Like the gates, NaN, ±Inf, stale and multi-series values are never a number.

Staleness comes from the samples' own timestamps (an instant query stamps its answer with the evaluation
time): each query has a freshness query (:func:`freshness_queries`), per pod for the gauges
(``max by (pod) (timestamp(gauge{...}))``) and `tandem.core.promql.freshness_query` for the pool-wide
rates. A value whose inputs were last scraped more than ``max_age_s`` ago (2 × the scrape interval), or
whose freshness is unknown, is missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tandem import enginemetrics as em
from tandem.core.autoscale import InstanceSample, MetricsSnapshot, PoolSample
from tandem.core.promql import (
    QueryResult,
    QueryStatus,
    attach_freshness,
    freshness_query,
    parse_sample_value,
    query_selectors,
)

RUNNING = "running"
WAITING = "waiting"
KV = "kv"
TTFT_P95 = "ttft_p95"
TPOT_P90 = "tpot_p90"
HIT_RATIO = "hit_ratio"
REQUEST_RATE = "request_rate"
PROMPT_RATE = "prompt_rate"
CACHE_HIT_RATIO = "cache_hit_ratio"
GENERATION_RATE = "generation_rate"
TTFT_ATTAINMENT = "ttft_attainment"
TPOT_ATTAINMENT = "tpot_attainment"
UNSERVED_SHARE = "unserved_share"
PREFILL_BUSY = "prefill_busy"
PREFILLS_RATE = "prefills_rate"
ITL_MEAN = "itl_mean"
PER_POD = (RUNNING, WAITING, KV)
WORK_KEYS = (
    REQUEST_RATE,
    PROMPT_RATE,
    CACHE_HIT_RATIO,
    GENERATION_RATE,
    TTFT_ATTAINMENT,
    TPOT_ATTAINMENT,
    UNSERVED_SHARE,
)
LEARN_KEYS = (PREFILL_BUSY, PREFILLS_RATE, ITL_MEAN)
"""Asked only when the pool learns its profile from the engines (``capacityProfile.learnFromEngines``)."""
ROUTER_SLO_METRIC = "tandem_router_slo_requests_total"
"""The router's per-request SLO counter (labels ``pool``, ``revision``, ``slo`` = ttft|tpot, ``result`` =
met|missed|rejected|timeout|error): one increment per request and SLO, judged by
:func:`tandem.core.capacity.judge_request` (TTFT budget by prompt size, TPOT from the request's own first and
last token times). Attainment is ``met`` over every result, so rejects, timeouts and failures are misses.
When no router is scraped the series is absent, the attainment queries return nothing, and work planning runs
on the model alone (no correction; the decision's ``signal`` says so)."""
UNSERVED_RESULTS = "rejected|timeout"
"""Results that mean the pool had no room (every pair walked was full, or a leg timed out): demand the engines'
own queues never show, so they count as queueing for the attainment correction."""
DEMAND_OUTCOMES_EXCLUDED = "bad_request|no_pool|client_gone"
"""Router outcomes that are not demand on the pool (malformed, unroutable or abandoned requests)."""


def _sel(namespace: str, pool: str, role: str | None = None) -> str:
    parts = [f'namespace="{namespace}"', f'pool="{pool}"']
    if role:
        parts.append(f'role="{role}"')
    return ",".join(parts)


def work_queries(namespace: str, pool: str, window: str, *, learn: bool = False) -> dict[str, str]:
    """The work-planning queries (spec.autoscaling.capacityProfile), by key: the pool's request rate from the
    router (rejects included: they are demand), prompt and generated tokens/s from the engines, the share of
    prompt tokens served from a cache (local + shared tier), the router's per-request SLO attainment and the
    share of requests it could not place (rejected or timed out); with ``learn``, for the profile learned from
    the engines, the prefill instances' seconds of prefill phase and prefills finished per second, and the decode
    instances' mean inter-token latency (``_sum``/``_count``: exact, not a quantile).

    Example (pool ml/speed, window 60s), the TTFT attainment::

        (sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft",result=~"met"}[60s])) or vector(0))
          / sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft"}[60s]))
    """
    dec, pre = _sel(namespace, pool, "decode"), _sel(namespace, pool, "prefill")
    router = f'pool="{namespace}/{pool}"'

    def share(slo: str, results: str) -> str:
        """Share of the pool's judged requests with one of ``results`` (no such series yet: 0, not missing;
        no series at all, i.e. no router scraped: missing)."""
        part = f'(sum(rate({ROUTER_SLO_METRIC}{{{router},slo="{slo}",result=~"{results}"}}[{window}])) or vector(0))'
        return f'{part} / sum(rate({ROUTER_SLO_METRIC}{{{router},slo="{slo}"}}[{window}]))'

    learned = {
        PREFILL_BUSY: f"sum(rate({em.sum_of(em.PREFILL_TIME)}{{{pre}}}[{window}]))",
        PREFILLS_RATE: f"sum(rate({em.count(em.PREFILL_TIME)}{{{pre}}}[{window}]))",
        ITL_MEAN: (
            f"sum(rate({em.sum_of(em.ITL)}{{{dec}}}[{window}])) / sum(rate({em.count(em.ITL)}{{{dec}}}[{window}]))"
        ),
    }
    return {
        REQUEST_RATE: (
            f'sum(rate(tandem_router_requests_total{{{router},outcome!~"{DEMAND_OUTCOMES_EXCLUDED}"}}[{window}]))'
        ),
        PROMPT_RATE: f"sum(rate({em.total(em.PROMPT_TOKENS)}{{{pre}}}[{window}]))",
        CACHE_HIT_RATIO: (
            f"(sum(rate({em.total(em.PREFIX_HITS)}{{{pre}}}[{window}])) + "
            f"(sum(rate({em.total(em.EXTERNAL_HITS)}{{{pre}}}[{window}])) or vector(0))) / "
            f"sum(rate({em.total(em.PREFIX_QUERIES)}{{{pre}}}[{window}]))"
        ),
        GENERATION_RATE: f"sum(rate({em.total(em.GENERATION_TOKENS)}{{{dec}}}[{window}]))",
        TTFT_ATTAINMENT: share("ttft", "met"),
        TPOT_ATTAINMENT: share("tpot", "met"),
        UNSERVED_SHARE: share("ttft", UNSERVED_RESULTS),
        **(learned if learn else {}),
    }


def scaling_queries(
    namespace: str, pool: str, window: str, *, work: bool = False, learn: bool = False
) -> dict[str, str]:
    """The queries of one autoscaling evaluation, by key (``work``: plus :func:`work_queries`, with ``learn``
    its profile-learning ones)."""
    extra = work_queries(namespace, pool, window, learn=learn) if work else {}
    sel, dec, pre = _sel(namespace, pool), _sel(namespace, pool, "decode"), _sel(namespace, pool, "prefill")
    return {
        RUNNING: f"max by (pod) ({em.RUNNING}{{{sel}}})",
        WAITING: f"max by (pod) ({em.WAITING}{{{sel}}})",
        KV: f"max by (pod) ({em.KV_USAGE}{{{sel}}})",
        TTFT_P95: (f"histogram_quantile(0.95, sum by (le) (rate({em.bucket(em.TTFT)}{{{dec}}}[{window}])))"),
        TPOT_P90: (f"histogram_quantile(0.90, sum by (le) (rate({em.bucket(em.TPOT)}{{{dec}}}[{window}])))"),
        HIT_RATIO: (
            f"sum(rate({em.total(em.PREFIX_HITS)}{{{pre}}}[{window}])) / "
            f"sum(rate({em.total(em.PREFIX_QUERIES)}{{{pre}}}[{window}]))"
        ),
        **extra,
    }


def freshness_queries(queries: Mapping[str, str]) -> dict[str, str]:
    """The freshness query of each scaling query, by the same key (see the module docstring)."""
    out: dict[str, str] = {}
    for key, query in queries.items():
        if key in PER_POD and (selectors := query_selectors(query)):
            out[key] = f"max by (pod) (timestamp({selectors[0]}))"
        elif (fresh := freshness_query(query)) is not None:
            out[key] = fresh
    return out


@dataclass(frozen=True)
class Freshness:
    """The freshness answers of one evaluation and how old an input may be."""

    results: Mapping[str, QueryResult]
    now_s: float
    max_age_s: float

    def fresh(self, sample_time: float | None) -> bool:
        return sample_time is not None and sample_time > 0 and abs(self.now_s - sample_time) <= self.max_age_s

    def fresh_pods(self, key: str) -> set[str]:
        """Pods whose gauge ``key`` has a current sample (an unusable answer: none)."""
        result = self.results.get(key)
        if result is None or result.status is not QueryStatus.OK or result.warnings:
            return set()
        return {s.labels.get("pod", "") for s in result.series if self.fresh(_finite(s.value))} - {""}


def _finite(value: str) -> float | None:
    try:
        number = parse_sample_value(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _scalar(result: QueryResult | None) -> float | None:
    if result is None or result.status is not QueryStatus.OK or result.warnings or len(result.series) != 1:
        return None
    return _finite(result.series[0].value)


def _per_pod(result: QueryResult | None) -> dict[str, float]:
    if result is None or result.status is not QueryStatus.OK or result.warnings:
        return {}
    out: dict[str, float] = {}
    seen: set[str] = set()
    for series in result.series:
        pod = series.labels.get("pod", "")
        if not pod:
            continue
        if pod in seen:  # two series for one pod: never pick one
            out.pop(pod, None)
            continue
        seen.add(pod)
        value = _finite(series.value)
        if value is not None:
            out[pod] = value
    return out


@dataclass(frozen=True)
class ServingInstance:
    pod: str
    pair: str
    role: str


def build_snapshot(
    results: Mapping[str, QueryResult], serving: Iterable[ServingInstance], freshness: Freshness | None = None
) -> MetricsSnapshot:
    """Turn the query results into the autoscaler's input (instances of serving pairs only).

    With ``freshness``, a pod's gauge counts only when that pod's sample is current, and a pool-wide value
    only when its inputs are (None: no freshness check, for callers without one).
    """

    def per_pod(key: str) -> dict[str, float]:
        values = _per_pod(results.get(key))
        if freshness is None:
            return values
        fresh = freshness.fresh_pods(key)
        return {pod: v for pod, v in values.items() if pod in fresh}

    def scalar(key: str) -> float | None:
        result = results.get(key)
        if freshness is None or result is None:
            return _scalar(result)
        checked = attach_freshness(result, freshness.results.get(key))
        return _scalar(checked) if freshness.fresh(checked.sample_time) else None

    running, waiting, kv = per_pod(RUNNING), per_pod(WAITING), per_pod(KV)
    instances = []
    prefill = decode = 0
    for inst in serving:
        if inst.role == "prefill":
            prefill += 1
        else:
            decode += 1
        instances.append(
            InstanceSample(
                pair=inst.pair,
                role="prefill" if inst.role == "prefill" else "decode",
                running=running.get(inst.pod),
                waiting=waiting.get(inst.pod),
                kv_cache_utilization=kv.get(inst.pod),
            )
        )
    return MetricsSnapshot(
        instances=tuple(instances),
        pool=PoolSample(
            ttft_p95_s=scalar(TTFT_P95),
            tpot_p90_s=scalar(TPOT_P90),
            local_hit_ratio=scalar(HIT_RATIO),
            request_rate=scalar(REQUEST_RATE),
            prompt_tokens_rate=scalar(PROMPT_RATE),
            cache_hit_ratio=scalar(CACHE_HIT_RATIO),
            generation_tokens_rate=scalar(GENERATION_RATE),
            ttft_attainment=scalar(TTFT_ATTAINMENT),
            tpot_attainment=scalar(TPOT_ATTAINMENT),
            unserved_share=scalar(UNSERVED_SHARE),
            prefill_busy=scalar(PREFILL_BUSY),
            prefills_rate=scalar(PREFILLS_RATE),
            itl_mean_s=scalar(ITL_MEAN),
        ),
        expected_prefill=prefill,
        expected_decode=decode,
    )
