"""TTFT per uncached prompt token (``compare.normalize: UncachedPromptTokens``, docs/design/009, issue 17 item 2).

The numbers are W5's at the full request rate (seed 1): an identical canary pair, 60 s into its first step, with
a prefix cache still cold (local hits 0.40 vs stable's 0.81) prefills ×3.2 the tokens per request and is ×3.2
slower on average — the same per uncached token.
"""

from __future__ import annotations

import pytest

from tandem.api.pool import GateComparison, MetricGate
from tandem.api.validate import validate_object
from tandem.core import gates as g
from tandem.core.comparison import LatencyHistogram, UncachedWork, compare_latency
from tandem.core.promql import UNCACHED_TOKENS_QUERY, template_sample_queries
from tests.fakes import prometheus as fp
from tests.unit.core.test_gate_statistics import WINDOW, _pool, res

CANARY_N, STABLE_N = 63, 3980
# cumulative TTFT buckets (s): the cold canary's mass sits higher
COLD_CANARY = [("1", 20.0), ("2.5", 40.0), ("5", 55.0), ("10", 60.0), ("20", 63.0), ("+Inf", 63.0)]
SLOW_CANARY = [("1", 5.0), ("2.5", 10.0), ("5", 20.0), ("10", 40.0), ("20", 63.0), ("+Inf", 63.0)]
STABLE = [("1", 3000.0), ("2.5", 3600.0), ("5", 3850.0), ("10", 3950.0), ("20", 3980.0), ("+Inf", 3980.0)]
COLD_UNCACHED, STABLE_UNCACHED = 52_500.0, 16_300.0  # tokens per request


def ttft_gate(normalize: str = "UncachedPromptTokens") -> MetricGate:
    return MetricGate(name="ttft-p95", template="TTFTP95", compare=GateComparison(normalize=normalize))  # type: ignore[arg-type]


def samples(
    n: float, buckets: list[tuple[str, float]], mean_s: float, uncached: fp.Reply | float | None
) -> g.SampleResults:
    u = None if uncached is None else res(uncached if isinstance(uncached, fp.Reply) else fp.value(uncached), "u-q")
    return g.SampleResults(
        res(fp.value(n), "count-q"), None, res(fp.buckets(buckets), "buckets-q"), res(fp.value(n * mean_s), "sum-q"), u
    )


def judge(gate: MetricGate, canary: g.SampleResults, stable: g.SampleResults | None = None) -> tuple[str, str, str]:
    stable = stable or samples(STABLE_N, STABLE, 0.902, STABLE_N * STABLE_UNCACHED)
    v = g.evaluate_gate(gate, res(fp.value(9.0)), res(fp.value(5.5)), WINDOW, g.GateSamples(canary, stable))
    return v.verdict, v.reason, v.condition


def test_a_cold_but_good_canary_fails_per_request_and_passes_per_uncached_token() -> None:
    canary = samples(CANARY_N, COLD_CANARY, 2.86, CANARY_N * COLD_UNCACHED)
    per_request = judge(ttft_gate("None"), canary)
    per_token = judge(ttft_gate(), canary)
    assert per_request[:2] == ("Failure", "SignificantlyWorse"), per_request
    assert per_token[:2] == ("Success", "NotSignificantlyWorse"), per_token
    assert "x3.22 = 2905 ms for 5.25e+04 vs 1.63e+04 uncached tokens/request" in per_token[2]


def test_a_canary_slower_per_uncached_token_still_fails() -> None:
    """Mean 8 s on the same cold cache: ×2.8 stable's scaled mean (2.9 s), far beyond what the misses explain."""
    verdict, reason, condition = judge(ttft_gate(), samples(CANARY_N, SLOW_CANARY, 8.0, CANARY_N * COLD_UNCACHED))
    assert (verdict, reason) == ("Failure", "SignificantlyWorse"), condition
    assert "rank 1," in condition  # the rank test is off while the canary does more work


@pytest.mark.parametrize(
    "uncached",
    [
        pytest.param(None, id="not queried"),
        pytest.param(fp.empty(), id="no series (engine without prefix caching)"),
        pytest.param(fp.value(float("nan")), id="NaN"),
        pytest.param(fp.value(-5.0), id="negative (a counter reset)"),
        pytest.param(fp.buckets([("1", 1.0), ("+Inf", 1.0)]), id="several series"),
        pytest.param(fp.http(503), id="Prometheus down"),
    ],
)
def test_unusable_cache_counters_leave_the_comparison_unscaled(uncached: fp.Reply | None) -> None:
    """Bad or absent counters can only make the gate stricter, never hide a regression: the cold canary fails
    as it would without ``normalize``."""
    canary = samples(CANARY_N, COLD_CANARY, 2.86, uncached)
    verdict, reason, condition = judge(ttft_gate(), canary)
    assert (verdict, reason) == ("Failure", "SignificantlyWorse"), condition
    assert "uncached" not in condition


def test_a_warmer_canary_is_judged_unscaled() -> None:
    """Fewer uncached tokens than stable: factor 1, the same comparison as without normalize (TTFT's fixed part
    would make scaling down unfair to the canary)."""
    canary = samples(CANARY_N, COLD_CANARY, 2.86, CANARY_N * 8_000.0)
    plain = judge(ttft_gate("None"), canary)
    scaled = judge(ttft_gate(), canary)
    assert scaled[:2] == plain[:2] == ("Failure", "SignificantlyWorse")
    assert "x1 = 902 ms" in scaled[2]


def test_uncached_work_factor() -> None:
    assert UncachedWork(52_500, 16_300).factor == pytest.approx(3.2209, rel=1e-4)
    assert UncachedWork(8_000, 16_300).factor == 1.0
    assert UncachedWork(5_000, 0).factor == 1.0  # stable missed nothing: nothing to scale by
    h = LatencyHistogram(((1.0, 50.0), (float("inf"), 63.0)), 63.0, 63 * 1.0)
    s = LatencyHistogram(((1.0, 3000.0), (float("inf"), 3980.0)), 3980.0, 3980 * 0.9)
    a = compare_latency(h, s, confidence_percent=99, max_mean_ratio_percent=110, work=UncachedWork(1, 2))
    b = compare_latency(h, s, confidence_percent=99, max_mean_ratio_percent=110)
    # a warmer canary (factor 1): the same decision as without work; only the summary names the work
    assert (a.worse, a.p_value, a.ratio, a.power) == (b.worse, b.p_value, b.ratio, b.power)
    assert "uncached" in a.summary and "uncached" not in b.summary


def test_the_uncached_query_reads_prefill_instances_and_is_sent() -> None:
    assert template_sample_queries("TTFTP95", "UncachedPromptTokens").uncached == UNCACHED_TOKENS_QUERY
    assert template_sample_queries("TTFTP95").uncached is None
    assert template_sample_queries("TPOTP90", "UncachedPromptTokens").uncached is None
    q = g.resolve_gate_queries(
        ttft_gate(), namespace="ml", pool="speed", canary_revision="new1", stable_revision="old1", interval="1m"
    )
    assert q.canary_samples is not None and q.stable_samples is not None
    assert q.canary_samples.uncached == (
        'sum(increase(vllm:prefix_cache_queries_total{namespace="ml",pool="speed",revision="new1",role="prefill"}[1m]))'
        ' - sum(increase(vllm:prefix_cache_hits_total{namespace="ml",pool="speed",revision="new1",role="prefill"}'
        "[1m]))"
    )
    assert q.stable_samples.uncached is not None and 'revision="old1"' in q.stable_samples.uncached
    assert {q.canary_samples.uncached, q.stable_samples.uncached} <= set(q.texts())


def test_the_ttft_presets_normalize() -> None:
    gate = MetricGate.model_validate({"name": "ttft", "preset": "ttft-p95"})
    assert gate.compare is not None and gate.compare.normalize == "UncachedPromptTokens"
    assert MetricGate.model_validate({"name": "t", "template": "TTFTP95", "compare": {}}).compare == GateComparison()


@pytest.mark.parametrize(
    ("metric", "want_error"),
    [
        pytest.param({"template": "TTFTP90", "compare": {"normalize": "UncachedPromptTokens"}}, None, id="TTFTP90"),
        pytest.param({"template": "TPOTP90", "compare": {"normalize": "None"}}, None, id="None anywhere"),
        pytest.param(
            {"template": "TPOTP90", "compare": {"normalize": "UncachedPromptTokens"}},
            "compare.normalize: UncachedPromptTokens applies to TTFT templates only",
            id="TPOT",
        ),
        pytest.param(
            {"preset": "errors", "compare": {"normalize": "UncachedPromptTokens"}},
            "compare.normalize: UncachedPromptTokens applies to TTFT templates only",
            id="errors preset",
        ),
        pytest.param({"template": "TTFTP95", "compare": {"normalize": "Tokens"}}, "normalize", id="unknown value"),
    ],
)
def test_validate_normalize(metric: dict[str, object], want_error: str | None) -> None:
    errors = [str(e) for e in validate_object(_pool(metric))]
    if want_error is None:
        assert errors == []
    else:
        assert any(want_error in e for e in errors), errors
