"""Reading the router replicas' reports: every EndpointSlice endpoint is asked; failures become problems
the planner treats as unknown (never as "no stream")."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from tandem.adapters.routerstreams import RouterStreamsReader, replica_urls
from tandem.core.drains import RouterStreams
from tandem.reconcile.pool import observe_router_streams
from tandem.routing.streams import PoolStreams, StreamsReport
from tests.support.factories import World, make_nodes, make_pool

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _slice(name: str, addresses: list[str], *, port_name: str = "metrics", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "ports": [{"name": "http", "port": 8000}, {"name": port_name, "port": 9090}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready, "terminating": not ready}} for a in addresses],
    }


@pytest.mark.parametrize(
    ("slices", "urls", "problem"),
    [
        pytest.param([], [], "", id="no slice"),
        pytest.param(
            [_slice("a", ["10.0.0.1"]), _slice("b", ["10.0.0.2"], ready=False)],
            ["http://10.0.0.1:9090/streams", "http://10.0.0.2:9090/streams"],
            "",
            id="terminating replicas are asked too",
        ),
        pytest.param([_slice("v6", ["fd00::1"])], ["http://[fd00::1]:9090/streams"], "", id="ipv6 bracketed"),
        pytest.param([_slice("x", ["10.0.0.1"], port_name="web")], [], "no port named 'metrics'", id="no such port"),
    ],
)
def test_replica_urls(slices: list[dict[str, Any]], urls: list[str], problem: str) -> None:
    got, why = replica_urls(slices, "metrics")
    assert got == urls
    assert problem in why and bool(problem) == bool(why)


def _reader(
    slices: list[dict[str, Any]] | Exception, answers: dict[str, tuple[int, bytes] | Exception]
) -> RouterStreamsReader:
    async def fetch(url: str) -> tuple[int, bytes]:
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    reader = RouterStreamsReader(client.ApiClient(), "tandem/tandem-router", fetch=fetch)

    async def list_slices() -> list[dict[str, Any]]:
        if isinstance(slices, Exception):
            raise slices
        return slices

    reader._list_slices = list_slices  # type: ignore[method-assign]
    return reader


GOOD = StreamsReport(pools={"ml/speed": PoolStreams(fingerprint="f" * 64)}).model_dump_json(by_alias=True).encode()


def test_reader_records_each_replica_answer_or_its_problem() -> None:
    reader = _reader(
        [_slice("s", ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"])],
        {
            "http://10.0.0.1:9090/streams": (200, GOOD),
            "http://10.0.0.2:9090/streams": TimeoutError(),
            "http://10.0.0.3:9090/streams": (503, b"{}"),
            "http://10.0.0.4:9090/streams": (200, b'{"apiVersion": "tandem.dev/router-streams-v9"}'),
        },
    )
    got = asyncio.run(reader.read(NOW))
    assert got.read_at == NOW and not got.problem
    by_address = {r.address: r for r in got.replicas}
    assert by_address["10.0.0.1:9090"].report is not None
    assert by_address["10.0.0.2:9090"].report is None and "unreachable" in by_address["10.0.0.2:9090"].problem
    assert by_address["10.0.0.3:9090"].problem == "answered HTTP 503"
    assert by_address["10.0.0.4:9090"].problem == "not a valid streams report"


def test_reader_turns_a_listing_failure_into_a_problem() -> None:
    got = asyncio.run(_reader(OSError("connection refused"), {}).read(NOW))
    assert got.replicas == () and "cannot list EndpointSlices" in got.problem


def test_reader_needs_namespace_and_name() -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        RouterStreamsReader(client.ApiClient(), "tandem-router")


class _CountingReader:
    def __init__(self) -> None:
        self.reads = 0

    async def read(self, now: datetime) -> RouterStreams:
        self.reads += 1
        return RouterStreams(read_at=now)


@pytest.mark.parametrize(
    ("draining", "configured", "reads"),
    [
        pytest.param(True, True, 1, id="a pair drains: read"),
        pytest.param(False, True, 0, id="nothing drains: no request at all"),
        pytest.param(True, False, 0, id="no --router-service: timer only"),
    ],
)
def test_observe_reads_the_routers_only_while_a_pair_drains(draining: bool, configured: bool, reads: int) -> None:
    world = World(make_pool().pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    if draining:
        world.set_spec(make_pool().pairs(1))
        world.tick()
    reader = _CountingReader()
    snapshot = asyncio.run(observe_router_streams(world.snapshot(), reader if configured else None))  # type: ignore[arg-type]
    assert reader.reads == reads
    assert (snapshot.router_streams is not None) == bool(reads)
