"""The simulator runs the operator's convergence and gate running, never a copy (issue 14 item 5, issue 17
item 6): it calls ``tandem.core.converge.next_moves`` and ``tandem.core.gaterun`` (``gate_queries``,
``judge``), and no lab module imports the pieces those functions are made of, which a copy would need."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tandem_lab
from tandem.api.pool import AnalysisSpec, MetricGate
from tandem.core import converge, gaterun
from tandem_lab.sim import engine, rollout
from tandem_lab.sim.metrics import ScrapeStore
from tests.sim.simhelpers import spy_on

LAB = Path(tandem_lab.__file__).parent

BUILDING_BLOCKS = {
    # what core.gaterun runs per gate: a lab module importing these is running gates itself
    "tandem.core.gates": {"evaluate_gate", "gate_samples", "invalid_query_verdict", "resolve_gate_queries"},
    "tandem.core.promql": {"attach_freshness", "freshness_query"},
}


def _imports(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


@pytest.mark.parametrize("path", sorted(LAB.rglob("*.py")), ids=lambda p: str(p.relative_to(LAB)))
def test_no_lab_module_imports_the_building_blocks_of_gate_running(path: Path) -> None:
    found = {(m, n) for m, n in _imports(path) if n in BUILDING_BLOCKS.get(m, set())}
    assert not found, f"{path.name} imports {sorted(found)}: call tandem.core.gaterun instead"


def test_the_simulator_runs_gates_with_gate_queries_and_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = spy_on(monkeypatch, rollout, "gate_queries")
    judged = spy_on(monkeypatch, rollout, "judge")
    gate = MetricGate(name="errors", template="ErrorRate", success_condition="result < 0.01", min_samples=0)
    verdicts = rollout.evaluate_gates(
        ScrapeStore(), 60.0, [gate], AnalysisSpec(metrics=[gate]), "r2", "r1", rollout.at(0.0), 15.0, 131_072
    )
    assert len(plans) == 1 and judged == [verdicts]
    assert [(v.name, v.verdict) for v in verdicts] == [("errors", "NoData")]  # no scrape yet: empty result


def test_the_core_functions_are_the_ones_the_operator_imports() -> None:
    """The simulator's names are core's objects (not same-named local copies)."""
    assert engine.next_moves is converge.next_moves
    assert rollout.gate_queries is gaterun.gate_queries and rollout.judge is gaterun.judge
