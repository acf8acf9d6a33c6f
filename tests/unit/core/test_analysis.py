"""Analysis step evaluation (testing.md §5): streaks, failure limit, NoData deadline, pacing. MP-01, MP-05."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.pool import AnalysisSpec, AnalysisStep, EvalGate, MetricGate
from tandem.api.pool_status import AnalysisProgress, GateVerdict
from tandem.core import analysis as a
from tandem.core import gates as g
from tests.fakes import prometheus as fp

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = AnalysisSpec(
    interval="30s", timeout="10s", initial_delay="60s", success_streak=3, failure_limit=1, no_data_deadline="2m"
)
S, F, N, E, Q = "Success", "Failure", "NoData", "Error", "InvalidQuery"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def verdicts(*kinds: str) -> list[GateVerdict]:
    out = []
    for i, kind in enumerate(kinds):
        if kind == Q:
            out.append(GateVerdict(name=f"g{i}", verdict="Error", reason="InvalidQuery"))
        elif kind == E:
            out.append(GateVerdict(name=f"g{i}", verdict="Error", reason="MetricsUnavailable"))
        else:
            out.append(GateVerdict(name=f"g{i}", verdict=kind, reason="x", value="0.1"))  # type: ignore[arg-type]
    return out


def run(
    steps: Sequence[tuple[float, Sequence[str]]], spec: AnalysisSpec = SPEC, progress: AnalysisProgress | None = None
) -> list[a.StepEvaluation]:
    """Feed (t, verdict kinds) in order, threading the progress; returns every evaluation."""
    p = progress or AnalysisProgress()
    out = []
    for t, kinds in steps:
        ev = a.evaluate_step(p, verdicts(*kinds), spec, T0, at(t))
        p = ev.progress
        out.append(ev)
    return out


def test_docstring_worked_example() -> None:
    evs = run([(30, [S, S]), (60, [S, S]), (90, [S, N]), (120, [S, F]), (150, [S, S]), (180, [S, S]), (210, [S, S])])
    rows = [
        (ev.evaluated, ev.progress.success_streak, ev.progress.failures, ev.progress.no_data_since, ev.outcome)
        for ev in evs
    ]
    assert rows == [
        (False, 0, 0, None, a.Outcome.CONTINUE),
        (True, 1, 0, None, a.Outcome.CONTINUE),
        (True, 0, 0, at(90), a.Outcome.CONTINUE),
        (True, 0, 1, None, a.Outcome.CONTINUE),
        (True, 1, 1, None, a.Outcome.CONTINUE),
        (True, 2, 1, None, a.Outcome.CONTINUE),
        (True, 3, 1, None, a.Outcome.PASSED),
    ]
    assert evs[0].next_due == at(60)
    assert evs[-1].reason == "SuccessStreakReached"


@pytest.mark.parametrize(
    ("steps", "want_outcome", "want_reason"),
    [
        pytest.param([(60, [S]), (90, [F])], a.Outcome.CONTINUE, "WaitingForStreak", id="one failure within limit 1"),
        pytest.param(
            [(60, [F]), (90, [F])], a.Outcome.FAILED, "FailureLimitExceeded", id="two failures exceed limit 1"
        ),
        pytest.param(
            [(60, [F, F, F])], a.Outcome.CONTINUE, "WaitingForStreak", id="failures count once per evaluation"
        ),
        pytest.param([(60, [S, Q])], a.Outcome.PAUSED, "InvalidQuery", id="invalid query pauses at once"),
        pytest.param(
            [(60, [F, Q]), (90, [F])], a.Outcome.CONTINUE, "WaitingForStreak", id="a paused pass counts no failure"
        ),
        pytest.param([(60, [])], a.Outcome.PAUSED, "NoGates", id="a step without gates pauses"),
        pytest.param([(60, [N]), (90, [E]), (150, [N])], a.Outcome.CONTINUE, "HoldingNoData", id="NoData holds"),
        pytest.param(
            [(60, [N]), (90, [E]), (120, [N]), (150, [N]), (180, [S, N])],
            a.Outcome.NO_DATA_DEADLINE,
            "NoDataDeadlineExceeded",
            id="NoData and Error for 2m reach the deadline",
        ),
        pytest.param(
            [(60, [N]), (90, [N]), (120, [S]), (150, [N]), (180, [N])],
            a.Outcome.CONTINUE,
            "HoldingNoData",
            id="one clean evaluation restarts the NoData clock",
        ),
        pytest.param(
            [(60, [S]), (90, [S]), (120, [E]), (150, [S])],
            a.Outcome.CONTINUE,
            "WaitingForStreak",
            id="Error resets the streak",
        ),
        pytest.param(
            [(60, [S]), (90, [S]), (180, [S])],
            a.Outcome.CONTINUE,
            "WaitingForStreak",
            id="a gap over 2 intervals restarts the streak",
        ),
        pytest.param(
            [(60, [S]), (90, [S]), (150, [S])],
            a.Outcome.PASSED,
            "SuccessStreakReached",
            id="a late but not missed evaluation keeps it",
        ),
    ],
)
def test_evaluate_step(steps: list[tuple[float, list[str]]], want_outcome: a.Outcome, want_reason: str) -> None:
    last = run(steps)[-1]
    assert (last.outcome, last.reason) == (want_outcome, want_reason)
    assert last.evaluated


def test_a_pass_says_how_many_failures_the_step_tolerated() -> None:
    """AnalysisPassed's text: "every gate Success" is only the last streak; a step that passed after Failures
    within failureLimit says so."""
    clean = run([(60, [S, S]), (90, [S, S]), (120, [S, S])])[-1]
    assert clean.outcome is a.Outcome.PASSED
    assert clean.message == "3 consecutive evaluations with every gate Success"
    after = run([(60, [S, F]), (90, [S, S]), (120, [S, S]), (150, [S, S])])[-1]
    assert after.outcome is a.Outcome.PASSED
    assert after.message.endswith("(after 1 failed evaluation(s), within failureLimit 1)")


def test_failure_limit_zero_fails_on_the_first_failure_and_minus_one_never() -> None:
    strict = SPEC.model_copy(update={"failure_limit": 0})
    assert run([(60, [F])], strict)[-1].outcome is a.Outcome.FAILED
    never = SPEC.model_copy(update={"failure_limit": -1})
    evs = run([(60 + 30 * i, [F]) for i in range(60)], never)
    assert {ev.outcome for ev in evs} == {a.Outcome.CONTINUE}
    assert evs[-1].progress.failures == 60


def _with_gates(spec: AnalysisSpec, step_window: str) -> AnalysisSpec:
    """``spec`` with gates g0 (ErrorRate, ``compare.window`` = ``step_window``) and g1 (a TPOT comparison)."""
    metrics = [
        MetricGate.model_validate({"name": "g0", "template": "ErrorRate", "compare": {"window": step_window}}),
        MetricGate.model_validate({"name": "g1", "template": "TPOTP90", "compare": {}}),
    ]
    return spec.model_copy(update={"metrics": metrics})


def test_a_step_window_failure_fails_the_step_without_waiting_out_failure_limit() -> None:
    """A Step gate's test holds its α over every look: its first Failure fails the step (the errors canary's
    confirming look cost W5 about 55 requests); an Interval gate's Failure still counts one of failureLimit."""
    step = _with_gates(SPEC, "Step")
    first = run([(60, [S, S]), (90, [F, S])], step)[-1]
    assert first.outcome is a.Outcome.FAILED and first.reason == "FailureLimitExceeded"
    assert first.message.startswith("a window: Step gate failed") and first.progress.failures == 2
    # g1 is on Interval windows: its Failure is one of the failureLimit 1 tolerated
    assert run([(60, [S, S]), (90, [S, F])], step)[-1].outcome is a.Outcome.CONTINUE
    interval = _with_gates(SPEC, "Interval")
    assert run([(60, [S, S]), (90, [F, S])], interval)[-1].outcome is a.Outcome.CONTINUE
    never = _with_gates(SPEC.model_copy(update={"failure_limit": -1}), "Step")
    assert {ev.outcome for ev in run([(60 + 30 * i, [F, S]) for i in range(5)], never)} == {a.Outcome.CONTINUE}


def _ttft_apart(limit: int | None) -> AnalysisSpec:
    """g0 a TTFT gate with its own failureLimit (None: shares it); g1 and g2 share SPEC's failureLimit 1."""
    own = {} if limit is None else {"failureLimit": limit}
    metrics = [
        MetricGate.model_validate({"name": "g0", "template": "TTFTP95", "compare": {}, **own}),
        MetricGate.model_validate({"name": "g1", "template": "TPOTP90", "compare": {}}),
        MetricGate.model_validate({"name": "g2", "template": "LocalKVHitRatio", "compare": {}}),
    ]
    return SPEC.model_copy(update={"metrics": metrics})


def test_a_gate_with_its_own_failure_limit_is_counted_apart() -> None:
    """W5 seed 10: two TTFT false alarms eleven looks apart rolled back a good canary under the shared count; with
    the TTFT gate at failureLimit 2 they are two of its three, and another gate's Failure does not add to them."""
    spec = _ttft_apart(2)
    looks = [(60 + 30 * i, kinds) for i, kinds in enumerate([[F, S, S], [S, S, S], [S, F, S], [F, S, S]])]
    evs = run(looks, spec)
    assert [ev.outcome for ev in evs] == [a.Outcome.CONTINUE] * 4
    assert (evs[-1].progress.failures, evs[-1].progress.gate_failures) == (1, {"g0": 2})
    assert "g0 2 failure(s)" in evs[-1].message
    third = run([*looks, (180, [F, S, S])], spec)[-1]
    assert third.outcome is a.Outcome.FAILED and third.reason == "FailureLimitExceeded"
    assert third.message.startswith("g0: 3 failed evaluation(s) > its failureLimit 2"), third.message
    # the same looks under the shared count: the second evaluation with a Failure fails the step
    assert [ev.outcome for ev in run(looks, _ttft_apart(None))][1:3] == [a.Outcome.CONTINUE, a.Outcome.FAILED]
    # the other two gates still share failureLimit 1
    assert run([(60, [S, F, S]), (90, [S, S, F])], spec)[-1].outcome is a.Outcome.FAILED
    # -1: that gate never fails the step
    never = run([(60 + 30 * i, [F, S, S]) for i in range(6)], _ttft_apart(-1))
    assert {ev.outcome for ev in never} == {a.Outcome.CONTINUE} and never[-1].progress.gate_failures == {"g0": 6}
    # a not-due call reports the standing outcome from the gate's own count; a new step starts clean
    early = a.evaluate_step(third.progress, verdicts(S, S, S), spec, T0, at(190))
    assert (early.evaluated, early.outcome) == (False, a.Outcome.FAILED)
    fresh = a.evaluate_step(third.progress, verdicts(S, S, S), spec, at(200), at(261))
    assert fresh.progress.gate_failures == {} and fresh.outcome is a.Outcome.CONTINUE


def test_at_most_one_evaluation_per_interval() -> None:
    first = a.evaluate_step(AnalysisProgress(), verdicts(S), SPEC, T0, at(60))
    again = a.evaluate_step(first.progress, verdicts(S), SPEC, T0, at(75))
    assert not again.evaluated and again.progress == first.progress
    assert again.next_due == at(90) and again.reason == "NotDue"
    assert a.next_evaluation_at(first.progress, SPEC, T0) == at(90)


def test_not_due_call_reports_the_standing_outcome() -> None:
    failed = run([(60, [F]), (90, [F])])[-1]
    assert failed.outcome is a.Outcome.FAILED
    early = a.evaluate_step(failed.progress, verdicts(S), SPEC, T0, at(100))
    assert (early.evaluated, early.outcome) == (False, a.Outcome.FAILED)


def test_invalid_query_is_retried_at_most_once_per_interval() -> None:
    """MP-04: InvalidQuery pauses at once and the next try is one interval later."""
    ev = run([(60, [Q])])[-1]
    assert ev.outcome is a.Outcome.PAUSED and ev.next_due == at(90)
    assert ev.progress.success_streak == 0


def test_progress_left_from_an_earlier_step_is_discarded() -> None:
    old = AnalysisProgress(success_streak=2, failures=1, no_data_since=T0 - timedelta(hours=1), last_evaluated_at=T0)
    ev = a.evaluate_step(old, verdicts(S), SPEC, T0 + timedelta(seconds=1), at(61))
    assert (ev.progress.success_streak, ev.progress.failures, ev.progress.no_data_since) == (1, 0, None)


def test_select_gates() -> None:
    m1 = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5")
    m2 = MetricGate(name="errors", template="ErrorRate", failure_condition="result > 0.01")
    ev = EvalGate(image="ghcr.io/acme/eval@sha256:" + "b" * 64, min_score_percent=98)
    spec = SPEC.model_copy(update={"metrics": [m1, m2], "eval": ev})
    assert a.select_gates(spec, AnalysisStep()) == a.GateSelection((m1, m2), False, ())
    assert a.select_gates(spec, AnalysisStep(metrics=["errors", "nope"], eval=True)) == a.GateSelection(
        (m2,), True, ("nope",)
    )
    assert a.select_gates(SPEC, AnalysisStep(eval=True)).eval is False


def test_mp01_refused_then_past_the_deadline_holds_then_applies_on_no_data() -> None:
    """MP-01: Prometheus refused for 3 min, then past noDataDeadline: hold, MetricsUnavailable at once,
    NoDataDeadline at the deadline ± 1 interval, 0 promotions (gates through the fake Prometheus)."""
    spec = AnalysisSpec(interval="30s", timeout="10s", initial_delay="60s", no_data_deadline="3m")
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5")
    fake = fp.FakePrometheus(now=lambda: clock[0])
    fake.always(fp.refused())
    clock = [T0]
    progress = AnalysisProgress()
    outcomes = []
    first_unavailable = None
    t = 0.0
    while t <= 600:
        clock[0] = at(t)
        due = a.next_evaluation_at(progress, spec, T0)
        if clock[0] >= due:
            window = g.SampleWindow.for_analysis(spec, now=clock[0], step_started_at=T0, scrape_interval_s=15)
            v = g.evaluate_gate(gate, fake.query("q", timeout_s=10), None, window)
            if v.reason == "MetricsUnavailable" and first_unavailable is None:
                first_unavailable = t
            ev = a.evaluate_step(progress, [v], spec, T0, clock[0])
            progress = ev.progress
            outcomes.append((t, ev.outcome))
            if ev.outcome is a.Outcome.NO_DATA_DEADLINE:
                break
        t += 5
    assert first_unavailable == 60  # the first due evaluation (≤ 2 intervals)
    assert a.Outcome.PASSED not in {o for _, o in outcomes}
    deadline_at = outcomes[-1][0]
    assert outcomes[-1][1] is a.Outcome.NO_DATA_DEADLINE
    assert abs(deadline_at - (60 + 180)) <= 30  # onNoData at the deadline ± 1 interval
    assert all(o is a.Outcome.CONTINUE for _, o in outcomes[:-1])


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(fp.nan(), id="NaN"),
        pytest.param(fp.empty(), id="empty"),
        pytest.param(fp.stale(31), id="stale"),
        pytest.param(fp.partial(), id="warnings"),
        pytest.param(fp.multi(), id="two series"),
        pytest.param(fp.inf(), id="+Inf"),
    ],
)
def test_mp02_mp03_invalid_results_never_promote_over_100_runs(reply: fp.Reply) -> None:
    spec = AnalysisSpec(interval="30s", timeout="10s", initial_delay="0s", success_streak=1, no_data_deadline="24h")
    gate = MetricGate(name="g", query='up{pool="${pool}"}', success_condition="true")
    progress = AnalysisProgress()
    for i in range(100):
        now = at(30 * i)
        window = g.SampleWindow.for_analysis(spec, now=now, step_started_at=T0, scrape_interval_s=15)
        v = g.evaluate_gate(gate, fp.answer(reply, now.timestamp()), None, window)
        ev = a.evaluate_step(progress, [v], spec, T0, now)
        progress = ev.progress
        assert ev.outcome is a.Outcome.CONTINUE, (i, v)


# --- properties ----------------------------------------------------------------------------------

KINDS = st.sampled_from([S, S, S, F, N, E])


@settings(max_examples=1000, deadline=None)
@given(
    seq=st.lists(st.lists(KINDS, min_size=1, max_size=3), min_size=1, max_size=25),
    k=st.integers(1, 5),
    limit=st.integers(-1, 3),
    gaps=st.lists(st.sampled_from([30, 30, 30, 45, 61, 90]), min_size=25, max_size=25),
)
def test_mp05_flapping_sequences_promote_only_after_k_consecutive_all_success(
    seq: list[list[str]], k: int, limit: int, gaps: list[int]
) -> None:
    """MP-05: 1,000 random flapping sequences: never a promotion when any of the last K evaluations was
    not all-Success, and never one across a missed interval."""
    spec = AnalysisSpec(
        interval="30s", timeout="10s", initial_delay="0s", success_streak=k, failure_limit=limit, no_data_deadline="1h"
    )
    progress = AnalysisProgress()
    t = 0.0
    history: list[tuple[float, bool]] = []  # (time, all Success) of each evaluation
    for kinds, gap in zip(seq, gaps, strict=False):
        ev = a.evaluate_step(progress, verdicts(*kinds), spec, T0, at(t))
        assert ev.evaluated
        progress = ev.progress
        history.append((t, all(x == S for x in kinds)))
        if ev.outcome is a.Outcome.PASSED:
            last = history[-k:]
            assert len(last) == k and all(ok for _, ok in last)
            assert all(b - a_ <= 60 for (a_, _), (b, _) in itertools.pairwise(last))
            break
        if ev.outcome is a.Outcome.FAILED:
            assert limit >= 0 and sum(1 for _ in [x for x in seq[: len(history)] if F in x]) > limit
            break
        t += gap


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.lists(KINDS, min_size=1, max_size=3), min_size=1, max_size=30), k=st.integers(1, 5))
def test_promotes_exactly_when_the_last_k_evaluations_were_all_success(seq: list[list[str]], k: int) -> None:
    spec = AnalysisSpec(
        interval="30s", timeout="10s", initial_delay="0s", success_streak=k, failure_limit=-1, no_data_deadline="24h"
    )
    progress = AnalysisProgress()
    for i, kinds in enumerate(seq):
        ev = a.evaluate_step(progress, verdicts(*kinds), spec, T0, at(30 * i))
        progress = ev.progress
        want = i + 1 >= k and all(all(x == S for x in seq[j]) for j in range(i + 1 - k, i + 1))
        assert (ev.outcome is a.Outcome.PASSED) == want
        if want:
            break


def test_a_gap_restarts_the_no_data_clock_but_keeps_failures() -> None:
    evs = run([(60, [F]), (90, [N]), (120, [N]), (400, [N])])
    last = evs[-1]
    assert last.progress.no_data_since == at(400) and last.progress.failures == 1
    assert last.outcome is a.Outcome.CONTINUE


def test_a_failure_beside_no_data_restarts_the_clock_instead_of_meeting_the_deadline() -> None:
    """W5 at the full rate: with a power floor the other gates are NoData (Underpowered) for the whole first
    step, and the errors gate's first Failure came in the evaluation at which 2 minutes of NoData ended. That
    evaluation must not apply onNoData (a paused bad canary keeps its keys): the Failure restarts the clock, and
    the confirming Failure fails the step."""
    evs = run([(60, [N, N]), (90, [N, N]), (120, [N, N]), (150, [N, N]), (180, [F, N]), (210, [F, N])])
    assert [ev.outcome for ev in evs[:4]] == [a.Outcome.CONTINUE] * 4
    assert evs[4].outcome is a.Outcome.CONTINUE and evs[4].progress.no_data_since is None
    assert evs[4].progress.failures == 1
    assert evs[5].outcome is a.Outcome.FAILED and evs[5].reason == "FailureLimitExceeded"


def test_after_a_failure_the_no_data_clock_runs_again_and_the_hold_stays_bounded() -> None:
    """One Failure buys the step one more noDataDeadline, not an endless hold: the clock restarts at the next
    NoData evaluation, and each restart costs a Failure (failureLimit bounds them)."""
    evs = run([(60, [N, N]), (180, [F, N])] + [(210 + 30 * i, [N, N]) for i in range(5)])
    assert evs[1].progress.no_data_since is None
    assert evs[2].progress.no_data_since == at(210)
    outcomes = [ev.outcome for ev in evs[2:]]
    assert outcomes == [a.Outcome.CONTINUE] * 4 + [a.Outcome.NO_DATA_DEADLINE]  # 330 − 210 ≥ 2m
