"""`tandem bench fleet`: runs the scenarios, writes fleet.json / fleet.md / PNGs, coexists with `bench controller`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tandem_lab.sim import bench
from tandem_lab.sim.config import load_params


def test_fleet_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    fleet = bench.run_fleet(
        load_params(), "smoke", 1, ["W2", "W5"], ["B0", "tandem"], w5_variants=[("errors", "regression")]
    )
    doc = bench.write(fleet, tmp_path)
    on_disk = json.loads((tmp_path / "fleet.json").read_text())
    assert on_disk["scenarios"]["W2"]["policies"].keys() == {"B0", "tandem"}
    assert {a["arm"] for a in on_disk["w5"]["arms"]} == {"tandem", "flagger"}
    assert "total_s" in on_disk["timing"] and "timing" not in on_disk["scenarios"]["W2"]
    for m in (p["metrics"] for p in doc["scenarios"]["W2"]["policies"].values()):
        assert m["oracle"]["o1_gpuh"] <= m["gpuh"]["total"]
    text = (tmp_path / "fleet.md").read_text()
    for heading in ("## W2", "## W5", "## Gates", "## Where Tandem loses", "÷ O1 (own)", "÷ B0"):
        assert heading in text
    # the gate set is named by the metrics the run's pool had (the regression set has no hit-ratio gate)
    assert on_disk["w5"]["gate_sets"] == {"regression": ["ttft-p95", "tokens-per-user", "errors"]}
    assert "*regression* = ttft-p95, tokens-per-user, errors." in text
    for png in ("fleet-gpuh.png", "fleet-w2-instances.png", "fleet-w2-attainment.png", "fleet-w5.png"):
        assert (tmp_path / png).stat().st_size > 1000


@pytest.mark.parametrize("controller_first", [True, False], ids=["after bench controller", "alone"])
def test_register_adds_fleet_under_one_bench_command(controller_first: bool) -> None:
    parser = argparse.ArgumentParser(prog="tandem")
    sub = parser.add_subparsers(dest="command")
    if controller_first:  # what tandem_lab.dev.benchctl registers
        b = sub.add_parser("bench")
        b.add_subparsers(dest="bench_command").add_parser("controller")
    bench.register(sub)
    args = parser.parse_args(["bench", "fleet", "--out", "/tmp/x", "--profile", "ci", "--seed", "2"])
    assert (args.func, args.profile, args.seed) == (bench.cmd_fleet, "ci", 2)
    if controller_first:
        assert parser.parse_args(["bench", "controller"]).bench_command == "controller"


def test_unknown_scenario_is_a_usage_error(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="tandem")
    bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "fleet", "--out", str(tmp_path), "--scenarios", "W9", "--quiet"])
    assert args.func(args) == 2


def test_the_w5_errors_line_says_what_this_run_decided() -> None:
    """fleet.md's prose follows the run's numbers: an arm that made no decision is not said to decide."""
    arm = {"requests_on_canary": 100, "rolled_back": False, "detection_s": None, "act_s": None}
    decided = {**arm, "rolled_back": True, "detection_s": 90.0, "act_s": 0.0}
    assert "Neither arm rolled it back" in bench._w5_errors_line(arm, arm)
    only = bench._w5_errors_line(arm, decided)
    assert "Only Flagger-like rolled it back (detection 90 s, act 0 s); Tandem made no decision" in only
    both = bench._w5_errors_line(decided, {**decided, "detection_s": 300.0})
    assert "Detection 90 s vs 300 s, act 0 s vs 0 s" in both and "no decision" not in both
