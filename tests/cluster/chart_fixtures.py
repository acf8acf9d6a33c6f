"""Installing the Tandem chart on the local cluster, for tests that need the real install and its identity.

What it owns: ``install_chart`` (``helm upgrade --install`` of ``charts/tandem`` into ``tandem-system``,
labelled Pod Security *restricted*, with the operator Deployment at ``replicas: 0``: KWOK runs no real
container, so the operator under test runs on the host with this install's ServiceAccount), the
``ChartInstall`` handle (Helm and kubectl bound to the cluster, the ServiceAccount kubeconfig from the
TokenRequest API, ``serve`` to add a namespace, ``uninstall``), and two fixtures:

- ``tandem_chart`` (module scope): the chart installed with one serving namespace of its own; uninstalled
  at the end of the module (the CRDs stay, as ``helm.sh/resource-policy: keep`` promises);
- ``chart_ns`` (function scope): a fresh serving namespace (PSA ``enforce=baseline``) added to the
  install's ``watchNamespaces``, so the ServiceAccount has its RoleBinding there; deleted afterwards.

Use them from another module by importing them (pytest then registers them there)::

    from tests.cluster.chart_fixtures import ChartInstall, chart_ns, tandem_chart  # noqa: F401

    def test_pool_ready_with_chart_rbac(tandem_chart: ChartInstall, chart_ns: str) -> None:
        kubeconfig = tandem_chart.sa_kubeconfig          # authenticates as tandem-system:tandem
        ...  # run the operator with it against chart_ns

What it must not do: touch ``~/.kube/config`` (every call names its kubeconfig), or leave admission
policies behind after its module (they would deny other modules' pool deletions).

Invariants: the release is the chart as shipped plus test values (``TEST_VALUES``): replicas 0, a fake
digest, the example images' registries on the allow-list, no router (``extra_values`` turns it on).
Everything cluster-scoped it creates is named ``tandem-*`` and removed by ``uninstall`` except the kept CRDs.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tandem_lab.dev import cluster as devcluster
from tandem_lab.dev.kube import Kubectl
from tests.chart.chartlib import CHART, RELEASE, RELEASE_NAMESPACE, TEST_DIGEST, run_helm

if TYPE_CHECKING:
    from conftest import DevCluster

SERVICE_ACCOUNT = "tandem"
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
BASELINE = {"pod-security.kubernetes.io/enforce": "baseline"}
# The chart as shipped, except: no real container runs on KWOK (replicas 0), a fake digest, the
# registries of examples/ on the allow-list, and the router off (its install has its own module,
# test_router_chart.py, so the operator-identity modules keep their footprint and their `--wait` does not
# depend on router pods). NetworkPolicy API server CIDRs are looked up (install time).
TEST_VALUES: dict[str, Any] = {
    "replicaCount": 0,
    "image": {"digest": TEST_DIGEST},
    "admissionPolicies": {"imageRegistries": {"allowed": ["docker.io/vllm", "docker.io/rocm", "ghcr.io/example"]}},
    "router": {"enabled": False},
}


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def ensure_namespace(kube: Kubectl, name: str, labels: Mapping[str, str]) -> None:
    """Create (or relabel) a namespace and wait for its default ServiceAccount."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}})
    kube.wait_for(
        f"ServiceAccount {name}/default",
        lambda: kube.get("serviceaccount", "default", namespace=name) is not None,
        timeout_s=30,
    )


@dataclass
class ChartInstall:
    """One release of the chart on the local cluster."""

    kube: Kubectl
    cluster_state: devcluster.ClusterState
    serving: list[str]
    cache_namespace: str = ""
    extra_values: dict[str, Any] = field(default_factory=dict)
    release: str = RELEASE
    namespace: str = RELEASE_NAMESPACE
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tandem-chart-")))
    sa_kubeconfig: Path | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.kube.kubeconfig

    @property
    def values(self) -> dict[str, Any]:
        values = _merge(TEST_VALUES, {"watchNamespaces": list(self.serving)})
        if self.cache_namespace:
            values = _merge(values, {"cache": {"namespace": self.cache_namespace}})
        return _merge(values, self.extra_values)

    def values_file(self) -> Path:
        path = self.workdir / "values.json"
        path.write_text(json.dumps(self.values, indent=2))
        return path

    def helm(self, *args: str, check: bool = True, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
        return run_helm(*args, "--kubeconfig", str(self.kubeconfig), check=check, timeout_s=timeout_s)

    def upgrade(self, *extra_args: str) -> subprocess.CompletedProcess[str]:
        """``helm upgrade --install`` with the current values; ``--take-ownership`` adopts CRDs that
        an earlier test applied with kubectl (they would otherwise block the install)."""
        return self.helm(
            "upgrade",
            "--install",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            "--values",
            str(self.values_file()),
            "--take-ownership",
            "--wait",
            "--timeout",
            "120s",
            *extra_args,
        )

    def install(self) -> ChartInstall:
        ensure_namespace(self.kube, self.namespace, RESTRICTED)
        for ns in self.serving:
            ensure_namespace(self.kube, ns, BASELINE)
        if self.cache_namespace:
            ensure_namespace(self.kube, self.cache_namespace, {"pod-security.kubernetes.io/enforce": "privileged"})
        self.upgrade()
        self.refresh_sa_kubeconfig()
        self.wait_policies_active()
        return self

    def wait_policies_active(self, timeout_s: float = 30.0) -> None:
        """New ValidatingAdmissionPolicies take a moment to reach the API server's admission chain: wait
        until a pool with an unlisted image is refused (server dry-run, nothing is stored)."""
        if not self.values["admissionPolicies"].get("imageRegistries", {}).get("enabled", True):
            return
        probe = json.dumps(
            {
                "apiVersion": "tandem.dev/v1alpha1",
                "kind": "InferencePool",
                "metadata": {"name": "policy-probe"},
                "spec": {
                    "model": {"servedName": "probe", "source": "hf://probe/probe", "quantization": "bf16"},
                    "stack": {"version": "probe", "image": "policy-probe.invalid/x@sha256:" + "0" * 64},
                },
            }
        )

        def refused() -> bool:
            proc = self.kube.run(
                "create", "-n", self.serving[0], "--dry-run=server", "-f", "-", stdin=probe, check=False
            )
            return proc.returncode != 0 and "registry not allowed" in proc.stderr

        self.kube.wait_for("the chart's admission policies to be active", refused, timeout_s=timeout_s)

    def serve(self, namespace: str) -> None:
        """Add a serving namespace (created, PSA baseline) to watchNamespaces: one more RoleBinding."""
        ensure_namespace(self.kube, namespace, BASELINE)
        if namespace not in self.serving:
            self.serving.append(namespace)
            self.upgrade()

    def unserve(self, namespace: str) -> None:
        if namespace in self.serving and len(self.serving) > 1:
            self.serving.remove(namespace)
            self.upgrade()

    def refresh_sa_kubeconfig(self) -> Path:
        """A kubeconfig authenticating as the chart's ServiceAccount (a new token: after a reinstall
        the ServiceAccount has a new UID and old tokens are invalid)."""
        self.sa_kubeconfig = devcluster.serviceaccount_kubeconfig(
            self.cluster_state,
            self.namespace,
            SERVICE_ACCOUNT,
            path=self.workdir / "sa.kubeconfig",
            duration="2h",
        )
        return self.sa_kubeconfig

    def sa_kube(self) -> Kubectl:
        assert self.sa_kubeconfig is not None, "install() first"
        return Kubectl(self.kube.binary, self.sa_kubeconfig, timeout_s=self.kube.timeout_s)

    def uninstall(self) -> None:
        self.helm("uninstall", self.release, "--namespace", self.namespace, "--wait", "--timeout", "120s", check=False)

    def deployment(self) -> dict[str, Any]:
        deploy = self.kube.get("deployment", self.release, namespace=self.namespace)
        assert deploy is not None
        return deploy


def install_chart(
    cluster: DevCluster,
    serving: Sequence[str],
    cache_namespace: str = "",
    extra_values: Mapping[str, Any] | None = None,
) -> ChartInstall:
    """Install (or upgrade to) the chart with ``serving`` namespaces; returns the handle."""
    return ChartInstall(
        kube=cluster.kube,
        cluster_state=cluster.state,
        serving=list(serving),
        cache_namespace=cache_namespace,
        extra_values=dict(extra_values or {}),
    ).install()


def delete_namespaces(kube: Kubectl, names: Sequence[str]) -> None:
    for name in names:
        kube.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def wait_gone(kube: Kubectl, kind: str, name: str, namespace: str | None = None, timeout_s: float = 90.0) -> float:
    """Seconds until the object is gone (``TimeoutError`` otherwise)."""
    start = time.monotonic()
    kube.wait_for(f"{kind} {name} gone", lambda: kube.get(kind, name, namespace=namespace) is None, timeout_s=timeout_s)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def tandem_chart(dev_cluster: DevCluster) -> Iterator[ChartInstall]:
    """The chart installed for this module (one serving namespace of its own); uninstalled afterwards."""
    serving = f"t-chart-{secrets.token_hex(3)}"
    install = install_chart(dev_cluster, [serving])
    try:
        yield install
    finally:
        install.uninstall()
        delete_namespaces(dev_cluster.kube, install.serving)


@pytest.fixture
def chart_ns(tandem_chart: ChartInstall, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace the installed operator serves (RoleBinding in place); deleted afterwards."""
    name = f"t-serve-{secrets.token_hex(3)}"
    tandem_chart.serve(name)
    try:
        yield name
    finally:
        delete_namespaces(tandem_chart.kube, [name])
        if name in tandem_chart.serving:
            tandem_chart.serving.remove(name)  # the next upgrade drops its RoleBinding from the release
