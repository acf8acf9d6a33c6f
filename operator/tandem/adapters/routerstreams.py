"""Reading the router replicas' open-streams reports (I/O only; ``tandem.core.drains`` decides).

Why this path (``docs/design/008-router.md``, *Closing the drain loop*): the router Service's
EndpointSlices are the authoritative list of router replicas — ready, starting and terminating ones alike,
kept by the endpoint-slice controller — so a replica that holds streams cannot be silently left out; each
replica answers ``GET /streams`` on its health/metrics port (named ``metrics`` in the chart) from its own
in-memory counts, so the answer is current, costs no API write, and needs no Prometheus.

Every endpoint of every slice is asked, whatever its conditions (a terminating replica may still relay
streams). A replica that does not answer within ``timeout_s`` or answers something that is not a valid
report is recorded with its problem; listing failures become ``RouterStreams.problem``. Nothing here
raises for those: the planner turns any of them into "wait for drainTimeout".

Must not: decide anything, or write to the API.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final

import aiohttp
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from tandem.core.drains import ReplicaStreams, RouterStreams
from tandem.routing.streams import STREAMS_PATH, StreamsReport

SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
DEFAULT_PORT_NAME: Final = "metrics"
DEFAULT_TIMEOUT_S: Final = 2.0
"""A report is a few hundred bytes from memory; a replica slower than this is treated as unknown."""
MAX_REPORT_BYTES: Final = 1 << 20
"""Bound on what a (possibly forged) endpoint may make the operator read."""

Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]
"""GET a URL → (status, body); injectable for tests."""


def replica_urls(slices: list[dict[str, Any]], port_name: str) -> tuple[list[str], str]:
    """The ``/streams`` URL of every endpoint in ``slices`` (pure), and a problem when a slice lacks the port."""
    urls: list[str] = []
    for item in slices:
        port = next((p.get("port") for p in item.get("ports") or [] if p.get("name") == port_name), None)
        endpoints = item.get("endpoints") or []
        if port is None:
            if endpoints:
                name = (item.get("metadata") or {}).get("name", "?")
                return [], f"EndpointSlice {name} has no port named {port_name!r}"
            continue
        for endpoint in endpoints:
            for address in (endpoint.get("addresses") or [])[:1]:
                urls.append(f"http://{_host(address)}:{int(port)}{STREAMS_PATH}")
    return sorted(set(urls)), ""


def _host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:  # an FQDN slice
        return address


class RouterStreamsReader:
    """Reads every router replica of one Service (``namespace/name``) once per call."""

    def __init__(
        self,
        api_client: client.ApiClient,
        service: str,
        *,
        port_name: str = DEFAULT_PORT_NAME,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fetch: Fetch | None = None,
    ) -> None:
        namespace, _, name = service.partition("/")
        if not namespace or not name:
            raise ValueError(f"router service must be NAMESPACE/NAME, got {service!r}")
        self.namespace, self.name = namespace, name
        self.port_name = port_name
        self.timeout_s = timeout_s
        self._discovery = client.DiscoveryV1Api(api_client)
        self._fetch = fetch or self._http_get

    async def _list_slices(self) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            response: Any = self._discovery.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=f"{SERVICE_NAME_LABEL}={self.name}",
                _preload_content=False,
                _request_timeout=10,
            )
            return list(json.loads(response.data).get("items") or [])

        return await asyncio.to_thread(run)

    async def _http_get(self, url: str) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            body = await response.content.read(MAX_REPORT_BYTES)
            return response.status, body

    async def _one(self, url: str) -> ReplicaStreams:
        address = url.removeprefix("http://").removesuffix(STREAMS_PATH)
        try:
            status, body = await asyncio.wait_for(self._fetch(url), self.timeout_s)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return ReplicaStreams(address, None, f"unreachable ({type(exc).__name__})")
        if status != 200:
            return ReplicaStreams(address, None, f"answered HTTP {status}")
        try:
            return ReplicaStreams(address, StreamsReport.model_validate_json(body))
        except ValidationError:
            return ReplicaStreams(address, None, "not a valid streams report")

    async def read(self, now: datetime) -> RouterStreams:
        """Every replica's answer; ``now`` is the pass's clock (reports are read after it)."""
        try:
            slices = await self._list_slices()
        except (ApiException, OSError, ValueError) as exc:
            return RouterStreams(read_at=now, problem=f"cannot list EndpointSlices: {type(exc).__name__}")
        urls, problem = replica_urls(slices, self.port_name)
        if problem:
            return RouterStreams(read_at=now, problem=problem)
        replicas = await asyncio.gather(*(self._one(u) for u in urls))
        return RouterStreams(read_at=now, replicas=tuple(replicas))


__all__ = ["RouterStreamsReader", "replica_urls"]
