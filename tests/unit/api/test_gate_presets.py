"""Named gate presets (issue 17 item 5): a preset fills what the gate leaves unset, never more."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from tandem.api.pool import (
    GATE_PRESETS,
    GATE_TEMPLATES,
    NORMALIZABLE_PRESETS,
    NORMALIZABLE_TEMPLATES,
    GatePreset,
    MetricGate,
)


@pytest.mark.parametrize(
    ("gate", "want"),
    [
        pytest.param(
            {"name": "ttft", "preset": "ttft-p95"},
            {"template": "TTFTP95", "compare": True, "failure_condition": None},
            id="ttft-p95 compares with stable",
        ),
        pytest.param(
            {"name": "errors", "preset": "errors"},
            {"template": "ErrorRate", "compare": True, "failure_condition": "result > 0.01"},
            id="errors: Fisher above a 1 % floor",
        ),
        pytest.param(
            {"name": "errors", "preset": "errors", "failureCondition": "result > 0.02"},
            {"template": "ErrorRate", "compare": True, "failure_condition": "result > 0.02"},
            id="a field set on the gate wins",
        ),
        pytest.param(
            {"name": "errors", "preset": "errors", "failure_condition": "result > 0.05"},
            {"template": "ErrorRate", "compare": True, "failure_condition": "result > 0.05"},
            id="by field name too",
        ),
        pytest.param(
            {"name": "hits", "preset": "local-kv-hits"},
            {"template": "LocalKVHitRatio", "compare": True, "failure_condition": None},
            id="hit ratio: the score test, no threshold",
        ),
        pytest.param(
            {"name": "custom", "preset": "errors", "query": 'sum(rate(x{pool="${pool}"}[${interval}]))'},
            {"template": None, "compare": False, "failure_condition": "result > 0.01"},
            id="a query replaces the preset's template",
        ),
    ],
)
def test_presets_expand(gate: dict[str, Any], want: dict[str, Any]) -> None:
    g = MetricGate.model_validate(gate)
    assert g.template == want["template"]
    assert (g.compare is not None) == want["compare"]
    assert g.failure_condition == want["failure_condition"]


def test_every_preset_is_a_valid_gate_and_round_trips() -> None:
    for name in GATE_PRESETS:
        g = MetricGate.model_validate({"name": "g", "preset": name})
        again = MetricGate.model_validate(g.model_dump(by_alias=True, exclude_none=True))
        assert again == g


def test_preset_and_template_names_have_one_source() -> None:
    """The API schema's enums, the presets' table and the CEL rule's normalizable lists are one set of names:
    a preset added to the table but not to the enum (or the reverse) would be refused, or never applied."""
    assert set(GATE_PRESETS) == set(get_args(GatePreset))
    assert {gate["template"] for gate in GATE_PRESETS.values()} <= set(GATE_TEMPLATES)
    assert set(NORMALIZABLE_TEMPLATES) <= set(GATE_TEMPLATES)
    assert NORMALIZABLE_PRESETS == ("ttft-p90", "ttft-p95")
    schema = MetricGate.model_json_schema()
    rules = " ".join(r["rule"] for r in schema.get("x-kubernetes-validations", []))
    assert "['TTFTP90', 'TTFTP95']" in rules and "['ttft-p90', 'ttft-p95']" in rules
