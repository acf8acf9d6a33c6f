"""A mirror step in the simulator: the engine copies the canary's pair-count keys to it as the router does
(`tandem.routing.mirror_target`), the copies load the canary pair and feed its engine metrics but are nobody's
answer, and W5 with a mirror first step rolls a bad canary back before any user is served by it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tandem.routing import mirror_candidates, mirror_target
from tandem_lab.sim import rollout
from tandem_lab.sim.config import load_params
from tandem_lab.sim.engine import LOADING, STATUS_OK, Revision, SimOptions, Simulation
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies.base import FleetTarget
from tandem_lab.sim.profile import FixedFleet
from tandem_lab.sim.scenarios import ScenarioConfig
from tests.sim.simhelpers import tiny_workload

N = 300


def _mirrored_sim() -> Simulation:
    """3 stable pairs and 1 Ready canary pair at 0 %, mirrored; ``N`` short requests with distinct keys (started:
    :meth:`Simulation.advance` runs it)."""
    p = load_params()
    wl = tiny_workload([0.5 * i for i in range(N)], [512] * N, [8] * N, [[10 * i + 1, 10 * i + 2] for i in range(N)])
    sim = Simulation(
        p,
        Roofline.from_params(p),
        wl,
        FixedFleet(FleetTarget(pairs=3, shape=(1, 1)), topology="pairs"),
        SimOptions(
            topology="pairs",
            horizon_s=wl.duration_s,
            default_shape=(1, 1),
            max_instances=100,
            routing_keys=tuple(i * 0x9E3779B97F4A7C15 % 2**64 for i in range(N)),
        ),
        np.random.default_rng(0),
        np.ones(N),  # no engine errors on the originals
    )
    sim.start()  # the initial fleet: 3 stable pairs
    sim.add_revision(Revision("r2"))
    sim.converge_revisions({"r1": 3, "r2": 1}, replicas=3, max_surge=1, max_unavailable=0)
    for g in sim.groups.values():
        if g.revision.name == "r2":
            for inst in (*g.prefill, *g.decode):
                inst.state = LOADING
                sim._on_ready(inst)
    sim.set_canary("r2", 0, mirror=True)
    return sim


def test_copies_go_to_the_canarys_pair_count_keys_and_answer_nobody() -> None:
    sim = _mirrored_sim()
    sim._rebuild_table()
    cset = mirror_candidates(sim._pairs)
    want = sum(mirror_target(cset, "r2", sim.keys[i], {}, sim.bound).pair is not None for i in range(N))
    assert 30 <= want <= 120  # about one key in four (idle pairs)
    sim.advance()
    # Each of them is copied unless the walk passed the canary pair by under load (counted, never silent).
    assert sim.copies + sim.copies_full == want and sim.copies >= 0.8 * want
    # Every user was answered by stable, once; the copies are in no result.
    assert (sim.res_rev == sim.revision_index["r1"]).all()
    assert (sim.res_status == STATUS_OK).sum() == N
    assert sim.c["requests"] == N and sim.c["finished"] == N
    assert sim.c["local_queries"] == sim.c["prompt_tokens"] == 512 * N  # the users' prompts only
    # The canary's engine counted each copy, as vLLM's metrics would.
    assert sim.rev_series["r2"].requests == sim.copies
    assert sim.rev_series["r1"].requests == N


def test_without_the_mirror_the_canary_at_zero_gets_nothing() -> None:
    sim = _mirrored_sim()
    sim.set_canary("r2", 0)
    sim.advance()
    assert sim.copies == 0 and sim.rev_series["r2"].requests == 0


MIRROR_STEPS: list[dict[str, Any]] = [
    {"setMirrorPairs": 1},
    {"analysis": {}},
    {"setCanaryPairs": 1},
    {"analysis": {}},
    {"setWeight": 100},
]


@pytest.mark.parametrize("canary", ["errors", "good"])
def test_w5_with_a_mirror_first_step(canary: str) -> None:
    """A 30 % erroring canary fails in the mirror step: rolled back with no request served to a user, its
    detection counted from its first copy. A good one serves nothing during the mirror step either."""
    p = load_params()
    p.policies.tandem_rollout["steps"] = MIRROR_STEPS
    for gate in p.policies.tandem_rollout["analysis"]["metrics"]:
        gate["minSamples"] = 0  # the 1 % workload sends a handful of canary requests per window
    cfg = ScenarioConfig("W5", scale=0.01, compress=5.0, canary=canary, gates="regression", canary_error_prob=0.3)
    result = rollout.run_w5(cfg, 1, p, arms=("tandem",))
    m = next(a.metrics for a in result.arms if a.arm == "tandem")
    assert m["copies_on_canary"] > 0
    if canary == "errors":
        assert m["rolled_back"]
        assert m["requests_on_canary"] == 0 and m["canary_share_of_all_requests"] == 0
        assert m["canary_first_copy_s"] <= m["first_breach_s"] <= m["decision_s"]
        assert m["detection_s"] == pytest.approx(m["decision_s"] - m["canary_first_copy_s"])
        assert m["act_s"] == 0.0
    else:
        assert not m["rolled_back"]
