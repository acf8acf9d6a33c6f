"""The oracle (benchmarks.md §4, docs/design/007-simulator.md): worked examples of its pieces, and the issue's
must-show — it is never above any policy's GPU-hours — over seeds and scenarios at small scale."""

from __future__ import annotations

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.oracle import (
    RequestFloors,
    _energy,
    _level_coverage_s,
    compute_bounds,
    min_load_s,
    served_bounds,
    startup_aware_seconds,
    ttft_miss_causes,
)
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies import POLICIES
from tandem_lab.sim.runner import run, stream
from tandem_lab.sim.scenarios import ScenarioConfig, build_workload


def test_ratio_tax_worked_example() -> None:
    # N_p* = 40, N_d* = 60 with 1:1 units: 60 units = 120 instances vs 100 → +20 %.
    n_p, n_d = np.array([40]), np.array([60])
    units = np.maximum(np.ceil(n_p / 1), np.ceil(n_d / 1))
    assert float((units * 2).sum()) / float((n_p + n_d).sum()) - 1 == pytest.approx(0.20)


@pytest.mark.parametrize(
    ("levels", "load_s", "want_s"),
    [
        pytest.param([1, 1, 1, 1], 50.0, 40.0, id="needed from t=0: warm, no load charge"),
        pytest.param([0, 1, 0, 1], 50.0, 30.0 + 10.0, id="short gap merged: one interval 10..40 s + min(load, 10)"),
        pytest.param([0, 1, 0, 0, 0, 0, 0, 1], 15.0, (10.0 + 10.0) + (10.0 + 15.0), id="long gap: two loads"),
        pytest.param([0, 2, 2, 0], 5.0, 2 * (20.0 + 5.0), id="two levels"),
    ],
)
def test_planning_model_o1_merges_gaps_shorter_than_the_load(levels: list[int], load_s: float, want_s: float) -> None:
    assert startup_aware_seconds(np.asarray(levels, dtype=np.int64), 10.0, load_s) == pytest.approx(want_s)


def test_energy_is_the_work_a_window_forces_into_each_block() -> None:
    # one job: work 3 s inside [0, 4]; slack 1 s. Blocks of 2 s: each must hold overlap − slack = 1 s.
    start, end, work = np.array([0.0]), np.array([4.0]), np.array([3.0])
    assert _energy(start, end, work, 2.0, 2).tolist() == pytest.approx([1.0, 1.0])
    assert _energy(start, end, work, 4.0, 1).tolist() == pytest.approx([3.0])  # the whole window: all of it


@pytest.mark.parametrize(
    ("levels", "want_s"),
    [
        pytest.param([0] * 60 + [1], 88.0, id="first instance at 600 s: one load (88 s)"),
        pytest.param([0, 1, 1], 10.0, id="at 10 s: min(88, 10); adjacent blocks add nothing provable"),
        pytest.param([1] + [0] * 19 + [1], 88.0, id="a gap longer than a load: one reload"),
        pytest.param([1] * 10, 80.0, id="a run of 10 blocks: its span minus a block"),
        pytest.param([2, 2, 2], 2 * 10.0, id="two levels of a 3-block run"),
    ],
)
def test_level_coverage_worked_examples(levels: list[int], want_s: float) -> None:
    assert _level_coverage_s(np.asarray(levels, dtype=np.int64), 10.0, 88.0) == pytest.approx(want_s)


def _floors(arrival: list[float], service: list[float], decode: list[float]) -> RequestFloors:
    n = len(arrival)
    a = np.asarray(arrival)
    return RequestFloors(
        arrival_s=a,
        budget_s=np.full(n, 1.0),
        service_s=np.asarray(service),
        pd_s=np.zeros(n),
        step1_s=np.zeros(n),
        decode_work_s=np.asarray(decode),
        output_tokens=np.full(n, 1, dtype=np.int64),
        feasible=np.ones(n, dtype=bool),
        hit_tokens=np.zeros(n, dtype=np.int64),
    )


def test_served_bounds_count_only_the_delivered_work_and_order_o0_o1() -> None:
    p = load_params()
    fl = _floors([100.0, 100.5, 5000.0], [0.5, 0.5, 0.8], [0.1, 0.1, 0.1])
    everything = served_bounds(fl, np.ones(3, dtype=bool), 6000.0, p, 4, 88.0)
    assert everything.o0_prefill_gpuh == pytest.approx(1.8 * 4 / 3600)
    assert everything.o0_gpuh <= everything.o1_gpuh
    # two isolated bursts far apart: each needs an instance that had to load (or be kept) → ≥ 2 × 88 s
    assert everything.o1_prefill_gpuh >= 2 * 88.0 * 4 / 3600 - 1e-12
    first_only = served_bounds(fl, np.array([True, True, False]), 6000.0, p, 4, 88.0)
    assert first_only.o1_gpuh < everything.o1_gpuh
    assert first_only.requests == 2


def test_oracle_uses_the_fastest_load_that_can_occur() -> None:
    p = load_params()
    assert min_load_s(p) == 88.0  # cold 695 s and warm 88 s have weight; restore (10 s) has none


def test_bounds_are_ordered() -> None:
    p = load_params()
    wl = build_workload(
        ScenarioConfig("W2", scale=0.01, compress=24.0, days=1.0), p, stream(3, "arrivals"), stream(3, "generator")
    ).workload
    b = compute_bounds(wl, p, Roofline.from_params(p))
    assert b.full.o0_gpuh <= b.full.o1_gpuh <= b.floor_gpuh * 10
    assert b.full.o0_gpuh <= b.floor_gpuh + 1e-9  # the windowed energy never exceeds the work
    assert b.model_o0_gpuh <= b.model_o1_gpuh <= b.static_gpuh * 1.0001
    assert b.tax_best <= b.tax_1to1
    assert 0 < b.demand.feasible_share <= 1


def test_ttft_miss_causes_worked_example() -> None:
    """The docstring's example, plus a request on time, an unserved one and an infeasible one (not counted)."""
    fl = _floors([0.0] * 5, [0.2] * 5, [0.0] * 5)
    fl = RequestFloors(
        **{
            **{f: getattr(fl, f) for f in fl.__dataclass_fields__},
            "pd_s": np.full(5, 0.05),
            "step1_s": np.full(5, 0.05),
            "feasible": np.array([True, True, True, True, False]),
        }
    )
    ok = np.array([True, True, True, False, True])
    ttft = np.array([1.4, 1.4, 0.5, np.nan, 5.0])
    prefill = np.array([1.0, 0.3, 0.3, 0.0, 4.0])
    causes = ttft_miss_causes(fl, ok, ttft, prefill)
    assert causes == {"cache": 0.25, "wait": 0.25, "unserved": 0.25}


def test_ttft_miss_causes_without_feasible_requests_are_nan() -> None:
    fl = _floors([0.0], [5.0], [0.0])
    fl = RequestFloors(**{**{f: getattr(fl, f) for f in fl.__dataclass_fields__}, "feasible": np.array([False])})
    causes = ttft_miss_causes(fl, np.array([True]), np.array([6.0]), np.array([5.0]))
    assert all(np.isnan(v) for v in causes.values())


CASES = (
    [pytest.param("W1", {"copies": 1}, seed, id=f"W1 seed {seed}") for seed in (1, 2)]
    + [
        pytest.param("W2", {"scale": 0.004, "compress": 48.0, "days": 2.0}, seed, id=f"W2 seed {seed}")
        for seed in (1, 2, 3)
    ]
    + [pytest.param("W3", {"scale": 0.004, "compress": 48.0, "days": 2.0}, 1, id="W3 seed 1")]
)


@pytest.mark.parametrize(("scenario", "knobs", "seed"), CASES)
def test_the_oracle_is_never_above_any_policys_gpu_hours(scenario: str, knobs: dict[str, float], seed: int) -> None:
    result = run(ScenarioConfig(scenario, **knobs), list(POLICIES), seed, load_params())  # type: ignore[arg-type]
    b = result.bounds
    assert b.full.o0_gpuh <= b.full.o1_gpuh
    for r in result.runs:
        m = r.metrics
        total = m["gpuh"]["total"]
        oracle = m["oracle"]
        assert oracle["o0_gpuh"] <= oracle["o1_gpuh"] <= total + 1e-9, r.policy
        assert m["floor_served_gpuh"] <= total + 1e-6, r.policy
        # a policy that delivered every feasible request is bounded by the all-requests oracle too
        if m["both_attainment_feasible"] == 1.0:
            assert b.full.o1_gpuh <= total + 1e-9, r.policy
        # every feasible TTFT miss has exactly one cause
        causes = m["ttft_miss_causes_feasible"]
        assert all(v >= 0 for v in causes.values()), r.policy
        assert sum(causes.values()) == pytest.approx(1.0 - m["ttft_attainment_feasible"], abs=1e-12), r.policy
