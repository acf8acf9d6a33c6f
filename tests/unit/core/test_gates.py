"""Gate verdicts (testing.md §5): validity rules, conditions, baselines, eval jobs. MP-02, MP-03, MP-04."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.pool import AnalysisSpec, EvalGate, MetricGate
from tandem.core import gates as g
from tandem.core.promql import QueryRenderError, QueryResult, QueryStatus
from tests.fakes import prometheus as fp

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NOW = START + timedelta(seconds=120)
WINDOW = g.SampleWindow(now=NOW, step_started_at=START, initial_delay_s=60, max_age_s=30, rate_window_s=30)
IMAGE = "ghcr.io/acme/eval@sha256:" + "a" * 64


def gate(success: str | None = "result <= 0.5", failure: str | None = None, **kw: object) -> MetricGate:
    return MetricGate(name="ttft", template="TTFTP90", success_condition=success, failure_condition=failure, **kw)  # type: ignore[arg-type]


CANARY_Q = 'canary_q{revision="c"}'


def res(reply: fp.Reply, query: str = CANARY_Q, now: datetime = NOW) -> QueryResult:
    """The answer and its freshness, as the adapter combines them (a real answer is stamped ``now``)."""
    return fp.answer(reply, now.timestamp(), query)


@pytest.mark.parametrize(
    ("reply", "want_verdict", "want_reason"),
    [
        pytest.param(
            fp.value("0.475"), "Success", "SuccessConditionMet", id="fresh single finite value meets condition"
        ),
        pytest.param(fp.value("0.71"), "Failure", "SuccessConditionNotMet", id="value misses the condition"),
        pytest.param(fp.scalar("0.4"), "Success", "SuccessConditionMet", id="a scalar is one value"),
        # MP-02
        pytest.param(fp.nan(), "NoData", "NaN", id="NaN (0/0 at zero traffic)"),
        pytest.param(fp.empty(), "NoData", "Empty", id="empty result"),
        pytest.param(fp.stale(31), "NoData", "Stale", id="older than 2 x scrape interval"),
        pytest.param(fp.stale(-31), "NoData", "Stale", id="from the future (clock skew)"),
        pytest.param(fp.partial(), "NoData", "Partial", id="warnings mean partial data"),
        # MP-03
        pytest.param(fp.multi("0.1", "0.2"), "NoData", "InvalidQueryResult", id="two series, never pick one"),
        pytest.param(fp.inf(), "NoData", "InvalidQueryResult", id="+Inf"),
        pytest.param(fp.inf(-1), "NoData", "InvalidQueryResult", id="-Inf"),
        pytest.param(fp.matrix(), "NoData", "InvalidQueryResult", id="range vector"),
        # MP-04 and R-04
        pytest.param(fp.http(400, "parse error", "bad_data"), "Error", "InvalidQuery", id="HTTP 400"),
        pytest.param(fp.http(422, "many-to-many", "execution"), "Error", "InvalidQuery", id="HTTP 422"),
        pytest.param(fp.http(503), "Error", "MetricsUnavailable", id="HTTP 503"),
        pytest.param(fp.http(500), "Error", "MetricsUnavailable", id="HTTP 500"),
        pytest.param(fp.http(401), "Error", "MetricsUnavailable", id="HTTP 401"),
        pytest.param(fp.refused(), "Error", "MetricsUnavailable", id="connection refused"),
        pytest.param(fp.timeout(), "Error", "MetricsUnavailable", id="timeout"),
        pytest.param(fp.unparsable(), "Error", "MetricsUnavailable", id="unparsable body"),
    ],
)
def test_evaluate_gate_verdicts(reply: fp.Reply, want_verdict: str, want_reason: str) -> None:
    v = g.evaluate_gate(gate(), res(reply), None, WINDOW)
    assert (v.verdict, v.reason) == (want_verdict, want_reason)
    # every verdict is explained
    assert v.name == "ttft" and v.condition == "success: result <= 0.5" and v.query == CANARY_Q
    assert v.evaluated_at is not None


@pytest.mark.parametrize(
    ("age_s", "want_reason"),
    [
        pytest.param(90, "TooEarly", id="taken before initialDelay (60 s) ended"),
        pytest.param(61, "TooEarly", id="59 s after the start is inside initialDelay"),
        pytest.param(30, "SuccessConditionMet", id="exactly 2 x scrape old is still fresh"),
    ],
)
def test_evaluate_gate_sample_must_follow_step_start_and_initial_delay(age_s: float, want_reason: str) -> None:
    v = g.evaluate_gate(gate(), res(fp.value("0.4", age_s=age_s)), None, WINDOW)
    assert v.reason == want_reason


def test_evaluate_gate_rate_window_must_lie_inside_the_step() -> None:
    window = g.SampleWindow(now=NOW, step_started_at=START, initial_delay_s=10, max_age_s=30, rate_window_s=150)
    assert g.evaluate_gate(gate(), res(fp.value("0.4")), None, window).reason == "TooEarly"
    assert window.not_before == START + timedelta(seconds=150)


@pytest.mark.parametrize(
    ("success", "failure", "value", "want_verdict", "want_reason"),
    [
        pytest.param(
            None,
            "result > 0.05",
            "0.01",
            "Success",
            "FailureConditionNotMet",
            id="failure-only: not failing is Success",
        ),
        pytest.param(None, "result > 0.05", "0.06", "Failure", "FailureConditionMet", id="failure-only: failing"),
        pytest.param("result < 0.5", "result > 1.0", "0.7", "NoData", "Inconclusive", id="both: neither holds"),
        pytest.param("result < 0.5", "result > 1.0", "0.4", "Success", "SuccessConditionMet", id="both: success holds"),
        pytest.param(
            "result < 5.0", "result > 1.0", "2", "Failure", "FailureConditionMet", id="both hold: failure wins"
        ),
        pytest.param(
            "result <= 1", None, "0.5", "Success", "SuccessConditionMet", id="double compared with an int literal"
        ),
        pytest.param("result == 1", None, "1", "Error", "InvalidQuery", id="CEL equality double vs int errors"),
        pytest.param("result + 1.0", None, "1", "Error", "InvalidQuery", id="condition not boolean"),
        pytest.param("results < 1.0", None, "1", "Error", "InvalidQuery", id="unknown variable"),
        pytest.param("result <=", None, "1", "Error", "InvalidQuery", id="does not compile"),
    ],
)
def test_evaluate_gate_conditions(
    success: str | None, failure: str | None, value: str, want_verdict: str, want_reason: str
) -> None:
    v = g.evaluate_gate(gate(success, failure), res(fp.value(value)), None, WINDOW)
    assert (v.verdict, v.reason) == (want_verdict, want_reason)
    compiles = success != "result <="
    assert v.value == (value if compiles else "")  # a condition that does not compile is judged before the data


def test_condition_that_does_not_compile_is_invalid_even_without_data() -> None:
    v = g.evaluate_gate(gate("result <"), res(fp.refused()), None, WINDOW)
    assert (v.verdict, v.reason) == ("Error", "InvalidQuery")


def test_a_gate_without_conditions_never_passes() -> None:
    v = g.evaluate_gate(gate(None, None), res(fp.value("0.1")), None, WINDOW)
    assert (v.verdict, v.reason) == ("Error", "InvalidQuery")


# --- baseline --------------------------------------------------------------------------------------

REL = "result <= baseline * 1.2"


@pytest.mark.parametrize(
    ("canary", "baseline", "want_verdict", "want_reason"),
    [
        pytest.param(fp.value("0.47"), fp.value("0.47"), "Success", "SuccessConditionMet", id="canary like stable"),
        pytest.param(fp.value("0.70"), fp.value("0.47"), "Failure", "SuccessConditionNotMet", id="canary 1.5x stable"),
        pytest.param(fp.value("0.47"), fp.nan(), "NoData", "BaselineNaN", id="stable idle"),
        pytest.param(fp.value("0.47"), fp.empty(), "NoData", "BaselineEmpty", id="stable not scraped"),
        pytest.param(fp.value("0.47"), fp.multi(), "NoData", "BaselineInvalidQueryResult", id="stable multi-series"),
        pytest.param(fp.value("0.47"), fp.refused(), "Error", "MetricsUnavailable", id="baseline query refused"),
        pytest.param(fp.nan(), fp.nan(), "NoData", "NaN", id="both NaN: the canary's reason"),
        pytest.param(
            fp.empty(), fp.http(400), "Error", "InvalidQuery", id="an invalid baseline query outranks canary NoData"
        ),
        pytest.param(
            fp.http(503), fp.http(422), "Error", "InvalidQuery", id="InvalidQuery outranks MetricsUnavailable"
        ),
        pytest.param(fp.http(400), fp.refused(), "Error", "InvalidQuery", id="canary invalid"),
    ],
)
def test_evaluate_gate_with_baseline(canary: fp.Reply, baseline: fp.Reply, want_verdict: str, want_reason: str) -> None:
    v = g.evaluate_gate(gate(REL), res(canary), res(baseline, 'baseline_q{revision="s"}'), WINDOW)
    assert (v.verdict, v.reason) == (want_verdict, want_reason)


def test_baseline_value_and_query_are_shown() -> None:
    v = g.evaluate_gate(gate(REL), res(fp.value("0.7")), res(fp.value("0.47"), 'baseline_q{revision="s"}'), WINDOW)
    assert (v.value, v.baseline, v.query) == ("0.7", "0.47", CANARY_Q)
    bad = g.evaluate_gate(gate(REL), res(fp.value("0.7")), res(fp.http(400), 'baseline_q{revision="s"}'), WINDOW)
    assert bad.query == 'baseline_q{revision="s"}'  # the query that is broken


def test_baseline_required_when_the_condition_reads_it() -> None:
    with pytest.raises(ValueError, match="baseline"):
        g.evaluate_gate(gate(REL), res(fp.value("0.7")), None, WINDOW)


def test_baseline_ignored_when_the_condition_does_not_read_it() -> None:
    v = g.evaluate_gate(gate(), res(fp.value("0.4")), res(fp.http(400)), WINDOW)
    assert v.verdict == "Success" and v.baseline == ""


def test_multi_series_shows_the_series_count_not_a_value() -> None:
    v = g.evaluate_gate(gate(), res(fp.multi("0.1", "0.9", "0.3")), None, WINDOW)
    assert v.value == "3 series"


# --- query resolution -------------------------------------------------------------------------------


def test_resolve_gate_queries_renders_baseline_on_the_stable_revision() -> None:
    q = g.resolve_gate_queries(
        gate(REL), namespace="ml", pool="speed", canary_revision="new1", stable_revision="old1", interval="1m"
    )
    assert 'revision="new1"' in q.canary and 'role=~"decode"' in q.canary
    assert q.baseline is not None and 'revision="old1"' in q.baseline
    plain = g.resolve_gate_queries(
        gate(), namespace="ml", pool="speed", canary_revision="n", stable_revision="o", interval="1m"
    )
    assert plain.baseline is None


def test_resolve_gate_queries_fails_without_a_stable_revision_for_baseline() -> None:
    with pytest.raises(QueryRenderError, match="stable revision"):
        g.resolve_gate_queries(
            gate(REL), namespace="ml", pool="speed", canary_revision="n", stable_revision=None, interval="1m"
        )


@pytest.mark.parametrize(
    ("success", "failure", "want"),
    [
        pytest.param("result <= baseline * 1.2", None, True, id="success reads baseline"),
        pytest.param(None, "result > baseline", True, id="failure reads baseline"),
        pytest.param("result <= 0.5", None, False, id="no baseline"),
        pytest.param("result <= baselines", None, False, id="a longer word is not baseline"),
    ],
)
def test_references_baseline(success: str | None, failure: str | None, want: bool) -> None:
    assert g.references_baseline(gate(success, failure)) is want


def test_invalid_query_verdict_for_a_query_that_cannot_render() -> None:
    m = MetricGate(name="custom", query='x{pool="${nope}"}', success_condition="result < 1.0")
    v = g.invalid_query_verdict(m, now=NOW)
    assert (v.verdict, v.reason, v.query, v.condition) == (
        "Error",
        "InvalidQuery",
        'x{pool="${nope}"}',
        "success: result < 1.0",
    )


def test_sample_window_for_analysis_uses_spec_and_scrape_interval() -> None:
    w = g.SampleWindow.for_analysis(
        AnalysisSpec(initial_delay="90s"), now=NOW, step_started_at=START, scrape_interval_s=15, rate_window_s=60
    )
    assert (w.initial_delay_s, w.max_age_s, w.not_before) == (90, 30, START + timedelta(seconds=90))


def test_explain_verdict_names_value_baseline_and_condition() -> None:
    v = g.evaluate_gate(gate(REL), res(fp.value("0.7")), res(fp.value("0.47")), WINDOW)
    assert g.explain_verdict(v) == (
        "ttft Failure (SuccessConditionNotMet) value=0.7 baseline=0.47 [success: result <= baseline * 1.2]"
    )


def test_long_values_are_clipped_to_the_status_bounds() -> None:
    v = g.evaluate_gate(gate(), res(fp.value("0." + "1" * 100)), None, WINDOW)
    assert len(v.value) == 64


# --- properties ----------------------------------------------------------------------------------

NO_DATA_REPLIES = st.sampled_from(
    [fp.nan(), fp.empty(), fp.stale(31), fp.stale(200), fp.partial(), fp.multi(), fp.inf(), fp.inf(-1), fp.matrix()]
)
ERROR_REPLIES = st.sampled_from([fp.refused(), fp.timeout(), fp.unparsable(), fp.http(500), fp.http(503), fp.http(400)])
CONDITIONS = st.sampled_from(
    [
        ("result <= 0.5", None),
        ("result >= 0.0", None),
        ("true", None),
        (None, "result > 1.0"),
        (None, "false"),
        ("result < 1.0", "result > 2.0"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(reply=NO_DATA_REPLIES | ERROR_REPLIES, conditions=CONDITIONS)
def test_empty_nan_stale_partial_multi_inf_and_errors_never_pass_or_fail(
    reply: fp.Reply, conditions: tuple[str | None, str | None]
) -> None:
    """MP-02/MP-03/MP-04: whatever the condition (even `true`), an invalid result is never a pass or a fail."""
    v = g.evaluate_gate(gate(*conditions), res(reply), None, WINDOW)
    assert v.verdict in ("NoData", "Error")
    assert v.reason


@settings(max_examples=200, deadline=None)
@given(
    value=st.floats(min_value=-1e6, max_value=1e6),
    age=st.floats(min_value=0, max_value=30),
    threshold=st.floats(min_value=-1e6, max_value=1e6),
)
def test_valid_samples_pass_exactly_when_the_condition_holds(value: float, age: float, threshold: float) -> None:
    v = g.evaluate_gate(gate(f"result <= {threshold!r}"), res(fp.value(repr(value), age_s=age)), None, WINDOW)
    assert v.verdict == ("Success" if value <= threshold else "Failure")


# --- eval gate -------------------------------------------------------------------------------------

EVAL = EvalGate(image=IMAGE, min_score_percent=98, deadline="20m")


@pytest.mark.parametrize(
    ("state", "message", "after_s", "want"),
    [
        pytest.param(
            "Succeeded", '{"score": 98.4}', 600, ("Success", "ScoreAtOrAboveThreshold", "98.4"), id="score above"
        ),
        pytest.param(
            "Succeeded", '{"score": 98}', 600, ("Success", "ScoreAtOrAboveThreshold", "98"), id="at threshold"
        ),
        pytest.param("Succeeded", '{"score": 97.9}', 600, ("Failure", "ScoreBelowThreshold", "97.9"), id="score below"),
        pytest.param("Succeeded", "", 600, ("Error", "EvalNoResult", ""), id="no termination message"),
        pytest.param("Succeeded", "score=99", 600, ("Error", "EvalNoResult", ""), id="not json"),
        pytest.param("Succeeded", '{"score": "99"}', 600, ("Error", "EvalNoResult", ""), id="score is a string"),
        pytest.param("Succeeded", '{"score": 101}', 600, ("Error", "EvalNoResult", ""), id="score above 100"),
        pytest.param("Succeeded", '{"score": NaN}', 600, ("Error", "EvalNoResult", ""), id="NaN score"),
        pytest.param("Failed", '{"score": 99}', 600, ("Error", "EvalFailed", ""), id="job failed"),
        pytest.param("Running", None, 600, ("NoData", "EvalRunning", ""), id="still running"),
        pytest.param("Pending", None, 600, ("NoData", "EvalRunning", ""), id="pending"),
        pytest.param("Running", None, 1200, ("Error", "EvalDeadlineExceeded", ""), id="running past its deadline"),
    ],
)
def test_evaluate_eval_gate(
    state: g.EvalJobState, message: str | None, after_s: float, want: tuple[str, str, str]
) -> None:
    job = g.EvalJobObservation(name="speed-eval-7f3a", state=state, started_at=START, termination_message=message)
    v = g.evaluate_eval_gate(EVAL, job, now=START + timedelta(seconds=after_s))
    assert (v.verdict, v.reason, v.value) == want
    assert (v.name, v.condition, v.query) == ("eval", "score >= 98", "job/speed-eval-7f3a")


def test_fake_results_carry_status() -> None:
    assert res(fp.refused()).status is QueryStatus.REFUSED
