"""A P:D change without rolling every pair group (issue 18 item 5, design note 012 §5, ``tandem.core.reshape``):
the revision stays, new groups take the new shape, off-target groups are replaced one at a time, surge first,
and a scale-down drains them first."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tandem.api.labels import parse_shape, shape_text
from tandem.api.revision import revision_spec, same_stack
from tandem.core import plan as plan_module
from tandem.core.autoscale import (
    AutoscaleState,
    MetricsSnapshot,
    ScaleContext,
    WorkState,
    compute_desired_pairs,
    compute_role_ratio,
    last_work_need,
)
from tandem.core.capacity import ForecastState
from tandem.core.observed import ObservedPod, Snapshot
from tandem.core.pairs import PairView
from tandem.core.plan import plan_pool
from tandem.core.reasons import REASON_RESHAPING
from tandem.core.reshape import drain_order, reshape_surge
from tandem.routing.table import PairState
from tests.support.factories import World, image, make_nodes, make_pool
from tests.unit.core.test_autoscale_work import snapshot as work_metrics


def shapes(world: World) -> Counter[tuple[int, int]]:
    """Live groups by (prefill, decode) pods."""
    by_pair: dict[int, Counter[str]] = {}
    for pod in world.pods.values():
        if not pod.deleting:
            assert pod.pair_index is not None and pod.role is not None
            by_pair.setdefault(pod.pair_index, Counter())[pod.role] += 1
    draining = {p.index for p in world.routing.pairs if p.state is PairState.DRAINING} if world.routing else set()
    return Counter((c["prefill"], c["decode"]) for i, c in by_pair.items() if i not in draining)


def converged(replicas: int, ratio: tuple[int, int], nodes: int) -> World:
    world = World(make_pool().pairs(replicas, ratio=ratio, gpus=2).obj(), make_nodes(nodes))
    world.run_until(lambda w: w.ready_pairs() == replicas and not w.plans[-1].creates)
    return world


def test_a_pd_change_keeps_the_revision_and_replaces_groups_one_at_a_time_surge_first() -> None:
    world = converged(3, (1, 1), nodes=6)
    assert world.pool.status is not None
    stable = world.pool.status.revisions.stable
    assert stable is not None
    world.set_spec(make_pool().pairs(3, ratio=(2, 1), gpus=2))
    plan = world.tick()
    assert plan.desired_revision == stable.name  # the stack did not change: no new revision, no canary
    assert plan.status.revisions.canary is None and plan.status.rollout.phase != "Progressing"
    assert {c.shape for c in plan.creates} == {(2, 1)} and Counter(c.role for c in plan.creates) == {
        "prefill": 2,
        "decode": 1,
    }
    assert any(e.reason == REASON_RESHAPING and "1P:1D" in e.message and "2P:1D" in e.message for e in plan.events)
    assert plan.status.pairs.off_shape == 3
    seen_live, seen_ready = [], []
    for _ in range(200):
        world.tick()
        seen_live.append(sum(shapes(world).values()))
        seen_ready.append(world.ready_pairs())
        table = world.routing.pairs
        if shapes(world) == Counter({(2, 1): 3}) and all(p.state is PairState.SERVING for p in table):
            break
    else:
        raise AssertionError(f"did not converge: {shapes(world)}")
    assert min(seen_ready) >= 3  # capacity never dropped below replicas
    assert max(seen_live) <= 4  # one surge group at a time (maxSurge 1)
    assert world.pool.status is not None and world.pool.status.pairs.off_shape == 0
    revs = {p.revision for p in world.pods.values()}
    assert revs == {stable.name}
    assert all(len(p.prefill) == 2 and len(p.decode) == 1 for p in world.routing.pairs)
    # converged: a quiet pass plans nothing
    plan = plan_pool(world.snapshot())
    assert (plan.creates, plan.deletes) == ((), ())


def test_without_room_groups_keep_their_shape_and_a_scale_down_drains_them_first() -> None:
    world = converged(4, (1, 1), nodes=2)  # 2 nodes x 8 GPUs hold exactly four 1P:1D groups of 4 GPUs
    world.set_spec(make_pool().pairs(4, ratio=(2, 1), gpus=2))
    plan = world.tick()
    assert plan.creates == () and plan.deletes == ()  # no free GPUs: nothing is replaced, nothing lost
    assert plan.status.pairs.off_shape == 4 and world.ready_pairs() == 4
    # the Progressing condition says why the groups stay as they are (offShape alone does not)
    progressing = next(c for c in plan.status.conditions if c.type == "Progressing")
    assert progressing.status == "False"
    assert "4 pair group(s) off the pool's P:D (2P:1D)" in progressing.message
    assert "no room for a surge group" in progressing.message
    # a lost pod comes back in its group's shape (1P:1D), not the pool's new one
    victim = next(p for p in world.pods.values() if p.role == "prefill" and p.pair_index == 1)
    world.delete_pod(victim.name)
    plan = world.tick()
    assert [(c.pair, c.role, c.instance, c.shape) for c in plan.creates] == [(1, "prefill", 0, (1, 1))]
    world.run_until(lambda w: w.ready_pairs() == 4)
    # scale up by one with room for it: the new group is 2P:1D
    world.nodes = make_nodes(3)
    world.set_spec(make_pool().pairs(5, ratio=(2, 1), gpus=2))
    world.run_until(lambda w: w.ready_pairs() == 5 and not w.plans[-1].creates)
    assert shapes(world)[(2, 1)] >= 1
    # scale down to 2: the drained groups are 1P:1D ones; the 2P:1D group stays
    on_target = {p.index for p in world.routing.pairs if (len(p.prefill), len(p.decode)) == (2, 1)}
    world.set_spec(make_pool().pairs(2, ratio=(2, 1), gpus=2))
    plan = world.tick()
    drained = {p.index for p in plan.routing.pairs if p.state is PairState.DRAINING}
    assert drained and not drained & on_target
    shape_of = {p.index: (len(p.prefill), len(p.decode)) for p in plan.routing.pairs}
    assert {shape_of[i] for i in drained} == {(1, 1)}
    # once the drains free GPUs, the last 1P:1D group is replaced, surge first
    world.run_until(lambda w: shapes(w) == Counter({(2, 1): 2}) and w.ready_pairs() == 2, 300)
    assert on_target <= {p.index for p in world.routing.pairs}


def test_a_new_stack_with_a_new_shape_is_a_rollout_built_in_the_new_shape() -> None:
    world = converged(2, (1, 1), nodes=6)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.set_spec(make_pool().pairs(2, ratio=(2, 1), gpus=2).version("v2"))
    plan = world.tick()
    assert plan.desired_revision != stable
    assert plan.creates and {c.shape for c in plan.creates} == {(2, 1)}
    assert {c.revision for c in plan.creates} == {plan.desired_revision}


def test_a_pd_change_during_a_rollout_keeps_the_canary_revision() -> None:
    """Only the shape changed while v2 is rolling out: the rollout goes on with the same canary revision (no
    third revision), its later groups take the new shape, and after the promotion the canary's old-shape group
    is replaced like any other."""
    world = converged(2, (1, 1), nodes=8)
    steps = ({"setWeight": 50}, {"setWeight": 100})
    world.set_spec(make_pool().pairs(2, ratio=(1, 1), gpus=2).version("v2").steps(*steps))
    since = len(world.plans)
    first = world.tick()
    canary = first.desired_revision
    assert {c.shape for c in first.creates} == {(1, 1)}
    world.set_spec(make_pool().pairs(2, ratio=(2, 1), gpus=2).version("v2").steps(*steps))
    plan = world.tick()
    assert plan.desired_revision == canary
    assert plan.status.revisions.canary is not None and plan.status.revisions.canary.name == canary
    world.run_until(
        lambda w: (
            w.pool.status.revisions.stable.name == canary
            and shapes(w) == Counter({(2, 1): 2})
            and all(p.state is PairState.SERVING for p in w.routing.pairs)
        ),
        300,
    )
    assert {p.desired_revision for p in world.plans[since:]} == {canary}
    assert {c.revision for p in world.plans[since:] for c in p.creates} == {canary}


def test_a_group_without_a_readable_shape_of_its_own_falls_back_to_its_revision() -> None:
    """A pod from before the shape was recorded (no env), or one whose value is garbled, gives its group the
    shape of its revision snapshot, as before."""
    world = converged(1, (1, 1), nodes=2)
    for name, pod in list(world.pods.items()):
        world.pods[name] = replace(pod, built_shape=None)
    plan = world.tick()
    assert (plan.creates, plan.deletes) == ((), ())
    assert plan.status.pairs.off_shape == 0 and world.ready_pairs() == 1


@pytest.mark.parametrize(
    ("text", "want"),
    [("2p1d", (2, 1)), ("1p16d", (1, 16)), ("0p1d", None), ("17p1d", None), ("2p", None), ("ap1d", None), ("", None)],
)
def test_shape_text_round_trips_within_the_api_bounds(text: str, want: tuple[int, int] | None) -> None:
    assert parse_shape(text) == want
    if want is not None:
        assert shape_text(want) == text


def test_same_stack_sets_only_the_shape_aside() -> None:
    base = make_pool().pairs(2, ratio=(1, 1)).obj().spec
    reshaped = make_pool().pairs(2, ratio=(4, 1)).obj().spec
    other_gpus = make_pool().pairs(2, ratio=(1, 1), gpus=8).obj().spec
    new_image = make_pool().pairs(2).version("v2").obj().spec
    assert same_stack(revision_spec(base), revision_spec(reshaped))
    assert not same_stack(revision_spec(base), revision_spec(other_gpus))  # GPUs per instance shape the pod
    assert not same_stack(revision_spec(base), revision_spec(new_image))
    assert image("v2") in new_image.stack.image


def _pair(index: int, shape: tuple[int, int], *, ready: bool = True, draining: bool = False) -> PairView:
    pods = tuple(
        ObservedPod(
            name=f"p{index}-{role}-{i}",
            uid=f"u{index}{role}{i}",
            labels={
                "tandem.dev/pool": "speed",
                "tandem.dev/pair": f"speed-p{index}",
                "tandem.dev/role": role,
                "tandem.dev/instance": str(i),
            },
            node="n",
            phase="Running",
            ready=ready,
            deleting=False,
            created=datetime(2026, 1, 1, tzinfo=UTC),
            built_shape=shape,
        )
        for role, n in (("prefill", shape[0]), ("decode", shape[1]))
        for i in range(n)
    )
    return PairView(
        pool="speed",
        index=index,
        revision="r1",
        pods=pods,
        shape=(("prefill", shape[0]), ("decode", shape[1])),
        draining_since=datetime(2026, 1, 1, tzinfo=UTC) if draining else None,
    )


@pytest.mark.parametrize(
    ("pairs", "steady", "room", "extra"),
    [
        pytest.param([_pair(0, (1, 1)), _pair(1, (1, 1))], True, 1, 1, id="replicas Ready, room: start one"),
        pytest.param([_pair(0, (1, 1)), _pair(1, (1, 1))], True, 0, 0, id="no room: wait for the fleet to cycle"),
        pytest.param([_pair(0, (1, 1)), _pair(1, (1, 1))], False, 1, 0, id="a rollout or scaling is moving"),
        pytest.param([_pair(0, (2, 1)), _pair(1, (2, 1))], True, 1, 0, id="all on target"),
        pytest.param(
            [_pair(0, (1, 1)), _pair(1, (1, 1)), _pair(2, (2, 1), ready=False)], True, 0, 1, id="replacement loading"
        ),
        pytest.param(
            [_pair(0, (1, 1)), _pair(1, (1, 1)), _pair(2, (2, 1))], True, 1, 0, id="replacement Ready: drain one"
        ),
        pytest.param(
            [_pair(0, (1, 1)), _pair(1, (2, 1)), _pair(2, (1, 1), draining=True)], True, 1, 0, id="drain in flight"
        ),
        pytest.param([_pair(0, (1, 1)), _pair(1, (1, 1), ready=False)], True, 1, 0, id="a group not Ready"),
    ],
)
def test_reshape_surge(pairs: list[PairView], steady: bool, room: int, extra: int) -> None:
    got = reshape_surge(pairs, revision="r1", target=(2, 1), replicas=2, steady=steady, room=room)
    assert got.extra == extra


@pytest.mark.parametrize(
    ("need", "at_max", "extra"),
    [
        pytest.param(None, False, 0, id="no work planning: drain"),
        pytest.param((2.0, 5.0), False, 1, id="draining a 1P:3D group leaves 4 decode of 5: keep"),
        pytest.param((3.0, 4.0), False, 1, id="prefill would be short: keep"),
        pytest.param((2.0, 4.0), False, 0, id="4 decode left cover 4: drain"),
        pytest.param((2.0, 5.0), True, 0, id="at maxPairs: drain"),
    ],
)
def test_reshape_surge_keeps_a_ready_replacement_while_the_drain_would_leave_a_role_short(
    need: tuple[float, float] | None, at_max: bool, extra: int
) -> None:
    pairs = [_pair(0, (1, 3)), _pair(1, (1, 3)), _pair(2, (1, 1))]
    got = reshape_surge(
        pairs, revision="r1", target=(1, 1), replicas=2, steady=True, room=0, need=need, at_max_pairs=at_max
    )
    assert got.extra == extra
    assert got.off_shape == 2


@pytest.mark.parametrize(
    ("need", "extra", "settled"),
    [
        pytest.param(None, 1, False, id="no need known: replace"),
        pytest.param((4.0, 2.0), 1, False, id="four 1P:1D hold 4P+2D in 8, two 2P:1D in 6: replace"),
        pytest.param((4.0, 4.0), 0, True, id="four 1P:1D hold 4P+4D in 8, 2P:1D groups take 12: keep"),
        pytest.param((4.0, 3.0), 0, True, id="8 against 9: keep"),
    ],
)
def test_reshape_surge_replaces_only_above_the_tax_bound(
    need: tuple[float, float] | None, extra: int, settled: bool
) -> None:
    pairs = [_pair(i, (1, 1)) for i in range(4)]
    got = reshape_surge(pairs, revision="r1", target=(2, 1), replicas=4, steady=True, room=1, need=need)
    assert (got.extra, got.settled, got.off_shape) == (extra, settled, 4)


def test_drain_order_takes_off_target_groups_first_then_the_highest_index() -> None:
    pairs = [_pair(0, (1, 1)), _pair(1, (2, 1)), _pair(2, (1, 1)), _pair(3, (2, 1))]
    order = sorted(pairs, key=lambda p: drain_order(p, (2, 1)), reverse=True)
    assert [p.index for p in order] == [2, 0, 3, 1]


def test_the_autoscaler_is_told_each_groups_own_shape_in_keep_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work planning counts groups as they are while they cycle (``tandem.core.capacity.groups_for``): the
    planner hands it every live group's P:D, target-shaped first, the ones a scale-down drains last."""
    world = converged(4, (1, 1), nodes=3)  # room for one surge group
    autoscaling = {"enabled": True, "minPairs": 1, "maxPairs": 8}
    world.set_spec(make_pool().pairs(4, ratio=(2, 1), gpus=2).set("spec.autoscaling", autoscaling))
    world.run_until(lambda w: shapes(w)[(2, 1)] == 1 and w.ready_pairs() == 4 and not w.plans[-1].creates, 300)
    seen: list[ScaleContext] = []

    def spy(policy: object, context: ScaleContext, *rest: object) -> object:
        seen.append(context)
        return compute_desired_pairs(policy, context, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr("tandem.core.plan.compute_desired_pairs", spy)
    plan_pool(replace(world.snapshot(), scaling_metrics=MetricsSnapshot()))
    assert len(seen) == 1
    assert seen[0].shape == (2, 1)
    assert seen[0].group_shapes == ((2, 1), (1, 1), (1, 1), (1, 1))


def _need_state(at: float, prefill: float, decode: float) -> AutoscaleState:
    """Work planning's state after one evaluation at ``at`` that needed these instances."""
    return AutoscaleState(
        work=WorkState(prefill=ForecastState(samples=((at, prefill),)), decode=ForecastState(samples=((at, decode),)))
    )


@pytest.mark.parametrize(
    ("need", "max_pairs", "age_s", "settled"),
    [
        pytest.param((3.0, 1.0), 8, 0.0, {(1, 3): 2, (1, 1): 1}, id="prefill would be short: keep the replacement"),
        pytest.param((2.0, 1.0), 8, 0.0, {(1, 1): 2}, id="the groups left cover the need: drain"),
        pytest.param((3.0, 1.0), 2, 0.0, {(1, 1): 2}, id="at maxPairs no group can come: drain"),
        pytest.param((3.0, 1.0), 8, 600.0, {(1, 1): 2}, id="a need older than 3 evaluations: drain"),
        pytest.param((2.0, 5.0), 8, 0.0, {(1, 3): 2}, id="the mix is cheaper for this need: no replacement"),
    ],
)
def test_a_replacement_waits_for_the_need_and_only_pays_off_above_the_tax_bound(
    need: tuple[float, float], max_pairs: int, age_s: float, settled: dict[tuple[int, int], int]
) -> None:
    """Two 1P:3D groups, target 1P:1D. A replacement starts only while the mix needs more than 15 % more
    instances than 1P:1D groups for work planning's last need (need 2P+5D: two 1P:3D hold it in 8 instances,
    five 1P:1D would take 10, so nothing is replaced). Once a replacement is Ready, an off-target group is
    drained only while the groups left still hold the need (need 3P: one 1P:3D and one 1P:1D hold 2), else the
    replacement stays until the autoscaler adds a group (``tandem.core.reshape``)."""
    world = converged(2, (1, 3), nodes=3)  # a 1P:3D group of 2-GPU instances fills an 8-GPU node: room for one
    autoscaling = {"enabled": True, "minPairs": 1, "maxPairs": max_pairs, "interval": "30s"}
    world.set_spec(make_pool().pairs(2, ratio=(1, 1), gpus=2).set("spec.autoscaling", autoscaling))
    plain = World.snapshot

    def with_need(w: World) -> Snapshot:
        return replace(plain(w), autoscale_state=_need_state(w.now.timestamp() - age_s, *need))

    world.snapshot = lambda: with_need(world)  # type: ignore[method-assign]
    world.run_until(lambda w: shapes(w) == Counter(settled) and all(p.ready for p in w.pods.values()), 200)
    for _ in range(20):  # and it stays there
        world.tick()
    assert shapes(world) == Counter(settled)
    assert world.ready_pairs() >= 2
    assert world.pool.status is not None and world.pool.status.pairs.off_shape == settled.get((1, 3), 0)
    progressing = next(c for c in world.pool.status.conditions if c.type == "Progressing")
    kept_by_choice = "within 15%, no replacement" in progressing.message
    assert kept_by_choice == (settled == {(1, 3): 2})  # only the cheaper mix is kept by choice, and status says so
    world.tick(30.0)
    assert plan_pool(world.snapshot()).status == world.pool.status  # a quiet pass writes an unchanged status
    if settled.get((1, 1)) == 1:
        # the autoscaler's next evaluation (which counts the groups as they are) asks for one more: the cycle goes on
        world.set_spec(make_pool().pairs(3, ratio=(1, 1), gpus=2).set("spec.autoscaling", autoscaling))
        world.run_until(lambda w: shapes(w) == Counter({(1, 1): 3}), 300)


def test_a_mix_kept_within_the_tax_bound_does_not_hold_the_pd_adjustment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off-target groups normally hold the next P:D choice until they are replaced; groups kept by choice
    (``settled``) would hold it forever, so they do not."""
    world = converged(2, (1, 3), nodes=3)
    autoscaling = {"enabled": True, "minPairs": 1, "maxPairs": 8, "interval": "30s"}
    world.set_spec(make_pool().pairs(2, ratio=(1, 1), gpus=2).set("spec.autoscaling", autoscaling))
    holds: list[bool] = []

    def spy(*args: object, hold: bool, **kwargs: object) -> object:
        holds.append(hold)
        return compute_role_ratio(*args, hold=hold, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("tandem.core.plan.compute_role_ratio", spy)
    snapshot = replace(world.snapshot(), scaling_metrics=MetricsSnapshot())
    plan_pool(replace(snapshot, autoscale_state=_need_state(world.now.timestamp(), 2.0, 5.0)))  # within the bound
    plan_pool(replace(snapshot, autoscale_state=_need_state(world.now.timestamp(), 2.0, 1.0)))  # to be replaced
    assert holds == [False, True]


def test_last_work_need_reads_the_last_evaluation_while_it_is_fresh() -> None:
    state = _need_state(1000.0, 7.4, 3.1)
    assert last_work_need(state, 1020.0, 90.0) == (7.4, 3.1)
    assert last_work_need(state, 1600.0, 90.0) is None  # the autoscaler stopped answering
    assert last_work_need(AutoscaleState(), 1000.0, 90.0) is None  # no work planning
    assert last_work_need(None, 1000.0, 90.0) is None


def test_the_planner_hands_the_pd_step_this_evaluations_work_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """With work planning the P:D step follows the need the autoscaler just computed (not the latency
    pressures), so the planner must pass it; a pool without work planning passes None."""
    world = converged(2, (1, 1), nodes=3)
    profile = {
        "prefill": [{"promptTokens": 8192, "uncachedTokensPerSecond": 16000}],
        "decode": [{"contextTokens": 10000, "streams": 32, "tokensPerSecond": 2000}],
        "loadTime": "240s",
    }
    needs: list[tuple[float, float] | None] = []
    returned: list[AutoscaleState] = []
    real_scale = plan_module.compute_desired_pairs

    def scale_spy(*args: object, **kwargs: object) -> object:
        decision, state = real_scale(*args, **kwargs)  # type: ignore[arg-type]
        returned.append(state)
        return decision, state

    def ratio_spy(*args: object, need: tuple[float, float] | None = None, **kwargs: object) -> object:
        needs.append(need)
        return compute_role_ratio(*args, need=need, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("tandem.core.plan.compute_desired_pairs", scale_spy)
    monkeypatch.setattr("tandem.core.plan.compute_role_ratio", ratio_spy)
    for planning in (profile, None):
        autoscaling = {"enabled": True, "minPairs": 1, "maxPairs": 8, "interval": "30s", "ratio": {"enabled": True}}
        if planning is not None:
            autoscaling["capacityProfile"] = planning
        world.set_spec(make_pool().pairs(2, ratio=(1, 1), gpus=2).set("spec.autoscaling", autoscaling))
        snapshot = replace(world.snapshot(), scaling_metrics=work_metrics(4.0, 2, streams=20.0))
        plan_pool(snapshot)
    now = world.now.timestamp()
    assert needs[0] is not None and needs[0] == last_work_need(returned[0], now, 30.0)
    assert needs[1] is None
