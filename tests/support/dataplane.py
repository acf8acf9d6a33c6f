"""The data plane on the local cluster: `tandem router` as a process, and engine doubles on pod addresses.

What it owns:
- ``RouterProcess``: ``tandem router --namespace NS --kubeconfig K`` as a child process (the real CLI and
  ConfigMap watch), requests on 127.0.0.1, its health/metrics listener (``/streams`` included) on an address
  the API server accepts in an EndpointSlice (``host_address()``: loopback is refused there), logs in
  ``.logs/router-<test>.log``;
- ``router_endpoint_slice``: a Service-less EndpointSlice naming that process as the router Service's one
  replica, so the operator's ``--router-service`` finds it as it would find router pods;
- ``LoopbackDoubles``: engine doubles (``tandem_lab.dev.enginedouble``) on one event loop in a thread, each bound
  to the address the operator published for a KWOK pod (pod CIDRs inside 127.0.0.0/8, see
  ``GpuNodes.add(loopback_pods=True)``).

Invariants: everything started here is stopped by ``stop()``; nothing binds a non-loopback address except
the router's health listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tandem.routing import RoutingTable
from tandem_lab.dev.enginedouble import EngineDouble
from tests.support.tandem_cluster import LOGS, REPO, free_port, wait_until

T = TypeVar("T")
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
                "endpointslice.kubernetes.io/managed-by": "tests.tandem.dev",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": METRICS_PORT_NAME, "port": metrics_port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }


@dataclass
class RouterProcess:
    """`tandem router` watching one namespace's routing tables."""

    kubeconfig: Path
    namespace: str
    name: str = "router"
    metrics_host: str = field(default_factory=host_address)
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()

    def start(self) -> RouterProcess:
        LOGS.mkdir(exist_ok=True)
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = LOGS / f"router-{self.name}.log"
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
            "--prefill-timeout=10",
            *self.extra_args,
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO
            )
        wait_until("the router's health listener", self._alive, timeout_s=60)
        return self

    def _alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"router exited early; see {self.log_path}:\n{self.logs()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection((self.metrics_host, self.metrics_port), 1):
            return True
        return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin(self, path: str) -> tuple[int, Any]:
        url = f"http://{self.metrics_host}:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


class LoopbackDoubles:
    """Engine doubles on the pod addresses of routing tables, served by one event loop in a thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-doubles", daemon=True)
        self._thread.start()
        self.by_address: dict[str, EngineDouble] = {}
        self.by_pod: dict[str, EngineDouble] = {}

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def serve(self, table: RoutingTable, model: str) -> None:
        """Start a double for every endpoint of ``table`` that has an address and none yet."""
        for pair in table.pairs:
            transfer = pair.transfer
            prefills = {id(e) for e in pair.prefill}
            for endpoint in (*pair.prefill, *pair.decode):
                if endpoint.address is None or endpoint.address in self.by_address:
                    continue
                host, _, port = endpoint.address.rpartition(":")
                assert host.startswith("127."), f"{endpoint.pod} has a non-loopback address {endpoint.address}"
                # A MooncakeConnector prefill also serves vLLM's bootstrap `/query` on the table's port.
                mooncake = transfer.connector == "MooncakeConnector" and id(endpoint) in prefills
                double = EngineDouble(
                    name=endpoint.pod,
                    host=host,
                    port=int(port),
                    model=model,
                    bootstrap_port=transfer.bootstrap_port if mooncake else None,
                    moriio_mode=transfer.moriio_mode if transfer.connector == "MoRIIOConnector" else None,
                )
                double = self._run(double.start())
                self.by_address[endpoint.address] = double
                self.by_pod[endpoint.pod] = double

    def requests(self) -> int:
        return sum(len(d.requests) for d in self.by_address.values())

    def stop(self) -> None:
        for double in self.by_address.values():
            with contextlib.suppress(Exception):
                self._run(double.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
