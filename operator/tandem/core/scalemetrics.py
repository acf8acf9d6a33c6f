"""Autoscaling inputs from Prometheus: the queries, and their results turned into a `MetricsSnapshot`.

What it owns: the PromQL the autoscaler reads (vLLM metric names, the series label contract of
`tandem.core.promql`: `namespace`, `pool`, `revision`, `role`, `pair`, `pod`) and the pure parsing of
query results. Only instances of *serving* pairs count, and each must report exactly one finite sample;
anything else is missing, so the autoscaler sees partial data (scale-up allowed, scale-down never)
or no data (hold). Like the gates, NaN, ±Inf, stale and multi-series values are never a number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tandem.core.autoscale import InstanceSample, MetricsSnapshot, PoolSample
from tandem.core.promql import QueryResult, QueryStatus, parse_sample_value

RUNNING = "running"
WAITING = "waiting"
KV = "kv"
TTFT_P95 = "ttft_p95"
TPOT_P90 = "tpot_p90"
HIT_RATIO = "hit_ratio"


def _sel(namespace: str, pool: str, role: str | None = None) -> str:
    parts = [f'namespace="{namespace}"', f'pool="{pool}"']
    if role:
        parts.append(f'role="{role}"')
    return ",".join(parts)


def scaling_queries(namespace: str, pool: str, window: str) -> dict[str, str]:
    """The queries of one autoscaling evaluation, by key."""
    sel, dec, pre = _sel(namespace, pool), _sel(namespace, pool, "decode"), _sel(namespace, pool, "prefill")
    return {
        RUNNING: f"max by (pod) (vllm:num_requests_running{{{sel}}})",
        WAITING: f"max by (pod) (vllm:num_requests_waiting{{{sel}}})",
        KV: f"max by (pod) (vllm:kv_cache_usage_perc{{{sel}}})",
        TTFT_P95: (
            f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{dec}}}[{window}])))"
        ),
        TPOT_P90: (
            "histogram_quantile(0.90, sum by (le) "
            f"(rate(vllm:request_time_per_output_token_seconds_bucket{{{dec}}}[{window}])))"
        ),
        HIT_RATIO: (
            f"sum(rate(vllm:prefix_cache_hits_total{{{pre}}}[{window}])) / "
            f"sum(rate(vllm:prefix_cache_queries_total{{{pre}}}[{window}]))"
        ),
    }


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


def build_snapshot(results: Mapping[str, QueryResult], serving: Iterable[ServingInstance]) -> MetricsSnapshot:
    """Turn the query results into the autoscaler's input (instances of serving pairs only)."""
    running, waiting, kv = _per_pod(results.get(RUNNING)), _per_pod(results.get(WAITING)), _per_pod(results.get(KV))
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
            ttft_p95_s=_scalar(results.get(TTFT_P95)),
            tpot_p90_s=_scalar(results.get(TPOT_P90)),
            local_hit_ratio=_scalar(results.get(HIT_RATIO)),
        ),
        expected_prefill=prefill,
        expected_decode=decode,
    )
