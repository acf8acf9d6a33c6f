"""A P:D change in the simulator is the operator's: groups take the target shape as they cycle, surge first
(``tandem.core.reshape``), never a rolling replacement of every group."""

from __future__ import annotations

import pytest

from tandem.core import reshape
from tandem_lab.sim import engine
from tandem_lab.sim.engine import LOADING, Simulation
from tandem_lab.sim.policies.base import FleetTarget
from tests.sim.simhelpers import pair_fleet


def _ready_all(sim: Simulation) -> None:
    for g in list(sim.groups.values()):
        for inst in (*g.prefill, *g.decode):
            if inst.state in (LOADING, engine.PENDING):
                inst.state = LOADING
                sim._on_ready(inst)


def _shapes(sim: Simulation, *, live: bool = True) -> list[tuple[int, int]]:
    return sorted((len(g.prefill), len(g.decode)) for g in sim.groups.values() if not (live and g.draining))


def _serving_instances(sim: Simulation) -> tuple[int, int]:
    serving = [g for g in sim.groups.values() if g.pair_state == engine.PairState.SERVING and not g.draining]
    return sum(len(g.prefill) for g in serving), sum(len(g.decode) for g in serving)


def test_a_new_shape_replaces_one_group_at_a_time_surge_first_and_never_drops_capacity() -> None:
    sim = pair_fleet(4, (1, 1))
    target = FleetTarget(pairs=4, shape=(2, 1))
    start = _serving_instances(sim)
    live_counts: list[int] = []
    for _ in range(12):
        sim.apply_target(target)
        live_counts.append(sum(1 for g in sim.groups.values() if not g.draining))
        # capacity first: the serving instances of each role never fall below the start's
        served = _serving_instances(sim)
        assert served[0] >= start[0] and served[1] >= start[1]
        _ready_all(sim)
    assert _shapes(sim) == [(2, 1)] * 4
    assert max(live_counts) == 5  # one surge group at a time, never a second
    assert sim.ratio_changes == 1


def test_the_first_pass_after_a_shape_change_adds_one_target_group_and_drains_nothing() -> None:
    sim = pair_fleet(3, (1, 1))
    sim.apply_target(FleetTarget(pairs=3, shape=(2, 1)))
    assert _shapes(sim) == [(1, 1), (1, 1), (1, 1), (2, 1)]
    assert not any(g.draining for g in sim.groups.values())
    obs = sim.observation()
    assert obs.shape_rollout  # a new P:D waits while groups are being replaced
    assert obs.group_shapes == ((2, 1), (1, 1), (1, 1), (1, 1))  # kept first: the target shape, then by index


def test_a_scale_down_drains_an_off_target_group_first() -> None:
    sim = pair_fleet(3, (1, 1))
    sim.apply_target(FleetTarget(pairs=3, shape=(2, 1)))
    _ready_all(sim)
    sim.apply_target(FleetTarget(pairs=2, shape=(2, 1)))
    # the target-shaped group is the newest (highest index) yet stays; two 1P:1D groups go
    assert _shapes(sim) == [(1, 1), (2, 1)]


def test_a_mix_within_the_tax_bound_is_kept_and_releases_the_ratio_hold() -> None:
    sim = pair_fleet(4, (2, 1))
    # need: 5 prefill, 4 decode instances. Four 2P:1D groups hold it. Target 1P:1D would need 5 groups
    # (10 instances) alone; the mix of 2P:1D groups needs 4 groups (12 instances): 20 % over, so replace.
    sim.apply_target(FleetTarget(pairs=4, shape=(1, 1), need=(5.0, 4.0)))
    assert sum(1 for g in sim.groups.values() if not g.draining) == 5
    # need 8 prefill, 4 decode: the 2P:1D mix (12 instances) is what 1P:1D alone would need (16): kept
    sim = pair_fleet(4, (2, 1))
    sim.apply_target(FleetTarget(pairs=4, shape=(1, 1), need=(8.0, 4.0)))
    assert _shapes(sim) == [(2, 1)] * 4
    assert not sim.observation().shape_rollout


def test_no_surge_without_room_in_the_instance_budget() -> None:
    sim = pair_fleet(3, (1, 1), max_instances=6)
    for _ in range(4):
        sim.apply_target(FleetTarget(pairs=2, shape=(2, 1)))  # 2 × 1P:1D kept; a 2P:1D surge group (3) won't fit
        _ready_all(sim)
    assert _shapes(sim) == [(1, 1), (1, 1)]


def test_the_engine_asks_the_operators_reshape_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []
    real = reshape.reshape_surge

    def spy(*args: object, **kwargs: object) -> reshape.ReshapeDecision:
        calls.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "reshape_surge", spy)
    sim = pair_fleet(2, (1, 1))
    sim.apply_target(FleetTarget(pairs=2, shape=(3, 1), need=(6.0, 2.0)))
    assert calls[-1]["target"] == (3, 1) and calls[-1]["need"] == (6.0, 2.0) and calls[-1]["replicas"] == 2


def test_the_routers_pair_limits_follow_the_groups_in_its_table_as_the_operators_do() -> None:
    """``tandem.routing.Admission.for_groups`` in the simulator too: 1P:1D → 2P:1D keeps a 1P:1D pair's queue
    limit while any 1P:1D group is listed, and takes the 2P:1D one when the last is gone."""
    sim = pair_fleet(2, (1, 1))
    per_instance = sim.p.admission.max_queued
    target = FleetTarget(pairs=2, shape=(2, 1))
    limits: list[tuple[list[tuple[int, int]], int]] = []
    for _ in range(12):
        sim.apply_target(target)
        _ready_all(sim)
        sim._rebuild_table()
        assert sim.bound.admission is not None
        limits.append((_shapes(sim, live=False), sim.bound.admission.max_queued))
    for listed, queued in limits:
        assert queued == per_instance * min(p for p, _ in listed), (listed, queued)
    assert limits[0][1] == per_instance and limits[-1] == ([(2, 1), (2, 1)], 2 * per_instance)
    assert sim.bound.admission.max_in_flight == sim.p.admission.max_in_flight
