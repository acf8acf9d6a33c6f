"""`tandem demo` shows the examples' own canary gates (issue 17 item 5): its fleet must not swap them."""

from __future__ import annotations

from pathlib import Path

import yaml

from tandem.api.resources import InferencePool
from tandem_lab.dev import demo

REPO = Path(__file__).resolve().parents[3]


def test_demo_speed_pool_uses_the_examples_analysis_unchanged() -> None:
    example = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
    speed = demo.demo_fleet()[1]
    assert speed["metadata"]["name"] == "speed"
    assert speed["spec"]["rollout"]["analysis"] == example["spec"]["rollout"]["analysis"]


def test_demo_steps_never_ask_for_the_eval_it_cannot_run() -> None:
    """The example's eval gate stays defined; no demo step selects it (the demo has no eval image)."""
    speed = demo.demo_fleet()[1]
    steps = speed["spec"]["rollout"]["steps"]
    assert [s for s in steps if (s.get("analysis") or {}).get("eval")] == []
    assert any("analysis" in s for s in steps)


def test_demo_fleet_is_valid() -> None:
    for obj in demo.demo_fleet()[1:]:
        InferencePool.model_validate(obj)
