"""Engine semantics on hand-made workloads: the TTFT/TPOT arithmetic, batching, lifecycle, failures."""

from __future__ import annotations

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.engine import DECODE, PREFILL, STATUS_FAILED, STATUS_OK, SimOptions, Simulation
from tandem_lab.sim.metrics import Observation
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies.base import FleetTarget
from tests.sim.simhelpers import FixedFleet, simulate, tiny_workload

NO_SHARED = {"shared_tier": {"enabled": False}}


def test_single_request_latency_is_prefill_plus_transfer_plus_one_step() -> None:
    p = load_params(overrides=NO_SHARED)
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0], [2048], [11], [[1, 2, 3, 4]])
    _, res = simulate(wl, FleetTarget(prefill=1, decode=1), params=p)
    step = cap.decode_step_time(1, 2048 + 11 / 2)
    want_ttft = cap.prefill_time(2048, 0) + 2048 * p.model.kv_bytes_per_token / p.network.nic_bandwidth + step
    assert res.status[0] == STATUS_OK
    assert res.ttft[0] == pytest.approx(want_ttft, rel=1e-9)
    assert res.tpot[0] == pytest.approx(step, rel=1e-6)


def test_a_shared_prefix_is_a_local_hit_for_the_next_request() -> None:
    p = load_params(overrides=NO_SHARED)
    wl = tiny_workload([1.0, 60.0], [2048, 2560], [5, 5], [[1, 2, 3, 4], [1, 2, 3, 4, 5]])
    _, res = simulate(wl, FleetTarget(prefill=1, decode=1), params=p)
    assert res.local_tokens.tolist() == [0, 2048]


def test_concurrent_sequences_share_decode_steps() -> None:
    p = load_params(overrides=NO_SHARED)
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0, 1.0], [512, 512], [2001, 2001], [[1], [2]])
    _, res = simulate(wl, FleetTarget(prefill=1, decode=1), params=p)
    solo = cap.decode_step_time(1, 512 + 1000.5)
    pair = cap.decode_step_time(2, 2 * (512 + 1000.5))
    # the second joins after the first's prefill; most tokens of both are produced at batch 2
    assert res.tpot.max() > solo
    assert res.tpot.min() == pytest.approx(pair, rel=0.05)


def test_fifo_prefill_queues_behind_a_long_prompt() -> None:
    # vLLM's default (no long-prefill threshold): one partial prefill at a time
    p = load_params(overrides={**NO_SHARED, "instance": {"long_prefill_token_threshold": 0}})
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0, 1.001], [60_000, 512], [2, 2], [list(range(118)), [999]])
    _, res = simulate(wl, FleetTarget(prefill=1, decode=1), params=p)
    assert res.ttft[1] > cap.prefill_time(60_000, 0)


def test_partial_prefills_let_a_short_prompt_pass_a_long_one() -> None:
    # the shipped speed-pool knobs: 16,384-token steps, 4,096 per prefill → 4 share the instance
    p = load_params(overrides=NO_SHARED)
    assert p.instance.prefill_concurrency == 4
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0, 1.001], [60_000, 512], [2, 2], [list(range(118)), [999]])
    _, res = simulate(wl, FleetTarget(prefill=1, decode=1), params=p)
    assert res.ttft[1] < 2 * cap.prefill_time(512, 0) + 0.1  # shares the instance, never waits 4.5 s


def test_grown_fleet_charges_loading_and_serves_after_load() -> None:
    p = load_params(overrides={**NO_SHARED, "lifecycle": {"load_mix": {"cold": 0.0, "warm": 1.0, "restore": 0.0}}})
    cap = Roofline.from_params(p)
    wl = tiny_workload([float(t) for t in range(1, 400, 20)], [1024] * 20, [3] * 20, [[i] for i in range(20)])

    class Grow(FixedFleet):
        def decide(self, obs: Observation) -> FleetTarget | None:
            return FleetTarget(prefill=2, decode=1)

    policy = Grow(FleetTarget(prefill=1, decode=1), interval_s=10.0)
    sim = Simulation(p, cap, wl, policy, SimOptions(horizon_s=wl.duration_s), np.random.default_rng(0), np.zeros(20))
    res = sim.run()
    prefills = [r for r in res.instances if r.role == PREFILL]
    assert len(prefills) == 2
    new = prefills[1]
    assert new.t_bound == pytest.approx(10.0 + p.lifecycle.schedule_delay_s)
    assert new.t_ready - new.t_bound == pytest.approx(88.0)
    assert (res.status == STATUS_OK).all()


def test_lost_decode_instance_fails_its_requests_and_is_replaced() -> None:
    p = load_params(overrides=NO_SHARED)
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0], [512], [30_000], [[1]])
    sim = Simulation(
        p,
        cap,
        wl,
        FixedFleet(FleetTarget(prefill=1, decode=1)),
        SimOptions(horizon_s=wl.duration_s),
        np.random.default_rng(0),
        np.zeros(1),
    )

    def lose(s: Simulation) -> None:
        for inst in [i for i in s.alive if i.role == DECODE]:
            s.kill_instance(inst)

    sim.at(5.0, lose, "lose decode")
    res = sim.run()
    assert res.status[0] == STATUS_FAILED
    decodes = [r for r in res.instances if r.role == DECODE]
    assert len(decodes) == 2 and decodes[0].t_end == pytest.approx(5.0)
    assert decodes[1].t_created == pytest.approx(5.0)


def test_pairs_topology_routes_whole_pairs_and_drains_on_scale_down() -> None:
    p = load_params(overrides=NO_SHARED)
    cap = Roofline.from_params(p)
    n = 40
    wl = tiny_workload([1.0 + 5 * i for i in range(n)], [1024] * n, [200] * n, [[i, i + 1000] for i in range(n)])

    class Shrink(FixedFleet):
        def decide(self, obs: Observation) -> FleetTarget | None:
            return FleetTarget(pairs=1, shape=(1, 1)) if obs.now >= 100 else None

    policy = Shrink(FleetTarget(pairs=3, shape=(1, 1)), topology="pairs", interval_s=50.0)
    sim = Simulation(
        p,
        cap,
        wl,
        policy,
        SimOptions(topology="pairs", horizon_s=wl.duration_s, routing_keys=wl.routing_keys("blocks", 1)),
        np.random.default_rng(0),
        np.zeros(n),
    )
    res = sim.run()
    assert (res.status == STATUS_OK).all()
    assert set(res.unit[wl.arrival_s > 150].tolist()) == {0}  # only pair-0 serves after the drain
    ended = [r for r in res.instances if r.t_end < res.horizon_s]
    assert len(ended) == 4  # two pairs drained, 2 instances each


def test_a_deleted_group_never_overwrites_the_load_of_a_new_group_with_its_name() -> None:
    # the router's load view must not depend on set order (object addresses): runs would differ
    from tandem_lab.sim.engine import Group, Revision  # noqa: PLC0415

    sim, _ = simulate(tiny_workload([0.0], [512], [2], [[1]]), FleetTarget(prefill=2, decode=1))
    live = next(iter(sim.groups.values()))
    dead = Group(10_000, live.index, live.name, Revision("r1"))
    dead.assigned, dead.queued = 7, 7
    live.assigned, live.queued = 1, 0
    for order in ((dead, live), (live, dead)):
        sim._dirty_loads.clear()
        sim._dirty_loads.update(order)
        sim._flush_loads()
        assert sim._loads[live.name].queued == 0


@pytest.mark.parametrize(
    ("scope", "shape"),
    [("node", (1, 1)), ("node", (2, 1)), ("node", (4, 1)), ("instance", (1, 1)), ("instance", (4, 1))],
)
def test_a_groups_instances_on_one_node_share_its_load_kind(scope: str, shape: tuple[int, int]) -> None:
    """Cold or warm is the node's weight cache: with ``load_kind_scope: node`` the instances a new pair group
    places on one node (two 4-GPU instances per 8-GPU node, prefill first) load alike, and different nodes draw apart;
    with ``instance`` every instance draws on its own, the rule before."""
    mix = {"cold": 0.5, "warm": 0.5, "restore": 0.0}
    p = load_params(overrides={**NO_SHARED, "lifecycle": {"load_mix": mix, "load_kind_scope": scope}})
    assert p.hardware.gpus_per_node // p.instance.gpus == 2
    cap = Roofline.from_params(p)
    wl = tiny_workload([1.0], [512], [3], [[1]])
    groups = 24

    class Grow(FixedFleet):
        def decide(self, obs: Observation) -> FleetTarget | None:
            return FleetTarget(pairs=groups, shape=shape)

    policy = Grow(FleetTarget(pairs=1, shape=shape), interval_s=10.0)
    opts = SimOptions(horizon_s=300.0, default_shape=shape)
    res = Simulation(p, cap, wl, policy, opts, np.random.default_rng(3), np.zeros(1)).run()
    by_group: dict[str, list[str]] = {}
    for r in sorted((r for r in res.instances if r.load_kind != "initial"), key=lambda r: r.role):
        by_group.setdefault(r.group, []).append(r.load_kind)  # prefill (role 0) first, then decode
    assert len(by_group) == groups - 1
    assert all(len(kinds) == shape[0] + shape[1] for kinds in by_group.values())
    nodes = [[kinds[i : i + 2] for i in range(0, len(kinds), 2)] for kinds in by_group.values()]
    same_node_alike = all(len(set(node)) == 1 for g in nodes for node in g)
    if scope == "node":
        assert same_node_alike
        if len(nodes[0]) > 1:  # several nodes per group: they draw apart
            assert any(len({node[0] for node in g}) > 1 for g in nodes)
    else:
        assert not same_node_alike
