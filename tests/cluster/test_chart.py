"""The chart on the real local control plane (security.md §7 steps 3 and 6, UP-01, UP-04, GC-03).

One install per module (``tandem_chart`` plus a cache namespace, see ``chart_fixtures``); the tests run
in file order and the last one uninstalls and reinstalls it. KWOK runs no real container, so the
operator Deployment is at ``replicas: 0``; PodSecurity admission, RBAC and the ValidatingAdmissionPolicies
are the API server's own and fully real.

Golden files: ``tests/security/golden/rbac-<ns>.txt`` (``kubectl auth can-i --list`` as the operator,
header first, rows sorted). Regenerate on purpose with ``TANDEM_UPDATE_GOLDEN=1`` and explain the RBAC
change in the same PR.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tandem.builders.common import container_security
from tandem_lab.dev.kube import Kubectl
from tests.chart.chartlib import FULL_VALUES, MINIMAL_VALUES, render_text
from tests.cluster.chart_fixtures import (
    OPERATOR_USER,
    ChartInstall,
    delete_namespaces,
    ensure_namespace,
    install_chart,
    wait_gone,
)

if TYPE_CHECKING:
    from conftest import DevCluster

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "security" / "golden"
UPDATE_GOLDEN = os.environ.get("TANDEM_UPDATE_GOLDEN") == "1"
EXAMPLE_POOL = yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text())
EXAMPLE_CACHE = yaml.safe_load((REPO / "examples" / "mooncake-cache.yaml").read_text())
UNLISTED_IMAGE = "quay.io/someone/vllm@sha256:" + "ab" * 32
CRDS = ("inferencepools.tandem.dev", "mooncakecaches.tandem.dev")


@pytest.fixture(scope="module")
def chart(dev_cluster: DevCluster) -> Iterator[ChartInstall]:
    """This module's install: one serving namespace and a cache namespace."""
    suffix = secrets.token_hex(3)
    install = install_chart(dev_cluster, [f"t-chart-{suffix}"], cache_namespace=f"t-chart-cache-{suffix}")
    try:
        yield install
    finally:
        install.uninstall()
        delete_namespaces(dev_cluster.kube, [*install.serving, install.cache_namespace])


@pytest.fixture(scope="module")
def serving(chart: ChartInstall) -> str:
    return chart.serving[0]


@pytest.fixture(scope="module")
def bare(chart: ChartInstall) -> str:
    """A served namespace without Pod Security enforcement: there the VAP backstop is the only guard
    (PodSecurity admission runs first and would otherwise answer for it)."""
    name = f"t-chart-bare-{secrets.token_hex(3)}"
    chart.serve(name)
    chart.kube.run("label", "namespace", name, "pod-security.kubernetes.io/enforce-")
    return name


def pool(name: str, replicas: int = 1, image: str | None = None, ratio: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    obj = copy.deepcopy(EXAMPLE_POOL)
    obj["metadata"] = {"name": name}
    obj["spec"]["pairs"] = {"replicas": replicas, "prefill": {"instances": ratio[0]}, "decode": {"instances": ratio[1]}}
    if image:
        obj["spec"]["stack"]["image"] = image
    return obj


def apply(kube: Kubectl, namespace: str, obj: dict[str, Any], check: bool = True) -> tuple[int, str]:
    """``kubectl apply``; (exit code, stdout + stderr) so warnings and denials can be read."""
    proc = kube.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(obj), check=check)
    return proc.returncode, proc.stdout + proc.stderr


def delete(kube: Kubectl, namespace: str, *what: str, dry_run: bool = False) -> tuple[int, str]:
    args = ["delete", "-n", namespace, *what, "--wait=false"]
    if dry_run:
        args.append("--dry-run=server")
    proc = kube.run(*args, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def operator_pod_manifest(name: str, **overrides: Any) -> dict[str, Any]:
    """A pod like the ones Tandem creates (its container hardening included); ``overrides`` are merged into
    the container (its securityContext key by key) or the pod spec."""
    container: dict[str, Any] = {
        "name": "engine",
        "image": EXAMPLE_POOL["spec"]["stack"]["image"],
        "securityContext": container_security(),
    }
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container]}
    for key, value in overrides.items():
        if key == "securityContext":
            container[key] = {**container[key], **value}
        else:
            (container if key == "ports" else spec)[key] = value
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


# --- step 3: the render on the real API server ------------------------------------------------------


@pytest.mark.parametrize("values", [MINIMAL_VALUES, FULL_VALUES], ids=["minimal", "full"])
def test_render_accepted_by_server_dry_run(chart: ChartInstall, serving: str, values: Path) -> None:
    """Every rendered object passes the API server's validation, CEL and admission (server dry-run)."""
    text = render_text(
        [values],
        {
            "watchNamespaces": [serving],
            "cache": {"namespace": chart.cache_namespace},
            # prometheus-operator CRDs are not on the local cluster (those objects are checked offline)
            "metrics": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}},
        },
    )
    # Server-side apply: the installed release's objects carry no client-side last-applied annotation.
    args = ["apply", "--server-side", "--force-conflicts", "--field-manager=tandem-test", "--dry-run=server"]
    proc = chart.kube.run(*args, "-f", "-", stdin=text, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # e.g. a PodSecurity `warn=restricted` violation
    assert "deployment.apps/tandem serverside-applied" in proc.stdout
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/tandem-pool-images" in proc.stdout


def test_s_pod_01_operator_pod_admitted_under_restricted(chart: ChartInstall) -> None:
    """The chart's pod template is admitted by PodSecurity `restricted` in tandem-system, and that
    enforcement is live (a privileged variant is refused)."""
    ns = chart.kube.get("namespace", chart.namespace)
    assert ns is not None
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    template = chart.deployment()["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator-probe", **template["metadata"]}}
    pod["spec"] = template["spec"]
    ok = chart.kube.run("create", "-n", chart.namespace, "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    assert "Warning" not in ok.stderr, ok.stderr
    bad = copy.deepcopy(pod)
    bad["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = False
    bad["spec"]["securityContext"]["runAsNonRoot"] = False
    proc = chart.kube.run(
        "create", "-n", chart.namespace, "--dry-run=server", "-f", "-", stdin=json.dumps(bad), check=False
    )
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr


def test_install_refuses_a_namespace_without_restricted(chart: ChartInstall) -> None:
    """The chart checks the release namespace's Pod Security label at install time (lookup)."""
    other = f"t-chart-unlabelled-{secrets.token_hex(3)}"
    ensure_namespace(chart.kube, other, {})
    try:
        proc = chart.helm(
            "install",
            "probe",
            str(REPO / "charts" / "tandem"),
            "--namespace",
            other,
            "--dry-run=server",
            "--values",
            str(chart.values_file()),
            check=False,
        )
        assert proc.returncode != 0
        assert f"namespace {other} must be labelled pod-security.kubernetes.io/enforce=restricted" in proc.stderr
    finally:
        delete_namespaces(chart.kube, [other])


def test_installed_objects(chart: ChartInstall, serving: str, dev_cluster: DevCluster) -> None:
    deploy = chart.deployment()
    assert deploy["spec"]["replicas"] == 0
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"  # the Lease keeps one acting
    sa = chart.kube.get("serviceaccount", "tandem", namespace=chart.namespace)
    assert sa is not None and sa["automountServiceAccountToken"] is False
    for ns in (serving, chart.cache_namespace):
        assert chart.kube.get("rolebinding", "tandem-operator" if ns == serving else "tandem-cache", namespace=ns)
    for crd in CRDS:
        obj = chart.kube.get("crd", crd)
        assert obj is not None and obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # S-NP-02: the API server CIDRs were looked up from the `kubernetes` EndpointSlice at install.
    np = chart.kube.get("networkpolicy", "tandem-operator", namespace=chart.namespace)
    assert np is not None
    slice_ = chart.kube.get("endpointslice", "kubernetes", namespace="default")
    assert slice_ is not None
    want = sorted({f"{a}/32" for ep in slice_["endpoints"] for a in ep["addresses"]})
    assert sorted(p["ipBlock"]["cidr"] for p in np["spec"]["egress"][0]["to"]) == want


def test_s_pod_06_token_authenticates_as_the_operator(chart: ChartInstall) -> None:
    out = chart.sa_kube().json("auth", "whoami")
    assert out["status"]["userInfo"]["username"] == OPERATOR_USER


# --- the admission policies, for real ---------------------------------------------------------------


def test_b20_image_from_unlisted_registry_denied(chart: ChartInstall, serving: str) -> None:
    code, out = apply(chart.kube, serving, pool("unlisted", image=UNLISTED_IMAGE), check=False)
    assert code != 0 and "registry not allowed" in out, out
    cache = copy.deepcopy(EXAMPLE_CACHE)
    cache["spec"]["image"] = UNLISTED_IMAGE
    code, out = apply(chart.kube, serving, cache, check=False)
    assert code != 0 and "registry not allowed" in out, out
    # A look-alike host is not a prefix match: entries are matched as "<entry>/".
    lookalike = EXAMPLE_POOL["spec"]["stack"]["image"].replace("docker.io/vllm/", "docker.io/vllm-evil/")
    code, out = apply(chart.kube, serving, pool("lookalike", image=lookalike), check=False)
    assert code != 0 and "registry not allowed" in out, out
    code, out = apply(chart.kube, serving, pool("listed"))
    assert code == 0, out


def test_b29_ratio_not_in_lowest_terms_warns(chart: ChartInstall, serving: str) -> None:
    code, out = apply(chart.kube, serving, pool("ratio-2-4", replicas=0, ratio=(2, 4)))
    assert code == 0
    assert "Warning" in out and "prefill:decode ratio 2:4 is not in lowest terms" in out, out
    code, out = apply(chart.kube, serving, pool("ratio-1-3", replicas=0, ratio=(1, 3)))
    assert code == 0 and "lowest terms" not in out, out


def test_b28_gc03_serving_pool_delete_needs_the_annotation(chart: ChartInstall, serving: str) -> None:
    apply(chart.kube, serving, pool("guarded", replicas=2))
    code, out = delete(chart.kube, serving, "inferencepools.tandem.dev", "guarded")
    assert code != 0 and "add the annotation" in out, out
    code, out = delete(chart.kube, serving, "inferencepools.tandem.dev", "--all")
    assert code != 0 and "guarded" in out, "kubectl delete --all is checked per object"
    assert chart.kube.get("inferencepools.tandem.dev", "guarded", namespace=serving) is not None
    chart.kube.run("annotate", "-n", serving, "inferencepools.tandem.dev", "guarded", "tandem.dev/confirm-delete=true")
    code, out = delete(chart.kube, serving, "inferencepools.tandem.dev", "guarded")
    assert code == 0, out
    # A pool at zero pairs needs no confirmation.
    apply(chart.kube, serving, pool("idle", replicas=0))
    code, out = delete(chart.kube, serving, "inferencepools.tandem.dev", "idle")
    assert code == 0, out


def test_s_del_01_referenced_cache_delete_needs_the_annotation(chart: ChartInstall, serving: str) -> None:
    cache = copy.deepcopy(EXAMPLE_CACHE)
    cache["metadata"] = {"name": "guarded-cache"}
    apply(chart.kube, serving, cache)
    status = {"status": {"referencedBy": ["speed"]}}
    chart.kube.run(
        "patch",
        "-n",
        serving,
        "mooncakecaches.tandem.dev",
        "guarded-cache",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    code, out = delete(chart.kube, serving, "mooncakecaches.tandem.dev", "guarded-cache")
    assert code != 0 and "is still used by speed" in out, out
    chart.kube.run(
        "annotate", "-n", serving, "mooncakecaches.tandem.dev", "guarded-cache", "tandem.dev/confirm-delete=true"
    )
    code, out = delete(chart.kube, serving, "mooncakecaches.tandem.dev", "guarded-cache")
    assert code == 0, out


def test_s_del_02_crd_delete_denied_without_the_annotation(chart: ChartInstall) -> None:
    for crd in CRDS:
        proc = chart.kube.run("delete", "crd", crd, "--dry-run=server", check=False)
        assert proc.returncode != 0 and "tandem.dev/confirm-delete" in proc.stderr, proc.stderr
        assert chart.kube.get("crd", crd) is not None


@pytest.mark.parametrize(
    "overrides, want",
    [
        pytest.param(
            {"securityContext": {"privileged": True, "allowPrivilegeEscalation": True}},
            "privileged containers",
            id="privileged",
        ),
        pytest.param({"hostNetwork": True}, "hostNetwork", id="hostNetwork"),
        pytest.param({"hostPID": True}, "hostPID and hostIPC are never allowed", id="hostPID"),
        pytest.param({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "hostPath volumes", id="hostPath"),
        pytest.param({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "added capabilities", id="caps"),
        pytest.param({"ports": [{"containerPort": 8000, "hostPort": 8000}]}, "hostPort", id="hostPort"),
    ],
)
def test_s_wl_03_operator_may_not_create_host_level_pods(
    chart: ChartInstall, bare: str, overrides: dict[str, Any], want: str
) -> None:
    """B-25 backstop: a host-level pod created *as the operator's ServiceAccount* is denied by the VAP,
    in a served namespace with no Pod Security enforcement."""
    pod = operator_pod_manifest("backstop", **overrides)
    proc = chart.sa_kube().run("create", "-n", bare, "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "tandem-operator-pods" in proc.stderr and want in proc.stderr, proc.stderr


def test_s_wl_03_scope(chart: ChartInstall, bare: str) -> None:
    """A plain pod by the operator is fine; the cache namespace is covered too (issue 19 class 8: only an
    RDMA store's host network and IPC_LOCK are allowed there); other users are not matched."""
    sa = chart.sa_kube()
    plain = json.dumps(operator_pod_manifest("plain"))
    sa.run("create", "-n", bare, "--dry-run=server", "-f", "-", stdin=plain)
    privileged = json.dumps(
        operator_pod_manifest("rdma", securityContext={"privileged": True, "allowPrivilegeEscalation": True})
    )
    proc = sa.run("create", "-n", chart.cache_namespace, "--dry-run=server", "-f", "-", stdin=privileged, check=False)
    assert proc.returncode != 0 and "privileged containers" in proc.stderr, proc.stderr
    # The backstop matches the operator's identity only: the admin's privileged pod passes it.
    chart.kube.run("create", "-n", bare, "--dry-run=server", "-f", "-", stdin=privileged)


def test_s_del_03_namespace_deletion_completes(chart: ChartInstall) -> None:
    """The delete guard never leaves a namespace stuck Terminating (whatever the controller's identity)."""
    ns = f"t-chart-nsdel-{secrets.token_hex(3)}"
    ensure_namespace(chart.kube, ns, {"pod-security.kubernetes.io/enforce": "baseline"})
    apply(chart.kube, ns, pool("serving-pool", replicas=3))
    chart.kube.run("delete", "namespace", ns, "--wait=false")
    seconds = wait_gone(chart.kube, "namespace", ns, timeout_s=90)
    assert seconds < 90


# --- S-RBAC: the live identity ----------------------------------------------------------------------


def can_i_list(kube: Kubectl, namespace: str) -> str:
    """``kubectl auth can-i --list`` as the operator: header, then rows sorted (stable across runs)."""
    out = kube.run("auth", "can-i", "--list", f"--as={OPERATOR_USER}", "-n", namespace).stdout
    lines = [" ".join(line.split()) for line in out.splitlines() if line.strip()]
    return "\n".join([lines[0], *sorted(set(lines[1:]))]) + "\n"


@pytest.mark.parametrize("which", ["tandem-system", "serving", "default", "kube-system"])
def test_s_rbac_01_golden_can_i_list(chart: ChartInstall, serving: str, which: str) -> None:
    namespace = {"tandem-system": chart.namespace, "serving": serving}.get(which, which)
    got = can_i_list(chart.kube, namespace)
    path = GOLDEN / f"rbac-{which}.txt"
    if UPDATE_GOLDEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        if not UPDATE_GOLDEN:
            pytest.fail(f"{path} did not exist; written now: review and commit it")
    assert got == path.read_text(), f"RBAC changed: review, then regenerate with TANDEM_UPDATE_GOLDEN=1 ({path})"


def can_i(kube: Kubectl, verb: str, resource: str, namespace: str, *extra: str) -> bool:
    proc = kube.run("auth", "can-i", verb, resource, "-n", namespace, *extra, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


def test_s_rbac_03_no_secret_access_anywhere(chart: ChartInstall, serving: str) -> None:
    sa = chart.sa_kube()
    for ns in (chart.namespace, serving, chart.cache_namespace, "default", "kube-system"):
        for verb in ("get", "list", "watch"):
            assert not can_i(sa, verb, "secrets", ns), f"{verb} secrets in {ns}"
    assert not can_i(sa, "list", "secrets", "default", "--all-namespaces")


@pytest.mark.parametrize(
    "verb, resource, subresource",
    [
        ("bind", "clusterroles.rbac.authorization.k8s.io", ""),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", ""),
        ("impersonate", "users", ""),
        ("impersonate", "serviceaccounts", ""),
        ("create", "pods", "exec"),
        ("create", "pods", "attach"),
        ("create", "pods", "portforward"),
        ("patch", "pods", "ephemeralcontainers"),
        ("get", "nodes", "proxy"),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io", ""),
        ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", ""),
        ("delete", "validatingadmissionpolicies.admissionregistration.k8s.io", ""),
        ("create", "rolebindings.rbac.authorization.k8s.io", ""),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
        ("patch", "roles.rbac.authorization.k8s.io", ""),
        ("create", "serviceaccounts", ""),
        ("create", "serviceaccounts", "token"),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io", ""),
        ("create", "namespaces", ""),
        ("deletecollection", "pods", ""),
        ("watch", "namespaces", ""),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ],
)
def test_s_rbac_04_no_escalation_paths(
    chart: ChartInstall, serving: str, verb: str, resource: str, subresource: str
) -> None:
    sa = chart.sa_kube()
    extra = [f"--subresource={subresource}"] if subresource else []
    for ns in (serving, chart.namespace):
        assert not can_i(sa, verb, resource, ns, *extra), f"{verb} {resource}/{subresource} in {ns}"


def test_can_i_sees_subresources(chart: ChartInstall, serving: str) -> None:
    """Control for the checks above: a subresource the operator does have is reported as such."""
    assert can_i(chart.sa_kube(), "update", "inferencepools.tandem.dev", serving, "--subresource=status")


def test_s_rbac_05_workload_creation_confined(chart: ChartInstall, serving: str) -> None:
    sa = chart.sa_kube()
    assert can_i(sa, "create", "pods", serving)
    assert can_i(sa, "create", "pods", chart.cache_namespace)
    assert can_i(sa, "create", "jobs.batch", serving)
    assert not can_i(sa, "create", "jobs.batch", chart.cache_namespace)
    for ns in ("default", "kube-system", chart.namespace):
        for verb, resource in (("create", "pods"), ("create", "jobs.batch"), ("create", "services")):
            assert not can_i(sa, verb, resource, ns), f"{verb} {resource} in {ns}"
    assert can_i(sa, "list", "nodes", "default")
    assert not can_i(sa, "patch", "nodes", "default")


def test_s_rbac_06_dedicated_identity(chart: ChartInstall) -> None:
    bindings = chart.kube.json("get", "rolebindings,clusterrolebindings", "-A")["items"]
    ours = [
        b
        for b in bindings
        if any(s.get("kind") == "ServiceAccount" and s.get("name") == "tandem" for s in b.get("subjects") or [])
    ]
    assert ours
    for b in ours:
        assert b["roleRef"]["name"].startswith("tandem-"), b["roleRef"]
        assert b["roleRef"]["name"] not in ("cluster-admin", "admin", "edit")


# --- upgrade, CRD upgrade, uninstall (keep these last: they rewrite the release) ---------------------


def snapshot(chart: ChartInstall, serving: str) -> dict[str, str]:
    """resourceVersion of every object the release owns, plus the pools (their children's owner)."""
    manifest = chart.helm("get", "manifest", chart.release, "-n", chart.namespace).stdout
    out = {}
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        meta = doc["metadata"]
        obj = chart.kube.get(doc["kind"], meta["name"], namespace=meta.get("namespace"))
        assert obj is not None, f"{doc['kind']}/{meta['name']} missing"
        out[f"{doc['kind']}/{meta.get('namespace', '')}/{meta['name']}"] = obj["metadata"]["resourceVersion"]
    for p in chart.kube.json("get", "inferencepools.tandem.dev", "-n", serving)["items"]:
        out[f"InferencePool/{serving}/{p['metadata']['name']}"] = p["metadata"]["resourceVersion"]
    return out


def test_up01_upgrade_with_unchanged_values_changes_nothing(chart: ChartInstall, serving: str) -> None:
    apply(chart.kube, serving, pool("steady", replicas=1))
    before = snapshot(chart, serving)
    revision = chart.deployment()["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
    chart.upgrade()
    after = snapshot(chart, serving)
    changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    assert not changed, f"an unchanged upgrade wrote: {changed}"
    deploy = chart.deployment()
    assert deploy["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == revision
    assert deploy["metadata"]["generation"] == deploy["status"]["observedGeneration"]


def test_crd_upgrade_procedure_server_side_then_helm(chart: ChartInstall, serving: str) -> None:
    """The README's CRD upgrade: server-side apply of files/crds with Helm's field manager, then upgrade."""
    crd_dir = REPO / "charts" / "tandem" / "files" / "crds"
    chart.kube.run("apply", "--server-side", "--force-conflicts", "--field-manager=helm", "-f", str(crd_dir))
    chart.upgrade()
    for crd in CRDS:
        obj = chart.kube.get("crd", crd)
        assert obj is not None
        assert obj["metadata"]["annotations"]["meta.helm.sh/release-name"] == chart.release
    assert chart.kube.get("inferencepools.tandem.dev", "steady", namespace=serving) is not None


def test_up04_uninstall_keeps_crds_and_pools_then_reinstall_adopts(chart: ChartInstall, serving: str) -> None:
    steady = chart.kube.get("inferencepools.tandem.dev", "steady", namespace=serving)
    assert steady is not None
    # A child the way Tandem makes them (owner reference to the pool): garbage collection must not fire.
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "steady-routing",
            "labels": {"tandem.dev/pool": "steady"},
            "ownerReferences": [
                {
                    "apiVersion": "tandem.dev/v1alpha1",
                    "kind": "InferencePool",
                    "name": "steady",
                    "uid": steady["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"routing.json": "{}"},
    }
    apply(chart.kube, serving, child)
    child_uid = chart.kube.get("configmap", "steady-routing", namespace=serving)["metadata"]["uid"]  # type: ignore[index]

    chart.uninstall()
    assert chart.kube.get("deployment", chart.release, namespace=chart.namespace) is None
    assert chart.kube.get("validatingadmissionpolicy", "tandem-pool-delete") is None
    for crd in CRDS:
        assert chart.kube.get("crd", crd) is not None, f"{crd} deleted by helm uninstall"
    again = chart.kube.get("inferencepools.tandem.dev", "steady", namespace=serving)
    assert again is not None and again["metadata"]["uid"] == steady["metadata"]["uid"]
    kept = chart.kube.get("configmap", "steady-routing", namespace=serving)
    assert kept is not None and kept["metadata"]["uid"] == child_uid

    chart.install()  # reinstall adopts the kept CRDs; the pool and its child are untouched
    after = chart.kube.get("inferencepools.tandem.dev", "steady", namespace=serving)
    assert after is not None and after["metadata"]["uid"] == steady["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == steady["metadata"]["resourceVersion"]
    assert chart.kube.get("configmap", "steady-routing", namespace=serving)["metadata"]["uid"] == child_uid  # type: ignore[index]
    assert chart.sa_kube().json("auth", "whoami")["status"]["userInfo"]["username"] == OPERATOR_USER
