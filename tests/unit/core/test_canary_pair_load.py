"""Like with like on load: a canary pair's share of keys over a stable pair's, per rollout step, and `tandem plan`'s
note on an analysis step that compares the canary at another load (docs/design/009, "Like with like on load")."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import yaml

from tandem.api.resources import InferencePool
from tandem.core.rollout import canary_pair_load, stable_beside
from tandem.planview import preview, print_text, synthetic_nodes
from tests.support.factories import make_pool
from tests.support.tandem_cluster import REPO


@pytest.mark.parametrize(
    ("canary", "replicas", "max_surge", "want"),
    [
        pytest.param(1, 8, 2, 8, id="surge: stable keeps every pair"),
        pytest.param(4, 8, 2, 4, id="more than maxSurge: capacity-first"),
        pytest.param(8, 8, 2, 0, id="promoted"),
        pytest.param(0, 8, 0, 8, id="no canary"),
        pytest.param(1, 8, None, 7, id="surge room not computed: capacity-first"),
        pytest.param(1, 1, 2, 0, id="the canary takes the only pair"),
    ],
)
def test_stable_beside(canary: int, replicas: int, max_surge: int | None, want: int) -> None:
    """One rule for the planner (room = the measured surge room) and the preview (room = maxSurge)."""
    assert stable_beside(canary, replicas, max_surge) == want


@pytest.mark.parametrize(
    ("steps", "replicas", "max_surge", "index", "want"),
    [
        # 5 % on 1 pair beside 8 stable pairs with 95/8 % each.
        pytest.param([{"setWeight": 5}], 8, 2, 0, (5 / 1) / (95 / 8), id="setWeight 5 of 8"),
        # W5 before stop 42: 2 % on 2 pairs beside 75 with 98/75 % each.
        pytest.param([{"setWeight": 2}], 75, 2, 0, (2 / 2) / (98 / 75), id="W5's old setWeight 2 of 75"),
        pytest.param([{"setCanaryPairs": 1}], 75, 2, 0, 1.0, id="by pair count"),
        pytest.param([{"setCanaryPairs": 1}, {"analysis": {}}], 8, 2, 1, 1.0, id="persists into the analysis"),
        pytest.param([{"setWeight": 50}], 8, 2, 0, 1.0, id="capacity-first half"),
        # 1 surge pair cannot carry 12 %: the table caps it at its share of serving pairs, 1/9.
        pytest.param([{"setWeight": 12}], 8, 2, 0, (100 / 9) / ((100 - 100 / 9) / 8), id="capped weight"),
        # 5 of 8 pairs (more than maxSurge) against 3 stable.
        pytest.param([{"setWeight": 60}], 8, 2, 0, (60 / 5) / (40 / 3), id="capacity-first 60"),
        pytest.param([{"pause": {}}], 8, 2, 0, None, id="no canary yet"),
        pytest.param([{"setWeight": 100}], 8, 2, 0, None, id="no stable left"),
    ],
)
def test_canary_pair_load(
    steps: list[dict[str, Any]], replicas: int, max_surge: int, index: int, want: float | None
) -> None:
    pool = make_pool().pairs(replicas).steps(*steps).obj()
    got = canary_pair_load(list(pool.spec.rollout.steps), index, replicas, max_surge)
    assert got == (None if want is None else pytest.approx(want))


def _example(steps: list[dict[str, Any]] | None = None, replicas: int | None = None) -> InferencePool:
    doc = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
    if steps is not None:
        doc["spec"]["rollout"]["steps"] = steps
    if replicas is not None:
        doc["spec"]["pairs"]["replicas"] = replicas
    doc["metadata"]["namespace"] = "default"
    return InferencePool.model_validate(doc)


def _summary(pool: InferencePool) -> dict[str, Any]:
    nodes = synthetic_nodes(pool.spec.pairs.replicas + 2, 8, 2, "MI325X", dict(pool.spec.placement.node_selector))
    return preview(pool, nodes)[1]


@pytest.mark.parametrize("replicas", [8, 95])
def test_the_examples_analysis_steps_compare_like_with_like(replicas: int) -> None:
    """The speed example's steps keep every analysed canary pair at a stable pair's load, at its minPairs and at
    its maxPairs: `tandem plan` has no note for it."""
    summary = _summary(_example(replicas=replicas))
    loads = [s["canaryPairLoad"] for s in summary["rolloutSteps"] if "analysis" in s["action"]]
    assert loads and all(0.9 <= load <= 1 / 0.9 for load in loads), loads
    assert summary["rolloutNotes"] == []


def _pools() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferencePool":
                found.append((path.name, doc))
    return found


@pytest.mark.parametrize(("name", "doc"), _pools(), ids=[n for n, _ in _pools()])
def test_no_example_analyses_a_canary_at_another_load(name: str, doc: dict[str, Any]) -> None:
    """Every example pool's analysis steps compare its canary pairs at a stable pair's load, at its replicas and at
    both ends of its autoscaling range."""
    spec = doc["spec"]
    auto = spec.get("autoscaling", {})
    sizes = {spec.get("pairs", {}).get("replicas", 1)}
    if auto.get("enabled"):
        sizes |= {max(1, auto.get("minPairs", 1)), auto.get("maxPairs", 8)}
    for replicas in sorted(sizes):
        body = {**doc, "metadata": {**doc["metadata"], "namespace": "default"}}
        body["spec"] = {**spec, "pairs": {**spec.get("pairs", {}), "replicas": replicas}}
        assert _summary(InferencePool.model_validate(body))["rolloutNotes"] == [], (name, replicas)


def test_plan_notes_an_analysis_step_at_another_load(capsys: pytest.CaptureFixture[str]) -> None:
    """`setWeight: 5` on 8 pairs: the analysis after it compares a canary pair with 5 % of keys against stable pairs
    with 11.9 % each (x0.42); the plan says so in its JSON and its text."""
    pool = _example(steps=[{"setWeight": 5}, {"analysis": {}}, {"setWeight": 100}], replicas=8)
    summary = _summary(pool)
    assert [s["canaryPairLoad"] for s in summary["rolloutSteps"]] == [0.42, 0.42, None]
    assert [s["stablePairs"] for s in summary["rolloutSteps"]] == [8, 8, 0]
    (note,) = summary["rolloutNotes"]
    assert note.startswith("step 2/3 analyses canary pairs that carry x0.42 of a stable pair's keys"), note
    print_text(summary, 10, argparse.Namespace(product="MI325X", gpus_per_node=8))
    out = capsys.readouterr().out
    assert "each canary pair x0.42 of a stable pair's keys" in out
    assert "note: step 2/3 analyses canary pairs that carry x0.42" in out
