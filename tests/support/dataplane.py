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
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tandem.routing import RoutingTable
from tandem_lab.dev.enginedouble import EngineDouble, connector_options
from tandem_lab.dev.kit import ROUTER_SERVICE, host_address, router_endpoint_slice
from tandem_lab.dev.kit import RouterProcess as KitRouterProcess
from tests.support.tandem_cluster import LOGS, REPO

T = TypeVar("T")
__all__ = ["ROUTER_SERVICE", "LoopbackDoubles", "RouterProcess", "host_address", "router_endpoint_slice"]


@dataclass
class RouterProcess(KitRouterProcess):
    """:class:`tandem_lab.dev.kit.RouterProcess` for a test: its health listener on :func:`host_address`,
    ``--prefill-timeout=10``, the log in ``.logs/router-<name>.log``, and :meth:`admin` for its JSON pages."""

    kubeconfig: Path = Path()
    namespace: str = ""
    log_path: Path = Path()
    name: str = "router"
    metrics_host: str = field(default_factory=host_address)

    def start(self, timeout_s: float = 60.0) -> RouterProcess:
        LOGS.mkdir(exist_ok=True)
        self.log_path = LOGS / f"router-{self.name}.log"
        self.cwd = REPO
        self.extra_args = ("--prefill-timeout=10", *self.extra_args)
        super().start(timeout_s)
        return self

    def admin(self, path: str) -> tuple[int, Any]:
        url = f"http://{self.metrics_host}:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None


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
            prefills = {id(e) for e in pair.prefill}
            for endpoint in (*pair.prefill, *pair.decode):
                if endpoint.address is None or endpoint.address in self.by_address:
                    continue
                host, _, port = endpoint.address.rpartition(":")
                assert host.startswith("127."), f"{endpoint.pod} has a non-loopback address {endpoint.address}"
                role = "prefill" if id(endpoint) in prefills else "decode"
                double = EngineDouble(
                    name=endpoint.pod,
                    host=host,
                    port=int(port),
                    model=model,
                    **connector_options(pair.transfer, role),
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
