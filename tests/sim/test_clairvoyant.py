"""C1, the clairvoyant reference: the model's future need × H, a slowest load ahead, and nothing else."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.policies import POLICIES, canonical, make_policy
from tandem_lab.sim.policies.clairvoyant import INTERVAL_S, Clairvoyant
from tandem_lab.sim.runner import make_context, prepare
from tandem_lab.sim.scenarios import ScenarioConfig

from .test_policies import make_ctx, obs

WINDOW_S = 10.0


def step_need(at_s: float, until_s: float, low: int, high: int, horizon_s: float = 3600.0) -> np.ndarray:
    """A per-window need that is ``high`` in [at_s, until_s) and ``low`` elsewhere."""
    t = np.arange(0.0, horizon_s, WINDOW_S)
    return np.where((t >= at_s) & (t < until_s), high, low).astype(np.int64)


def c1(
    headroom: float = 1.0, lead_s: float | None = None, prefill: np.ndarray | None = None, decode_h: float | None = None
) -> Clairvoyant:
    pol = {"clairvoyant_headroom": headroom, "clairvoyant_lead_s": lead_s, "clairvoyant_decode_headroom": decode_h}
    p = load_params(overrides={"policies": pol})
    n_p = step_need(2000.0, 2600.0, 4, 12) if prefill is None else prefill
    n_d = np.full(len(n_p), 2, dtype=np.int64)
    return Clairvoyant(make_ctx(params=p, model_need=(n_p, n_d, WINDOW_S)))


def test_it_is_ready_for_a_step_one_lead_ahead_and_lets_go_after_it() -> None:
    policy = c1(lead_s=300.0)
    reach = 300.0 + INTERVAL_S
    assert policy.decide(obs(now=2000.0 - reach - WINDOW_S)).prefill == 4  # the step is beyond its horizon
    assert policy.decide(obs(now=2000.0 - reach + WINDOW_S)).prefill == 12  # within it: asked for a lead ahead
    assert policy.decide(obs(now=2590.0)).prefill == 12  # the step's last window
    assert policy.decide(obs(now=2600.0)).prefill == 4  # over: it drains at once
    assert policy.decide(obs(now=2600.0)).decode == 2


def test_headroom_multiplies_the_need_and_rounds_up() -> None:
    assert c1(headroom=1.2, lead_s=0.0).decide(obs(now=100.0)).prefill == 5  # ⌈1.2 × 4⌉
    assert c1(headroom=1.0, lead_s=0.0).decide(obs(now=100.0)).prefill == 4
    assert c1(headroom=1.25, lead_s=0.0).decide(obs(now=100.0)).decode == 3  # ⌈2.5⌉
    split = c1(headroom=1.5, lead_s=0.0, decode_h=1.0).decide(obs(now=100.0))
    assert (split.prefill, split.decode) == (6, 2)  # decode keeps its own H


def test_the_initial_fleet_already_holds_the_first_lead() -> None:
    need = step_need(200.0, 400.0, 3, 9)
    assert c1(lead_s=300.0, prefill=need).initial_target().prefill == 9
    assert c1(lead_s=60.0, prefill=need).initial_target().prefill == 3


def test_the_role_floors_hold_when_the_model_needs_nothing() -> None:
    policy = c1(lead_s=0.0, prefill=np.zeros(360, dtype=np.int64))
    target = policy.decide(obs(now=100.0))
    assert (target.prefill, target.decode) == (1, 2)


def test_past_the_end_of_the_run_it_keeps_the_last_window() -> None:
    policy = c1(lead_s=0.0, prefill=step_need(3590.0, 3600.0, 4, 7))
    assert policy.decide(obs(now=5000.0)).prefill == 7


def test_the_default_lead_is_the_slowest_load_it_can_draw() -> None:
    p = load_params(overrides={"lifecycle": {"load_mix": {"cold": 0.0, "warm": 1.0, "restore": 0.0}}})
    n = np.ones(360, dtype=np.int64)
    warm = Clairvoyant(make_ctx(params=p, model_need=(n, n, WINDOW_S)))
    life = p.lifecycle
    assert warm.lead_s == pytest.approx(life.schedule_delay_s + life.load_times_s["warm"])
    shipped = Clairvoyant(make_ctx(model_need=(n, n, WINDOW_S)))
    life = load_params().lifecycle
    assert shipped.lead_s == pytest.approx(life.schedule_delay_s + max(life.load_times_s.values()))


def test_without_the_future_it_refuses_to_run() -> None:
    with pytest.raises(ValueError, match="model_need"):
        Clairvoyant(make_ctx())


def test_it_is_reachable_by_id_and_alias() -> None:
    assert canonical("clairvoyant") == "C1"
    p = load_params()
    n = np.ones(360, dtype=np.int64)
    assert isinstance(make_policy("C1", make_ctx(params=p, model_need=(n, n, WINDOW_S))), Clairvoyant)


def test_the_context_carries_the_models_need_and_no_other_policy_depends_on_it() -> None:
    prep = prepare(ScenarioConfig("W1", copies=1), 1, load_params())
    ctx = make_context(prep.params, prep.cap, prep.bounds, prep.profile)
    assert ctx.model_need is not None
    n_p, n_d, window = ctx.model_need
    assert np.array_equal(n_p, prep.bounds.demand.n_prefill)
    assert np.array_equal(n_d, prep.bounds.demand.n_decode)
    assert window == prep.bounds.demand.window_s
    blind = replace(ctx, model_need=None)
    for name in POLICIES:
        if name == "C1":
            continue
        assert make_policy(name, blind).initial_target() == make_policy(name, ctx).initial_target(), name
