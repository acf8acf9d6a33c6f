"""`tandem rollout status`'s summary (``rolloutctl.describe``): what a person reading a held step needs."""

from __future__ import annotations

from typing import Any

from tandem import rolloutctl


def pool(analysis: dict[str, Any]) -> dict[str, Any]:
    gate = {"name": "ttft-p95", "verdict": "Failure", "reason": "SignificantlyWorse", "value": "0.9"}
    return {
        "metadata": {"namespace": "ml", "name": "speed"},
        "spec": {"stack": {"version": "v2"}},
        "status": {"rollout": {"phase": "Progressing", "step": "2/7", "analysis": analysis, "gates": [gate]}},
    }


def test_the_analysis_line_shows_the_gates_counted_apart() -> None:
    text = rolloutctl.describe(pool({"successStreak": 0, "failures": 1, "gateFailures": {"ttft-p95": 2}}))
    assert "analysis    success streak 0, failures 1, ttft-p95 2\n" in text + "\n", text
    shared = rolloutctl.describe(pool({"successStreak": 1, "failures": 0}))
    assert "analysis    success streak 1, failures 0\n" in shared + "\n", shared
