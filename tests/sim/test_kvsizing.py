"""`tandem sim kv-tier`: the shared tier's hits and TTFT ceiling by size (tandem_lab.sim.kvsizing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tandem.cli import main
from tandem_lab.sim.config import SimParams, load_params
from tandem_lab.sim.kvsizing import tier_curve, tier_hits
from tandem_lab.sim.oracle import request_floors
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.workload import infinite_cache_hits
from tests.sim.simhelpers import tiny_workload

BT = 512
LONG = list(range(1, 65))
"""One 64-block prompt (32,768 tokens): over its TTFT budget uncached (≈ 1.6 s against 1.19 s), well within it
when all but its last block hit."""


def reuse_after_a_gap(filler_blocks: int = 2_000) -> tuple[list[float], list[int], list[list[int]]]:
    """The long prompt at 0, 10 and 400 s, with ``filler_blocks`` unique blocks (4-block prompts) between the
    second and the third."""
    arrivals: list[float] = [0.0, 10.0]
    inputs = [len(LONG) * BT, len(LONG) * BT]
    blocks = [LONG, LONG]
    fillers = filler_blocks // 4
    for k in range(fillers):
        arrivals.append(20.0 + 370.0 * k / fillers)
        inputs.append(4 * BT)
        blocks.append([10_000 + 4 * k + j for j in range(4)])
    arrivals.append(400.0)
    inputs.append(len(LONG) * BT)
    blocks.append(LONG)
    return arrivals, inputs, blocks


def params_with_tier(blocks: int) -> SimParams:
    """Parameters whose configured tier holds ``blocks`` blocks at rate scale 1 (one store)."""
    base = load_params()
    block_bytes = BT * base.model.kv_bytes_per_token
    return load_params(overrides={"shared_tier": {"stores": 1, "segment_bytes": blocks * block_bytes}})


def test_an_lru_tier_loses_a_prefix_that_more_unique_blocks_pushed_out() -> None:
    arrivals, inputs, blocks = reuse_after_a_gap()
    wl = tiny_workload(arrivals, inputs, [10] * len(arrivals), blocks)
    small, large = tier_hits(wl, 1_000, BT), tier_hits(wl, 4_096, BT)
    full = len(LONG) * BT
    assert (small[0], small[1], small[-1]) == (0, full, 0)
    assert (large[0], large[1], large[-1]) == (0, full, full)
    # a tier that holds everything gives the infinite cache's hits, request by request
    assert np.array_equal(tier_hits(wl, 10**7, BT), infinite_cache_hits(wl, BT)[1])


def test_the_ceiling_counts_requests_a_small_tier_makes_infeasible() -> None:
    arrivals, inputs, blocks = reuse_after_a_gap()
    wl = tiny_workload(arrivals, inputs, [10] * len(arrivals), blocks)
    params = params_with_tier(1_000)
    cap = Roofline.from_params(params)
    floors = request_floors(wl, params, cap)
    # the premise: the long prompt needs its hits (the first copy, with none, is infeasible on any fleet)
    assert not floors.feasible[0] and floors.feasible[1] and floors.feasible[-1]
    n_feasible = int(floors.feasible.sum())

    curve = tier_curve(wl, params, cap, rate_scale=1.0, multiples=(4.096, 1.0))
    small, large = curve.points  # sorted by size
    assert (small.multiple, large.multiple) == (1.0, 4.096)
    assert curve.feasible_requests == n_feasible
    assert small.ttft_ceiling == pytest.approx((n_feasible - 1) / n_feasible)  # the third copy was evicted
    assert large.ttft_ceiling == 1.0
    total = float(sum(inputs))
    assert small.hit_share == pytest.approx(len(LONG) * BT / total)
    assert large.hit_share == pytest.approx(2 * len(LONG) * BT / total) == curve.infinite_hit_share
    assert small.run_bytes == pytest.approx(1_000 * BT * params.model.kv_bytes_per_token)
    assert small.horizon_s == pytest.approx(1_000 / (curve.unique_blocks / wl.duration_s))
    assert curve.smallest(1.0) == large and curve.smallest(0.5) == small


def test_fleet_bytes_scale_with_the_stores_the_run_keeps() -> None:
    """A 5 % run keeps one of the fleet's 16 stores (the simulator's shared tier, ``stores_at``); the fleet's
    tier is what a MooncakeCache declares."""
    params = load_params()
    st = params.shared_tier
    arrivals, inputs, blocks = reuse_after_a_gap(filler_blocks=40)
    wl = tiny_workload(arrivals, inputs, [10] * len(arrivals), blocks)
    (point,) = tier_curve(wl, params, Roofline.from_params(params), rate_scale=0.05, multiples=(2.0,)).points
    assert st.stores_at(0.05) == 1 and st.stores_at(1.0) == st.stores
    assert point.run_bytes == pytest.approx(2.0 * st.segment_bytes)
    assert point.fleet_bytes == pytest.approx(2.0 * st.stores * st.segment_bytes)


def write_trace(path: Path) -> Path:
    arrivals, inputs, blocks = reuse_after_a_gap(filler_blocks=400)
    rows = [
        {"timestamp": int(a * 1000), "input_length": n, "output_length": 10, "hash_ids": b}
        for a, n, b in zip(arrivals, inputs, blocks, strict=True)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_kv_tier_command_prints_the_curve_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "mine.jsonl")
    out = tmp_path / "curve.json"
    argv = ["sim", "kv-tier", "--trace", str(trace), "--copies", "1", "--multiples", "1e-6,1", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| tier × |" in text and "TTFT ceiling" in text
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [p["multiple"] for p in doc["points"]] == [1e-6, 1.0]
    tiny, configured = doc["points"]
    assert tiny["hit_share"] == 0.0 and tiny["ttft_ceiling"] < 1.0  # a tier of no blocks: the copies miss
    assert configured["ttft_ceiling"] == 1.0
    assert "smallest tier tried with a TTFT ceiling ≥ 99 %: × 1" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--multiples", "two"], "--multiples must be comma-separated numbers > 0"),
        (["--multiples", "1,-2"], "--multiples must be comma-separated numbers > 0"),
        (["--target", "0"], "--target is a percent in (0, 100]"),
        (["--params", "missing.yaml"], "cannot read --params"),
    ],
)
def test_kv_tier_refuses_bad_arguments_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "mine.jsonl")
    assert main(["sim", "kv-tier", "--trace", str(trace), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
