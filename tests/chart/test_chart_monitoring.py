"""The optional monitoring objects: the PrometheusRule's alerts are valid PromQL (checked by `promtool`)
and use only the operator metrics the chart README documents (the contract the operator implements).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.chart.chartlib import CHART, FULL_VALUES, MINIMAL_VALUES, of_kind, one, render

PROMTOOL = Path("/usr/bin/promtool")
METRIC_ROW = re.compile(r"^\| `(tandem_[a-z_]+)` \|", re.MULTILINE)
METRIC_USE = re.compile(r"\b(tandem_[a-z_]+)\b")
REQUIRED_ALERTS = {
    "TandemRolloutFailed",
    "TandemRolloutRollingBack",
    "TandemPoolDegraded",
    "TandemPoolNotReady",
    "TandemKVCacheDegraded",
    "TandemCacheDegraded",
    "TandemOperatorDown",
}


def documented_metrics() -> set[str]:
    return set(METRIC_ROW.findall((CHART / "README.md").read_text()))


def alert_rules() -> list[dict[str, object]]:
    rule = one(render([FULL_VALUES]), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_monitoring_objects_off_by_default() -> None:
    objects = render([MINIMAL_VALUES])
    assert not of_kind(objects, "PrometheusRule")
    assert not of_kind(objects, "ServiceMonitor")


def test_alerts_cover_rollout_pool_and_cache() -> None:
    names = {str(r["alert"]) for r in alert_rules()}
    assert names >= REQUIRED_ALERTS
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical")  # type: ignore[index]
        assert rule["annotations"]["summary"]  # type: ignore[index]


def test_alerts_use_only_documented_metrics() -> None:
    documented = documented_metrics()
    assert {"tandem_pool_pairs_ready", "tandem_pool_condition", "tandem_rollout_phase"} <= documented
    used = {m for r in alert_rules() for m in METRIC_USE.findall(str(r["expr"]))}
    assert used, "the alerts use no Tandem metric"
    assert used <= documented, f"undocumented metrics in alerts: {used - documented}"


def test_alert_conditions_use_the_api_condition_types() -> None:
    types = {t for r in alert_rules() for t in re.findall(r'type="([A-Za-z]+)"', str(r["expr"]))}
    assert types == {"Ready", "Degraded", "KVCacheDegraded", "Progressing"}


def test_no_operator_down_alert_when_stopped() -> None:
    rule = one(render([FULL_VALUES], {"replicaCount": 0}), "PrometheusRule")
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "TandemOperatorDown" not in names


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    """Every expression parses and every rule is well-formed, as Prometheus itself loads them."""
    assert PROMTOOL.exists() or shutil.which("promtool"), "promtool missing: run tools/testenv/prometheus.sh"
    rule = one(render([FULL_VALUES]), "PrometheusRule")
    path = tmp_path / "tandem-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool = str(PROMTOOL) if PROMTOOL.exists() else str(shutil.which("promtool"))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objects = render([FULL_VALUES])
    sm = one(objects, "ServiceMonitor", "tandem")
    svc = one(objects, "Service", "tandem-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
