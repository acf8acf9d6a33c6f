"""Cluster fixtures (a pytest plugin, loaded by the root conftest): one real local control plane per
test session, one namespace per test. Used by the contract, cluster, fault and scale tiers.

What it owns:

- ``dev_cluster`` (session): reuses the cluster whose kubeconfig is ``$TANDEM_KUBECONFIG`` (its
  ``state.json`` is read from beside the kubeconfig when it was made by ``tandem dev cluster up``),
  otherwise starts ``pytest-<hex>`` (4 × MI325X over zone-a/zone-b, Prometheus scraping every 1 s)
  and tears it down at the end of the session;
- ``ns`` (function): a fresh namespace labelled ``pod-security.kubernetes.io/enforce=baseline``,
  deleted afterwards;
- ``prometheus`` / ``prometheus_url`` / ``scrape_target``: the session's Prometheus and a way to
  register loopback scrape targets (file_sd) that are unregistered after the test;
- ``audit_log``: the API server audit log path;
- on a failed test: ``kubectl get all,events -A``, the nodes and the last audit writes are attached to
  the report and written to ``.logs/cluster-tests/<test>.txt``.

Invariants: a missing binary or a control plane that fails to start is a test *error* with the fix in
the message (``make testenv``), never a skip, with or without ``CI`` (testing.md §1). Deselect the tier
explicitly with ``-m "not cluster"``. The session's cluster and Prometheus die with the pytest process,
however it dies (``cluster.up(die_with_caller=True)``: a guard runs ``tandem dev cluster down``); whatever
that teardown leaves, the next session reaps (clusters named ``pytest-*`` whose owner PID is gone).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tandem_lab.dev import audit
from tandem_lab.dev import cluster as devcluster
from tandem_lab.dev.kube import Kubectl, KubectlError
from tandem_lab.dev.prometheus import PrometheusServer
from tandem_lab.dev.testenv import CLUSTER_BINARIES, TestenvError, Toolchain, locate
from tests.support.tandem_cluster import GpuNodes, OperatorProcess, install_crds

REPO = Path(__file__).resolve().parents[2]
FAILURE_DIR = REPO / ".logs" / "cluster-tests"
REUSE_ENV = "TANDEM_KUBECONFIG"
SESSION_NODES = 4
SESSION_ZONES = ("zone-a", "zone-b")
SESSION_SCRAPE_INTERVAL_S = 1.0

# The running cluster, for the failure hook (hooks cannot request fixtures).
_ACTIVE: dict[str, DevCluster] = {}


@dataclass
class DevCluster:
    """The cluster under test, as the tests see it."""

    state: devcluster.ClusterState  # synthetic (no Prometheus, no audit log) for a foreign cluster
    kube: Kubectl
    toolchain: Toolchain
    reused: bool
    state_root: Path | None  # where state.json lives (for `tandem dev cluster status`), None if foreign

    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def has_state(self) -> bool:
        return self.state_root is not None


def _fail(message: str) -> NoReturn:
    pytest.fail(
        message
        + (
            ""
            if os.environ.get("CI")
            else "\n(locally: run `make testenv`, or deselect the tier explicitly with -m 'not cluster')"
        ),
        pytrace=False,
    )


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    return locate()


@pytest.fixture(scope="session")
def dev_cluster(toolchain: Toolchain) -> Iterator[DevCluster]:
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        cluster = _reuse(Path(reuse).expanduser().resolve(), toolchain)
        _ACTIVE["cluster"] = cluster
        yield cluster
        _ACTIVE.clear()
        return

    try:
        toolchain.require((*CLUSTER_BINARIES, "prometheus"))
    except TestenvError as exc:
        _fail(str(exc))
    devcluster.reap_stale()
    name = f"pytest-{secrets.token_hex(3)}"
    options = devcluster.ClusterOptions(
        name=name,
        nodes=SESSION_NODES,
        zones=SESSION_ZONES,
        scrape_interval_s=SESSION_SCRAPE_INTERVAL_S,
    )
    try:
        # Bound to this session: a pytest killed even by SIGKILL takes its control plane and Prometheus along.
        state = devcluster.up(options, toolchain=toolchain, owner_pid=os.getpid(), die_with_caller=True)
    except (devcluster.ClusterError, TestenvError) as exc:
        _fail(f"the local control plane did not start: {exc}")
    cluster = DevCluster(
        state=state,
        kube=state.kube(),
        toolchain=toolchain,
        reused=False,
        state_root=devcluster.state_root(),
    )
    _ACTIVE["cluster"] = cluster
    try:
        yield cluster
    finally:
        _ACTIVE.clear()
        devcluster.down(name, toolchain=toolchain)


def _reuse(kubeconfig: Path, toolchain: Toolchain) -> DevCluster:
    if not kubeconfig.is_file():
        _fail(f"{REUSE_ENV}={kubeconfig} does not exist")
    try:
        toolchain.require(("kubectl",))
    except TestenvError as exc:
        _fail(str(exc))
    state_file = kubeconfig.parent / devcluster.STATE_FILE
    state: devcluster.ClusterState | None = None
    root: Path | None = None
    if state_file.is_file():
        state = devcluster.ClusterState.load(state_file)
        if Path(state.kubeconfig).resolve() == kubeconfig:
            root = Path(state.state_dir).parent
        else:
            state = None
    if state is None:
        state = devcluster.ClusterState(
            name="external",
            state_dir=str(kubeconfig.parent),
            kubeconfig=str(kubeconfig),
            kwok_workdir="",
            cluster_dir="",
            audit_log="",
            kubectl=str(toolchain.kubectl),
            kwokctl=str(toolchain.kwokctl),
        )
    kube = Kubectl(toolchain.kubectl, kubeconfig)
    if kube.run("get", "--raw=/readyz", check=False, timeout_s=15).returncode != 0:
        _fail(f"the cluster of {REUSE_ENV}={kubeconfig} is not ready (/readyz failed)")
    return DevCluster(state=state, kube=kube, toolchain=toolchain, reused=True, state_root=root)


@pytest.fixture
def kube(dev_cluster: DevCluster) -> Kubectl:
    return dev_cluster.kube


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-") or "t"


@pytest.fixture
def ns(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (PSA enforce=baseline) with its default ServiceAccount; deleted afterwards."""
    name = f"t-{_slug(request.node.name, 40)}-{secrets.token_hex(3)}"
    kube = dev_cluster.kube
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline", "tandem.dev/test": "true"},
            },
        }
    )
    # Pods are refused until the controller manager has made the namespace's default ServiceAccount.
    kube.wait_for(
        f"ServiceAccount {name}/default",
        lambda: kube.get("serviceaccount", "default", namespace=name) is not None,
        timeout_s=30,
    )
    yield name
    # The operator is gone by now: release its finalizers so the namespace can actually go away.
    for kind in ("inferencepools.tandem.dev", "mooncakecaches.tandem.dev"):
        out = kube.run("get", kind, "-n", name, "-o", "name", check=False).stdout.split()
        for obj in out:
            kube.run("patch", obj, "-n", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    kube.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def prometheus(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """The cluster's Prometheus; for a foreign cluster without one, a session Prometheus of our own."""
    server = dev_cluster.state.prometheus_server()
    if server is not None and server.is_ready():
        yield server
        return
    try:
        dev_cluster.toolchain.require(("prometheus",))
    except TestenvError as exc:
        _fail(str(exc))
    own = PrometheusServer(
        binary=dev_cluster.toolchain.prometheus,
        state_dir=tmp_path_factory.mktemp("prometheus"),
        scrape_interval_s=SESSION_SCRAPE_INTERVAL_S,
        die_with_parent=True,
    )
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def prometheus_url(prometheus: PrometheusServer) -> str:
    return prometheus.url


ScrapeTarget = Callable[..., str]


@pytest.fixture
def scrape_target(prometheus: PrometheusServer, request: pytest.FixtureRequest) -> Iterator[ScrapeTarget]:
    """``register(targets, labels=None) -> name``: add loopback targets via file_sd for this test only."""
    names: list[str] = []

    def register(targets: Sequence[str], labels: Mapping[str, str] | None = None) -> str:
        name = f"{_slug(request.node.name, 40)}-{secrets.token_hex(3)}"
        prometheus.add_target(name, targets, labels)
        names.append(name)
        return name

    yield register
    for name in names:
        prometheus.remove_target(name)


@pytest.fixture
def audit_log(dev_cluster: DevCluster) -> Path:
    """The API server's audit log (Metadata level)."""
    if not dev_cluster.state.audit_log:
        _fail(f"the reused cluster ({REUSE_ENV}) was not made by `tandem dev cluster up`: no known audit log")
    return Path(dev_cluster.state.audit_log)


# --- failure artifacts -----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    active = _ACTIVE.get("cluster")
    if report.failed and report.when in ("setup", "call") and active is not None:
        text = _diagnostics(active)
        report.sections.append(("cluster state at failure", text))
        FAILURE_DIR.mkdir(parents=True, exist_ok=True)
        path = FAILURE_DIR / f"{_slug(item.nodeid, 150)}.txt"
        path.write_text(f"# {item.nodeid}\n{text}")
    return report


def _diagnostics(cluster: DevCluster) -> str:
    parts = []
    for args in (("get", "all,events", "-A", "-o", "wide"), ("get", "nodes", "-o", "wide")):
        try:
            out = cluster.kube.run(*args, timeout_s=20).stdout
        except KubectlError as exc:
            out = str(exc)
        parts.append(f"$ kubectl {' '.join(args)}\n{out}")
    if cluster.state.audit_log and Path(cluster.state.audit_log).is_file():
        since = time.time() - 300
        writes = [
            ev
            for ev in audit.iter_events(Path(cluster.state.audit_log))
            if ev.is_write and ev.timestamp.timestamp() >= since
        ][-40:]
        lines = [
            json.dumps(
                {
                    "t": ev.timestamp.isoformat(),
                    "user": ev.user,
                    "verb": ev.verb,
                    "res": ev.resource,
                    "ns": ev.namespace,
                    "name": ev.name,
                    "code": ev.code,
                }
            )
            for ev in writes
        ]
        parts.append(f"# last audit writes ({cluster.state.audit_log})\n" + "\n".join(lines))
    return "\n\n".join(parts)


# --- Tandem on the cluster ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def crds(dev_cluster: DevCluster) -> Kubectl:
    """Tandem's CRDs installed (server-side apply of the committed crds/)."""
    install_crds(dev_cluster.kube)
    return dev_cluster.kube


@pytest.fixture
def gpu_nodes(dev_cluster: DevCluster) -> Iterator[GpuNodes]:
    """Simulated MI325X nodes that belong to this test only (select them with ``.selector``)."""
    nodes = GpuNodes(dev_cluster.kube)
    yield nodes
    nodes.cleanup()


@pytest.fixture
def operator_factory(
    dev_cluster: DevCluster, crds: Kubectl, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """``start(namespaces, kubeconfig=None, **kw) -> OperatorProcess``; every one is stopped after the test."""
    started: list[OperatorProcess] = []

    def start(namespaces: Sequence[str], kubeconfig: Path | None = None, **kwargs: Any) -> OperatorProcess:
        op = OperatorProcess(
            kubeconfig=kubeconfig or dev_cluster.kubeconfig,
            namespaces=list(namespaces),
            name=f"{_slug(request.node.name, 60)}-{len(started)}",
            **kwargs,
        )
        started.append(op)
        return op.start()

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def operator_identity(dev_cluster: DevCluster, crds: Kubectl, ns: str) -> Iterator[tuple[Path, str]]:
    """(kubeconfig, username) of a least-privilege ServiceAccount for the operator in ``ns``."""
    from tests.support import rbac  # noqa: PLC0415

    yield rbac.operator_identity(dev_cluster.kube, dev_cluster.state, ns)
    rbac.drop_identity(dev_cluster.kube, ns)


@pytest.fixture
def live_metrics(crds: Kubectl, ns: str, prometheus: PrometheusServer) -> Iterator[Any]:
    """The test exporter mirroring this namespace's engine pods, scraped by the session's Prometheus.

    Yields the `Exporter`: script per-revision behaviour with ``set_revision(rev, ...)``.
    """
    from tandem_lab.dev.exporter import Behaviour, Exporter  # noqa: PLC0415
    from tandem_lab.dev.podmetrics import PodMetricsBridge  # noqa: PLC0415

    exporter = Exporter(seed=7, tick_s=0.25, default=Behaviour(request_rate=20.0))
    exporter.start()
    bridge = PodMetricsBridge(crds, [ns], exporter, prometheus, prefix=f"live-{ns}")
    bridge.start()
    try:
        yield exporter
    finally:
        bridge.stop()
        exporter.stop()
