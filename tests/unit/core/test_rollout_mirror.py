"""A mirror first step (`setMirrorPairs`): the canary's pairs come up beside stable's, serve no key, and the routing
table asks the router to copy their pair-count keys to them; the next set step serves, a rollback stops the copies
in the same pass (docs/design/009, "Evidence without exposure")."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.api.labels import ANNOTATION_ABORT
from tandem.api.resources import InferencePool
from tandem.core.rollout import canary_pair_load, canary_target, mirrors, step_pairs
from tandem.routing.table import PairState, RoutingTable
from tests.support.factories import World, make_nodes, make_pool


def _steps(*steps: dict[str, Any]) -> list[Any]:
    pool = InferencePool.model_validate(make_pool().steps(*steps).obj())
    return list(pool.spec.rollout.steps)


def test_a_mirror_step_sets_pairs_at_zero_weight_until_a_serving_step() -> None:
    steps = _steps({"setMirrorPairs": 1}, {"analysis": {}}, {"setCanaryPairs": 1}, {"setWeight": 100})
    assert [canary_target(steps, i, 8) for i in range(4)] == [(1, 0), (1, 0), (1, None), (8, 100)]
    assert [mirrors(steps, i) for i in range(4)] == [True, True, False, False]
    # The copies are a stable pair's share: like with like on load.
    assert canary_pair_load(steps, 1, 8, 1) == 1.0


@pytest.mark.parametrize(
    ("mirrored", "replicas", "room", "want"),
    [
        pytest.param(2, 8, 2, (2, 8), id="surge: stable keeps every pair"),
        pytest.param(2, 8, 1, (2, 6), id="no room for both: capacity-first"),
        pytest.param(2, 2, 2, (2, 2), id="as many mirrored pairs as stable's fit surge"),
        pytest.param(2, 2, 0, (1, 1), id="capacity-first never takes stable's last pair"),
        pytest.param(3, 2, None, (1, 1), id="room not computed"),
        pytest.param(1, 1, 0, (0, 1), id="one replica, no room: no mirrored pair"),
    ],
)
def test_a_mirror_step_never_takes_stables_last_pair(
    mirrored: int, replicas: int, room: int | None, want: tuple[int, int]
) -> None:
    """A mirrored canary answers no user: the router sends every request to stable's pairs, so stable must keep at
    least one, whatever the surge room."""
    steps = _steps({"setMirrorPairs": mirrored}, {"analysis": {}}, {"setWeight": 100})
    assert step_pairs(steps, 0, replicas, room) == step_pairs(steps, 1, replicas, room) == want
    assert step_pairs(steps, 2, replicas, room) == (replicas, 0)  # a serving step may take them all


def test_a_serving_step_keeps_its_capacity_first_count() -> None:
    steps = _steps({"setCanaryPairs": 2}, {"setWeight": 100})
    assert step_pairs(steps, 0, 2, 2) == (2, 0)  # all of them: a serving canary serves
    assert step_pairs(steps, 0, 8, 1) == (2, 6)


def test_a_mirror_step_without_surge_room_leaves_stable_serving_every_key() -> None:
    """Two pairs, no free GPU for a surge pair, `setMirrorPairs: 2`: one stable pair is replaced by a mirrored
    one (capacity-first, status says so), the other keeps serving every key; the canary gets copies only."""
    builder = make_pool().pairs(2).rollout(maxSurge=2, maxUnavailable=1)
    builder = builder.steps({"setMirrorPairs": 2}, {"pause": {"duration": "60s"}}, {"setWeight": 100})
    world = World(builder.obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    table = world.routing
    assert table is not None and table.revisions.canary_mirror
    canary = table.revisions.canary
    assert canary is not None and canary != stable
    assert _serving(table, canary) == [0]
    assert len(_serving(table, stable)) == 1 and all(w > 0 for w in _serving(table, stable))
    assert world.pool.status is not None and "mirrored canary pair(s) do not fit" in world.pool.status.rollout.message


def _serving(table: RoutingTable, revision: str) -> list[int]:
    return [p.weight for p in table.pairs if p.revision == revision and p.state is PairState.SERVING]


def _mirror_world(mirrored: int = 1) -> tuple[World, str, str]:
    builder = make_pool().pairs(4).rollout(maxSurge=mirrored)
    builder = builder.steps(
        {"setMirrorPairs": mirrored}, {"pause": {"duration": "60s"}}, {"setCanaryPairs": 1}, {"pause": {}}
    )
    world = World(builder.obj(), make_nodes(5 + mirrored))
    world.run_until(lambda w: w.ready_pairs() == 4)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    assert world.pool.status is not None
    return world, stable, world.pool.status.rollout.revision


def test_the_table_mirrors_a_surge_canary_pair_that_serves_no_key_then_serves_it() -> None:
    world, stable, canary = _mirror_world()
    table = world.routing
    assert table is not None
    assert table.revisions.canary == canary
    assert table.revisions.canary_weight_percent == 0
    assert table.revisions.canary_mirror
    assert _serving(table, canary) == [0]  # Ready, in the table, no key of its own
    assert len(_serving(table, stable)) == 4  # surge: stable keeps every pair
    assert world.pool.status is not None
    revs = world.pool.status.revisions
    assert revs.canary is not None and revs.canary.mirrored and revs.canary.weight_percent == 0
    assert revs.stable is not None and not revs.stable.mirrored

    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 3)
    table = world.routing
    assert table is not None
    assert not table.revisions.canary_mirror  # setCanaryPairs: the pair serves its keys now
    assert table.revisions.canary_weight_percent == 20  # 1 of 5 serving pairs
    assert all(w > 0 for w in _serving(table, canary))


def test_two_mirrored_pairs_then_one_serving_keeps_one_and_stable_whole() -> None:
    """The example's shape (`setMirrorPairs: 2`, then `setCanaryPairs: 1`): both surge pairs get copies; the serving
    step keeps one of them at a stable pair's share and lets the other go, and stable never loses a pair."""
    world, stable, canary = _mirror_world(mirrored=2)
    table = world.routing
    assert table is not None and table.revisions.canary_mirror
    assert _serving(table, canary) == [0, 0]
    assert len(_serving(table, stable)) == 4

    world.run_until(
        lambda w: (
            w.pool.status is not None
            and w.pool.status.rollout.step_index == 3
            and w.routing is not None
            and len([p for p in w.routing.pairs if p.revision == canary]) == 1
        )
    )
    table = world.routing
    assert table is not None and not table.revisions.canary_mirror
    assert table.revisions.canary_weight_percent == 20  # 1 of 5 serving pairs
    assert [w > 0 for w in _serving(table, canary)] == [True]
    assert len(_serving(table, stable)) == 4


def test_a_rollback_stops_the_copies_in_the_same_pass() -> None:
    world, _, _ = _mirror_world()
    meta = world.pool.metadata
    annotations = {**meta.annotations, ANNOTATION_ABORT: "20261201T100000Z-ab"}
    world.pool = world.pool.model_copy(update={"metadata": meta.model_copy(update={"annotations": annotations})})
    plan = world.tick()
    assert plan.routing is not None
    assert not plan.routing.revisions.canary_mirror
