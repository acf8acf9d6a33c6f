"""Tandem on the real local cluster: CRDs, per-test GPU nodes, and the operator as a process or in-process.

What it owns (fixtures are registered by the root conftest through tests/support/clusterfix.py users):
- ``install_crds(kube)``: server-side apply of the committed ``crds/`` and wait until Established;
- ``GpuNodes``: simulated MI325X nodes labelled for one test (`tandem.dev/test-nodes=<id>`), so a
  pool placed with that nodeSelector never competes with another test's leftovers; deleted after;
- ``OperatorProcess``: `tandem run` as a subprocess (SIGKILL/SIGTERM-able, its own identity via an
  optional ServiceAccount kubeconfig), with logs in `.logs/operator-<test>.log`;
- ``operator_in_process``: the same operator inside the test process through kopf's KopfRunner;
- ``wait_until``: polling with a deadline and a message that says what was awaited.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.nodes import NodeSpec, add_nodes, delete_node

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / ".logs"
NODE_LABEL = "tandem.dev/test-nodes"
T = TypeVar("T")
# Loopback pod CIDRs: one /24 per node from 127.64.0.0 up (127.0.0.0/16, where the control plane listens,
# is never used). Linux routes all of 127.0.0.0/8 to `lo`, so a test process can listen on any pod address.
_LOOPBACK_CIDRS = itertools.count()


def next_loopback_cidr() -> str:
    """A fresh 127.x.y.0/24 for one node's pods (unique within this test session)."""
    n = next(_LOOPBACK_CIDRS)
    return f"127.{64 + n // 256}.{n % 256}.0/24"


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, interval_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def install_crds(kube: Kubectl) -> None:
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for crd in ("inferencepools.tandem.dev", "mooncakecaches.tandem.dev"):
        kube.run("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GpuNodes:
    """Nodes that belong to one test; pools select them with ``selector``."""

    kube: Kubectl
    group: str = field(default_factory=lambda: secrets.token_hex(3))
    names: list[str] = field(default_factory=list)

    @property
    def selector(self) -> dict[str, str]:
        return {NODE_LABEL: self.group}

    def add(
        self,
        count: int,
        *,
        gpus: int = 8,
        zones: tuple[str, ...] = ("zone-a", "zone-b"),
        loopback_pods: bool = False,
    ) -> list[str]:
        """Create ``count`` nodes; ``loopback_pods``: each gets a loopback pod CIDR (``next_loopback_cidr``),
        so the addresses KWOK gives their pods can be served by local processes (engine doubles)."""
        specs = []
        for i in range(len(self.names), len(self.names) + count):
            name = f"n{self.group}-{i}"
            zone = zones[i % len(zones)]
            specs.append(
                NodeSpec(
                    name=name,
                    gpus=gpus,
                    zone=zone,
                    rack=f"{zone}-rack-{i // 4}",
                    extra_labels=((NODE_LABEL, self.group),),
                    pod_cidr=next_loopback_cidr() if loopback_pods else "",
                )
            )
        # Create in chunks: one kubectl call per 100 nodes keeps each request small.
        for start in range(0, len(specs), 100):
            add_nodes(self.kube, specs[start : start + 100])
        self.names.extend(s.name for s in specs)
        wait_until(
            f"{count} nodes Ready",
            lambda: self._ready_count() >= len(self.names),
            timeout_s=60 + count,
        )
        return [s.name for s in specs]

    def _ready_count(self) -> int:
        data = self.kube.json("get", "nodes", "-l", f"{NODE_LABEL}={self.group}", "-o", "json")
        ready = 0
        for node in data["items"]:
            # Ready, and the node lifecycle controller has lifted its not-ready taint (schedulable).
            tainted = any(
                t.get("key") == "node.kubernetes.io/not-ready" for t in node.get("spec", {}).get("taints") or []
            )
            for cond in node.get("status", {}).get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True" and not tainted:
                    ready += 1
        return ready

    def remove(self, name: str) -> None:
        delete_node(self.kube, name, wait=False)
        if name in self.names:
            self.names.remove(name)

    def cleanup(self) -> None:
        if self.names:
            self.kube.run("delete", "nodes", "-l", f"{NODE_LABEL}={self.group}", "--wait=false", check=False)


@dataclass
class OperatorProcess:
    """`tandem run` as a child process."""

    kubeconfig: Path
    namespaces: list[str]
    name: str = "operator"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    liveness_port: int = 0
    log_path: Path | None = None
    starts: int = 0

    def start(self) -> OperatorProcess:
        LOGS.mkdir(exist_ok=True)
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.log_path = LOGS / f"operator-{self.name}.log"
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
            *self.extra_args,
        ]
        # One leader-election identity per OperatorProcess, the same across its restarts (like a pod name):
        # a restarted operator takes its own Lease back at once; two different ones never act together.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TANDEM_LEADER_IDENTITY": self.name, **self.env}
        mode = "ab" if self.starts else "wb"
        with self.log_path.open(mode) as log:
            log.write(f"\n=== start {self.starts} ===\n".encode())
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.starts += 1
        wait_until("operator liveness endpoint", self._alive, timeout_s=60)
        return self

    def _alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited early; see {self.log_path}:\n{self.logs()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.liveness_port), timeout=1):
            return True
        return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a crashed pod."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def metrics(self) -> str:
        import urllib.request  # noqa: PLC0415

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def operator_in_process(kubeconfig: Path, namespace: str) -> Iterator[Any]:
    """The operator inside this process (kopf's KopfRunner, a thread with its own event loop)."""
    from kopf.testing import KopfRunner  # noqa: PLC0415 - kopf only where a test asks for it

    old = {k: os.environ.get(k) for k in ("KUBECONFIG", "TANDEM_NAMESPACES")}
    os.environ["KUBECONFIG"] = str(kubeconfig)
    os.environ["TANDEM_NAMESPACES"] = namespace
    try:
        with KopfRunner(
            ["run", "-m", "tandem.controller.main", "--standalone", f"--namespace={namespace}"],
            timeout=60,
        ) as runner:
            yield runner
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
