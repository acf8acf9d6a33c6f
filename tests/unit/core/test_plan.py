"""The pool planner: pairs, placement, scaling, drain, repair, idempotence (pure, table + property)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.api.labels import LABEL_REVISION
from tandem.core import conditions as c
from tandem.core.plan import plan_pool
from tandem.routing.table import PairState
from tests.support.factories import World, make_nodes, make_pool


def condition(world: World, kind: str) -> tuple[str, str]:
    assert world.pool.status is not None
    cond = c.find(world.pool.status.conditions, kind)
    assert cond is not None
    return cond.status, cond.reason


def pods_by_pair(world: World) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for pod in world.pods.values():
        assert pod.pair_index is not None
        out.setdefault(pod.pair_index, []).append(pod.name)
    return out


def test_plan_creates_every_pair_on_one_node_each() -> None:
    world = World(make_pool().pairs(3).obj(), make_nodes(4))
    plan = world.tick()
    assert len(plan.creates) == 6
    nodes_per_pair = {c.pair: set() for c in plan.creates}
    for create in plan.creates:
        nodes_per_pair[create.pair].add(create.node)
    assert all(len(nodes) == 1 for nodes in nodes_per_pair.values())
    assert len({next(iter(n)) for n in nodes_per_pair.values()}) == 3
    assert [p.state for p in plan.routing.pairs] == [PairState.WARMING] * 3


def test_plan_spreads_pairs_across_zones() -> None:
    world = World(make_pool().pairs(4).obj(), make_nodes(8, zones=2))
    plan = world.tick()
    zones = Counter(
        next(n.labels["topology.kubernetes.io/zone"] for n in world.nodes if n.name == c.node)
        for c in plan.creates
        if c.role == "prefill"
    )
    assert zones == {"zone-a": 2, "zone-b": 2}


def test_converged_pool_plans_nothing_and_keeps_status() -> None:
    world = World(make_pool().pairs(3).obj(), make_nodes(4))
    world.run_until(lambda w: w.ready_pairs() == 3)
    world.tick()
    before = world.pool.status
    plan = plan_pool(world.snapshot())
    assert (plan.creates, plan.deletes, plan.rollout_first, plan.events) == ((), (), None, ())
    assert plan.status == before
    assert plan.routing == world.routing
    assert plan.requeue_after == 300.0
    assert condition(world, c.CONDITION_READY) == ("True", c.REASON_ALL_PAIRS_READY)


def test_one_prefill_three_decode_pairs_stay_in_one_zone() -> None:
    world = World(make_pool().pairs(2, ratio=(1, 3)).obj(), make_nodes(8, zones=2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    for pair, names in pods_by_pair(world).items():
        assert len(names) == 4, pair
        zones = {
            next(n.labels["topology.kubernetes.io/zone"] for n in world.nodes if n.name == world.pods[name].node)
            for name in names
        }
        assert len(zones) == 1
    roles = Counter(p.role for p in world.pods.values())
    assert roles == {"prefill": 2, "decode": 6}


def test_scale_down_drains_before_deleting() -> None:
    builder = make_pool().pairs(4)
    world = World(builder.obj(), make_nodes(4))
    world.run_until(lambda w: w.ready_pairs() == 4)
    world.set_spec(builder.pairs(2))
    plan = world.tick()
    assert plan.deletes == ()
    draining = [p for p in plan.routing.pairs if p.state is PairState.DRAINING]
    assert sorted(p.index for p in draining) == [2, 3]
    assert all(p.draining_since for p in draining)
    assert world.pool.status is not None and world.pool.status.pairs.draining == 2
    # drainTimeout is 30s: nothing deleted before it, everything after.
    for _ in range(4):
        assert world.tick(5).deletes == ()
    world.run_until(lambda w: len(w.pods) == 4, seconds=5)
    assert sorted(pods_by_pair(world)) == [0, 1]


def test_scale_back_up_mid_drain_cancels_the_drain_instead_of_replacing_the_pair() -> None:
    builder = make_pool().pairs(4)
    world = World(builder.obj(), make_nodes(4))
    world.run_until(lambda w: w.ready_pairs() == 4)
    pods = {p.name: p.uid for p in world.pods.values()}
    world.set_spec(builder.pairs(3))
    assert [p.index for p in world.tick().routing.pairs if p.state is PairState.DRAINING] == [3]
    world.set_spec(builder.pairs(4))
    plan = world.tick()
    assert plan.creates == () and plan.deletes == ()
    assert [p.state for p in plan.routing.pairs] == [PairState.SERVING] * 4
    assert {p.name: p.uid for p in world.pods.values()} == pods


@pytest.mark.parametrize("since", ["2026-01-01T00:00:00Z", "not-a-time"], ids=["forged drain", "garbage time"])
def test_foreign_drain_record_in_the_routing_table_is_not_acted_on(since: str) -> None:
    """CC-02: the drain record lives in the published table; a foreign edit marking a needed Ready pair
    draining (or writing a non-time) neither removes the pair nor breaks the pass; the table is restored."""
    world = World(make_pool().pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    pods = {p.name: p.uid for p in world.pods.values()}
    published = world.routing
    forged = [p.model_copy(update={"state": PairState.DRAINING, "draining_since": since}) for p in published.pairs]
    world.routing = published.model_copy(update={"pairs": (forged[0], *published.pairs[1:])})
    for _ in range(10):  # > drainTimeout (30 s)
        plan = world.tick()
        assert plan.creates == () and plan.deletes == ()
    assert world.routing == published
    assert {p.name: p.uid for p in world.pods.values()} == pods


def test_foreign_revision_label_is_restored_and_the_pair_kept() -> None:
    """CC-02: the revision label is editable by anyone; the pod's env records what it was built from, so
    the pair is not "mixed" (which would replace it) and the label is put back."""
    from dataclasses import replace  # noqa: PLC0415

    world = World(make_pool().pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    pods = {p.name: p.uid for p in world.pods.values()}
    victim = sorted(world.pods)[0]
    built = world.pods[victim].built_revision
    assert built
    world.pods[victim] = replace(world.pods[victim], labels={**world.pods[victim].labels, LABEL_REVISION: "foreign"})
    plan = world.tick()
    assert [(r.name, r.revision) for r in plan.relabels] == [(victim, built)]
    assert plan.creates == () and plan.deletes == ()
    assert world.pods[victim].labels[LABEL_REVISION] == built
    assert world.tick().relabels == ()
    assert {p.name: p.uid for p in world.pods.values()} == pods


def test_gpus_exhausted_bounds_pending_and_keeps_serving_pairs() -> None:
    builder = make_pool().pairs(2)
    world = World(builder.obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    serving = {p.name: p.uid for p in world.pods.values()}
    world.set_spec(builder.pairs(6))
    for _ in range(10):
        world.tick()
    pending = [p for p in world.pods.values() if p.node is None]
    assert len(pending) <= 2  # maxSurge 1 pair x 2 pods
    assert all(world.pods[name].uid == uid for name, uid in serving.items())
    assert condition(world, c.CONDITION_DEGRADED) == ("True", c.REASON_INSUFFICIENT_GPU)
    assert condition(world, c.CONDITION_READY)[0] == "False"


def test_deleted_pod_is_recreated_with_same_name_on_partner_node() -> None:
    world = World(make_pool().pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    victim = world.pods["speed-p1-decode-0"]
    partner = world.pods["speed-p1-prefill-0"]
    world.delete_pod(victim.name)
    plan = world.tick()
    assert [(c.pair, c.role, c.instance, c.node, c.revision) for c in plan.creates] == [
        (1, "decode", 0, partner.node, victim.revision)
    ]
    world.run_until(lambda w: w.ready_pairs() == 2)


def test_lost_node_pair_is_replaced_elsewhere() -> None:
    world = World(make_pool().pairs(2).obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 2)
    lost = world.pods["speed-p0-prefill-0"].node
    assert lost is not None
    world.remove_node(lost)
    world.run_until(lambda w: w.ready_pairs() == 2)
    assert all(p.node != lost for p in world.pods.values())


def test_half_pair_is_replaced_after_orphan_timeout() -> None:
    builder = make_pool().pairs(1).set("spec.pairs.orphanTimeout", "60s")
    world = World(builder.obj(), make_nodes(1))
    world.run_until(lambda w: w.ready_pairs() == 1)
    # decode lost and its GPUs taken by something else: it cannot come back on the partner's node
    world.delete_pod("speed-p0-decode-0")
    world.nodes = [n.__class__(name=n.name, labels=n.labels, allocatable={"amd.com/gpu": 4}) for n in world.nodes]
    plans = [world.tick(10) for _ in range(8)]
    assert any(d.name == "speed-p0-prefill-0" for p in plans for d in p.deletes)
    assert condition(world, c.CONDITION_READY)[0] == "False"


def test_scale_to_zero_is_ready() -> None:
    builder = make_pool().pairs(1)
    world = World(builder.obj(), make_nodes(1))
    world.run_until(lambda w: w.ready_pairs() == 1)
    world.set_spec(builder.pairs(0))
    world.run_until(lambda w: not w.pods, seconds=10)
    assert condition(world, c.CONDITION_READY) == ("True", c.REASON_SCALED_TO_ZERO)


def test_status_reports_selector_and_counts() -> None:
    world = World(make_pool("pool-a").pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    status = world.pool.status
    assert status is not None
    assert status.selector == "tandem.dev/component=engine,tandem.dev/pool=pool-a"
    assert (status.replicas, status.pairs.ready, status.pairs.summary) == (2, 2, "2/2")
    assert status.revisions.stable is not None and status.revisions.stable.version == "v1"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    replicas=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=4),
    ratio=st.sampled_from([(1, 1), (1, 2), (2, 1)]),
    nodes=st.integers(min_value=2, max_value=8),
)
def test_planner_invariants_under_scaling(replicas: list[int], ratio: tuple[int, int], nodes: int) -> None:
    """Ratio kept, pairs never mix revisions, pending bounded by surge, quiet once converged."""
    builder = make_pool().pairs(replicas[0], ratio=ratio)
    world = World(builder.obj(), make_nodes(nodes))
    for target in replicas:
        world.set_spec(builder.pairs(target, ratio=ratio))
        for _ in range(20):
            world.tick(10)
            pending_pairs = {p.pair_index for p in world.pods.values() if p.node is None and not p.deleting}
            assert len(pending_pairs) <= 1  # maxSurge
            for pair, names in pods_by_pair(world).items():
                assert len({world.pods[n].revision for n in names}) == 1
                roles = Counter(world.pods[n].role for n in names)
                assert roles["prefill"] <= ratio[0] and roles["decode"] <= ratio[1], pair
    # at rest: a second pass over the same world changes nothing
    again = plan_pool(world.snapshot())
    if (
        not any(p.node is None for p in world.pods.values())
        and world.pool.status
        and world.pool.status.pairs.draining == 0
    ):
        assert (again.creates, again.deletes) == ((), ())
        assert again.status == world.pool.status


def test_prefill_bound_pool_gets_a_new_pair_shape_through_a_rollout() -> None:
    """P:D adjustment (issue 7): a prefill-bound pool is reshaped 1P:1D → 2P:1D, keeping its instances."""
    from dataclasses import replace  # noqa: PLC0415

    from tandem.core.autoscale import InstanceSample, MetricsSnapshot, PoolSample, RatioState  # noqa: PLC0415

    builder = (
        make_pool()
        .pairs(4)
        .set(
            "spec.autoscaling",
            {
                "enabled": True,
                "minPairs": 1,
                "maxPairs": 8,
                "interval": "30s",
                "targets": {"ttftP95Ms": 1000, "tpotP90Ms": 20, "kvCacheUtilizationPercent": None},
                "ratio": {"enabled": True, "minPrefill": 1, "maxPrefill": 2, "minDecode": 1, "maxDecode": 1},
            },
        )
    )
    world = World(builder.obj(), make_nodes(8))
    world.run_until(lambda w: w.ready_pairs() == 4)
    instances = tuple(
        InstanceSample(pair=f"speed-p{i}", role=role, running=10.0, waiting=0.0, kv_cache_utilization=0.3)
        for i in range(4)
        for role in ("prefill", "decode")
    )
    # TTFT at its target while decode is idle: prefill is the bottleneck, and has been for a long time.
    metrics = MetricsSnapshot(
        instances=instances,
        pool=PoolSample(ttft_p95_s=1.0, tpot_p90_s=0.008),
        expected_prefill=4,
        expected_decode=4,
    )
    snapshot = replace(
        world.snapshot(),
        scaling_metrics=metrics,
        ratio_state=RatioState(bottleneck="prefill", since=world.now.timestamp() - 3600),
    )
    plan = plan_pool(snapshot)
    assert plan.reshape_to == (2, 1)
    assert plan.scale_to is not None and plan.scale_to >= 4  # no role loses instances
    assert any("1P:1D → 2P:1D" in e.message for e in plan.events)


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(({"setCanaryPairs": 1}, {"setWeight": 100}), id="all canary at promotion"),
        pytest.param(({"setCanaryPairs": 1},), id="stable pairs left at promotion"),
    ],
)
def test_a_promotion_persisted_without_its_stable_revision_is_finished_not_restarted(
    steps: tuple[dict[str, object], ...],
) -> None:
    """OP-01: the operator persists a promotion (the rollout status alone) before acting, and writes
    ``revisions.stable`` with the full status afterwards. Killed between the two, the next pass must finish
    the promotion, never start the rollout over from step 1."""
    builder = make_pool().pairs(3).rollout(maxSurge=1, maxUnavailable=0).steps(*steps)
    world = World(builder.obj(), make_nodes(4))
    world.run_until(lambda w: w.ready_pairs() == 3)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    old = world.pool.status.revisions.stable.name
    world.set_spec(builder.version("v2"))
    before, table, pods = world.pool.status, world.routing, dict(world.pods)
    for _ in range(100):
        before, table, pods = world.pool.status, world.routing, dict(world.pods)
        plan = world.tick()
        if plan.status.rollout.phase == "Promoted":
            break
    else:
        raise AssertionError("never promoted")
    assert plan.rollout_first is not None and plan.rollout_first.phase == "Promoted"
    new = plan.rollout_first.revision
    assert new != old
    # the kill: only the persist-first write landed; the pass's pod actions, table and full status did not
    assert before is not None and before.revisions.stable is not None and before.revisions.stable.name == old
    world.pool = world.pool.model_copy(update={"status": before.model_copy(update={"rollout": plan.rollout_first})})
    world.routing, world.pods = table, pods
    replayed = [world.tick() for _ in range(30)]
    reasons = {e.reason for p in replayed for e in p.events}
    assert not reasons & {"RolloutStarted", "RolloutRestarted", "DrainRecordRejected"}, reasons
    final = world.pool.status
    assert final is not None and final.revisions.stable is not None
    assert final.rollout.phase == "Promoted" and final.revisions.stable.name == new
    assert {p.labels[LABEL_REVISION] for p in world.pods.values()} == {new}
    assert world.ready_pairs() == 3
