"""Golden files of the chart's renders for each CI values file (tests/golden/chart/).

What the chart installs besides the CRDs (those are compared with crds/ by the CRD tests): the operator
Deployment, its ServiceAccount and RBAC, the admission policies, NetworkPolicies, the router and the
monitoring objects, in Helm's own output order. A golden diff in review shows what a chart change does
to a cluster; regenerate on purpose with ``pytest --update-golden`` (tests/support/golden.py).

Offline ``helm template`` with the pinned Helm and ``--kube-version``: ``lookup`` returns nothing and
the chart calls no clock or random function, so the render is deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chartlib import CI_VALUES, REPO, render
from tests.support.golden import assert_golden

GOLDEN = REPO / "tests" / "golden" / "chart"


@pytest.mark.parametrize("values", [pytest.param(p, id=p.stem) for p in CI_VALUES])
def test_chart_render_matches_golden(values: Path) -> None:
    objects = [o for o in render([values]) if o.get("kind") != "CustomResourceDefinition"]
    assert objects, "the chart rendered nothing"
    assert_golden(GOLDEN / f"{values.stem.removesuffix('-values')}.yaml", objects)


def test_every_ci_values_file_has_a_golden() -> None:
    want = {p.stem.removesuffix("-values") for p in CI_VALUES}
    have = {p.stem for p in GOLDEN.glob("*.yaml")}
    assert have == want, f"missing: {sorted(want - have)}, orphaned: {sorted(have - want)}"
