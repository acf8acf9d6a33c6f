"""The engine scrape configuration: a PodMonitor and the same job as plain Prometheus ``scrape_configs``.

Both forms render one set of relabel rules (the ``tandem.engineRelabelRules`` helper), keep exactly the
engine pods the operator's builders produce, on their OpenAI port, and give their series the target labels
of the series label contract in ``core/promql.py`` (the labels every gate and autoscaling query filters on).
The realengine tier runs the rendered rules through a real Prometheus against real engines.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.labels import LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_PAIR, LABEL_POOL, LABEL_REVISION, LABEL_ROLE
from tandem.api.resources import InferencePool
from tandem.api.revision import revision_id, revision_spec
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.promql import SERIES_LABELS
from tests.chart.chartlib import (
    ENGINE_SCRAPE_VALUES,
    FULL_VALUES,
    MINIMAL_VALUES,
    REPO,
    apply_relabel,
    engine_scrape_job,
    of_kind,
    one,
    pod_sd_targets,
    render,
)

PROMTOOL = Path("/usr/bin/promtool")
CAMEL_TO_SNAKE = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def _snake(rule: dict[str, Any]) -> dict[str, Any]:
    return {CAMEL_TO_SNAKE.get(key, key): value for key, value in rule.items()}


def _objects(values: Path = FULL_VALUES) -> list[dict[str, Any]]:
    return render([values], ENGINE_SCRAPE_VALUES)


def _pod_monitor_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    endpoints = one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 1
    return [_snake(rule) for rule in endpoints[0]["relabelings"]]


def _engine_pod(role: str, namespace: str = "speed") -> dict[str, Any]:
    obj = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
    obj.setdefault("metadata", {}).update(namespace=namespace, uid="uid-speed", generation=1)
    pool = InferencePool.model_validate(obj)
    spec = revision_spec(pool.spec, None)
    params = InstanceParams(
        pool=pool.metadata.name,
        namespace=namespace,
        pool_uid="uid-speed",
        pair=3,
        role=role,  # type: ignore[arg-type]
        instance=0,
        revision=revision_id(spec),
        spec=spec,
        cache_name=None,
    )
    return build_instance_pod(params)


def test_engine_scrape_config_off_by_default() -> None:
    objects = render([MINIMAL_VALUES])
    assert not of_kind(objects, "PodMonitor")
    assert not [o for o in of_kind(objects, "ConfigMap") if "scrape" in o["metadata"]["name"]]


def test_pod_monitor_and_plain_job_render_the_same_rules() -> None:
    objects = _objects()
    rules = engine_scrape_job(objects)["relabel_configs"]
    assert rules, "the plain job has no relabel rules"
    assert _pod_monitor_rules(objects) == rules


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_both_forms_select_engine_pods_in_the_served_namespaces_only(values: Path) -> None:
    objects = _objects(values)
    served = yaml.safe_load(values.read_text())["watchNamespaces"]
    monitor = one(objects, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": served}
    assert monitor["spec"]["selector"] == {"matchLabels": {LABEL_COMPONENT: "engine", LABEL_MANAGED_BY: "tandem"}}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["http"]
    (sd,) = engine_scrape_job(objects)["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["namespaces"] == {"names": served}


def test_rules_write_exactly_the_series_label_contract() -> None:
    rules = engine_scrape_job(_objects())["relabel_configs"]
    targets = {rule["target_label"] for rule in rules if "target_label" in rule}
    assert targets == set(SERIES_LABELS)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_rules_turn_a_built_engine_pod_into_the_contract_labels(role: str) -> None:
    """Only the pod's `http` port survives, labelled from the builder's labels."""
    pod = _engine_pod(role)
    labels = pod["metadata"]["labels"]
    rules = engine_scrape_job(_objects())["relabel_configs"]
    kept = [out for target in pod_sd_targets(pod) if (out := apply_relabel(rules, target)) is not None]
    assert kept == [
        {
            "namespace": "speed",
            "pool": labels[LABEL_POOL],
            "revision": labels[LABEL_REVISION],
            "role": role,
            "pair": labels[LABEL_PAIR],
            "pod": pod["metadata"]["name"],
        }
    ]
    assert labels[LABEL_ROLE] == role and labels[LABEL_PAIR] == "speed-p3"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({LABEL_COMPONENT: "cache"}, id="not-an-engine"),
        pytest.param({LABEL_MANAGED_BY: "someone-else"}, id="not-tandems"),
    ],
)
def test_rules_drop_pods_that_are_not_tandem_engines(change: dict[str, str]) -> None:
    pod = _engine_pod("decode")
    pod["metadata"]["labels"] = pod["metadata"]["labels"] | change
    rules = engine_scrape_job(_objects())["relabel_configs"]
    assert [apply_relabel(rules, target) for target in pod_sd_targets(pod)] == [None] * len(pod_sd_targets(pod))


def test_promtool_accepts_the_plain_job(tmp_path: Path) -> None:
    """Prometheus's own config loader accepts the job as rendered (relabel rules, regexes, fields). The
    Debian build of the test toolchain has no Kubernetes SD compiled in, so its SD block is swapped for a
    static one here; the SD block's shape is asserted above."""
    promtool = PROMTOOL if PROMTOOL.exists() else shutil.which("promtool")
    assert promtool, "promtool missing: run tools/testenv/prometheus.sh"
    job = dict(engine_scrape_job(_objects()))
    assert job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["10.0.0.7:8000"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    argv = [str(promtool), "check", "config", str(config)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"SUCCESS", result.stdout + result.stderr)
