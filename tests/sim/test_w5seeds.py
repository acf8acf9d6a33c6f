"""W5 over seeds (issue 17 item 7): per-seed rows, the Must-show summary and its fleet.json gates."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tandem.api.pool_status import AnalysisProgress, GateVerdict
from tandem.core.rollout import AnalysisResult
from tandem_lab.sim import bench, rollout, w5seeds
from tandem_lab.sim.config import load_params
from tandem_lab.sim.scenarios import ScenarioConfig


def _row(seed: int, canary: str, rolled_back: bool, act: float | None, share: float) -> dict[str, object]:
    return {
        "seed": seed,
        "arm": "tandem",
        "canary": canary,
        "gates": "example",
        "rolled_back": rolled_back,
        "promoted": not rolled_back,
        "detection_s": 100.0 if rolled_back else None,
        "act_s": act,
        "canary_share_of_all_requests": share,
        "outcome": "rolled back" if rolled_back else "promoted",
    }


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        pytest.param(
            [_row(1, "errors", True, 0.0, 0.0004), _row(2, "errors", True, 5.0, 0.0008)],
            {"rolled back in every seed": True, "act ≤ 30 s": True, "exposure < 0.1 % of all requests": True},
            id="all met",
        ),
        pytest.param(
            [_row(1, "errors", True, 0.0, 0.0004), _row(2, "errors", False, None, 0.02)],
            {"rolled back in every seed": False, "act ≤ 30 s": False, "exposure < 0.1 % of all requests": False},
            id="one seed missed: every check fails",
        ),
        pytest.param(
            [_row(1, "errors", True, 700.0, 0.0004)],
            {"rolled back in every seed": True, "act ≤ 30 s": False, "exposure < 0.1 % of all requests": True},
            id="slow act",
        ),
        pytest.param(
            [_row(1, "good", False, None, 0.01), _row(2, "good", True, 0.0, 0.001)],
            {"0 false rollbacks": False},
            id="a false rollback",
        ),
    ],
)
def test_must_show_checks(rows: list[dict[str, object]], want: dict[str, bool]) -> None:
    doc = w5seeds.document(rows, sorted({int(str(r["seed"])) for r in rows}))
    got = {g["gate"].split(": ", 1)[1]: g["pass"] for g in w5seeds.gates(doc)}
    assert got == want
    assert any("W5 over" in line for line in w5seeds.markdown(doc))


def test_act_check_names_the_seeds_that_have_no_act() -> None:
    """A seed with no rollback has no act: the check fails there and its value says which seed, not just the
    slowest act that exists."""
    rows = [_row(9, "errors", True, 0.0, 0.0), _row(28, "errors", False, None, 0.0), _row(30, "tpot", True, 0.0, 0.0)]
    doc = w5seeds.document(rows, [9, 28, 30])
    values = {g["gate"]: g["value"] for g in w5seeds.gates(doc) if "act" in g["gate"]}
    assert values == {
        "W5 × 2 seeds errors/example: act ≤ 30 s": "max 0 s; no act in seed 28",
        "W5 × 1 seeds tpot/example: act ≤ 30 s": "max 0 s",
    }


def test_two_seeds_run_the_tandem_arm_and_keep_only_metrics() -> None:
    p = load_params()
    for gate in p.policies.tandem_rollout["analysis"]["metrics"]:
        gate["minSamples"] = 0  # the 1 % workload sends a handful of canary requests per window
    cfg = ScenarioConfig("W5", scale=0.01, compress=5.0, canary_error_prob=0.3)
    rows = w5seeds.run_w5_seeds(cfg, [1, 2], p, ["tandem"], [("errors", "regression")])
    assert [(r["seed"], r["arm"], r["canary"], r["gates"]) for r in rows] == [
        (1, "tandem", "errors", "regression"),
        (2, "tandem", "errors", "regression"),
    ]
    assert all(r["rolled_back"] and r["act_s"] == 0.0 for r in rows)
    for r in rows:  # each gate's looks and Failures are recorded; the errors canary failed the errors gate
        looks, failures = r["gate_looks"], r["gate_failures"]
        assert isinstance(looks, dict) and isinstance(failures, dict) and set(failures) == set(looks)
        assert all(0 <= failures[g] <= looks[g] for g in looks) and failures["errors"] >= 1, (looks, failures)


def test_gate_counts_take_only_evaluations_with_a_verdict() -> None:
    evaluations = [
        {"gates": {"ttft": "Failure:1.4 vs 1.0 | Worse", "errors": "NoData:0.01 | Underpowered"}},
        {"gates": {"ttft": "Success:1.0 vs 1.0", "errors": "Success:0.004 vs 0.005"}},
        {"gates": {"ttft": "Error: | Timeout", "errors": "Failure:0.03 vs 0.005"}},
    ]
    assert rollout._gate_counts(evaluations) == {
        "gate_looks": {"ttft": 2, "errors": 2},
        "gate_failures": {"ttft": 1, "errors": 1},
    }


def test_the_log_keeps_what_the_step_counted() -> None:
    """A cold canary's hit-ratio Failure held by the warm-up is logged as the NoData the step folded, so the per-gate
    counts take only the Failures that counted toward ``failureLimit``."""
    held = GateVerdict(name="hits", verdict="NoData", reason="WarmingUp", value="0.3", condition="warming up")
    failed = GateVerdict(name="ttft", verdict="Failure", reason="SignificantlyWorse", value="1.4")
    entry = rollout._log_entry(2920.0, AnalysisResult(AnalysisProgress(), "Continue", (held, failed)))
    assert entry["gates"]["hits"].startswith("NoData:0.3 | WarmingUp")
    assert rollout._gate_counts([entry]) == {"gate_looks": {"ttft": 1}, "gate_failures": {"ttft": 1}}


def test_good_canaries_false_alarms_are_summed_per_gate() -> None:
    """Each Failure of a good canary is a false alarm: summed over seeds per gate, they are the per-look rate that
    ``failureLimit`` must tolerate; a run without the counts (an older run's rows) is left out, not counted as 0."""
    rows = [
        {**_row(1, "good", False, None, 0.003), "gate_looks": {"ttft": 13, "errors": 20}, "gate_failures": {"ttft": 1}},
        {**_row(2, "good", False, None, 0.003), "gate_looks": {"ttft": 12}, "gate_failures": {"ttft": 0}},
        _row(3, "good", False, None, 0.003),
        {**_row(1, "errors", True, 0.0, 0.0004), "gate_looks": {"ttft": 5}, "gate_failures": {"ttft": 5}},
    ]
    doc = w5seeds.document(rows, [1, 2, 3])
    good = next(s for s in doc["summary"] if s["canary"] == "good")
    assert good["false_alarms"] == {"ttft": [1, 25], "errors": [0, 20]}
    assert "false_alarms" not in next(s for s in doc["summary"] if s["canary"] == "errors")
    assert "- good/example tandem: errors 0/20 (0.000 %); ttft 1/25 (4.000 %)" in w5seeds.markdown(doc)


@pytest.mark.parametrize(("seeds", "want_seeds"), [(None, None), (1, [5]), (2, [5, 6])])
def test_any_explicit_seed_count_writes_mergeable_rows(
    monkeypatch: pytest.MonkeyPatch, seeds: int | None, want_seeds: list[int] | None
) -> None:
    """``--seeds 1`` is a run over one seed like any other (its rows merge with ``fleet-merge``); only without
    ``--seeds`` does W5 run once in the single-run form."""
    chosen: list[list[int]] = []

    def fake_seeds(_cfg: object, seeds: list[int], *_args: object) -> list[dict[str, object]]:
        chosen.append(list(seeds))
        return [_row(s, "errors", True, 0.0, 0.0004) for s in seeds]

    monkeypatch.setattr(w5seeds, "run_w5_seeds", fake_seeds)
    monkeypatch.setattr(bench, "run_w5", lambda *_args: "single")
    fleet = bench.run_fleet(load_params(), "smoke", 5, ["W5"], seeds=seeds, arms=["tandem"])
    if want_seeds is None:
        assert fleet.w5 == "single" and fleet.w5_seeds is None and not chosen
    else:
        assert fleet.w5 is None and chosen == [want_seeds] and fleet.w5_seeds is not None
        assert fleet.w5_seeds["seeds"] == want_seeds


def _fleet_doc(rows: list[dict[str, object]], code: str = "abc") -> dict[str, object]:
    seeds = sorted({int(str(r["seed"])) for r in rows})
    return {
        "version": 1,
        "code_revision": code,
        "profile": "canary",
        "params_hash": "p1",
        "w5_seeds": w5seeds.document(rows, seeds),
        "timing": {"W5_seeds_s": 10.0},
    }


def test_runs_over_disjoint_seeds_merge_into_one_must_show(tmp_path: Path) -> None:
    """``tandem bench fleet-merge``: two runs' seeds judged together (a seed that fails in one run fails the
    merged check); the same seed twice, or runs of different code, are refused with a message."""
    a = _fleet_doc([_row(1, "errors", True, 0.0, 0.0004), _row(2, "errors", True, 0.0, 0.0006)])
    b = _fleet_doc([_row(3, "errors", True, 0.0, 0.0012)])
    doc = bench.merge_documents([b, a])
    assert doc["w5_seeds"]["seeds"] == [1, 2, 3] and [r["seed"] for r in doc["w5_seeds"]["runs"]] == [1, 2, 3]
    got = {g["gate"].split(": ", 1)[1]: g["pass"] for g in doc["gates"]}
    assert got == {"rolled back in every seed": True, "act ≤ 30 s": True, "exposure < 0.1 % of all requests": False}
    assert "W5 over 3 seeds (seeds 1–3)" in bench.markdown(doc)
    assert "- runs merged: 2\n" in bench.markdown(doc)
    c = _fleet_doc([_row(4, "errors", True, 0.0, 0.0004)])
    assert bench.merge_documents([doc, c])["timing"]["runs merged"] == 3  # a merged file counts its own runs
    with pytest.raises(ValueError, match="seed 1 errors/example tandem is in more than one run"):
        bench.merge_documents([a, a])
    with pytest.raises(ValueError, match="the runs differ in code_revision"):
        bench.merge_documents([a, _fleet_doc([_row(3, "errors", True, 0.0, 0.0004)], code="def")])
    for i, d in enumerate((a, b)):
        (tmp_path / f"{i}.json").write_text(json.dumps(d), encoding="utf-8")
    args = argparse.Namespace(
        out=tmp_path / "m", inputs=[tmp_path / "0.json", tmp_path / "1.json"], no_plots=True, across_code=False
    )
    assert bench.cmd_fleet_merge(args) == 0
    assert json.loads((tmp_path / "m" / "fleet.json").read_text(encoding="utf-8"))["w5_seeds"]["seeds"] == [1, 2, 3]
    args.inputs = [tmp_path / "0.json", tmp_path / "0.json"]
    assert bench.cmd_fleet_merge(args) == 2


def test_runs_of_two_code_revisions_merge_only_on_an_identical_replay() -> None:
    """``fleet-merge --across-code``: seeds of a later revision count with the first's only when that revision
    replayed one of the first's rows identically; the replayed row counts once, and the merged document names
    both revisions."""
    old = _fleet_doc([_row(1, "errors", True, 0.0, 0.0004), _row(2, "errors", True, 0.0, 0.0006)])
    new_rows = [_row(2, "errors", True, 0.0, 0.0006), _row(3, "errors", True, 0.0, 0.0012)]
    new = _fleet_doc(new_rows, code="def")
    with pytest.raises(ValueError, match="the runs differ in code_revision"):
        bench.merge_documents([old, new])
    doc = bench.merge_documents([old, new], across_code=True)
    assert doc["code_revision"] == "abc+def"
    assert [r["seed"] for r in doc["w5_seeds"]["runs"]] == [1, 2, 3]
    assert doc["w5_seeds"]["replayed"] == [[2, "errors", "example", "tandem"]]
    assert doc["w5_seeds"]["summary"][0]["seeds"] == 3
    assert "1 row ran on more than one and were identical" in bench.markdown(doc)
    unlinked = _fleet_doc([_row(3, "errors", True, 0.0, 0.0012)], code="def")
    with pytest.raises(ValueError, match="runs of def replay no"):
        bench.merge_documents([old, unlinked], across_code=True)
    drifted = _fleet_doc([_row(2, "errors", True, 0.0, 0.0007)], code="def")
    with pytest.raises(ValueError, match="seed 2 errors/example tandem was replayed with a different result"):
        bench.merge_documents([old, drifted], across_code=True)
    with pytest.raises(ValueError, match="the runs differ in params_hash"):
        bench.merge_documents([old, {**new, "params_hash": "p2"}], across_code=True)
    with pytest.raises(ValueError, match="seed 1 errors/example tandem is in more than one run of abc"):
        bench.merge_documents([old, old, new], across_code=True)  # the same run twice is no replay
    with pytest.raises(ValueError, match="seed 2 errors/example tandem is in more than one run of def"):
        bench.merge_documents([doc, new], across_code=True)  # the merged file holds def's rows already
