"""The two pieces every local-cluster user needs: the operator as a child process and a group of GPU nodes.

Why one module: the cluster tests, the fault and scale tests, the controller benchmark and the demo each
start ``tandem run`` and create KWOK GPU nodes of their own. Three copies had drifted (liveness timeouts,
log handling, whether SIGTERM escalated to SIGKILL, how a node group waits for schedulable nodes). They now
share :class:`OperatorProcess` and :class:`NodeGroup`; callers differ only in arguments (node label,
name prefix, identity, extra flags).

What it owns: spawning, liveness, stopping and killing the operator process, with its log in one file per
process (appended across restarts); creating, awaiting (Ready *and* without the not-ready taint, so the
scheduler can use them), removing and deleting the nodes of one group.

What it must not do: know any test, benchmark or demo scenario; the nodes' manifests come from
:mod:`tandem_lab.dev.nodes`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.lifetime import bind_to_this_process
from tandem_lab.dev.nodes import NodeSpec, add_nodes, delete_node
from tandem_lab.dev.ports import free_port

# Loopback pod CIDRs: one /24 per node from 127.64.0.0 up (127.0.0.0/16, where the control plane listens,
# is never used). Linux routes all of 127.0.0.0/8 to `lo`, so a local process can listen on any pod address.
_LOOPBACK_CIDRS = itertools.count()
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def next_loopback_cidr() -> str:
    """A fresh 127.x.y.0/24 for one node's pods (unique within this process)."""
    n = next(_LOOPBACK_CIDRS)
    return f"127.{64 + n // 256}.{n % 256}.0/24"


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM a child still running, SIGKILL it after ``timeout_s``, and reap it."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def node_schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready taint (the scheduler may use it)."""
    tainted = any(t.get("key") == NOT_READY_TAINT for t in node.get("spec", {}).get("taints") or [])
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions") or []
    )
    return ready and not tainted


@dataclass
class OperatorProcess:
    """``tandem run`` as a child process: its own ports, its log file, SIGTERM/SIGKILL-able, restartable.

    ``identity`` becomes ``TANDEM_LEADER_IDENTITY`` (the same across restarts, like a pod name: a restarted
    operator takes its own Lease back at once; two different ones never act together). ``prometheus_url``
    and ``scrape_interval_s`` are passed when set; ``extra_args`` go last. ``die_with_parent``: the operator
    gets SIGTERM when the process that started it dies, even by SIGKILL (``lifetime.bind_to_this_process``;
    start it from the thread that lives as long as the caller, e.g. the main thread).
    """

    kubeconfig: Path
    namespaces: list[str]
    log_path: Path
    identity: str = ""
    prometheus_url: str = ""
    scrape_interval_s: float | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    die_with_parent: bool = False
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    liveness_port: int = 0
    starts: int = 0

    def command(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "tandem.cli",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-port={self.metrics_port}",
            "--metrics-address=127.0.0.1",
            f"--liveness-port={self.liveness_port}",
            *[f"--namespace={ns}" for ns in self.namespaces],
        ]
        if self.scrape_interval_s is not None:
            args.append(f"--scrape-interval={self.scrape_interval_s:g}")
        if self.prometheus_url:
            args.append(f"--prometheus-url={self.prometheus_url}")
        return [*args, *self.extra_args]

    def start(self, timeout_s: float = 90.0, settle_s: float = 0.0) -> OperatorProcess:
        """Spawn and wait until its liveness port accepts (it fails at once if the process exits)."""
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if self.identity:
            env["TANDEM_LEADER_IDENTITY"] = self.identity
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if self.starts else "wb") as log:
            log.write(f"\n=== start {self.starts} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                preexec_fn=bind_to_this_process() if self.die_with_parent else None,  # noqa: PLW1509
            )
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while not self.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"operator not live after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        if settle_s:
            time.sleep(settle_s)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def alive(self) -> bool:
        """Its liveness port accepts a connection; raises if the process has exited (with its log's tail)."""
        if not self.running():
            raise RuntimeError(f"the operator exited early; see {self.log_path}:\n{self.logs()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.liveness_port), timeout=1):
            return True
        return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a crashed pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 45.0) -> float:
        """SIGTERM, escalated to SIGKILL after ``timeout_s``; returns the seconds it took to exit."""
        started = time.monotonic()
        terminate(self.proc, timeout_s)
        return time.monotonic() - started

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics_text(self) -> str:
        """The operator's own ``/metrics`` exposition."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class NodeGroup:
    """Simulated MI325X nodes that belong to one user, labelled ``<label>=<group>``; pools select them with
    ``selector``, so they never compete with another test's or run's leftovers."""

    kube: Kubectl
    label: str
    group: str = field(default_factory=lambda: secrets.token_hex(3))
    prefix: str = "n"
    wait_s: float | None = None
    """How long ``add`` waits for schedulable nodes by default (None: 60 s plus one per node)."""
    names: list[str] = field(default_factory=list)

    @property
    def selector(self) -> dict[str, str]:
        return {self.label: self.group}

    def add(
        self,
        count: int,
        *,
        gpus: int = 8,
        zones: tuple[str, ...] = ("zone-a", "zone-b"),
        loopback_pods: bool = False,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Create ``count`` nodes and wait until all of the group's nodes are schedulable.

        ``loopback_pods``: each node gets a loopback pod CIDR (``next_loopback_cidr``), so the addresses KWOK
        gives its pods can be served by local processes (engine doubles).
        """
        specs = []
        for i in range(len(self.names), len(self.names) + count):
            zone = zones[i % len(zones)]
            specs.append(
                NodeSpec(
                    name=f"{self.prefix}{self.group}-{i}",
                    gpus=gpus,
                    zone=zone,
                    rack=f"{zone}-rack-{i // 4}",
                    extra_labels=((self.label, self.group),),
                    pod_cidr=next_loopback_cidr() if loopback_pods else "",
                )
            )
        for start in range(0, len(specs), 100):  # one kubectl call per 100 nodes keeps each request small
            add_nodes(self.kube, specs[start : start + 100])
        self.names.extend(s.name for s in specs)
        wait_s = timeout_s if timeout_s is not None else self.wait_s if self.wait_s is not None else 60.0 + count
        deadline = time.monotonic() + wait_s
        while (ready := self.schedulable_count()) < len(self.names):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nodes of group {self.group}: {ready}/{len(self.names)} Ready and untainted after {wait_s:.0f} s"
                )
            time.sleep(0.5)
        return [s.name for s in specs]

    def items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.json("get", "nodes", "-l", f"{self.label}={self.group}")["items"]
        return items

    def schedulable_count(self) -> int:
        return sum(node_schedulable(node) for node in self.items())

    def remove(self, name: str) -> None:
        delete_node(self.kube, name, wait=False)
        if name in self.names:
            self.names.remove(name)

    def delete(self, wait: bool = False) -> None:
        """Delete every node of the group (``wait``: until they are gone)."""
        if self.names:
            self.kube.run(
                "delete", "nodes", "-l", f"{self.label}={self.group}", f"--wait={str(wait).lower()}", timeout_s=180
            )
            self.names = []


ROUTER_SERVICE = "tandem-router"
METRICS_PORT_NAME = "metrics"


def host_address() -> str:
    """This machine's first non-loopback IPv4 address (the route to a public address; nothing is sent)."""
    for probe in ("10.255.255.255", "192.0.2.255", "198.51.100.1"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((probe, 9))
            address = str(sock.getsockname()[0])
            if not address.startswith("127."):
                return address
    raise AssertionError("no non-loopback IPv4 address: an EndpointSlice cannot name a loopback router")


def router_endpoint_slice(namespace: str, address: str, metrics_port: int) -> dict[str, Any]:
    """One EndpointSlice for the router Service ``tandem-router`` with one endpoint (the local router)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{ROUTER_SERVICE}-local",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": ROUTER_SERVICE,
                "endpointslice.kubernetes.io/managed-by": "lab.tandem.dev",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": METRICS_PORT_NAME, "port": metrics_port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }


@dataclass
class RouterProcess:
    """``tandem router`` watching one namespace's routing tables, as a child process.

    Requests on ``127.0.0.1:<port>``; the health/metrics listener on ``metrics_host`` (a cluster test puts it
    on an address an EndpointSlice accepts, so the operator's drain loop can ask it for open streams). Used
    by the demo (its traffic goes through this router) and the cluster tests. ``die_with_parent`` as for
    :class:`OperatorProcess`.
    """

    kubeconfig: Path
    namespace: str
    log_path: Path
    metrics_host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    cwd: Path | None = None
    die_with_parent: bool = False
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> RouterProcess:
        self.port = free_port()
        self.metrics_port = free_port()
        args = [
            sys.executable,
            "-m",
            "tandem.cli",
            "router",
            f"--namespace={self.namespace}",
            f"--kubeconfig={self.kubeconfig}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--metrics-host={self.metrics_host}",
            f"--metrics-port={self.metrics_port}",
            *self.extra_args,
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=self.cwd,
                preexec_fn=bind_to_this_process() if self.die_with_parent else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout_s
        while not self.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"router not live after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        return self

    def alive(self) -> bool:
        """Its health listener accepts a connection; raises if the process has exited (with its log's tail)."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the router exited early; see {self.log_path}:\n{self.logs()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection((self.metrics_host, self.metrics_port), 1):
            return True
        return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (the router drains its open streams), escalated to SIGKILL after ``timeout_s``."""
        terminate(self.proc, timeout_s)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
