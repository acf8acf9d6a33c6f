"""``core.gaterun``: what a pass asks for its gates (``gate_queries``) and the verdicts from the answers
(``judge``), the two pure halves the Prometheus adapter and the simulator both run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tandem.api.pool import GateComparison, MetricGate
from tandem.core import gates as g
from tandem.core.gaterun import GatePlan, gate_queries, judge, step_range
from tandem.core.promql import QueryResult, freshness_of, freshness_query
from tests.fakes import prometheus as fp

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NOW = START + timedelta(seconds=120)
WINDOW = g.SampleWindow(now=NOW, step_started_at=START, initial_delay_s=60, max_age_s=30, rate_window_s=30)


def ttft(name: str = "ttft", **kw: object) -> MetricGate:
    fields: dict[str, object] = {"success_condition": "result <= 0.5", "min_samples": 0, **kw}
    return MetricGate(name=name, template="TTFTP90", **fields)  # type: ignore[arg-type]


def plan(*gates: MetricGate, stable: str | None = "s1") -> GatePlan:
    return gate_queries(
        gates, namespace="ns", pool="speed", canary_revision="c1", stable_revision=stable, interval="30s", now=NOW
    )


def answers_for(p: GatePlan, reply: fp.Reply, *, freshness: bool = True) -> dict[str, QueryResult]:
    """Every data query answered with ``reply`` (and, if asked, its freshness query as Prometheus would)."""
    out = {t: reply.build(NOW.timestamp(), t) for t in p.texts()}
    if freshness:
        out |= {f: fp.freshness_answer(reply, NOW.timestamp(), f) for f in p.freshness().values()}
    return out


@pytest.mark.parametrize(
    ("gates", "stable", "invalid"),
    [
        pytest.param((ttft(),), "s1", [False], id="template gate renders"),
        pytest.param(
            (ttft(), MetricGate(name="raw", query="", success_condition="result > 0")),
            "s1",
            [False, True],
            id="a gate with neither template nor query is InvalidQuery, the others still render",
        ),
        pytest.param(
            (ttft(success_condition="result <= baseline * 1.2"),),
            None,
            [True],
            id="baseline without a stable revision is InvalidQuery",
        ),
    ],
)
def test_gate_queries_plans_each_gate_or_its_invalid_verdict(
    gates: tuple[MetricGate, ...], stable: str | None, invalid: list[bool]
) -> None:
    p = plan(*gates, stable=stable)
    assert [pg.invalid is not None for pg in p.gates] == invalid
    for pg in p.gates:
        if pg.invalid is not None:
            assert (pg.invalid.verdict, pg.invalid.reason) == ("Error", "InvalidQuery")
            assert pg.invalid.evaluated_at is not None and pg.queries is None and pg.error


def test_asked_is_every_query_once_each_with_its_freshness_query() -> None:
    gates = (ttft(min_samples=50), ttft("same"), ttft("vs-stable", compare=GateComparison()))
    p = plan(*gates)
    texts = p.texts()
    assert len(texts) == len(set(texts)) and list(texts) == sorted(texts)
    for pg in p.gates:
        assert pg.queries is not None and set(pg.queries.texts()) <= set(texts)
    asked = p.asked()
    assert asked[: len(texts)] == texts
    assert {freshness_of(f) for f in asked[len(texts) :]} == {
        freshness_of(f) for t in texts if (f := freshness_query(t)) is not None
    }


@pytest.mark.parametrize(
    ("reply", "freshness", "want"),
    [
        pytest.param(fp.value("0.4"), True, ("Success", "SuccessConditionMet"), id="fresh value, freshness answered"),
        pytest.param(
            fp.value("0.4"), False, ("Success", "SuccessConditionMet"), id="freshness unanswered leaves the answer"
        ),
        pytest.param(fp.stale(31, "0.4"), True, ("NoData", "Stale"), id="freshness answer says stale"),
        pytest.param(fp.value("0.9"), True, ("Failure", "SuccessConditionNotMet"), id="value misses the condition"),
        pytest.param(fp.http(503), True, ("Error", "MetricsUnavailable"), id="failed query"),
    ],
)
def test_judge_verdicts_from_the_answers(reply: fp.Reply, freshness: bool, want: tuple[str, str]) -> None:
    p = plan(ttft())
    [v] = judge(p, answers_for(p, reply, freshness=freshness), WINDOW)
    assert (v.verdict, v.reason) == want


def test_judge_counts_an_unanswered_data_query_as_unavailable() -> None:
    p = plan(ttft())
    [v] = judge(p, {}, WINDOW)
    assert (v.verdict, v.reason) == ("Error", "MetricsUnavailable")


def test_judge_keeps_gate_order_and_invalid_verdicts() -> None:
    broken = MetricGate(name="raw", query="", success_condition="result > 0")
    p = plan(broken, ttft())
    verdicts = judge(p, answers_for(p, fp.value("0.4")), WINDOW)
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [
        ("raw", "Error", "InvalidQuery"),
        ("ttft", "Success", "SuccessConditionMet"),
    ]


def test_judge_reads_the_sample_answers() -> None:
    """A gate with ``minSamples`` judges its request count: too few requests is NoData, not a verdict."""
    p = plan(ttft(min_samples=50))
    pg = p.gates[0]
    assert pg.queries is not None and pg.queries.canary_samples is not None
    count = pg.queries.canary_samples.count
    answers = answers_for(p, fp.value("0.4"))
    answers[count] = fp.value("3").build(NOW.timestamp(), count)
    [few] = judge(p, answers, WINDOW)
    answers[count] = fp.value("500").build(NOW.timestamp(), count)
    [enough] = judge(p, answers, WINDOW)
    assert few.verdict == "NoData" and (enough.verdict, enough.reason) == ("Success", "SuccessConditionMet")


# --- window: Step ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("since_start_s", "want"),
    [
        pytest.param(330.4, "5m30s", id="5m30.4s after start: whole seconds since the start"),
        pytest.param(60, None, id="60 s is not longer than the 60 s rate window: use interval"),
        pytest.param(61, "1m1s", id="one second longer"),
        pytest.param(30, None, id="shorter than the rate window"),
    ],
)
def test_step_range(since_start_s: float, want: str | None) -> None:
    got = step_range(now=START + timedelta(seconds=since_start_s), step_started_at=START, rate_window_s=60)
    assert got == want


def test_only_step_window_gates_read_the_step_range() -> None:
    step = MetricGate(name="errors", template="ErrorRate", compare=GateComparison(window="Step"))
    per_interval = MetricGate(name="tpot", template="TPOTP90", compare=GateComparison())
    condition = ttft()
    p = gate_queries(
        [step, per_interval, condition],
        namespace="ns",
        pool="speed",
        canary_revision="c1",
        stable_revision="s1",
        interval="30s",
        now=NOW,
        step_interval="4m30s",
    )
    assert [pg.interval for pg in p.gates] == ["4m30s", "30s", "30s"]
    step_q, interval_q, cond_q = (pg.queries for pg in p.gates)
    assert step_q is not None and interval_q is not None and cond_q is not None
    assert all("[4m30s]" in t and "[30s]" not in t for t in step_q.texts())
    assert all("[30s]" in t and "[4m30s]" not in t for t in (*interval_q.texts(), *cond_q.texts()))
    # before the step is long enough, a Step gate reads the interval like the others
    early = gate_queries(
        [step], namespace="ns", pool="speed", canary_revision="c1", stable_revision="s1", interval="30s", now=NOW
    )
    assert early.gates[0].interval == "30s"


@pytest.mark.parametrize(
    ("since_start_s", "want"),
    [(60, 1), (89, 1), (90, 2), (330, 10), (0, 1)],
)
def test_looks_are_numbered_by_interval_after_the_delay(since_start_s: float, want: int) -> None:
    window = g.SampleWindow(
        now=START + timedelta(seconds=since_start_s), step_started_at=START, initial_delay_s=60, interval_s=30
    )
    assert window.look == want


def test_alpha_spent_over_looks_sums_to_alpha() -> None:
    assert g.look_confidence(99, 0) == 99
    assert g.look_confidence(99, 1) == pytest.approx(99.5)
    assert g.look_confidence(99, 4) == pytest.approx(99.95)
    spent = sum(100 - g.look_confidence(99, j) for j in range(1, 100_000))
    assert spent == pytest.approx(1.0, rel=1e-4) and spent < 1.0
