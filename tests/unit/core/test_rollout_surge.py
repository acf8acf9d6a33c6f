"""Surge canary capacity (issue 17 item 3): stable keeps its pairs while there is room, a rollback takes
the canary's weight to 0 in one pass, and a pool without room says it runs capacity-first."""

from __future__ import annotations

import pytest

from tandem.api.labels import ANNOTATION_ABORT, LABEL_PAIR
from tandem.core import conditions as c
from tandem.core.plan import canary_share
from tandem.core.rollout import surge_room
from tandem.routing.table import PairState
from tests.support.factories import World, make_nodes, make_pool


@pytest.mark.parametrize(
    ("max_surge", "live_canary", "live_stable", "free_pairs", "budget", "want"),
    [
        pytest.param(2, 0, 8, 5, None, 2, id="maxSurge caps"),
        pytest.param(2, 1, 8, 0, None, 1, id="a placed canary keeps its room"),
        pytest.param(2, 1, 7, 0, None, 0, id="a canary in a stable pair's place stays capacity-first"),
        pytest.param(2, 0, 8, 0, None, 0, id="no free GPUs"),
        pytest.param(2, 0, 8, 5, 72, 1, id="gpuBudget caps"),
        pytest.param(2, 0, 8, 5, 64, 0, id="budget already full"),
        pytest.param(0, 0, 8, 5, None, 0, id="maxSurge 0"),
    ],
)
def test_surge_room(
    max_surge: int, live_canary: int, live_stable: int, free_pairs: int, budget: int | None, want: int
) -> None:
    got = surge_room(
        max_surge=max_surge,
        replicas=8,
        live_canary=live_canary,
        live_stable=live_stable,
        free_pairs=free_pairs,
        gpus_per_pair=8,
        gpu_budget=budget,
    )
    assert got == want


def _canary_world(nodes: int, max_unavailable: int = 0) -> tuple[World, str]:
    """4 stable v1 pairs (one 8-GPU node each), then v2 with steps [setCanaryPairs 1, pause]."""
    builder = make_pool().pairs(4).rollout(maxSurge=1, maxUnavailable=max_unavailable)
    builder = builder.steps({"setCanaryPairs": 1}, {"pause": {}})
    world = World(builder.obj(), make_nodes(nodes))
    world.run_until(lambda w: w.ready_pairs() == 4)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    return world, stable


def _live_pairs(world: World) -> dict[str, int]:
    assert world.routing is not None
    out: dict[str, int] = {}
    for pair in world.routing.pairs:
        if pair.state is not PairState.DRAINING:
            out[pair.revision] = out.get(pair.revision, 0) + 1
    return out


def test_surge_canary_keeps_every_stable_pair_and_rolls_back_in_one_pass() -> None:
    world, stable = _canary_world(nodes=6)
    live = _live_pairs(world)
    assert live[stable] == 4 and sum(live.values()) == 5  # the canary came up beside stable
    assert world.pool.status is not None
    cond = c.find(world.pool.status.conditions, "Progressing")
    assert cond is not None and cond.reason == c.REASON_ROLLOUT_IN_PROGRESS
    canary = world.pool.status.rollout.revision
    assert world.routing.revisions.canary == canary

    meta = world.pool.metadata
    annotations = {**meta.annotations, ANNOTATION_ABORT: "20261201T100000Z-ab"}
    world.pool = world.pool.model_copy(update={"metadata": meta.model_copy(update={"annotations": annotations})})
    plan = world.tick()
    # One pass: no canary traffic in the published table, the canary pair draining, stable untouched.
    assert plan.routing.revisions.canary is None or plan.routing.revisions.canary_weight_percent == 0
    assert not [p for p in plan.routing.pairs if p.revision == canary and p.state is PairState.SERVING]
    assert len([p for p in plan.routing.pairs if p.revision == stable and p.state is PairState.SERVING]) == 4
    assert not [d for d in plan.deletes if stable in d.name]
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.phase == "RolledBack")
    assert _live_pairs(world) == {stable: 4}


def test_no_free_gpus_runs_capacity_first_and_says_so() -> None:
    world, stable = _canary_world(nodes=4, max_unavailable=1)  # no room: a stable pair must make way
    live = _live_pairs(world)
    assert live[stable] == 3 and sum(live.values()) == 4  # the canary replaced a stable pair
    assert world.pool.status is not None
    cond = c.find(world.pool.status.conditions, "Progressing")
    assert cond is not None and cond.reason == c.REASON_CANARY_CAPACITY_FIRST
    assert "capacity-first" in world.pool.status.rollout.message


@pytest.mark.parametrize(
    ("weight", "ready_canary", "serving", "want"),
    [
        pytest.param(5, 1, 9, 5, id="small weight on one surge pair"),
        pytest.param(50, 1, 9, 11, id="weight capped by the Ready share"),
        pytest.param(None, 1, 9, 11, id="by pair count"),
        pytest.param(0, 1, 9, 0, id="rollback: weight 0"),
        pytest.param(30, 2, 2, 100, id="only canary pairs serve"),
        pytest.param(5, 0, 0, 0, id="nothing serving"),
    ],
)
def test_canary_share(weight: int | None, ready_canary: int, serving: int, want: int) -> None:
    """The one share the operator's table and the simulator publish (``core.plan.canary_share``)."""
    assert canary_share(weight, ready_canary, serving) == want


def _two_pair_step(nodes: int, max_unavailable: int) -> tuple[World, str]:
    """4 stable v1 pairs, then v2 with [setWeight 50 (2 canary pairs), pause]; the second canary pair to be
    created never becomes Ready. Returns the world one pass after the first canary pair is Ready."""
    builder = make_pool().pairs(4).rollout(maxSurge=2, maxUnavailable=max_unavailable)
    builder = builder.steps({"setWeight": 50}, {"pause": {}})
    world = World(builder.obj(), make_nodes(nodes))
    world.run_until(lambda w: w.ready_pairs() == 4)
    world.set_spec(builder.version("v2"))
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.run_until(lambda w: len({p.labels[LABEL_PAIR] for p in w.pods.values() if p.revision != stable}) == 2)
    late = max(p.labels[LABEL_PAIR] for p in world.pods.values() if p.revision != stable)
    world.never_ready_pairs.add(late)
    world.run_until(
        lambda w: (
            w.routing is not None
            and any(p.revision != stable and p.state is PairState.SERVING for p in w.routing.pairs)
        )
    )
    world.tick()
    return world, late


def test_surge_step_publishes_its_weight_only_when_all_its_pairs_are_ready() -> None:
    """A surge set step keeps the previous weight (0 before the first step) while some of its pairs load:
    analysis starts only when the step completes, so earlier traffic would go unwatched (W5 seeds 2 and 6
    served a bad canary 664 s before its first evaluation)."""
    world, late = _two_pair_step(nodes=8, max_unavailable=0)
    assert world.pool.status is not None and world.pool.status.rollout.step_index == 0
    assert world.routing.revisions.canary is not None  # one canary pair serves in the table...
    assert world.routing.revisions.canary_weight_percent == 0  # ...with no share of keys yet
    canary = world.routing.revisions.canary
    serving = [p for p in world.routing.pairs if p.revision == canary and p.state is PairState.SERVING]
    assert len(serving) == 1 and serving[0].weight == 0

    world.never_ready_pairs.discard(late)
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    # The pass that completes the step starts the next one and publishes the step's weight (capped by the
    # Ready share: 2 canary pairs of 6 serving).
    assert world.routing.revisions.canary_weight_percent == canary_share(50, 2, 6)


def test_capacity_first_step_serves_its_ready_pairs_at_once() -> None:
    """Without surge room the Ready canary pair replaced a stable one and must carry traffic."""
    world, _ = _two_pair_step(nodes=4, max_unavailable=2)
    assert world.pool.status is not None and world.pool.status.rollout.step_index == 0
    serving = [p for p in world.routing.pairs if p.state is PairState.SERVING]
    ready_canary = sum(1 for p in serving if p.revision == world.routing.revisions.canary)
    assert ready_canary == 1
    assert world.routing.revisions.canary_weight_percent == canary_share(50, 1, len(serving)) > 0
