"""Scenario perturbations run and land where they should (tiny scales); W5 belongs to tandem_lab.sim.rollout."""

from __future__ import annotations

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.runner import run, stream
from tandem_lab.sim.scenarios import ScenarioConfig, build_workload

TINY = {"scale": 0.004, "compress": 24.0}


def test_w3_adds_a_burst_of_sessions_within_a_minute() -> None:
    p = load_params()
    knobs = {"scale": 0.02, "compress": 24.0, "days": 2.0}
    w2 = build_workload(ScenarioConfig("W2", **knobs), p, stream(1, "arrivals"), stream(1, "generator"))
    cfg = ScenarioConfig("W3", **knobs)
    w3 = build_workload(cfg, p, stream(1, "arrivals"), stream(1, "generator"))
    t0 = cfg.event_time_s(p)

    def rate(wl: object, a: float, b: float) -> float:
        t = wl.workload.arrival_s  # type: ignore[attr-defined]
        return float(((t >= a) & (t < b)).sum()) / (b - a)

    before = rate(w3, t0 - 240, t0)
    after = rate(w3, t0, t0 + 120)
    assert after > 1.6 * before  # a ~2x step within a minute
    assert rate(w2, t0, t0 + 120) < 1.3 * rate(w2, t0 - 240, t0)


@pytest.mark.parametrize("scenario", [pytest.param("W4", id="W4 storm"), pytest.param("W6", id="W6 loss")])
def test_event_scenarios_run_and_report_the_event_window(scenario: str) -> None:
    result = run(ScenarioConfig(scenario, **TINY), ["B0", "tandem"], 1, load_params())
    assert result.events
    for r in result.runs:
        assert "event_both_attainment" in r.metrics
        assert r.result.hooks, "the perturbation ran"
    if scenario == "W6":
        lost = [i for r in result.runs for i in r.result.instances if i.role == 1 and i.t_end < result.bounds.horizon_s]
        assert lost


def test_w4_storm_lowers_local_hits_during_the_window() -> None:
    cfg = ScenarioConfig("W4", **TINY)
    p = load_params()
    result = run(cfg, ["B0"], 1, p)
    r = result.runs[0].result
    wl = result.workload
    t0 = cfg.event_time_s(p)
    inside = (wl.arrival_s >= t0) & (wl.arrival_s < t0 + cfg.storm_s)
    outside = (wl.arrival_s >= t0 - 3600) & (wl.arrival_s < t0)
    share = lambda m: r.local_tokens[m].sum() / max(1, wl.input_tokens[m].sum())  # noqa: E731
    assert share(inside) < 0.7 * share(outside)


def test_w5_is_run_by_the_rollout_module_not_the_scaling_runner() -> None:
    with pytest.raises(ValueError, match="run_w5"):
        run(ScenarioConfig("W5", **TINY), ["B0"], 1, load_params())


def test_w5_window_is_tuesday_afternoon_and_the_canary_lands_at_the_peak() -> None:
    p = load_params()
    cfg = ScenarioConfig("W5", scale=0.01, compress=5.0)
    assert (cfg.resolved_days(), cfg.resolved_start_day()) == (0.25, 1.5)  # Tuesday 12:00-18:00
    assert cfg.event_time_s(p) == pytest.approx(3 * 3600 / 5)  # 15:00, three envelope hours in
    wl = build_workload(cfg, p, stream(1, "arrivals"), stream(1, "generator")).workload
    assert wl.duration_s == pytest.approx(0.25 * 86_400 / 5)


def test_unknown_canary_or_gate_set_is_refused() -> None:
    with pytest.raises(ValueError, match="canary"):
        ScenarioConfig("W5", canary="slow")
    with pytest.raises(ValueError, match="gate set"):
        ScenarioConfig("W5", gates="all")


def test_seed_streams_are_independent_per_component() -> None:
    a = stream(5, "arrivals").uniform(size=3)
    assert not np.array_equal(a, stream(5, "generator").uniform(size=3))
    assert np.array_equal(a, stream(5, "arrivals").uniform(size=3))
