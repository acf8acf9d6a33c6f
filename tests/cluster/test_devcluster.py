"""The local dev cluster itself: real scheduling of AMD GPU pods on KWOK nodes, the simulated pod
lifecycle, Prometheus scraping through file_sd, the audit log, ServiceAccount identity, Helm and the
``tandem dev cluster status`` command.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tandem_lab.dev import audit, cluster, nodes, stages
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tandem_lab.dev.testenv import TestenvError, Toolchain

REPO = Path(__file__).resolve().parents[2]
STUB_CHART = REPO / "tests" / "fixtures" / "stub-chart"
IMAGE = "vllm/vllm-openai-rocm:v0.33.0"

if TYPE_CHECKING:
    from conftest import DevCluster, ScrapeTarget


def make_pod(
    name: str,
    gpus: int | None = None,
    annotations: dict[str, str] | None = None,
    restart_policy: str = "Always",
    containers: int = 1,
) -> dict[str, Any]:
    resources = {"limits": {nodes.RESOURCE_GPU: str(gpus)}} if gpus is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [
                {"name": f"engine-{i}" if i else "engine", "image": IMAGE, "resources": resources}
                for i in range(containers)
            ],
        },
    }


def create_in(kube: Kubectl, ns: str, *objs: dict[str, Any]) -> None:
    kube.run("create", "-n", ns, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))


def get_pod(kube: Kubectl, ns: str, name: str) -> dict[str, Any]:
    pod = kube.get("pod", name, namespace=ns)
    assert pod is not None, f"pod {ns}/{name} vanished"
    return pod


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in pod.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def is_ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def wait_pod(kube: Kubectl, ns: str, name: str, what: str, pred: Any, *, timeout_s: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> bool:
        seen["pod"] = get_pod(kube, ns, name)
        return bool(pred(seen["pod"]))

    try:
        kube.wait_for(f"pod {name} {what}", check, timeout_s=timeout_s, interval_s=0.3)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last status: {json.dumps(seen.get('pod', {}).get('status'))}") from exc
    return seen["pod"]


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- nodes -----------------------------------------------------------------------------------------


def test_nodes_carry_amd_gpus_and_node_labeller_labels(kube: Kubectl, dev_cluster: DevCluster) -> None:
    items = kube.json("get", "nodes", "-l", f"{nodes.LABEL_SIM_NODE}=true")["items"]
    assert items, "no simulated GPU nodes"
    if not dev_cluster.reused:
        assert len(items) == 4
        assert {n["metadata"]["labels"][nodes.LABEL_ZONE] for n in items} == {"zone-a", "zone-b"}
    for node in items:
        name = node["metadata"]["name"]
        labels = node["metadata"]["labels"]
        status = node["status"]
        prod = nodes.PRODUCTS[name.split("-")[0].upper()]
        assert nodes.node_is_ready(node), name
        assert status["capacity"][nodes.RESOURCE_GPU] == "8", name
        assert status["allocatable"][nodes.RESOURCE_GPU] == "8", name
        assert int(status["capacity"]["cpu"]) >= 64 and status["capacity"]["pods"] == "110", name
        want = {
            nodes.LABEL_GPU_DEVICE_ID: prod.device_id,
            nodes.LABEL_GPU_PRODUCT_NAME: prod.product_name,
            nodes.LABEL_GPU_VRAM: prod.vram,
            nodes.LABEL_GPU_CU_COUNT: str(prod.cu_count),
            nodes.LABEL_GPU_FAMILY: prod.family,
            nodes.LABEL_GPU_COMPUTE_MEMORY_PARTITION: "spx_nps1",
            nodes.LABEL_NFD_AMD_GPU: "true",
            f"beta.{nodes.LABEL_GPU_DEVICE_ID}": prod.device_id,
            f"beta.{nodes.LABEL_GPU_DEVICE_ID}.{prod.device_id}": "8",
        }
        assert {k: labels.get(k) for k in want} == want, name
        assert labels.get(nodes.LABEL_GPU_DRIVER_VERSION)
        for key in (nodes.LABEL_REGION, nodes.LABEL_ZONE, nodes.LABEL_RACK):
            assert labels.get(key), f"{name} lacks {key}"
        assert not node["spec"].get("taints"), f"{name} is tainted"


def test_node_helpers_add_set_gpus_cordon_and_delete(kube: Kubectl, ns: str) -> None:
    """Fault-test helpers on a node of the test's own (the session fleet is never mutated)."""
    name = f"fault-{secrets.token_hex(3)}"
    spec = nodes.NodeSpec(name=name, internal_ip=nodes.node_ip(1000 + secrets.randbelow(5000)))
    nodes.add_nodes(kube, [spec])
    try:
        nodes.wait_nodes_ready(kube, [name], timeout_s=30)
        nodes.set_gpu_allocatable(kube, name, 0)  # device plugin down
        node = kube.get("node", name)
        assert node is not None
        assert node["status"]["allocatable"][nodes.RESOURCE_GPU] == "0"
        assert node["status"]["capacity"][nodes.RESOURCE_GPU] == "8"
        pinned = make_pod("pinned", gpus=2)
        pinned["spec"]["nodeSelector"] = {nodes.LABEL_HOSTNAME: name}
        create_in(kube, ns, pinned)
        pod = wait_pod(
            kube, ns, "pinned", "Unschedulable", lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable"
        )
        assert f"Insufficient {nodes.RESOURCE_GPU}" in condition(pod, "PodScheduled")["message"]
        nodes.set_gpu_allocatable(kube, name, 8)  # back: the scheduler retries and binds it
        pod = wait_pod(kube, ns, "pinned", "Ready", is_ready, timeout_s=60)
        assert pod["spec"]["nodeName"] == name
        nodes.cordon(kube, name)
        node = kube.get("node", name)
        assert node is not None and node["spec"].get("unschedulable") is True
        second = make_pod("second", gpus=2)
        second["spec"]["nodeSelector"] = {nodes.LABEL_HOSTNAME: name}
        create_in(kube, ns, second)
        wait_pod(
            kube, ns, "second", "Unschedulable", lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable"
        )
        nodes.cordon(kube, name, unschedulable=False)
        wait_pod(kube, ns, "second", "Ready", is_ready, timeout_s=60)
    finally:
        nodes.delete_node(kube, name)
    assert kube.get("node", name) is None


# --- scheduling and the simulated pod lifecycle ----------------------------------------------------


def test_gpu_pod_is_scheduled_on_a_kwok_gpu_node_and_becomes_ready(kube: Kubectl, ns: str) -> None:
    create_in(kube, ns, make_pod("engine", gpus=4))
    pod = wait_pod(kube, ns, "engine", "Ready", is_ready)
    node = kube.get("node", pod["spec"]["nodeName"])
    assert node is not None
    assert node["metadata"]["labels"][nodes.LABEL_SIM_NODE] == "true"
    assert node["metadata"]["annotations"][nodes.ANNOTATION_KWOK_NODE] == "fake"
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert pod["status"]["hostIP"].startswith("10.250.")


def test_pod_asking_more_gpus_than_any_node_has_stays_pending_unschedulable(kube: Kubectl, ns: str) -> None:
    create_in(kube, ns, make_pod("too-big", gpus=16))
    pod = wait_pod(
        kube, ns, "too-big", "Unschedulable", lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable"
    )
    scheduled = condition(pod, "PodScheduled")
    assert scheduled["status"] == "False"
    assert f"Insufficient {nodes.RESOURCE_GPU}" in scheduled["message"]
    time.sleep(2)  # still nothing binds it
    pod = get_pod(kube, ns, "too-big")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_load_delay_annotation_holds_readiness(kube: Kubectl, ns: str) -> None:
    zero = {stages.ANNOTATION_SIM_LOAD_SECONDS: "0", stages.ANNOTATION_SIM_LOAD_JITTER_SECONDS: "0"}
    slow = {stages.ANNOTATION_SIM_LOAD_SECONDS: "6", stages.ANNOTATION_SIM_LOAD_JITTER_SECONDS: "0"}
    create_in(kube, ns, make_pod("fast", gpus=1, annotations=zero), make_pod("slow", gpus=1, annotations=slow))
    fast = wait_pod(kube, ns, "fast", "Ready", is_ready, timeout_s=30)
    slow_now = wait_pod(kube, ns, "slow", "Running", lambda p: p["status"].get("phase") == "Running", timeout_s=30)
    assert not is_ready(slow_now), "the slow pod turned Ready with the fast one"
    assert condition(slow_now, "Ready").get("reason") == "ContainersNotReady"
    slow_ready = wait_pod(kube, ns, "slow", "Ready", is_ready, timeout_s=60)
    started = ts(slow_ready["status"]["startTime"])
    ready_at = ts(condition(slow_ready, "Ready")["lastTransitionTime"])
    assert ready_at - started >= timedelta(seconds=5), (started, ready_at)  # 6 s, 1 s timestamp granularity
    assert ts(condition(fast, "Ready")["lastTransitionTime"]) <= ready_at


def test_crashloop_and_fail_annotations(kube: Kubectl, ns: str) -> None:
    crash = {stages.ANNOTATION_SIM_FAIL: stages.SIM_FAIL_CRASHLOOP, stages.ANNOTATION_SIM_RESTART_COUNT: "3"}
    fail = {stages.ANNOTATION_SIM_FAIL: stages.SIM_FAIL_FAIL}
    create_in(
        kube,
        ns,
        make_pod("crashy", annotations=crash, containers=2),
        make_pod("eval", annotations=fail, restart_policy="Never"),
    )

    def crashlooping(pod: dict[str, Any]) -> bool:
        statuses = pod["status"].get("containerStatuses") or []
        return bool(statuses) and all(
            (s.get("state", {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff" for s in statuses
        )

    pod = wait_pod(kube, ns, "crashy", "CrashLoopBackOff", crashlooping, timeout_s=30)
    assert not is_ready(pod)
    assert pod["status"]["phase"] == "Running"
    assert [s["restartCount"] for s in pod["status"]["containerStatuses"]] == [3, 3]
    pod = wait_pod(kube, ns, "eval", "Failed", lambda p: p["status"].get("phase") == "Failed", timeout_s=30)
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1


def test_deleted_pods_go_away_and_finalizers_stay_with_their_owner(kube: Kubectl, ns: str) -> None:
    held = make_pod("held")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    stripped = make_pod("stripped", annotations={stages.ANNOTATION_SIM_STRIP_FINALIZERS: "true"})
    stripped["metadata"]["finalizers"] = ["example.com/hold"]
    create_in(kube, ns, make_pod("plain"), held, stripped)
    for name in ("plain", "held", "stripped"):
        wait_pod(kube, ns, name, "Ready", is_ready, timeout_s=30)
    kube.run("delete", "pod", "-n", ns, "plain", "held", "stripped", "--wait=false")
    kube.wait_for(
        "plain and stripped pods deleted",
        lambda: kube.get("pod", "plain", ns) is None and kube.get("pod", "stripped", ns) is None,
        timeout_s=30,
    )
    held_now = get_pod(kube, ns, "held")
    assert held_now["metadata"].get("deletionTimestamp"), "held pod should be Terminating"
    kube.run("patch", "pod", "-n", ns, "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    kube.wait_for("held pod deleted", lambda: kube.get("pod", "held", ns) is None, timeout_s=30)


# --- Prometheus ------------------------------------------------------------------------------------


class _MetricsHandler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, str]]:
    """A loopback /metrics endpoint exposing one gauge with a unique nonce; yields (host:port, nonce)."""
    nonce = secrets.token_hex(4)
    handler = type("Handler", (_MetricsHandler,), {"body": f'tandem_devcluster_probe{{nonce="{nonce}"}} 42\n'.encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", nonce
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_scrapes_a_target_registered_through_file_sd(
    prometheus: PrometheusServer, scrape_target: ScrapeTarget, metrics_server: tuple[str, str]
) -> None:
    address, nonce = metrics_server
    scrape_target([address], {"role": "probe"})
    promql = f'tandem_devcluster_probe{{nonce="{nonce}",role="probe"}}'
    deadline = time.monotonic() + 60
    result: list[Any] = []
    while time.monotonic() < deadline:
        result = prometheus.query(promql)["result"]
        if result:
            break
        time.sleep(0.5)
    assert result, f"{promql} never appeared in {prometheus.url}"
    assert result[0]["value"][1] == "42"
    assert result[0]["metric"]["job"] == "tandem"


# --- audit log and identity ------------------------------------------------------------------------


def test_audit_log_records_a_create_by_the_test_user(kube: Kubectl, ns: str, audit_log: Path) -> None:
    user = kube.json("auth", "whoami")["status"]["userInfo"]["username"]
    since = datetime.now(UTC) - timedelta(seconds=2)
    name = f"cm-{secrets.token_hex(3)}"
    kube.run("create", "configmap", name, "-n", ns, "--from-literal=k=v")

    def recorded() -> bool:
        writes = audit.select_writes(audit.iter_events(audit_log), since=since, users=[user], namespace=ns)
        return any(ev.verb == "create" and ev.resource == "configmaps" and ev.name == name for ev in writes)

    kube.wait_for("the audit event of the configmap create", recorded, timeout_s=15)
    counts = audit.count_writes(audit.iter_events(audit_log), since=since, namespace=ns, successful_only=True)
    assert counts[(user, "create", "configmaps")] >= 1


def test_serviceaccount_kubeconfig_authenticates_with_real_rbac(
    kube: Kubectl, ns: str, dev_cluster: DevCluster, tmp_path: Path
) -> None:
    sa = "tandem-operator"
    kube.run("create", "serviceaccount", sa, "-n", ns)
    kube.run("create", "role", "pod-reader", "-n", ns, "--verb=get,list,watch", "--resource=pods")
    kube.run("create", "rolebinding", "pod-reader", "-n", ns, "--role=pod-reader", f"--serviceaccount={ns}:{sa}")
    path = cluster.serviceaccount_kubeconfig(dev_cluster.state, ns, sa, path=tmp_path / "sa.kubeconfig")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    as_sa = Kubectl(dev_cluster.toolchain.kubectl, path)
    who = as_sa.json("auth", "whoami")["status"]["userInfo"]["username"]
    assert who == f"system:serviceaccount:{ns}:{sa}"
    as_sa.run("get", "pods", "-n", ns)
    denied = as_sa.run("get", "pods", "-n", "kube-system", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    denied = as_sa.run("create", "configmap", "x", "-n", ns, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


# --- Helm ------------------------------------------------------------------------------------------


def test_helm_lints_and_templates_the_stub_chart(toolchain: Toolchain, tmp_path: Path) -> None:
    try:
        toolchain.require(("helm",))
    except TestenvError as exc:
        pytest.fail(str(exc), pytrace=False)
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }
    helm = str(toolchain.helm)
    version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, env=env, check=True)
    assert version.stdout.startswith(toolchain.versions.helm)
    lint = subprocess.run(
        [helm, "lint", str(STUB_CHART), "--kube-version", toolchain.versions.k8s],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 chart(s) failed" in lint.stdout
    rendered = subprocess.run(
        [helm, "template", "smoke", str(STUB_CHART), "--kube-version", toolchain.versions.k8s],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    minor = toolchain.versions.k8s.split(".")[1]
    assert "kind: Deployment" in rendered.stdout
    assert f'tandem.dev/rendered-for: "v1.{minor}"' in rendered.stdout


# --- CLI -------------------------------------------------------------------------------------------


def test_tandem_dev_cluster_status_reports_the_cluster(dev_cluster: DevCluster) -> None:
    if not dev_cluster.has_state:
        pytest.skip(f"{dev_cluster.kubeconfig} was not made by `tandem dev cluster up` (no state.json)")
    assert dev_cluster.state_root is not None
    base = [sys.executable, "-m", "tandem.cli", "dev", "cluster", "status"]
    args = ["--name", dev_cluster.state.name, "--state-dir", str(dev_cluster.state_root)]
    text = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60, check=False)
    assert text.returncode == 0, text.stdout + text.stderr
    assert str(dev_cluster.kubeconfig) in text.stdout
    assert "kube-apiserver=running" in text.stdout and "kwok-controller=running" in text.stdout
    as_json = subprocess.run([*base, *args, "--json"], capture_output=True, text=True, timeout=60, check=False)
    data = json.loads(as_json.stdout)
    assert data["apiReady"] is True
    assert all(data["components"].values()), data["components"]
    assert data["nodes"] and data["gpusAllocatable"] > 0
    if dev_cluster.state.prometheus_url:
        assert data["prometheusUrl"] == dev_cluster.state.prometheus_url
        assert data["prometheusReady"] is True
