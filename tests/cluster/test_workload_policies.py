"""What Tandem runs, on the real local control plane: the pod backstop and the NetworkPolicies (issue 19 class 8).

One chart install for the module (router on, a cache namespace, see ``chart_fixtures``), and one
``tandem run`` under the chart's ServiceAccount serving two namespaces: ``serving`` (Pod Security
baseline) and ``bare`` (no Pod Security level: RDMA pools need IPC_LOCK, which the baseline level
refuses, so they belong in a namespace labelled like the cache namespace). The operator creates the pods
of a plain pool and of an RDMA pool for real; the eval Job is the builder's, created as the operator's
ServiceAccount, so its pod is made by the Job controller; Mooncake pods are the builder's, created as
the operator's ServiceAccount. The ValidatingAdmissionPolicy is the API server's own, so "admitted" and
"refused" are real. The local cluster has no CNI that enforces NetworkPolicy: the applied policies are
read back and evaluated against the real pods with ``tests.support.netpol``.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tandem.api.cache import MooncakeCacheSpec
from tandem.api.pool import EvalGate
from tandem.builders import mooncake as mc
from tandem.builders.evaljob import build_eval_job
from tandem.builders.pods import ENGINE_PORT, NIXL_SIDE_CHANNEL_PORT
from tandem_lab.dev.kube import Kubectl
from tests.cluster.chart_fixtures import ChartInstall, delete_namespaces, install_chart
from tests.support.netpol import Endpoint, allowed, isolating
from tests.support.tandem_cluster import REPO, GpuNodes, OperatorProcess, wait_until

if TYPE_CHECKING:
    from conftest import DevCluster

EXAMPLE_POOL = yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text())
ENGINE_IMAGE = EXAMPLE_POOL["spec"]["stack"]["image"]
MOONCAKE_IMAGE = "ghcr.io/example/mooncake@sha256:" + "b" * 64
UNLISTED_IMAGE = "quay.io/someone/vllm@sha256:" + "ab" * 32
RDMA_RESOURCE = "rdma/ib"


@dataclass
class Fleet:
    chart: ChartInstall
    serving: str
    bare: str
    operator: OperatorProcess

    @property
    def sa(self) -> Kubectl:
        return self.chart.sa_kube()

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return list(self.chart.kube.json("get", "pods", "-n", namespace, "-l", selector)["items"])


def _pool(name: str, nodes: GpuNodes, rdma: bool = False) -> dict[str, Any]:
    obj = copy.deepcopy(EXAMPLE_POOL)
    obj["metadata"] = {"name": name}
    obj["spec"]["pairs"] = {"replicas": 1}
    obj["spec"]["placement"] = {"nodeSelector": nodes.selector}
    if rdma:
        obj["spec"]["placement"]["rdma"] = {"name": RDMA_RESOURCE, "perInstance": 1}
    return obj


@pytest.fixture(scope="module")
def fleet(dev_cluster: DevCluster) -> Iterator[Fleet]:
    suffix = secrets.token_hex(3)
    serving, bare, cache = f"t-wl-{suffix}", f"t-wl-bare-{suffix}", f"t-wl-cache-{suffix}"
    chart = install_chart(dev_cluster, [serving], cache_namespace=cache, extra_values={"router": {"enabled": True}})
    nodes = GpuNodes(dev_cluster.kube)
    op: OperatorProcess | None = None
    try:
        chart.serve(bare)
        chart.kube.run("label", "namespace", bare, "pod-security.kubernetes.io/enforce-")
        chart.wait_policies_active()
        nodes.add(2)
        lease = [f"--leader-election-namespace={chart.namespace}", f"--leader-election-id={chart.release}"]
        assert chart.sa_kubeconfig is not None
        op = OperatorProcess(
            kubeconfig=chart.sa_kubeconfig, namespaces=[serving, bare], name=f"wl-{suffix}", extra_args=lease
        ).start()
        chart.kube.run("apply", "-n", serving, "-f", "-", stdin=json.dumps(_pool("plain", nodes)))
        chart.kube.run("apply", "-n", bare, "-f", "-", stdin=json.dumps(_pool("rdma", nodes, rdma=True)))
        fleet = Fleet(chart, serving, bare, op)
        for ns, pool in ((serving, "plain"), (bare, "rdma")):
            wait_until(
                f"{ns}/{pool}: the operator's 2 pods exist",
                lambda ns=ns, pool=pool: len(fleet.pods(ns, f"tandem.dev/pool={pool}")) == 2,
                timeout_s=90,
            )
        yield fleet
    finally:
        if op is not None:
            op.stop()
        for ns in (serving, bare):
            for pool in ("plain", "rdma"):
                chart.kube.run(
                    "annotate",
                    "inferencepools.tandem.dev",
                    pool,
                    "-n",
                    ns,
                    "tandem.dev/confirm-delete=true",
                    check=False,
                )
        chart.uninstall()
        delete_namespaces(dev_cluster.kube, [serving, bare, cache])
        nodes.cleanup()


def _create(kube: Kubectl, namespace: str, obj: dict[str, Any], dry_run: bool = True) -> tuple[int, str]:
    args = ["create", "-n", namespace, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    proc = kube.run(*args, stdin=json.dumps(obj), check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _cache_ref(namespace: str, protocol: str = "tcp") -> mc.CacheRef:
    transport: dict[str, Any] = {"protocol": protocol}
    if protocol == "rdma":
        transport |= {"devices": ["mlx5_0"], "rdma": {"name": RDMA_RESOURCE, "perInstance": 1}}
    spec = MooncakeCacheSpec.model_validate(
        {"image": MOONCAKE_IMAGE, "version": "0.3.13", "store": {"transport": transport}}
    )
    return mc.CacheRef(name="kv", namespace=namespace, uid="00000000-0000-0000-0000-000000000001", spec=spec)


def _without_owner(obj: dict[str, Any]) -> dict[str, Any]:
    """The builder's object without its owner reference (the owner uid is made up here)."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("ownerReferences", None)
    return out


def _eval_job(namespace: str) -> dict[str, Any]:
    gate = EvalGate.model_validate({"image": ENGINE_IMAGE, "deadline": "10m", "minScorePercent": 50})
    job = build_eval_job(
        pool="plain",
        namespace=namespace,
        pool_uid="u",
        revision="r",
        step=1,
        gate=gate,
        model="m",
        target_urls=["http://10.0.0.1:8000"],
    )
    return _without_owner(job)


# --- admitted ---------------------------------------------------------------------------------------


def test_the_operators_real_pods_are_admitted_including_an_rdma_pool(fleet: Fleet) -> None:
    """The operator, as the chart's ServiceAccount, created every pod of both pools: non-root with a
    read-only root, and on the RDMA pool exactly IPC_LOCK (as uid 0) next to the RDMA resource."""
    (plain,) = {
        json.dumps(p["spec"]["containers"][0]["securityContext"], sort_keys=True)
        for p in fleet.pods(fleet.serving, "tandem.dev/pool=plain")
    }
    assert json.loads(plain) == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
    }
    for pod in fleet.pods(fleet.bare, "tandem.dev/pool=rdma"):
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert container["resources"]["limits"][RDMA_RESOURCE] == "1"
    assert "tandem-operator-pods" not in fleet.operator.logs()


def test_eval_job_and_the_pod_the_job_controller_makes_are_admitted(fleet: Fleet) -> None:
    job = _eval_job(fleet.serving)
    code, out = _create(fleet.sa, fleet.serving, job, dry_run=False)
    assert code == 0, out
    name = job["metadata"]["name"]
    pod = wait_until(
        "the eval Job's pod",
        lambda: next(iter(fleet.pods(fleet.serving, f"job-name={name}")), None),
        timeout_s=60,
    )
    assert pod["metadata"]["labels"]["tandem.dev/component"] == "eval"
    assert pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("what", "build"),
    [
        pytest.param("serving", lambda ns: mc.build_master_pod(_cache_ref(ns), 0, {}), id="mooncake master"),
        pytest.param("serving", lambda ns: mc.build_metadata_pod(_cache_ref(ns), {}), id="mooncake metadata"),
        pytest.param(
            "serving",
            lambda ns: mc.build_store_pod(
                mc.StoreParams(_cache_ref(ns), 0, "n1"), mc.cache_endpoints("kv", ns, _cache_ref(ns).spec)
            ),
            id="mooncake tcp store",
        ),
        pytest.param(
            "cache",
            lambda ns: mc.build_store_pod(
                mc.StoreParams(_cache_ref(ns, "rdma"), 0, "n1"),
                mc.cache_endpoints("kv", ns, _cache_ref(ns, "rdma").spec),
            ),
            id="mooncake rdma store in the cache namespace (hostNetwork, IPC_LOCK)",
        ),
    ],
)
def test_mooncake_pods_as_built_are_admitted(fleet: Fleet, what: str, build: Callable[[str], dict[str, Any]]) -> None:
    ns = fleet.serving if what == "serving" else fleet.chart.cache_namespace
    code, out = _create(fleet.sa, ns, _without_owner(build(ns)))
    assert code == 0, out


# --- refused ----------------------------------------------------------------------------------------


def _engine_pod(fleet: Fleet) -> dict[str, Any]:
    """A copy of one of the operator's real engine pods, as a fresh create."""
    pod = copy.deepcopy(fleet.pods(fleet.serving, "tandem.dev/pool=plain")[0])
    spec = pod["spec"]
    for key in ("nodeName", "serviceAccount", "serviceAccountName", "priority"):
        spec.pop(key, None)
    pod.pop("status", None)
    pod["metadata"] = {"name": "forged-" + secrets.token_hex(3), "labels": pod["metadata"]["labels"]}
    return pod


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        target = _container(pod) if path.startswith("c.") else pod["spec"]
        keys = path.removeprefix("c.").split(".")
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value

    return mutate


FORGERIES = [
    pytest.param(_set("c.securityContext.runAsUser", 0), "must run as non-root", id="uid 0"),
    pytest.param(_set("c.securityContext.runAsNonRoot", False), "must run as non-root", id="runAsNonRoot false"),
    pytest.param(
        _set("c.securityContext.readOnlyRootFilesystem", False), "readOnlyRootFilesystem=true", id="writable root"
    ),
    pytest.param(
        _set("c.securityContext.allowPrivilegeEscalation", True), "allowPrivilegeEscalation=false", id="escalation"
    ),
    pytest.param(_set("c.securityContext.capabilities", {"drop": []}), "drop ALL", id="capabilities kept"),
    pytest.param(
        _set("c.securityContext.capabilities", {"drop": ["ALL"], "add": ["IPC_LOCK"]}),
        "added capabilities",
        id="IPC_LOCK without rdma",
    ),
    pytest.param(
        _set("c.securityContext.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        "added capabilities",
        id="SYS_ADMIN",
    ),
    pytest.param(
        # the API server itself refuses privileged together with allowPrivilegeEscalation=false
        lambda pod: _container(pod)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "privileged containers",
        id="privileged",
    ),
    pytest.param(_set("hostNetwork", True), "hostNetwork", id="hostNetwork"),
    pytest.param(_set("hostPID", True), "hostPID", id="hostPID"),
    pytest.param(_set("automountServiceAccountToken", True), "automountServiceAccountToken=false", id="token mounted"),
    pytest.param(_set("serviceAccountName", "tandem-other"), "default ServiceAccount", id="other ServiceAccount"),
    pytest.param(
        lambda pod: pod["spec"]["volumes"].append({"name": "creds", "secret": {"secretName": "anything"}}),
        "no Secret except",
        id="Secret volume",
    ),
    pytest.param(
        lambda pod: pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath", id="hostPath"
    ),
    pytest.param(_set("c.image", UNLISTED_IMAGE), "from an allowed registry", id="unlisted registry"),
    pytest.param(_set("c.image", "docker.io/vllm/vllm-openai:latest"), "pinned by digest", id="tag only"),
]


@pytest.mark.parametrize(("mutate", "want"), FORGERIES)
def test_forged_pod_refused_as_the_operator(fleet: Fleet, mutate: Callable[[dict[str, Any]], None], want: str) -> None:
    """Each rule of the backstop refuses a pod the operator's ServiceAccount writes that breaks it (in the
    namespace without Pod Security enforcement, so the policy alone answers)."""
    fleet.chart.kube.run("create", "serviceaccount", "tandem-other", "-n", fleet.bare, check=False)
    pod = _engine_pod(fleet)
    mutate(pod)
    code, out = _create(fleet.sa, fleet.bare, pod)
    assert code != 0, out
    assert "tandem-operator-pods" in out and want in out, out


def test_forged_eval_job_pod_and_cache_namespace_pod_refused(fleet: Fleet) -> None:
    """The backstop sees an eval Job written by the operator, a pod labelled as Tandem's eval pod whoever
    writes it (the Job controller does), and the cache namespace (a privileged pod there is refused)."""
    job = _eval_job(fleet.bare)
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    code, out = _create(fleet.sa, fleet.bare, job)
    assert code != 0 and "must run as non-root" in out, out

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "eval-forged", "labels": job["spec"]["template"]["metadata"]["labels"]},
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
    }
    code, out = _create(fleet.chart.kube, fleet.bare, pod)  # the admin, standing in for the Job controller
    assert code != 0 and "tandem-operator-pods" in out, out

    store = _without_owner(mc.build_master_pod(_cache_ref(fleet.chart.cache_namespace), 0, {}))
    store["spec"]["containers"][0]["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    code, out = _create(fleet.sa, fleet.chart.cache_namespace, store)
    assert code != 0 and "privileged containers" in out, out
    master_on_host = _without_owner(mc.build_master_pod(_cache_ref(fleet.chart.cache_namespace), 0, {}))
    master_on_host["spec"]["hostNetwork"] = True
    code, out = _create(fleet.sa, fleet.chart.cache_namespace, master_on_host)
    assert code != 0 and "hostNetwork" in out, out


# --- NetworkPolicies --------------------------------------------------------------------------------


def test_network_policies_select_exactly_the_operators_pods_and_allow_the_intended_peers(fleet: Fleet) -> None:
    """The applied policies (read back from the API server) against the real pods: engine, Mooncake and
    eval pods each isolated by their own policy; a user's pod in the same namespace by none; the router
    and pair peers reach engines, a stranger does not; engines reach the cache, strangers do not; the
    eval pod reaches engines and nothing else. Evaluated in Python (no enforcing CNI here)."""
    kube = fleet.chart.kube
    ns, cache = fleet.serving, fleet.chart.cache_namespace
    for obj in (mc.build_master_pod(_cache_ref(cache), 0, {}), mc.build_metadata_pod(_cache_ref(cache), {})):
        _create(fleet.sa, cache, _without_owner(obj), dry_run=False)
    stranger = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stranger", "labels": {"app": "curious"}},
        "spec": {"containers": [{"name": "c", "image": UNLISTED_IMAGE}]},
    }
    _create(kube, ns, stranger, dry_run=False)
    job = _eval_job(ns)
    job["metadata"]["name"] = "plain-eval-np"
    _create(fleet.sa, ns, job, dry_run=False)
    wait_until("the eval pod", lambda: fleet.pods(ns, "job-name=plain-eval-np"), timeout_s=60)

    policies = kube.json("get", "networkpolicies", "-A")["items"]
    namespaces = {
        n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in kube.json("get", "namespaces")["items"]
    }
    namespaces.setdefault("monitoring", {"kubernetes.io/metadata.name": "monitoring"})
    pods = {p["metadata"]["name"]: Endpoint.of_pod(p) for p in kube.json("get", "pods", "-n", ns)["items"]}
    pods |= {p["metadata"]["name"]: Endpoint.of_pod(p) for p in kube.json("get", "pods", "-n", cache)["items"]}
    router_template = kube.json("get", "deployment", "tandem-router", "-n", fleet.chart.namespace)["spec"]["template"]
    router = Endpoint.of_pod(router_template, namespace=fleet.chart.namespace)
    prometheus = Endpoint("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"})

    def selected_by(name: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in isolating(policies, pods[name], "Ingress"))

    engines = sorted(n for n, p in pods.items() if p.labels.get("tandem.dev/component") == "engine")
    evals = sorted(n for n, p in pods.items() if p.labels.get("tandem.dev/component") == "eval")
    cache_pods = sorted(n for n, p in pods.items() if "tandem.dev/cache" in p.labels)
    assert len(engines) == 2 and evals and len(cache_pods) == 2, sorted(pods)
    assert {n: selected_by(n) for n in engines} == {key: ["tandem-engines"] for key in engines}
    assert {n: selected_by(n) for n in evals} == {key: ["tandem-eval"] for key in evals}
    assert {n: selected_by(n) for n in cache_pods} == {key: ["tandem-mooncake"] for key in cache_pods}
    assert selected_by("stranger") == []

    prefill = next(pods[n] for n in engines if "prefill" in n)
    decode = next(pods[n] for n in engines if "decode" in n)
    master = next(pods[n] for n in cache_pods if "master" in n)
    evaluator, user = pods[evals[0]], pods["stranger"]
    want = [
        (router, decode, ENGINE_PORT, True),
        (prefill, decode, NIXL_SIDE_CHANNEL_PORT, True),
        (prometheus, decode, ENGINE_PORT, True),
        (evaluator, decode, ENGINE_PORT, True),
        (user, decode, ENGINE_PORT, False),
        (user, prefill, NIXL_SIDE_CHANNEL_PORT, False),
        (evaluator, decode, NIXL_SIDE_CHANNEL_PORT, False),
        (decode, master, master.ports["rpc"], True),
        (user, master, master.ports["rpc"], False),
        (prometheus, master, master.ports["metrics"], True),
        (prometheus, master, master.ports["rpc"], False),
        (evaluator, master, master.ports["rpc"], False),
        (evaluator, user, 80, False),
        (user, evaluator, 8080, False),
    ]
    got = [(s.name, d.name, port, allowed(policies, namespaces, s, d, port)) for s, d, port, _ in want]
    assert got == [(s.name, d.name, port, ok) for s, d, port, ok in want]
