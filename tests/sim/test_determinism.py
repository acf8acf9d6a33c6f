"""Same code + config + seed → identical results JSON (wall-clock data only under ``timing``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.cli import main
from tandem_lab.sim.config import load_params
from tandem_lab.sim.report import results
from tandem_lab.sim.runner import run
from tandem_lab.sim.scenarios import ScenarioConfig


def _doc(seed: int) -> dict[str, Any]:
    cfg = ScenarioConfig("W2", scale=0.004, compress=48.0, days=2.0)
    doc = results(run(cfg, ["B1", "tandem"], seed, load_params()))
    doc.pop("timing")
    return doc


def test_same_seed_and_config_give_identical_results() -> None:
    a, b = _doc(11), _doc(11)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = _doc(12)
    assert c["policies"] != a["policies"]
    assert c["config_hash"] == a["config_hash"]  # the seed is not part of the configuration


def test_cli_writes_results_summary_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "w1"
    code = main(
        [
            "sim",
            "run",
            "--scenario",
            "W1",
            "--copies",
            "1",
            "--policy",
            "B0,tandem",
            "--seed",
            "3",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["policies"]) == {"B0", "tandem"}
    assert doc["workload"]["requests"] == 12_031
    summary = (out / "summary.md").read_text()
    assert "Gates" in summary
    log = doc["policies"]["tandem"]["decision_log_summary"]
    assert f"{log['scale_downs']} scale-downs, {log['scale_downs_undone']} of them undone" in summary
    for name in ("instances.png", "attainment.png", "hit_rates.png", "latency_cdf.png"):
        assert (out / name).stat().st_size > 1000


def test_cli_params_override_is_deep_merged(tmp_path: Path) -> None:
    override = tmp_path / "p.yaml"
    override.write_text("shared_tier: {enabled: false}\n")
    out = tmp_path / "w1"
    argv = ["sim", "run", "--scenario", "W1", "--copies", "1", "--policy", "B0", "--out", str(out), "--quiet"]
    assert main([*argv, "--no-plots", "--params", str(override)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["policies"]["B0"]["metrics"]["hit_shared"] == 0.0
    bad = tmp_path / "bad.yaml"
    bad.write_text("shared_tier: {enabld: false}\n")
    assert main([*argv, "--no-plots", "--params", str(bad)]) == 2
