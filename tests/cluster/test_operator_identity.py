"""The operator under the chart's own identity: its RBAC is enough, and no secret leaks (issue 8; S-RBAC-07,
S-SEC-04).

The chart is installed for real (Deployment at replicas 0: KWOK runs no container), and the operator runs
on the host with the chart ServiceAccount's token; it must reconcile an example pool to Ready, and
neither its logs, nor Events, nor the pool's status may contain the model token or a bearer token.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from typing import Any

import yaml

from tandem_lab.dev import audit
from tandem_lab.dev.kube import Kubectl
from tests.cluster.chart_fixtures import OPERATOR_USER, ChartInstall, chart_ns, tandem_chart
from tests.support.tandem_cluster import REPO, GpuNodes, wait_until

__all__ = ["chart_ns", "tandem_chart"]  # fixtures imported for pytest to register them here

SECRET_PATTERN = re.compile(r"hf_[A-Za-z0-9]{30,}|Bearer ")


def test_example_pool_ready_with_chart_rbac_and_no_secret_leaks(
    tandem_chart: ChartInstall, chart_ns: str, gpu_nodes: GpuNodes, operator_factory: Any, audit_log: Any
) -> None:
    kube: Kubectl = tandem_chart.kube
    token = "hf_" + secrets.token_hex(20)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-token", "namespace": chart_ns},
            "stringData": {"token": token},
        }
    )
    gpu_nodes.add(2)
    pool = copy.deepcopy(yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text()))
    spec = pool["spec"]
    spec["pairs"]["replicas"] = 2
    spec["autoscaling"]["enabled"] = False
    spec["kvCache"].pop("mooncakeRef", None)
    spec["placement"]["nodeSelector"] = gpu_nodes.selector
    spec["stack"]["env"].append(
        {"name": "EXTRA_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    )
    # As the chart's Deployment runs it: the Lease in the release namespace, named after the release
    # (POD_NAMESPACE and --leader-election-id there); the chart's Role grants exactly that one Lease.
    lease = [f"--leader-election-namespace={tandem_chart.namespace}", f"--leader-election-id={tandem_chart.release}"]
    op = operator_factory([chart_ns], kubeconfig=tandem_chart.sa_kubeconfig, extra_args=lease)
    kube.run("apply", "-n", chart_ns, "-f", "-", stdin=json.dumps(pool))
    status = wait_until(
        "the example pool Ready under the chart's ServiceAccount",
        lambda: (
            (
                s := kube.json("get", "inferencepools.tandem.dev", "speed", "-n", chart_ns, "-o", "json").get("status")
                or {}
            )
            and s.get("pairs", {}).get("ready") == 2
            and s
        ),
        timeout_s=120,
    )
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
    writes = audit.count_writes(audit.iter_events(audit_log), users=[OPERATOR_USER], namespace=chart_ns)
    assert writes[(OPERATOR_USER, "create", "pods")] == 4  # the writes really came from the chart identity
    forbidden = [line for line in op.logs().splitlines() if " 403 " in line or "Forbidden" in line]
    assert forbidden == []

    # S-SEC-04: the token is referenced, never copied into logs, Events or status
    pods = kube.json("get", "pods", "-n", chart_ns, "-l", "tandem.dev/pool=speed", "-o", "json")["items"]
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["EXTRA_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    events = kube.run("get", "events", "-n", chart_ns, "-o", "yaml").stdout
    status_text = json.dumps(status)
    for where, text in (("operator log", op.logs()), ("events", events), ("status", status_text)):
        assert token not in text, where
        assert not SECRET_PATTERN.search(text), where
