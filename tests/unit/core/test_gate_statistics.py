"""Gates with a sample floor (``minSamples``) and a statistical comparison (``compare``): queries and verdicts."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from tandem.api.pool import GateComparison, MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.api.validate import validate_object
from tandem.core import gates as g
from tandem.core.promql import QueryRenderError, QueryResult, template_sample_queries
from tests.fakes import prometheus as fp

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NOW = START + timedelta(seconds=180)
WINDOW = g.SampleWindow(now=NOW, step_started_at=START, initial_delay_s=60, max_age_s=30, rate_window_s=60)


def res(reply: fp.Reply, query: str = "q") -> QueryResult:
    """The answer as the adapter hands it over: data plus the freshness of its inputs (tests/fakes)."""
    return dataclasses.replace(fp.answer(reply, NOW.timestamp()), query=query)


def arm(
    count: fp.Reply | float,
    *,
    errors: fp.Reply | float | None = None,
    buckets: fp.Reply | list[tuple[str, float]] | None = None,
    total: fp.Reply | float | None = None,
) -> g.SampleResults:
    def one(x: fp.Reply | float | None, name: str) -> QueryResult | None:
        if x is None:
            return None
        return res(x if isinstance(x, fp.Reply) else fp.value(x), name)

    b = buckets if isinstance(buckets, fp.Reply) or buckets is None else fp.buckets(buckets)
    count_result = one(count, "count-q")
    assert count_result is not None
    return g.SampleResults(count_result, one(errors, "errors-q"), one(b, "buckets-q"), one(total, "sum-q"))


def errors_gate(failure: str | None = "result > 0.01", **kw: object) -> MetricGate:
    return MetricGate(
        name="errors",
        template="ErrorRate",
        failure_condition=failure,
        compare=GateComparison(),
        **kw,  # type: ignore[arg-type]
    )


def tpot_gate(**kw: object) -> MetricGate:
    return MetricGate(name="tpot", template="TPOTP90", compare=GateComparison(), **kw)  # type: ignore[arg-type]


# --- queries ----------------------------------------------------------------------------------------


def resolve(gate: MetricGate, stable: str | None = "old1") -> g.GateQueries:
    return g.resolve_gate_queries(
        gate, namespace="ml", pool="speed", canary_revision="new1", stable_revision=stable, interval="1m"
    )


def test_template_sample_queries_read_the_histogram_for_latency() -> None:
    q = template_sample_queries("TTFTP95")
    assert q.count.startswith("sum(increase(vllm:time_to_first_token_seconds_count{")
    assert q.buckets is not None and q.buckets.startswith(
        "sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{"
    )
    assert q.sum is not None and "vllm:time_to_first_token_seconds_sum{" in q.sum and q.errors is None


def test_template_sample_queries_count_requests_and_errors_for_error_rate() -> None:
    q = template_sample_queries("ErrorRate")
    assert q.count.startswith("sum(increase(vllm:request_success_total{")
    assert q.errors is not None and 'finished_reason="error"' in q.errors and q.errors.endswith("or vector(0))")
    assert q.buckets is None and q.sum is None


def test_template_sample_queries_reject_unknown_templates() -> None:
    with pytest.raises(QueryRenderError, match="unknown template"):
        template_sample_queries("P99")


@pytest.mark.parametrize(
    ("gate", "want_texts"),
    [
        pytest.param(
            MetricGate(name="t", template="TTFTP90", success_condition="result <= 1.0"),
            ["histogram_quantile", 'time_to_first_token_seconds_count{namespace="ml",pool="speed",revision="new1"'],
            id="condition gate: value and the canary's count",
        ),
        pytest.param(
            MetricGate(name="t", template="TTFTP90", success_condition="result <= 1.0", min_samples=0),
            ["histogram_quantile"],
            id="minSamples 0: no count",
        ),
        pytest.param(
            MetricGate(name="t", query="up", success_condition="result > 0.0"),
            ["up"],
            id="own query: no counter to read",
        ),
        pytest.param(
            tpot_gate(),
            [
                'revision="new1"',
                'revision="old1"',
                'revision="new1"',
                'revision="new1"',
                'revision="new1"',
                'by (pair) (increase(vllm:request_time_per_output_token_seconds_count{namespace="ml",pool="speed",'
                'revision="new1"',
                'by (pair) (increase(vllm:request_time_per_output_token_seconds_sum{namespace="ml",pool="speed",'
                'revision="new1"',
                'revision="old1"',
                'revision="old1"',
                'revision="old1"',
                '_count{namespace="ml",pool="speed",revision="old1"',
                '_sum{namespace="ml",pool="speed",revision="old1"',
            ],
            id="compare latency: value, baseline, count+buckets+sum+per-pair count and sum per revision",
        ),
        pytest.param(
            errors_gate(),
            ['revision="new1"', 'revision="old1"', "success_total", 'error"}', "success_total", 'error"}'],
            id="compare errors: value, baseline, count+errors per revision",
        ),
    ],
)
def test_resolve_gate_queries_adds_the_sample_queries(gate: MetricGate, want_texts: list[str]) -> None:
    texts = resolve(gate).texts()
    assert len(texts) == len(want_texts)
    for text, want in zip(texts, want_texts, strict=True):
        assert want in text


def test_compare_needs_a_stable_revision() -> None:
    with pytest.raises(QueryRenderError, match="stable revision"):
        resolve(tpot_gate(), stable=None)


def test_gate_samples_map_the_answers_by_query_text() -> None:
    q = resolve(errors_gate())
    answers = {t: res(fp.value(1.0), t) for t in q.texts()}
    samples = g.gate_samples(q, answers)
    assert samples is not None and samples.stable is not None
    assert samples.canary.count.query == q.canary_samples.count  # type: ignore[union-attr]
    assert samples.stable.errors is not None and 'revision="old1"' in samples.stable.errors.query
    assert g.gate_samples(resolve(MetricGate(name="t", query="up", success_condition="result > 0.0")), {}) is None


# --- minSamples -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "want_verdict", "want_reason"),
    [
        pytest.param(fp.value(19.6), "NoData", "TooFewSamples", id="19.6 requests < 20: NoData, not Failure"),
        pytest.param(fp.value(0), "NoData", "TooFewSamples", id="no request at all"),
        pytest.param(fp.value(20), "Failure", "SuccessConditionNotMet", id="at minSamples the condition decides"),
        pytest.param(fp.empty(), "NoData", "Empty", id="count not scraped"),
        pytest.param(fp.stale(90, 100), "NoData", "Stale", id="stale count"),
        pytest.param(fp.http(503), "Error", "MetricsUnavailable", id="count query failed"),
    ],
)
def test_min_samples_guards_a_condition_gate(count: fp.Reply, want_verdict: str, want_reason: str) -> None:
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5")
    v = g.evaluate_gate(gate, res(fp.value(0.9), "canary-q"), None, WINDOW, g.GateSamples(arm(count)))
    assert (v.verdict, v.reason) == (want_verdict, want_reason)
    if want_reason == "TooFewSamples":
        assert "minSamples 20" in v.condition and v.query == "count-q" and v.value == "0.9"


def test_without_sample_answers_min_samples_is_not_checked() -> None:
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5")
    assert g.evaluate_gate(gate, res(fp.value(0.4)), None, WINDOW).verdict == "Success"


# --- compare: errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "canary", "stable", "value", "want_verdict", "want_reason"),
    [
        pytest.param(
            errors_gate(),
            arm(40, errors=1),
            arm(6000, errors=30),
            0.025,
            "Success",
            "NotSignificantlyWorse",
            id="1 error in 40 vs 0.5 %: not a failure",
        ),
        pytest.param(
            errors_gate(),
            arm(40, errors=6),
            arm(6000, errors=30),
            0.15,
            "Failure",
            "SignificantlyWorse",
            id="6 in 40: significant and above the 1 % floor",
        ),
        pytest.param(
            errors_gate("result > 0.2"),
            arm(40, errors=6),
            arm(6000, errors=30),
            0.15,
            "Success",
            "WorseWithinCondition",
            id="significant but under the absolute floor",
        ),
        pytest.param(
            errors_gate(None),
            arm(40, errors=6),
            arm(6000, errors=30),
            0.15,
            "Failure",
            "SignificantlyWorse",
            id="compare alone",
        ),
        pytest.param(
            errors_gate(),
            arm(12, errors=6),
            arm(6000, errors=30),
            0.5,
            "NoData",
            "TooFewSamples",
            id="below minSamples even when obviously bad",
        ),
        pytest.param(
            errors_gate(),
            arm(40, errors=6),
            arm(10, errors=0),
            0.15,
            "NoData",
            "BaselineTooFewSamples",
            id="stable below minSamples",
        ),
        pytest.param(
            errors_gate(),
            arm(40, errors=fp.empty()),
            arm(6000, errors=30),
            0.15,
            "NoData",
            "Empty",
            id="canary errors not scraped",
        ),
        pytest.param(
            errors_gate(),
            arm(40, errors=2),
            arm(6000, errors=fp.nan()),
            0.05,
            "NoData",
            "BaselineNaN",
            id="stable errors NaN",
        ),
    ],
)
def test_compare_errors(
    gate: MetricGate,
    canary: g.SampleResults,
    stable: g.SampleResults,
    value: float,
    want_verdict: str,
    want_reason: str,
) -> None:
    v = g.evaluate_gate(gate, res(fp.value(value)), res(fp.value(0.005)), WINDOW, g.GateSamples(canary, stable))
    assert (v.verdict, v.reason) == (want_verdict, want_reason), v.condition
    if want_reason.endswith("Worse") or want_reason == "WorseWithinCondition":
        assert "p=" in v.condition and v.baseline == "0.005"


# --- compare: latency --------------------------------------------------------------------------------

STABLE_TPOT = [("0.01", 6000.0), ("0.025", 6000.0), ("+Inf", 6000.0)]
CANARY_TPOT = [("0.01", 300.0), ("0.025", 300.0), ("+Inf", 300.0)]


@pytest.mark.parametrize(
    ("canary", "stable", "want_verdict", "want_reason"),
    [
        pytest.param(
            arm(300, buckets=CANARY_TPOT, total=300 * 0.0091),
            arm(6000, buckets=STABLE_TPOT, total=6000 * 0.007),
            "Failure",
            "SignificantlyWorse",
            id="TPOT x 1.3 inside the first bucket: seen through the means",
        ),
        pytest.param(
            arm(300, buckets=CANARY_TPOT, total=300 * 0.0072),
            arm(6000, buckets=STABLE_TPOT, total=6000 * 0.007),
            "Success",
            "NotSignificantlyWorse",
            id="x 1.03: within the allowed ratio",
        ),
        pytest.param(
            arm(300, buckets=[("0.01", 300.0), ("0.025", 300.0)], total=2.7),
            arm(6000, buckets=STABLE_TPOT, total=42.0),
            "NoData",
            "InvalidQueryResult",
            id="no +Inf bucket",
        ),
        pytest.param(
            arm(300, buckets=fp.multi(1, 2), total=2.7),
            arm(6000, buckets=STABLE_TPOT, total=42.0),
            "NoData",
            "InvalidQueryResult",
            id="series without le",
        ),
        pytest.param(
            arm(300, buckets=[("0.01", 300.0), ("0.01", 300.0), ("+Inf", 300.0)], total=2.7),
            arm(6000, buckets=STABLE_TPOT, total=42.0),
            "NoData",
            "InvalidQueryResult",
            id="duplicate le",
        ),
        pytest.param(
            arm(300, buckets=fp.buckets([("0.01", 300.0), ("+Inf", 300.0)], age_s=90), total=2.7),
            arm(6000, buckets=STABLE_TPOT, total=42.0),
            "NoData",
            "Stale",
            id="stale buckets",
        ),
        pytest.param(
            arm(300, buckets=CANARY_TPOT, total=2.7),
            arm(6000, buckets=fp.empty(), total=42.0),
            "NoData",
            "BaselineEmpty",
            id="stable buckets not scraped",
        ),
        pytest.param(
            arm(300, buckets=CANARY_TPOT, total=fp.http(400)),
            arm(6000, buckets=STABLE_TPOT, total=42.0),
            "Error",
            "InvalidQuery",
            id="sum query rejected",
        ),
    ],
)
def test_compare_latency(canary: g.SampleResults, stable: g.SampleResults, want_verdict: str, want_reason: str) -> None:
    v = g.evaluate_gate(tpot_gate(), res(fp.value(0.009)), res(fp.value(0.009)), WINDOW, g.GateSamples(canary, stable))
    assert (v.verdict, v.reason) == (want_verdict, want_reason), v.condition


def test_compare_latency_with_a_condition_floor() -> None:
    gate = tpot_gate(success_condition="result <= 0.0167")  # 60 tokens/s: an absolute SLO
    samples = g.GateSamples(
        arm(300, buckets=CANARY_TPOT, total=300 * 0.0091), arm(6000, buckets=STABLE_TPOT, total=6000 * 0.007)
    )
    v = g.evaluate_gate(gate, res(fp.value(0.009)), res(fp.value(0.009)), WINDOW, samples)
    assert (v.verdict, v.reason) == ("Success", "WorseWithinCondition")
    assert v.condition.startswith("success: result <= 0.0167; mean 9.1 ms vs stable 7 ms (x1.3")


def test_compare_requires_sample_answers() -> None:
    with pytest.raises(ValueError, match="no sample results"):
        g.evaluate_gate(tpot_gate(), res(fp.value(0.009)), res(fp.value(0.009)), WINDOW)


def test_compare_without_condition_is_valid_in_the_api() -> None:
    gate = MetricGate.model_validate({"name": "tpot", "template": "TPOTP90", "compare": {}})
    assert gate.compare == GateComparison(confidence_percent=99, max_mean_ratio_percent=110)
    assert gate.min_samples == 20


def _pool(metric: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "speed"},
        "spec": {
            "model": {"servedName": "Qwen/Qwen3-8B", "source": "hf://Qwen/Qwen3-8B", "quantization": "bf16"},
            "stack": {"version": "v1", "image": "docker.io/vllm/vllm-openai-rocm:v0.33.0@sha256:" + "3f" * 32},
            "rollout": {"analysis": {"metrics": [{"name": "g", **metric}]}},
        },
    }


@pytest.mark.parametrize(
    ("metric", "want_error"),
    [
        pytest.param({"template": "ErrorRate", "compare": {}}, None, id="compare alone is a gate"),
        pytest.param(
            {"template": "TPOTP90", "compare": {"confidencePercent": 95}, "minSamples": 100}, None, id="all fields"
        ),
        pytest.param({"template": "ErrorRate"}, "a condition is required", id="neither condition nor compare"),
        pytest.param({"template": "LocalKVHitRatio", "compare": {}}, None, id="hit ratio compares its tokens"),
        pytest.param(
            {"query": "up", "successCondition": "result > 0.0", "compare": {}},
            "compare needs a template",
            id="own query has no counts",
        ),
        pytest.param(
            {"template": "TPOTP90", "compare": {"confidencePercent": 100}}, "confidencePercent", id="100 % is no test"
        ),
        pytest.param({"template": "TPOTP90", "compare": {}, "minSamples": -1}, "minSamples", id="negative floor"),
    ],
)
def test_validate_compare_and_min_samples(metric: dict[str, object], want_error: str | None) -> None:
    errors = [str(e) for e in validate_object(_pool(metric))]
    if want_error is None:
        assert errors == []
    else:
        assert any(want_error in e for e in errors), errors


# --- compare: the power floor --------------------------------------------------------------------------


def powered_errors_gate(min_power: int = 80, **kw: object) -> MetricGate:
    return MetricGate(
        name="errors",
        template="ErrorRate",
        failure_condition="result > 0.01",
        compare=GateComparison(min_power_percent=min_power, **kw),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("gate", "canary", "want"),
    [
        pytest.param(
            powered_errors_gate(), arm(60, errors=1), ("NoData", "Underpowered"), id="60 requests: 6 % power < 80 %"
        ),
        pytest.param(
            powered_errors_gate(), arm(3000, errors=15), ("Success", "NotSignificantlyWorse"), id="3000: powered"
        ),
        pytest.param(
            powered_errors_gate(), arm(60, errors=6), ("Failure", "SignificantlyWorse"), id="a Failure needs no power"
        ),
        pytest.param(
            powered_errors_gate(0), arm(60, errors=1), ("Success", "NotSignificantlyWorse"), id="floor off (default)"
        ),
        pytest.param(
            powered_errors_gate(error_increase_permille=100),
            arm(60, errors=1),
            ("Success", "NotSignificantlyWorse"),
            id="+10 points is visible in 60 requests",
        ),
    ],
)
def test_power_floor_turns_an_uninformative_pass_into_no_data(
    gate: MetricGate, canary: g.SampleResults, want: tuple[str, str]
) -> None:
    value = res(fp.value(0.1 if want[0] == "Failure" else 0.0))  # the template's error rate over the same window
    v = g.evaluate_gate(gate, value, res(fp.value(0.005)), WINDOW, g.GateSamples(canary, arm(6000, errors=30)))
    assert (v.verdict, v.reason) == want, v.condition
    assert "power" in v.condition
    # An Underpowered verdict names the floor it waits for, and only that verdict does.
    assert ("below minPowerPercent 80" in v.condition) == (want[1] == "Underpowered"), v.condition


def test_an_undecided_step_errors_gate_is_decided_by_its_power_floor() -> None:
    """The gate hands its floor to Wald's test: W5 seed 16's +1-point canary, Underpowered for 48 looks, fails
    where a single test of its 2,346 requests has 99 % power (core.comparison, "Truncation")."""
    gate = powered_errors_gate(99, window="Step")
    samples = g.GateSamples(arm(2346, errors=26), arm(123_215, errors=651))
    v = g.evaluate_gate(
        gate, res(fp.value(0.0111)), res(fp.value(0.0053)), dataclasses.replace(WINDOW, interval_s=30), samples
    )
    assert (v.verdict, v.reason) == ("Failure", "SignificantlyWorse"), v.condition
    assert "undecided; truncated" in v.condition
    held = g.evaluate_gate(
        gate.model_copy(update={"compare": gate.compare.model_copy(update={"min_power_percent": 0})}),  # type: ignore[union-attr]
        res(fp.value(0.0111)),
        res(fp.value(0.0053)),
        dataclasses.replace(WINDOW, interval_s=30),
        samples,
    )
    assert (held.verdict, held.reason) == ("Success", "NotSignificantlyWorse"), held.condition  # no floor: Wald's


def test_a_long_condition_keeps_the_floor_it_waits_for() -> None:
    """The condition text is clipped at 1,024 characters; the summary gives way, not the Underpowered note."""
    long = "result >" + " " * 1_100 + "0.01"  # the condition alone is longer than the limit
    gate = powered_errors_gate().model_copy(update={"failure_condition": long})
    v = g.evaluate_gate(
        gate, res(fp.value(0.0)), res(fp.value(0.005)), WINDOW, g.GateSamples(arm(60, errors=1), arm(6000, errors=30))
    )
    assert (v.verdict, v.reason) == ("NoData", "Underpowered"), v.condition
    assert len(v.condition) <= 1024 and v.condition.endswith("…; power below minPowerPercent 80"), v.condition[-80:]


def test_power_floor_on_latency_uses_the_allowed_ratio() -> None:
    gate = MetricGate(name="tpot", template="TPOTP90", compare=GateComparison(min_power_percent=80))
    stable = arm(6000, buckets=STABLE_TPOT, total=6000 * 0.007)

    def judge(n: float) -> GateVerdict:
        """``n`` canary requests, every TPOT in the first bucket, mean 7.1 ms (stable's 7.0 ms)."""
        canary = arm(n, buckets=[("0.01", n), ("0.025", n), ("+Inf", n)], total=n * 0.0071)
        return g.evaluate_gate(gate, res(fp.value(0.009)), res(fp.value(0.009)), WINDOW, g.GateSamples(canary, stable))

    small, big = judge(300), judge(3000)
    # 300 requests, bound 21 ms², x1.1 of 7 ms at α/2 = 0.005: power 0.50 (core.stats.mean_power's example).
    assert (small.verdict, small.reason) == ("NoData", "Underpowered") and "power 50." in small.condition
    assert (big.verdict, big.reason) == ("Success", "NotSignificantlyWorse"), big.condition
