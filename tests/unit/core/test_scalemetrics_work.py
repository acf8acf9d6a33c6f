"""Work-planning inputs from Prometheus (spec.autoscaling.capacityProfile): queries and parsing."""

from __future__ import annotations

import pytest

from tandem.core import scalemetrics as sm
from tandem.core.autoscale import work_demand
from tandem.core.promql import QueryResult, QueryStatus, Series, freshness_of

NOW = 1_800_000_000.0
SERVING = [
    sm.ServingInstance("speed-p0-prefill-0", "speed-p0", "prefill"),
    sm.ServingInstance("speed-p0-decode-0", "speed-p0", "decode"),
]


def scalar(value: str) -> QueryResult:
    return QueryResult(QueryStatus.OK, http_status=200, result_type="vector", series=(Series({}, NOW, value),))


def test_work_queries_only_when_asked_and_all_have_freshness() -> None:
    plain = sm.scaling_queries("ml", "speed", "60s")
    work = sm.scaling_queries("ml", "speed", "60s", work=True)
    assert not set(sm.WORK_KEYS) & set(plain)
    assert set(sm.WORK_KEYS) <= set(work)
    fresh = sm.freshness_queries(work)
    assert all(freshness_of(fresh[k]) is not None for k in sm.WORK_KEYS)
    assert 'pool="ml/speed"' in work[sm.REQUEST_RATE]  # the router labels pools namespace/name
    assert 'outcome!~"bad_request|no_pool|client_gone"' in work[sm.REQUEST_RATE]  # rejects are demand
    assert sm.ROUTER_SLO_METRIC in work[sm.TTFT_ATTAINMENT]


@pytest.mark.parametrize(
    ("values", "want_rate", "want_attainment"),
    [
        pytest.param({}, None, None, id="nothing answered: no work data"),
        pytest.param(
            {sm.REQUEST_RATE: "4", sm.PROMPT_RATE: "32000", sm.GENERATION_RATE: "400", sm.CACHE_HIT_RATIO: "0.5"},
            4.0,
            None,
            id="no router SLO metric yet: model alone",
        ),
        pytest.param(
            {
                sm.REQUEST_RATE: "4",
                sm.PROMPT_RATE: "32000",
                sm.GENERATION_RATE: "400",
                sm.CACHE_HIT_RATIO: "0.5",
                sm.TTFT_ATTAINMENT: "0.97",
            },
            4.0,
            0.97,
            id="attainment read",
        ),
        pytest.param(
            {sm.REQUEST_RATE: "NaN", sm.PROMPT_RATE: "1", sm.GENERATION_RATE: "1"}, None, None, id="NaN is missing"
        ),
    ],
)
def test_build_snapshot_reads_work(
    values: dict[str, str], want_rate: float | None, want_attainment: float | None
) -> None:
    results = {k: scalar(v) for k, v in values.items()}
    snap = sm.build_snapshot(results, SERVING)
    assert snap.pool.ttft_attainment == want_attainment
    demand = work_demand(snap)
    if want_rate is None:
        assert demand is None
    else:
        assert demand is not None
        assert demand.request_rate == want_rate
        assert demand.uncached_tokens_per_s == pytest.approx(16_000)


@pytest.mark.parametrize(
    ("key", "want"),
    [
        pytest.param(
            sm.TTFT_ATTAINMENT,
            '(sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft",result=~"met"}[60s])) '
            "or vector(0)) / "
            'sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft"}[60s]))',
            id="ttft attainment: met over every result (rejects, timeouts and errors are misses)",
        ),
        pytest.param(
            sm.TPOT_ATTAINMENT,
            '(sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="tpot",result=~"met"}[60s])) '
            "or vector(0)) / "
            'sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="tpot"}[60s]))',
            id="tpot attainment",
        ),
        pytest.param(
            sm.UNSERVED_SHARE,
            '(sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft",result=~"rejected|timeout"}'
            "[60s])) or vector(0)) / "
            'sum(rate(tandem_router_slo_requests_total{pool="ml/speed",slo="ttft"}[60s]))',
            id="unserved share: rejected or timed out",
        ),
    ],
)
def test_router_slo_queries_read_the_router_counter(key: str, want: str) -> None:
    query = sm.work_queries("ml", "speed", "60s")[key]
    assert query == want
    assert freshness_of(sm.freshness_queries({key: query})[key]) is not None


@pytest.mark.parametrize(
    ("values", "want"),
    [
        pytest.param({}, (None, None, None), id="no router scraped: all missing"),
        pytest.param(
            {sm.TTFT_ATTAINMENT: "0.97", sm.TPOT_ATTAINMENT: "0.99", sm.UNSERVED_SHARE: "0.02"},
            (0.97, 0.99, 0.02),
            id="router answers",
        ),
        pytest.param(
            {sm.TTFT_ATTAINMENT: "NaN", sm.TPOT_ATTAINMENT: "NaN", sm.UNSERVED_SHARE: "NaN"},
            (None, None, None),
            id="no request judged in the window (0/0): missing",
        ),
    ],
)
def test_build_snapshot_reads_router_attainment(
    values: dict[str, str], want: tuple[float | None, float | None, float | None]
) -> None:
    snap = sm.build_snapshot({k: scalar(v) for k, v in values.items()}, SERVING)
    assert (snap.pool.ttft_attainment, snap.pool.tpot_attainment, snap.pool.unserved_share) == want


@pytest.mark.parametrize(
    ("key", "want"),
    [
        pytest.param(
            sm.PREFILL_BUSY,
            'sum(rate(vllm:request_prefill_time_seconds_sum{namespace="ml",pool="speed",role="prefill"}[60s]))',
            id="prefill phase seconds per second, prefill instances",
        ),
        pytest.param(
            sm.PREFILLS_RATE,
            'sum(rate(vllm:request_prefill_time_seconds_count{namespace="ml",pool="speed",role="prefill"}[60s]))',
            id="prefills finished per second",
        ),
        pytest.param(
            sm.ITL_MEAN,
            'sum(rate(vllm:inter_token_latency_seconds_sum{namespace="ml",pool="speed",role="decode"}[60s])) / '
            'sum(rate(vllm:inter_token_latency_seconds_count{namespace="ml",pool="speed",role="decode"}[60s]))',
            id="decode inter-token latency: an exact mean, not a quantile",
        ),
    ],
)
def test_profile_learning_queries_read_the_engines(key: str, want: str) -> None:
    assert sm.work_queries("ml", "speed", "60s", learn=True)[key] == want
    assert key not in sm.work_queries("ml", "speed", "60s")  # not asked unless the pool learns
    assert key in sm.freshness_queries(sm.scaling_queries("ml", "speed", "60s", work=True, learn=True))


def test_build_snapshot_reads_what_the_engines_measured() -> None:
    results = {sm.PREFILL_BUSY: scalar("1.5"), sm.PREFILLS_RATE: scalar("2"), sm.ITL_MEAN: scalar("+Inf")}
    pool = sm.build_snapshot(results, SERVING).pool
    assert (pool.prefill_busy, pool.prefills_rate, pool.itl_mean_s) == (1.5, 2.0, None)  # +Inf is never a number
