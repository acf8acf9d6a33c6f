"""The rollout state machine through the planner: promotion, capacity floor, rollback, restarts, controls."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.api.pool_status import RolloutStatus
from tandem.api.revision import revision_id, revision_spec
from tandem.core.rollout import RevisionCounts, RolloutInputs, canary_target, is_new_request, plan_rollout
from tandem.routing.table import PairState
from tests.support.factories import T0, World, make_nodes, make_pool


def rev_of(world: World) -> str:
    return revision_id(revision_spec(world.pool.spec))


def phase(world: World) -> str:
    assert world.pool.status is not None
    return world.pool.status.rollout.phase


def ready_pairs_by_revision(world: World) -> dict[str, int]:
    out: dict[str, int] = {}
    assert world.routing is not None
    for pair in world.routing.pairs:
        if pair.state is PairState.SERVING:
            out[pair.revision] = out.get(pair.revision, 0) + 1
    return out


def start(steps: list[dict[str, Any]], replicas: int = 4, nodes: int = 6, **rollout: Any) -> tuple[World, Any]:
    builder = make_pool().pairs(replicas).steps(*steps).rollout(**rollout)
    world = World(builder.obj(), make_nodes(nodes))
    world.run_until(lambda w: w.ready_pairs() == replicas)
    return world, builder


@pytest.mark.parametrize(
    ("steps", "replicas", "index", "want_pairs", "want_weight"),
    [
        pytest.param([{"setWeight": 10}], 8, 0, 1, 10, id="10 percent of 8 rounds up to 1 pair"),
        pytest.param([{"setWeight": 50}], 8, 0, 4, 50, id="half"),
        pytest.param([{"setCanaryPairs": 2}, {"pause": {}}], 8, 1, 2, None, id="pairs persist through pause"),
        pytest.param([{"pause": {}}], 8, 0, 0, 0, id="no set step yet"),
        pytest.param([{"setCanaryPairs": 20}], 8, 0, 8, None, id="capped at replicas"),
    ],
)
def test_canary_target(
    steps: list[dict[str, Any]], replicas: int, index: int, want_pairs: int, want_weight: int | None
) -> None:
    pool = make_pool().pairs(replicas).steps(*steps).obj()
    assert canary_target(list(pool.spec.rollout.steps), index, replicas) == (want_pairs, want_weight)


def test_good_version_walks_every_step_and_is_promoted() -> None:
    world, builder = start(
        [{"setCanaryPairs": 1}, {"pause": {"duration": "20s"}}, {"setWeight": 50}, {"setWeight": 100}]
    )
    old = rev_of(world)
    world.set_spec(builder.version("v2"))
    new = rev_of(world)
    steps_seen = []
    for _ in range(60):
        world.tick()
        assert world.pool.status is not None
        steps_seen.append(world.pool.status.rollout.step_index)
        if phase(world) == "Promoted" and ready_pairs_by_revision(world) == {new: 4}:
            break
    assert phase(world) == "Promoted"
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    assert world.pool.status.revisions.stable.name == new and old != new
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(steps_seen) if b >= a)  # INV-3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.sampled_from(
        [
            [{"setCanaryPairs": 1}, {"setWeight": 50}, {"setWeight": 100}],
            [{"setWeight": 25}, {"pause": {"duration": "10s"}}, {"setWeight": 75}],
            [{"setCanaryPairs": 2}, {"setCanaryPairs": 3}],
        ]
    ),
    replicas=st.integers(min_value=1, max_value=5),
    surge=st.integers(min_value=1, max_value=2),
    unavailable=st.integers(min_value=0, max_value=1),
    ready_delay=st.integers(min_value=1, max_value=3),
)
def test_capacity_floor_never_violated_during_rollout(
    steps: list[dict[str, Any]], replicas: int, surge: int, unavailable: int, ready_delay: int
) -> None:
    """INV-1: serving pairs ≥ replicas − maxUnavailable at every pass; INV-5: live ≤ replicas + surge."""
    world, builder = start(
        steps, replicas=replicas, nodes=replicas + surge + 2, maxSurge=surge, maxUnavailable=unavailable
    )
    world.ready_delay_ticks = ready_delay
    world.set_spec(builder.version("v2"))
    for _ in range(80):
        world.tick()
        serving = sum(ready_pairs_by_revision(world).values())
        assert serving >= replicas - unavailable
        assert world.routing is not None
        live = [p for p in world.routing.pairs if p.state is not PairState.DRAINING]
        assert len(live) <= replicas + surge
        if phase(world) == "Promoted":
            break
    assert phase(world) == "Promoted"


def test_canary_that_never_becomes_ready_rolls_back_at_the_progress_deadline() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"setWeight": 100}], progressDeadline="60s")
    stable = rev_of(world)
    world.set_spec(builder.version("bad"))
    world.never_ready.add(rev_of(world))
    world.run_until(lambda w: phase(w) == "RolledBack", max_ticks=60, seconds=10)
    assert ready_pairs_by_revision(world) == {stable: 4}
    assert not [p for p in world.pods.values() if p.revision != stable]
    assert world.pool.status is not None and world.pool.status.rollout.failed_revision == rev_of(world)
    # the failed revision is parked: more passes do not retry it
    for _ in range(5):
        assert not world.tick(10).creates


def test_new_version_mid_rollout_restarts_and_never_promotes_the_intermediate_one() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"pause": {}}, {"setWeight": 100}])
    world.set_spec(builder.version("v2"))
    v2 = rev_of(world)
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    world.set_spec(builder.version("v3"))
    v3 = rev_of(world)
    plan = world.tick()
    assert any(e.reason == "RolloutRestarted" for e in plan.events)
    assert world.pool.status is not None and world.pool.status.rollout.revision == v3
    assert world.pool.status.rollout.step_index == 0
    world.run_until(lambda w: v2 not in {p.revision for p in w.pods.values()}, seconds=10)
    assert world.pool.status.revisions.stable is not None and world.pool.status.revisions.stable.name != v2


def test_abort_rolls_back_and_abort_without_rollout_is_a_no_op() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"pause": {}}])
    stable = rev_of(world)
    # no rollout: abort changes nothing
    world.pool = world.pool.model_copy(
        update={"metadata": world.pool.metadata.model_copy(update={"annotations": {"tandem.dev/abort": "a1"}})}
    )
    plan = world.tick()
    assert [e.reason for e in plan.events] == ["AbortIgnored"] and not plan.creates and not plan.deletes
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    world.pool = world.pool.model_copy(
        update={"metadata": world.pool.metadata.model_copy(update={"annotations": {"tandem.dev/abort": "a2"}})}
    )
    world.run_until(lambda w: phase(w) == "RolledBack", seconds=10)
    assert ready_pairs_by_revision(world) == {stable: 4}


def test_promote_request_skips_an_indefinite_pause() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"pause": {}}, {"setWeight": 100}])
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    for _ in range(5):
        world.tick()
    assert world.pool.status is not None and world.pool.status.rollout.step_index == 1
    world.pool = world.pool.model_copy(
        update={"metadata": world.pool.metadata.model_copy(update={"annotations": {"tandem.dev/promote": "p1"}})}
    )
    world.run_until(lambda w: phase(w) == "Promoted")


def test_spec_paused_freezes_the_step() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"pause": {"duration": "10s"}}, {"setWeight": 100}])
    world.set_spec(builder.version("v2").rollout(paused=True))
    for _ in range(10):
        world.tick()
    assert phase(world) == "Paused"
    assert world.pool.status is not None and world.pool.status.rollout.step_index == 0
    world.set_spec(builder.rollout(paused=False))
    world.run_until(lambda w: phase(w) == "Promoted")


def test_stable_pod_deleted_mid_canary_comes_back_on_the_stable_revision() -> None:
    world, builder = start([{"setCanaryPairs": 1}, {"pause": {}}])
    stable = rev_of(world)
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    victim = next(p for p in world.pods.values() if p.revision == stable)
    world.delete_pod(victim.name)
    plan = world.tick()
    assert [(c.revision, c.pair, c.role) for c in plan.creates] == [(stable, victim.pair_index, victim.role)]


def test_state_machine_is_deterministic_for_the_same_inputs() -> None:
    pool = make_pool().pairs(4).steps({"setWeight": 50}).obj()
    inputs = RolloutInputs(
        spec=pool.spec,
        status=RolloutStatus(),
        stable="a",
        desired="b",
        counts={"a": RevisionCounts(4, 4)},
        now=T0,
    )
    assert plan_rollout(inputs) == plan_rollout(inputs)
    decision = plan_rollout(inputs)
    assert decision.targets == {"a": 2, "b": 2} and decision.persist_first


def test_no_step_advances_while_ready_pairs_are_below_the_capacity_floor() -> None:
    """DP-02: a stable pair lost mid-canary (4 replicas, maxUnavailable 0 → floor 4): the elapsed pause does
    not complete and the status says why; once the pair is back the step completes on the next pass."""
    from datetime import timedelta  # noqa: PLC0415

    pool = make_pool().pairs(4).steps({"setCanaryPairs": 1}, {"pause": {"duration": "10s"}}, {"setWeight": 100}).obj()
    started = plan_rollout(
        RolloutInputs(spec=pool.spec, status=RolloutStatus(), stable="a", desired="b", counts={}, now=T0)
    ).status
    at_pause = started.model_copy(update={"step_index": 1, "step": "2/3", "step_started_at": T0})
    later = T0 + timedelta(seconds=30)

    def decide(stable_ready: int) -> Any:
        counts = {"a": RevisionCounts(3, stable_ready), "b": RevisionCounts(1, 1)}
        return plan_rollout(
            RolloutInputs(spec=pool.spec, status=at_pause, stable="a", desired="b", counts=counts, now=later)
        )

    held = decide(stable_ready=2)
    assert held.status.step_index == 1 and held.status.phase == "Progressing"
    assert "below the capacity floor 4" in held.status.message and "3 Ready pair(s)" in held.status.message
    assert held.requeue_after is not None and held.requeue_after <= 5.0
    assert not [e for e in held.events if e.reason == "StepCompleted"]
    resumed = decide(stable_ready=3)
    assert resumed.status.step_index == 2
    assert "holding" not in resumed.status.message


def test_rolling_back_keeps_the_canary_at_its_step_weight_until_stable_is_back() -> None:
    """While stable is short (the canary step drained one of its pairs) the failed canary keeps serving
    at the weight of the step it failed at, not at its pair share (1 of 8 pairs would be 12.5 % > 5 %)."""
    pool = make_pool().pairs(8).steps({"setWeight": 5}, {"analysis": {}}, {"setWeight": 100}).obj()
    started = plan_rollout(
        RolloutInputs(spec=pool.spec, status=RolloutStatus(), stable="a", desired="b", counts={}, now=T0)
    ).status
    rolling = started.model_copy(update={"phase": "RollingBack", "step_index": 1, "failed_revision": "b"})

    def decide(stable_ready: int) -> Any:
        counts = {"a": RevisionCounts(stable_ready, stable_ready), "b": RevisionCounts(1, 1)}
        return plan_rollout(
            RolloutInputs(spec=pool.spec, status=rolling, stable="a", desired="b", counts=counts, now=T0)
        )

    short = decide(stable_ready=7)
    assert short.targets == {"a": 8, "b": 1} and short.canary_weight_percent == 5
    back = decide(stable_ready=8)
    assert back.targets == {"a": 8, "b": 0} and back.canary_weight_percent == 0


def test_a_pass_that_is_not_due_requeues_at_the_next_evaluation_not_a_full_interval_later() -> None:
    """Controller bench C6: an intermediate pass (a pod event, a status write) in an analysis step must not
    postpone the due evaluation. interval 30 s, last evaluation at +70 s: a pass at +95 s requeues in 5 s."""
    from datetime import timedelta  # noqa: PLC0415

    from tandem.api.pool_status import AnalysisProgress  # noqa: PLC0415

    pool = make_pool().pairs(4).steps({"setCanaryPairs": 1}, {"analysis": {}}, {"setWeight": 100}).obj()
    started = plan_rollout(
        RolloutInputs(spec=pool.spec, status=RolloutStatus(), stable="a", desired="b", counts={}, now=T0)
    ).status
    progress = AnalysisProgress(success_streak=1, last_evaluated_at=T0 + timedelta(seconds=70))
    at_analysis = started.model_copy(
        update={"step_index": 1, "step": "2/3", "step_started_at": T0, "analysis": progress}
    )
    counts = {"a": RevisionCounts(3, 3), "b": RevisionCounts(1, 1)}

    def requeue_at(seconds: float) -> float | None:
        inputs = RolloutInputs(
            spec=pool.spec,
            status=at_analysis,
            stable="a",
            desired="b",
            counts=counts,
            now=T0 + timedelta(seconds=seconds),
        )
        decision = plan_rollout(inputs)
        assert decision.status.step_index == 1 and decision.status.phase == "Progressing"
        return decision.requeue_after

    assert requeue_at(95) == pytest.approx(5.0)
    assert requeue_at(71) == pytest.approx(29.0)
    assert requeue_at(100.5) == 1.0  # due now but evaluated elsewhere: retried soon, never a busy loop
    fresh = at_analysis.model_copy(update={"analysis": AnalysisProgress()})
    inputs = RolloutInputs(spec=pool.spec, status=fresh, stable="a", desired="b", counts=counts, now=T0)
    assert plan_rollout(inputs).requeue_after == pytest.approx(30.0)  # first due at initialDelay 60 s, capped


@pytest.mark.parametrize(
    ("request_id", "handled", "want"),
    [
        pytest.param("", "", False, id="no request"),
        pytest.param("20261201T100000Z-b2", "20261201T100000Z-b2", False, id="already handled"),
        pytest.param("20261201T100000Z-b2", "", True, id="first request"),
        pytest.param("20261201T100000Z-b2", "20261201T100500Z-a1", False, id="older than the abort handled since"),
        pytest.param("20261201T101000Z-c3", "20261201T100500Z-a1", True, id="newer than the last handled"),
        pytest.param("full-20261201T101000Z-c3", "20261201T100500Z-a1", True, id="full promote, newer"),
        pytest.param("full-20261201T100000Z-c3", "20261201T100500Z-a1", False, id="full promote, older"),
        pytest.param("20261201T100500Z-ff", "20261201T100500Z-a1", True, id="same second, another request"),
        pytest.param("by-hand", "20261201T100500Z-a1", True, id="hand-written id: inequality"),
    ],
)
def test_is_new_request(request_id: str, handled: str, want: bool) -> None:
    assert is_new_request(request_id, handled) is want
