"""`tandem sim run --trace FILE` with --copies / --scale-to and --decorrelate (issue 18 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tandem.cli import main
from tandem_lab.sim.scenarios import ScenarioConfig
from tandem_lab.sim.traces import load_trace, multiply_prefix_roots


def write_trace(path: Path, n: int = 120, burst_at_ms: int = 60_000) -> Path:
    """A small trace in the documented format: steady arrivals plus a burst of 40 requests in one tick."""
    rows = []
    for i in range(n):
        ts = i * 1_000 if i < n - 40 else burst_at_ms
        tokens = 600 + 10 * i
        ids = list(range(i * 10, i * 10 + -(-tokens // 512)))
        rows.append({"timestamp": ts, "input_length": tokens, "output_length": 20, "hash_ids": ids})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def peak_per_10s(arrivals: np.ndarray) -> int:
    return int(np.bincount((arrivals // 10).astype(np.int64)).max())


def test_decorrelate_spreads_copies_of_a_burst(tmp_path: Path) -> None:
    base = load_trace(write_trace(tmp_path / "t.jsonl"))
    stacked = multiply_prefix_roots(base, 8, np.random.default_rng(1))
    spread = multiply_prefix_roots(base, 8, np.random.default_rng(1), decorrelate=True)
    assert len(spread) == len(stacked) == 8 * len(base)
    assert spread.arrival_s.min() >= 0 and spread.arrival_s.max() < base.duration_s
    assert peak_per_10s(stacked.arrival_s) >= 8 * 40  # every copy's burst in one window
    assert peak_per_10s(spread.arrival_s) < peak_per_10s(stacked.arrival_s) / 2


@pytest.mark.parametrize(
    ("copies", "scale_to", "base_rps", "want"),
    [
        pytest.param(3, None, 2.0, 3, id="copies given"),
        pytest.param(None, 20.0, 2.0, 10, id="scale-to over the mean rate"),
        pytest.param(5, 20.0, 2.0, 5, id="copies win over scale-to"),
        pytest.param(None, 0.5, 2.0, 1, id="never below one copy"),
    ],
)
def test_resolved_copies(copies: int | None, scale_to: float | None, base_rps: float, want: int) -> None:
    assert ScenarioConfig("W1", copies=copies, scale_to_rps=scale_to).resolved_copies(base_rps) == want


@pytest.mark.parametrize("policy", ["B0", "tandem"], ids=["baseline", "tandem"])
def test_sim_run_trace_file_every_policy(tmp_path: Path, policy: str) -> None:
    trace = write_trace(tmp_path / "mine.jsonl")
    out = tmp_path / "out"
    argv = ["sim", "run", "--trace", str(trace), "--copies", "2", "--decorrelate", "--policy", policy]
    assert main([*argv, "--out", str(out), "--no-plots", "--quiet"]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    text = json.dumps(doc)
    assert "mine.jsonl" in text
    assert '"decorrelated": true' in text


def test_sim_run_needs_scenario_or_trace(tmp_path: Path) -> None:
    assert main(["sim", "run", "--out", str(tmp_path)]) == 2
    assert main(["sim", "run", "--trace", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]) == 2
