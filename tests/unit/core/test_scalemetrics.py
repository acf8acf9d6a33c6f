"""Autoscaling inputs: per-pod and pool-wide values count only when their samples are current (issue 19 item 7)."""

from __future__ import annotations

import pytest

from tandem.core import scalemetrics as sm
from tandem.core.promql import QueryResult, QueryStatus, Series, freshness_of

NOW = 1_800_000_000.0
SERVING = [
    sm.ServingInstance("speed-p0-prefill-0", "speed-p0", "prefill"),
    sm.ServingInstance("speed-p0-decode-0", "speed-p0", "decode"),
]


def vector(*series: tuple[dict[str, str], str]) -> QueryResult:
    """An instant answer: every series stamped with the evaluation time, like a real Prometheus."""
    return QueryResult(
        QueryStatus.OK,
        http_status=200,
        result_type="vector",
        series=tuple(Series(labels, NOW, v) for labels, v in series),
    )


def per_pod(value: str) -> QueryResult:
    return vector(({"pod": "speed-p0-prefill-0"}, value), ({"pod": "speed-p0-decode-0"}, value))


def stamps(prefill_age: float | None, decode_age: float | None) -> QueryResult:
    rows = [
        ({"pod": p}, repr(NOW - a))
        for p, a in (("speed-p0-prefill-0", prefill_age), ("speed-p0-decode-0", decode_age))
        if a is not None
    ]
    return vector(*rows)


def test_freshness_queries_cover_every_scaling_query() -> None:
    queries = sm.scaling_queries("ml", "speed", "60s")
    fresh = sm.freshness_queries(queries)
    assert set(fresh) == set(queries)
    assert fresh[sm.RUNNING] == 'max by (pod) (timestamp(vllm:num_requests_running{namespace="ml",pool="speed"}))'
    assert freshness_of(fresh[sm.TTFT_P95]) is not None


@pytest.mark.parametrize(
    ("ages", "want_running"),
    [
        pytest.param((0, 10), (3.0, 3.0), id="both pods scraped recently"),
        pytest.param((0, 120), (3.0, None), id="decode pod's gauge stopped updating 2 min ago"),
        pytest.param((0, None), (3.0, None), id="no current sample for the decode pod"),
        pytest.param((-120, 0), (None, 3.0), id="sample from the future"),
    ],
)
def test_stale_pod_gauges_are_missing(
    ages: tuple[float | None, float | None], want_running: tuple[float | None, ...]
) -> None:
    fresh = sm.Freshness({sm.RUNNING: stamps(*ages)}, now_s=NOW, max_age_s=30)
    snap = sm.build_snapshot({sm.RUNNING: per_pod("3")}, SERVING, fresh)
    assert tuple(i.running for i in snap.instances) == want_running


@pytest.mark.parametrize(
    ("freshness", "want"),
    [
        pytest.param(vector(({}, repr(NOW - 5))), 0.4, id="inputs fresh"),
        pytest.param(vector(({}, repr(NOW - 300))), None, id="inputs 5 min old, answer stamped now"),
        pytest.param(vector(), None, id="no input has a current sample"),
        pytest.param(None, None, id="freshness unknown"),
        pytest.param(QueryResult(QueryStatus.TIMEOUT), None, id="freshness query timed out"),
    ],
)
def test_stale_pool_values_are_missing(freshness: QueryResult | None, want: float | None) -> None:
    results = {sm.TTFT_P95: vector(({}, "0.4"))}
    fresh = sm.Freshness({sm.TTFT_P95: freshness} if freshness is not None else {}, now_s=NOW, max_age_s=30)
    assert sm.build_snapshot(results, SERVING, fresh).pool.ttft_p95_s == want


def test_without_freshness_values_are_taken_as_answered() -> None:
    snap = sm.build_snapshot({sm.RUNNING: per_pod("3"), sm.TTFT_P95: vector(({}, "0.4"))}, SERVING)
    assert [i.running for i in snap.instances] == [3.0, 3.0] and snap.pool.ttft_p95_s == 0.4
