"""W5 over seeds (issue 17 item 7): per-seed rows, the Must-show summary and its fleet.json gates."""

from __future__ import annotations

import pytest

from tandem_lab.sim import w5seeds
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
