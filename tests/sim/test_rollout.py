"""W5: Tandem's rollout logic (imported from tandem.core) and the Flagger-like baseline on a bad canary; the
engine's per-revision pairs and canary weights; the statistical floor of benchmarks.md §7."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import yaml

from tandem.api.pool import MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.core.promql import template_sample_queries
from tandem.routing import PairState
from tandem_lab.sim import engine, rollout
from tandem_lab.sim.config import load_params
from tandem_lab.sim.engine import LOADING, Revision, Simulation
from tandem_lab.sim.metrics import RevisionSeries, Scrape, ScrapeStore
from tandem_lab.sim.scenarios import ScenarioConfig
from tests.sim.simhelpers import pair_fleet, spy_on
from tests.support.tandem_cluster import REPO


def test_statistical_floor_matches_benchmarks_section_7() -> None:
    # 0.5 % → 1.0 % against a much larger stable arm: ≈ 1,600 canary requests (≈ 58 s at 27.5 req/s)
    assert rollout.statistical_floor("errors", 0.005, 0.010) == pytest.approx(1597, abs=2)
    assert rollout.statistical_floor("tpot", 0.0, 0.0) == pytest.approx(100)  # ≈ 10 tail events of a p90 gate


def _store(finished: tuple[float, float], errors: tuple[float, float], tpot_bucket: int) -> ScrapeStore:
    store = ScrapeStore()
    for t, fin, err in ((0.0, finished[0], errors[0]), (60.0, finished[1], errors[1])):
        series = RevisionSeries(finished=fin, engine_errors=err)
        series.tpot[tpot_bucket] = fin
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, {"r2": series}))
    return store


def test_query_values_follow_prometheus_semantics() -> None:
    store = _store((100.0, 200.0), (0.0, 5.0), tpot_bucket=1)  # 100 requests in the window, 5 errors
    assert float(rollout.template_value(store, 60.0, 60.0, "ErrorRate", "r2") or "nan") == pytest.approx(0.05)
    tpot = float(rollout.template_value(store, 60.0, 60.0, "TPOTP90", "r2") or "nan")
    assert 0.01 < tpot <= 0.025  # inside vLLM's [10 ms, 25 ms] bucket, linearly interpolated
    quiet = _store((100.0, 100.0), (0.0, 0.0), tpot_bucket=1)
    assert rollout.template_value(quiet, 60.0, 60.0, "ErrorRate", "r2") == "NaN"  # 0/0 → NoData, never 0
    assert rollout.template_value(store, 60.0, 60.0, "ErrorRate", "r9") is None  # no series → empty result


def test_gates_are_judged_by_tandem_core() -> None:
    store = _store((100.0, 200.0), (0.0, 5.0), tpot_bucket=1)
    p = load_params()
    pool = rollout.build_pool(p, 4, (1, 1), 1.9, gates="regression")
    gate = MetricGate.model_validate({"name": "errors", "template": "ErrorRate", "failureCondition": "result > 0.01"})
    verdicts = rollout.evaluate_gates(
        store, 60.0, [gate], pool.spec.rollout.analysis, "r2", "r1", rollout.at(-120.0), 15.0, 131_072
    )
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [("errors", "Failure", "FailureConditionMet")]


def _two_revisions(canary_tpot_s: float) -> ScrapeStore:
    """Stable 700 and canary 40 requests in the last 60 s, every TPOT in vLLM's first bucket [0, 10 ms]."""
    store = ScrapeStore()
    for t, k in ((0.0, 0.0), (60.0, 1.0)):
        revisions = {}
        for rev, n, tpot, errors in (("r1", 700.0, 0.006, 3.0), ("r2", 40.0, canary_tpot_s, 1.0)):
            series = RevisionSeries(finished=n * k, engine_errors=errors * k, tpot_sum=n * k * tpot)
            series.tpot[0] = n * k
            revisions[rev] = series
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, revisions))
    return store


def test_sample_queries_are_answered_from_the_scrapes() -> None:
    store = _two_revisions(0.006)
    queries = template_sample_queries("TPOTP90")
    answers = rollout.sample_results(store, 60.0, 60.0, "TPOTP90", "r2", queries)
    assert answers[queries.count].series[0].value == "40.0"
    assert queries.sum is not None and float(answers[queries.sum].series[0].value) == pytest.approx(0.24)
    assert queries.buckets is not None
    buckets = answers[queries.buckets].series
    assert [(s.labels["le"], s.value) for s in buckets[:2]] == [("0.01", "40.0"), ("0.025", "40.0")]
    assert buckets[-1].labels["le"] == "+Inf" and len(buckets) == 20
    errors = template_sample_queries("ErrorRate")
    answers = rollout.sample_results(store, 60.0, 60.0, "ErrorRate", "r1", errors)
    assert errors.errors is not None and answers[errors.errors].series[0].value == "3.0"
    assert rollout.sample_results(store, 60.0, 60.0, "ErrorRate", "r9", errors)[errors.count].series == ()


def _paired(canary: list[tuple[int, float]], stable: list[tuple[int, float]]) -> ScrapeStore:
    """Per pair ``(requests, TPOT)`` in the last 60 s, counted through ``RevisionSeries.add_latency`` as the
    engine counts them (TTFT 0.1 s; TPOTs inside vLLM's first bucket); stable's pair ``r1-idle`` served one
    request before the window and none in it."""
    before = {"r1": RevisionSeries(), "r2": RevisionSeries()}
    before["r1"].add_latency("r1-idle", 0.1, 0.006)
    after = {rev: series.copy() for rev, series in before.items()}
    for rev, pairs in (("r1", stable), ("r2", canary)):
        for i, (n, tpot) in enumerate(pairs):
            for _ in range(n):
                after[rev].add_latency(f"{rev}-p{i}", 0.1, tpot)
            after[rev].finished += n
    store = ScrapeStore()
    for t, revisions in ((0.0, before), (60.0, after)):
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, revisions))
    return store


def test_per_pair_queries_are_answered_from_the_scrapes() -> None:
    store = _paired(canary=[(40, 0.006)], stable=[(300, 0.004), (400, 0.008)])
    queries = template_sample_queries("TPOTP90")
    assert queries.pair_counts is not None and queries.pair_sums is not None
    answers = rollout.sample_results(store, 60.0, 60.0, "TPOTP90", "r1", queries)
    counts = {s.labels["pair"]: float(s.value) for s in answers[queries.pair_counts].series}
    sums = {s.labels["pair"]: float(s.value) for s in answers[queries.pair_sums].series}
    assert counts == {"r1-p0": 300.0, "r1-p1": 400.0}  # r1-idle served nothing in the window: no series
    assert sums == pytest.approx({"r1-p0": 1.2, "r1-p1": 3.2})
    assert sum(counts.values()) == float(answers[queries.count].series[0].value)  # adds up to the totals
    ttft = template_sample_queries("TTFTP95")
    assert ttft.pair_counts is not None
    ttft_counts = rollout.sample_results(store, 60.0, 60.0, "TTFTP95", "r2", ttft)[ttft.pair_counts].series
    assert [(s.labels["pair"], s.value) for s in ttft_counts] == [("r2-p0", "40.0")]


def test_the_evaluation_log_says_why_each_gate_decided() -> None:
    """``fleet.json``'s W5 evaluation log keeps each verdict's reason and the comparison's numbers (clipped)."""
    long = "mean 1869 ms vs stable 964.9 ms on its pairs' line " + "x" * 700
    got = rollout._summ(
        [
            GateVerdict(name="ttft", verdict="Failure", reason="SignificantlyWorse", value="15", condition=long),
            GateVerdict(name="errors", verdict="Success", value="0.004", baseline="0.005"),
        ]
    )
    assert got["ttft"].startswith("Failure:15 | SignificantlyWorse | mean 1869 ms vs stable 964.9 ms on its pairs")
    assert len(got["ttft"]) < 600
    assert got["errors"] == "Success:0.004 vs 0.005"


def test_each_pairs_uncached_work_is_answered_from_the_scrapes() -> None:
    """``sum by (pair)`` of queries − hits and of the shared tier's hits, as ``RevisionSeries.add_prefix`` counted
    them: per pair they add up to the revision's ``uncached`` and ``fetched`` answers, and a pair whose counters did
    not move in the window answers 0."""
    before = RevisionSeries()
    before.add_prefix("r1-idle", 5_000, 1_000, 2_000)
    after = before.copy()
    after.add_prefix("r1-p0", 30_000, 10_000, 4_000)
    after.add_prefix("r1-p1", 50_000, 45_000)
    after.add_prefix("r1-p0", 10_000, 0, 6_000)
    store = ScrapeStore()
    for t, series in ((0.0, before), (60.0, after)):
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, {"r1": series}))
    queries = template_sample_queries("TTFTP95", "UncachedPromptTokens")
    assert queries.pair_uncached is not None and queries.uncached is not None
    answers = rollout.sample_results(store, 60.0, 60.0, "TTFTP95", "r1", queries)
    per_pair = {s.labels["pair"]: float(s.value) for s in answers[queries.pair_uncached].series}
    assert per_pair == {"r1-idle": 0.0, "r1-p0": 30_000.0, "r1-p1": 5_000.0}
    assert sum(per_pair.values()) == float(answers[queries.uncached].series[0].value)
    assert queries.pair_fetched is not None and queries.fetched is not None
    fetched = {s.labels["pair"]: float(s.value) for s in answers[queries.pair_fetched].series}
    assert fetched == {"r1-idle": 0.0, "r1-p0": 10_000.0, "r1-p1": 0.0}
    assert sum(fetched.values()) == float(answers[queries.fetched].series[0].value)


def test_the_simulators_gates_see_the_spread_between_pairs() -> None:
    """TPOT × 1.3 on the canary's one pair is a Failure against stable pairs that agree, and not against
    stable pairs as far apart as that (the pairs are the unit, core.comparison), as in the operator."""
    p = load_params()
    analysis = rollout.build_pool(p, 4, (1, 1), 1.9, gates="regression").spec.rollout.analysis
    gate = MetricGate.model_validate({"name": "tpot", "template": "TPOTP90", "compare": {}})
    got = {}
    for name, stable in (
        ("agree", [(350, 0.006), (350, 0.006)]),
        ("spread", [(350, 0.003), (350, 0.009)]),
    ):
        store = _paired(canary=[(40, 0.0078)], stable=stable)
        (verdict,) = rollout.evaluate_gates(
            store, 60.0, [gate], analysis, "r2", "r1", rollout.at(-120.0), 15.0, 131_072
        )
        assert "pairs 1 vs 2" in verdict.condition, verdict.condition
        got[name] = verdict.verdict
    assert got == {"agree": "Failure", "spread": "Success"}


@pytest.mark.parametrize(
    ("canary_tpot_s", "want"),
    [
        pytest.param(0.006, ("Success", "NotSignificantlyWorse"), id="same TPOT"),
        pytest.param(0.0078, ("Failure", "SignificantlyWorse"), id="TPOT x 1.3 inside the first bucket"),
    ],
)
def test_the_simulator_runs_statistical_gates_through_tandem_core(canary_tpot_s: float, want: tuple[str, str]) -> None:
    p = load_params()
    pool = rollout.build_pool(p, 4, (1, 1), 1.9, gates="regression")
    gates = [
        MetricGate.model_validate({"name": "tpot", "template": "TPOTP90", "compare": {}}),
        MetricGate.model_validate({"name": "errors", "template": "ErrorRate", "compare": {}}),
    ]
    verdicts = rollout.evaluate_gates(
        _two_revisions(canary_tpot_s),
        60.0,
        gates,
        pool.spec.rollout.analysis,
        "r2",
        "r1",
        rollout.at(-120.0),
        15.0,
        131_072,
    )
    assert [(v.verdict, v.reason) for v in verdicts] == [want, ("Success", "NotSignificantlyWorse")]


def _hit_counts(canary_hits: float) -> ScrapeStore:
    """Stable 700 requests of 8 k prompt tokens with 30 % local hits, the canary 40 with ``canary_hits``."""
    store = ScrapeStore()
    for t, k in ((0.0, 0.0), (60.0, 1.0)):
        revisions = {
            rev: RevisionSeries(finished=n * k, local_queries=n * 8_192 * k, local_hits=n * 8_192 * hit * k)
            for rev, n, hit in (("r1", 700.0, 0.3), ("r2", 40.0, canary_hits))
        }
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, revisions))
    return store


@pytest.mark.parametrize(
    ("canary_hits", "longest_prompt", "want"),
    [
        pytest.param(0.0, 8_192, ("Failure", "SignificantlyWorse"), id="no hits, short prompts"),
        pytest.param(0.0, 131_072, ("Success", "NotSignificantlyWorse"), id="no hits, too few tokens to tell"),
        pytest.param(0.25, 8_192, ("Success", "NotSignificantlyWorse"), id="within noise"),
    ],
)
def test_the_simulator_answers_the_hit_ratio_comparison(
    canary_hits: float, longest_prompt: int, want: tuple[str, str]
) -> None:
    """The simulator answers the prefix-cache token queries from its scrapes, and the pool's longest prompt
    reaches the judgement: the same counts fail in a pool of 8 k prompts and are too few in one of 131 k."""
    p = load_params()
    pool = rollout.build_pool(p, 4, (1, 1), 1.9, gates="regression")
    gate = MetricGate.model_validate({"name": "hits", "template": "LocalKVHitRatio", "compare": {}})
    [verdict] = rollout.evaluate_gates(
        _hit_counts(canary_hits),
        60.0,
        [gate],
        pool.spec.rollout.analysis,
        "r2",
        "r1",
        rollout.at(-120.0),
        15.0,
        longest_prompt,
    )
    assert (verdict.verdict, verdict.reason) == want, verdict.condition


def test_regression_gate_set_keeps_only_the_named_gates() -> None:
    p = load_params()
    example = rollout.build_pool(p, 4, (1, 1), 1.9, gates="example")
    regression = rollout.build_pool(p, 4, (1, 1), 1.9, gates="regression")
    assert [m.name for m in example.spec.rollout.analysis.metrics] == [
        "ttft-p95",
        "tokens-per-user",
        "errors",
        "local-kv-hits",
    ]
    assert [m.name for m in regression.spec.rollout.analysis.metrics] == ["ttft-p95", "tokens-per-user", "errors"]
    assert example.spec.rollout.analysis.warm_up is not None  # the example's cold-cache warm-up


def _sim(pairs: int, shape: tuple[int, int] = (1, 1)) -> Simulation:
    sim = pair_fleet(pairs, shape)
    sim.add_revision(Revision("r2"))
    return sim


def canary_key_share(sim: Simulation, revision: str) -> float:
    """Share of the serving pairs' rendezvous weight the routing table gives ``revision``."""
    sim._rebuild_table()
    serving = [p for p in sim._pairs if p.state is PairState.SERVING]
    total = sum(p.weight for p in serving)
    return sum(p.weight for p in serving if p.revision == revision) / total


def _make_ready(sim: Simulation, revision: str) -> None:
    for g in sim.groups.values():
        if g.revision.name == revision:
            for inst in (*g.prefill, *g.decode):
                inst.state = LOADING
                sim._on_ready(inst)


def test_converge_brings_the_canary_up_before_the_stable_pair_drains() -> None:
    sim = _sim(3)
    sim.converge_revisions({"r1": 2, "r2": 1}, replicas=3, max_surge=1, max_unavailable=0)
    assert sim.revision_counts() == {"r1": (3, 3), "r2": (1, 0)}  # surge first; no serving pair drained yet
    _make_ready(sim, "r2")
    sim.converge_revisions({"r1": 2, "r2": 1}, replicas=3, max_surge=1, max_unavailable=0)
    assert sim.revision_counts() == {"r1": (2, 2), "r2": (1, 1)}


def test_converge_applies_the_operators_next_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator converges with ``tandem.core.converge.next_moves`` (the decision ``core.plan`` runs)."""
    calls = spy_on(monkeypatch, engine, "next_moves")
    sim = _sim(3)
    sim.converge_revisions({"r1": 2, "r2": 1}, replicas=3, max_surge=1, max_unavailable=0)
    assert [m.creates for m in calls] == [(("r2", 1),)]
    assert sim.revision_counts() == {"r1": (3, 3), "r2": (1, 0)}


def test_canary_weight_gives_the_canary_its_share_of_keys() -> None:
    sim = _sim(9)
    sim.converge_revisions({"r1": 9, "r2": 1}, replicas=9, max_surge=1, max_unavailable=0)
    _make_ready(sim, "r2")
    sim.set_canary("r2", 5)
    assert canary_key_share(sim, "r2") == pytest.approx(0.05)
    sim.set_canary("r2", None)  # by pair count, as the routing table does without a weight
    assert canary_key_share(sim, "r2") == pytest.approx(0.1)


def test_a_loaded_prefill_instance_inside_a_pair_sends_the_key_to_its_sibling() -> None:
    sim = _sim(1, shape=(2, 1))
    g = next(iter(sim.groups.values()))
    key = 12345
    first = sim._pick_prefill(g, key)
    assert first is not None
    other = next(c for c in g.prefill if c is not first)
    first.batch = 4
    first.queue.extend([object()] * 2)  # type: ignore[list-item]
    assert sim._pick_prefill(g, key) is other  # over the bounded load: the walk moves on
    first.batch = 0
    first.queue.clear()
    assert sim._pick_prefill(g, key) is first  # idle again: back to its own cache


W5_TINY: dict[str, Any] = {"scale": 0.01, "compress": 5.0, "canary": "errors", "gates": "regression"}


def test_w5_both_arms_roll_back_an_erroring_canary_and_report_the_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = rollout.plan_rollout

    def spy(inp: Any) -> Any:
        calls.append(inp)
        return real(inp)

    monkeypatch.setattr(rollout, "plan_rollout", spy)
    p = load_params()
    for gate in p.policies.tandem_rollout["analysis"]["metrics"]:
        gate["minSamples"] = 0  # the 1 % workload sends a handful of canary requests per window
    cfg = ScenarioConfig("W5", **{**W5_TINY, "canary_error_prob": 0.3})
    result = rollout.run_w5(cfg, 1, p)
    assert calls, "tandem.core.rollout.plan_rollout drove the Tandem arm"
    by_arm = {a.arm: a.metrics for a in result.arms}
    for arm, m in by_arm.items():
        assert m["rolled_back"], arm
        # Evidence starts with the canary's first request or, under Tandem's mirror first step, its first copy.
        start = min(t for t in (m["canary_first_request_s"], m["canary_first_copy_s"]) if t is not None)
        assert start <= m["first_breach_s"] <= m["decision_s"] <= m["weight_zero_s"], arm
        assert m["rollback_s"] == pytest.approx(m["observe_s"] + m["decide_s"] + m["act_s"])
    assert by_arm["flagger"]["requests_on_canary"] > 0
    # The example's first step mirrors: a 30 % erroring canary fails on its copies, before any user is served by it.
    assert by_arm["tandem"]["copies_on_canary"] > 0
    assert by_arm["tandem"]["requests_on_canary"] == 0
    assert by_arm["flagger"]["act_s"] == 0.0  # the primary never shrank: routing back is immediate
    # Surge canary (issue 17 item 3): stable kept its pairs, so the decision's own pass zeroes the canary.
    assert by_arm["tandem"]["act_s"] == 0.0
    assert all(c.surge_room is not None for c in calls)
    assert by_arm["flagger"]["decide_s"] >= (p.policies.flagger.threshold - 1) * p.policies.flagger.interval_s


def _w5_tiny_errors() -> tuple[ScenarioConfig, Any, int, tuple[int, int], rollout.Warm]:
    """The tiny W5 with a 30 % erroring canary (every arm rolls it back), prepared and warmed up."""
    p = load_params()
    for gate in p.policies.tandem_rollout["analysis"]["metrics"]:
        gate["minSamples"] = 0
    cfg = ScenarioConfig("W5", **{**W5_TINY, "canary_error_prob": 0.3})
    prep = rollout.prepare(cfg, 1, p)
    pairs, shape = rollout.w5_pairs(prep)
    return cfg, prep, pairs, shape, rollout.warm_up(prep, pairs, shape, cfg.event_time_s(p), cfg.scale)


def _comparable(m: dict[str, Any]) -> str:
    """The metrics without where the run ended, NaN-safe (``nan != nan``)."""
    return json.dumps({k: v for k, v in m.items() if k != "ended_s"}, sort_keys=True, default=str)


def test_a_run_continued_from_the_shared_warm_up_is_the_straight_run() -> None:
    """W5 simulates the part before the revision is applied once per seed and forks it per arm and
    variant: each forked run must be the run a straight simulation from t = 0 gives, to the last metric."""
    cfg, prep, pairs, shape, warm = _w5_tiny_errors()
    t_apply = warm.t_apply
    straight = rollout.warm_up(prep, pairs, shape, t_apply, cfg.scale, until=0.0)
    assert warm.sim.now < t_apply and warm.sim.events > 0 and straight.sim.events == 0
    for arm in rollout.ARMS:
        forked = [rollout.run_arm(prep, cfg, arm, pairs, shape, print, w) for w in (warm, warm, straight)]
        a, b, c = (_comparable(r.metrics) for r in forked)
        m = forked[0].metrics
        assert m["requests_on_canary"] + m["copies_on_canary"] > 0 and m["rolled_back"], arm  # the canary ran
        assert a == b == c, arm  # the fork leaves the warm simulation as it was; forked = straight
        np.testing.assert_array_equal(forked[0].result.ttft, forked[2].result.ttft)


def test_settling_ends_the_run_without_changing_what_w5_measures() -> None:
    cfg, prep, pairs, shape, warm = _w5_tiny_errors()
    full = rollout.run_arm(prep, cfg, "tandem", pairs, shape, print, warm).metrics
    settled = rollout.run_arm(prep, cfg, "tandem", pairs, shape, print, warm, settle=True).metrics
    assert full["ended_s"] is None and full["rolled_back"]
    assert settled["ended_s"] is not None
    assert settled["weight_zero_s"] + rollout.SETTLED_GRACE_S <= settled["ended_s"] < prep.workload.duration_s
    for key in (
        "decision_s",
        "weight_zero_s",
        "first_breach_s",
        "requests_on_canary",
        "copies_on_canary",
        "canary_share_of_all_requests",
    ):
        assert settled[key] == full[key], key


def test_powered_and_stepped_gate_sets_add_the_floor_and_step_windows() -> None:
    p = load_params()
    powered = rollout.build_pool(p, 4, (1, 1), 1.9, gates="powered").spec.rollout.analysis.metrics
    stepped = rollout.build_pool(p, 4, (1, 1), 1.9, gates="stepped").spec.rollout.analysis.metrics
    assert [m.name for m in powered] == [m.name for m in stepped] == ["ttft-p95", "tokens-per-user", "errors"]
    assert all(m.compare is not None and m.compare.min_power_percent == 80 for m in (*powered, *stepped))
    # the example's errors gate is a step gate itself (stop 34); powered adds only the floor
    assert [m.compare.window for m in powered if m.compare] == ["Interval", "Interval", "Step"]
    assert [m.compare.window for m in stepped if m.compare] == ["Interval", "Step", "Step"]


def test_a_step_window_gate_is_answered_over_the_whole_step() -> None:
    """The simulator answers a ``window: Step`` gate over its own range, the others over ``${interval}``."""
    store = ScrapeStore()
    for t in (0.0, 60.0, 120.0, 180.0):  # each minute: stable 700 requests / 3 errors, canary 40 / 1
        k = 1.0 + t / 60.0
        revisions = {
            rev: RevisionSeries(finished=n * k, engine_errors=e * k)
            for rev, n, e in (("r1", 700.0, 3.0), ("r2", 40.0, 1.0))
        }
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, {}, revisions))
    analysis = rollout.build_pool(load_params(), 4, (1, 1), 1.9, gates="regression").spec.rollout.analysis
    gates = [
        MetricGate.model_validate({"name": "step", "template": "ErrorRate", "compare": {"window": "Step"}}),
        MetricGate.model_validate({"name": "interval", "template": "ErrorRate", "compare": {}}),
    ]
    # the step started at 0 s with a 60 s delay: at 180 s the step range is the whole step, 3m (its first
    # minute included), the interval's 1m; look 1 + (180 − 60)/30 = 5
    verdicts = rollout.evaluate_gates(store, 180.0, gates, analysis, "r2", "r1", rollout.at(0.0), 15.0, 131_072)
    assert "errors 3/120" in verdicts[0].condition and "step look 5" in verdicts[0].condition
    assert "errors 1/40" in verdicts[1].condition and "step look" not in verdicts[1].condition


def test_w5s_example_gate_set_is_the_examples_analysis() -> None:
    """W5's ``example`` set must be ``examples/speed-pool.yaml``'s analysis: the local-kv-hits gate had drifted to
    the old ``result >= baseline * 0.9`` after the example moved to the score test. Only the eval Job (no eval
    image in the simulator) is left out. The steps up to the second analysis are the example's (four mirrored pairs,
    then one of them serving a stable pair's share of keys); the later ones are W5's own, and so is maxSurge."""
    example = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())["spec"]["rollout"]["analysis"]
    simulated = load_params().policies.tandem_rollout["analysis"]
    assert simulated == {k: v for k, v in example.items() if k != "eval"}
    example_steps = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())["spec"]["rollout"]["steps"]
    simulated_steps = load_params().policies.tandem_rollout["steps"]
    assert simulated_steps[0] == example_steps[0] == {"setMirrorPairs": 4}
    assert simulated_steps[2] == example_steps[2] == {"setCanaryPairs": 1}
    assert all("analysis" in steps[i] for steps in (simulated_steps, example_steps) for i in (1, 3))
