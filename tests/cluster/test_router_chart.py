"""The router part of the chart on the real local control plane (issue 15 §8: "helm install brings the
router up Ready and hardened").

One install per module with the router on (``chart_fixtures.install_chart``; the other chart modules run
without it). KWOK marks pods Ready without running containers, so "Ready" here proves the Deployment, its
PodSecurity `restricted` admission in the release namespace, scheduling and the rollout, not the process;
the router's ``/ready`` itself is covered by ``tests/component/test_router.py``. RBAC is the API server's
own: the router's identity may get, list and watch ConfigMaps in a served namespace and nothing else, and
nothing at all elsewhere.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tandem_lab.dev.kube import Kubectl
from tests.cluster.chart_fixtures import OPERATOR_USER, ChartInstall, delete_namespaces, install_chart

if TYPE_CHECKING:
    from conftest import DevCluster

ROUTER = "tandem-router"
ROUTER_SA = "tandem-router"
READ_VERBS = ("get", "list", "watch")


@pytest.fixture(scope="module")
def chart(dev_cluster: DevCluster) -> Iterator[ChartInstall]:
    """The chart with the router on (2 replicas, the default), one served namespace."""
    serving = f"t-router-{secrets.token_hex(3)}"
    install = install_chart(dev_cluster, [serving], extra_values={"router": {"enabled": True}})
    try:
        yield install
    finally:
        install.uninstall()
        delete_namespaces(dev_cluster.kube, install.serving)


def router_user(chart: ChartInstall) -> str:
    return f"system:serviceaccount:{chart.namespace}:{ROUTER_SA}"


def can_i(chart: ChartInstall, verb: str, resource: str, namespace: str) -> bool:
    proc = chart.kube.run("auth", "can-i", verb, resource, "-n", namespace, f"--as={router_user(chart)}", check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


def can_i_rows(kube: Kubectl, user: str, namespace: str) -> set[str]:
    """``kubectl auth can-i --list`` rows (whitespace-normalised, header dropped)."""
    out = kube.run("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout
    return {" ".join(line.split()) for line in out.splitlines()[1:] if line.strip()}


def test_router_deployment_ready(chart: ChartInstall) -> None:
    """`helm install --wait` returned; the Deployment has all its replicas Ready and a PDB guards them."""
    kube = chart.kube

    def ready() -> bool:
        deploy = kube.get("deployment", ROUTER, namespace=chart.namespace) or {}
        status = deploy.get("status") or {}
        want = (deploy.get("spec") or {}).get("replicas")
        return bool(want) and status.get("readyReplicas") == want == status.get("updatedReplicas")

    kube.wait_for("the router Deployment to be Ready", ready, timeout_s=120)
    deploy = kube.get("deployment", ROUTER, namespace=chart.namespace)
    assert deploy is not None and deploy["spec"]["replicas"] == 2
    pods = kube.json("get", "pods", "-n", chart.namespace, "-l", "app.kubernetes.io/component=router")["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == ROUTER_SA
        assert pod["spec"]["automountServiceAccountToken"] is False
    ns = kube.get("namespace", chart.namespace)
    assert ns is not None and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pdb = kube.get("poddisruptionbudget", ROUTER, namespace=chart.namespace)
    assert pdb is not None and pdb["spec"]["minAvailable"] == 1
    assert kube.get("service", ROUTER, namespace=chart.namespace) is not None
    assert kube.get("networkpolicy", "tandem-engines", namespace=chart.serving[0]) is not None


def test_router_reads_configmaps_in_served_namespace_only(chart: ChartInstall) -> None:
    serving = chart.serving[0]
    for verb in READ_VERBS:
        assert can_i(chart, verb, "configmaps", serving), f"{verb} configmaps in {serving}"
    for verb in ("create", "patch", "update", "delete"):
        assert not can_i(chart, verb, "configmaps", serving), f"{verb} configmaps in {serving}"
    for ns in (serving, chart.namespace, "default", "kube-system"):
        for verb in READ_VERBS:
            assert not can_i(chart, verb, "secrets", ns), f"{verb} secrets in {ns}"
        for resource in ("pods", "services", "endpoints", "inferencepools.tandem.dev", "events"):
            assert not can_i(chart, "list", resource, ns), f"list {resource} in {ns}"
    for ns in (chart.namespace, "default", "kube-system"):
        assert not can_i(chart, "list", "configmaps", ns), f"list configmaps in {ns}"
    assert not can_i(chart, "list", "nodes", "default")


def test_router_can_i_list_is_configmap_reads_beyond_any_serviceaccount(chart: ChartInstall) -> None:
    """What the router may do in a served namespace, minus what every ServiceAccount may do (the
    namespace's own `default` ServiceAccount has no bindings), is exactly reading ConfigMaps."""
    serving = chart.serving[0]
    baseline = can_i_rows(chart.kube, f"system:serviceaccount:{serving}:default", serving)
    extra = can_i_rows(chart.kube, router_user(chart), serving) - baseline
    assert extra == {"configmaps [] [] [get list watch]"}
    assert can_i_rows(chart.kube, router_user(chart), chart.namespace) == can_i_rows(
        chart.kube, f"system:serviceaccount:{chart.namespace}:default", chart.namespace
    )


def test_operator_may_list_the_router_endpointslices_and_nothing_more_for_them(chart: ChartInstall) -> None:
    """With the router on, the operator finds the router replicas (their open-streams reports end drains)
    by listing EndpointSlices in the release namespace: list only, there only, and it is told which Service."""
    extra = can_i_rows(chart.kube, OPERATOR_USER, chart.namespace) - can_i_rows(
        chart.kube, f"system:serviceaccount:{chart.namespace}:default", chart.namespace
    )
    assert {row for row in extra if row.startswith("endpointslices")} == {
        "endpointslices.discovery.k8s.io [] [] [list]"
    }
    for ns in (chart.serving[0], "default"):
        rows = can_i_rows(chart.kube, OPERATOR_USER, ns)
        assert not any(row.startswith("endpointslices") for row in rows), ns
    deploy = chart.kube.get("deployment", chart.release, namespace=chart.namespace)
    assert deploy is not None
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--router-service={chart.namespace}/{ROUTER}" in args
