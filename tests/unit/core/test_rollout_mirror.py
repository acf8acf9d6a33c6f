"""A mirror first step (`setMirrorPairs`): the canary's pairs come up beside stable's, serve no key, and the routing
table asks the router to copy their pair-count keys to them; the next set step serves, a rollback stops the copies
in the same pass (docs/design/009, "Evidence without exposure")."""

from __future__ import annotations

from typing import Any

from tandem.api.labels import ANNOTATION_ABORT
from tandem.api.resources import InferencePool
from tandem.core.rollout import canary_pair_load, canary_target, mirrors
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


def _serving(table: RoutingTable, revision: str) -> list[int]:
    return [p.weight for p in table.pairs if p.revision == revision and p.state is PairState.SERVING]


def _mirror_world() -> tuple[World, str, str]:
    builder = make_pool().pairs(4).rollout(maxSurge=1)
    builder = builder.steps({"setMirrorPairs": 1}, {"pause": {"duration": "60s"}}, {"setCanaryPairs": 1}, {"pause": {}})
    world = World(builder.obj(), make_nodes(6))
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


def test_a_rollback_stops_the_copies_in_the_same_pass() -> None:
    world, _, _ = _mirror_world()
    meta = world.pool.metadata
    annotations = {**meta.annotations, ANNOTATION_ABORT: "20261201T100000Z-ab"}
    world.pool = world.pool.model_copy(update={"metadata": meta.model_copy(update={"annotations": annotations})})
    plan = world.tick()
    assert plan.routing is not None
    assert not plan.routing.revisions.canary_mirror
