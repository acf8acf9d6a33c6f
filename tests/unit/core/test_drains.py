"""The drain loop closed on router reports: a draining pair goes when every router replica reports no
open stream on it, and only then (or at drainTimeout); anything unknown keeps the timer."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from tandem.core.drains import ReplicaStreams, RouterStreams, streams_closed, wants_reports
from tandem.routing.streams import PoolStreams, StreamsReport
from tandem.routing.table import PairState, RoutingTable
from tests.support.factories import T0, World, make_nodes, make_pool

POOL = "ns/speed"


def _draining_world() -> tuple[World, RoutingTable, int]:
    """A pool of 3 Ready pairs scaled to 2: pair index 2 drains. Returns (world, published table, index)."""
    builder = make_pool().pairs(3)
    world = World(builder.obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 3)
    world.set_spec(builder.pairs(2))
    plan = world.tick()
    [draining] = [p for p in plan.routing.pairs if p.state is PairState.DRAINING]
    return world, plan.routing, draining.index


def _report(
    table: RoutingTable, *, streams: dict[str, int] | None = None, older: int = 0, fp: str = ""
) -> StreamsReport:
    pool = PoolStreams(fingerprint=fp or table.fingerprint(), open_streams=streams or {}, older_table_requests=older)
    return StreamsReport(pools={f"{table.namespace}/{table.pool}": pool})


def _pair_id(table: RoutingTable) -> str:
    return next(p.id for p in table.pairs if p.state is PairState.DRAINING)


def _case(name: str) -> tuple[bool, str]:
    world, table, _ = _draining_world()
    pair = _pair_id(table)
    since = world.now
    later = since + timedelta(seconds=5)
    both_clear = (ReplicaStreams("a", _report(table)), ReplicaStreams("b", _report(table, streams={"other": 3})))
    streams: RouterStreams | None = RouterStreams(read_at=later, replicas=both_clear)
    own = True
    pool_key = f"{table.namespace}/{table.pool}"
    if name == "not configured":
        streams = None
    elif name == "replicas not listed":
        streams = RouterStreams(read_at=later, problem="cannot list EndpointSlices: ApiException")
    elif name == "no replica":
        streams = RouterStreams(read_at=later)
    elif name == "one unreachable":
        streams = RouterStreams(read_at=later, replicas=(both_clear[0], ReplicaStreams("b", None, "unreachable")))
    elif name == "one open stream":
        streams = RouterStreams(
            read_at=later, replicas=(both_clear[0], ReplicaStreams("b", _report(table, streams={pair: 1})))
        )
    elif name == "older table request":
        streams = RouterStreams(read_at=later, replicas=(both_clear[0], ReplicaStreams("b", _report(table, older=1))))
    elif name == "stale table on a replica":
        streams = RouterStreams(
            read_at=later, replicas=(both_clear[0], ReplicaStreams("b", _report(table, fp="f" * 64)))
        )
    elif name == "pool unknown to a replica":
        streams = RouterStreams(read_at=later, replicas=(both_clear[0], ReplicaStreams("b", StreamsReport())))
    elif name == "foreign table":
        own = False
    elif name == "read before the drain":
        streams = replace(streams, read_at=since - timedelta(seconds=1))  # type: ignore[arg-type]
    elif name == "pair not draining":
        pair = next(p.id for p in table.pairs if p.state is PairState.SERVING)
    return streams_closed(streams, pool_key=pool_key, pair_id=pair, table=table, own_table=own, draining_since=since)


@pytest.mark.parametrize(
    ("name", "closed"),
    [
        ("every replica clear", True),
        ("not configured", False),
        ("replicas not listed", False),
        ("no replica", False),
        ("one unreachable", False),
        ("one open stream", False),
        ("older table request", False),
        ("stale table on a replica", False),
        ("pool unknown to a replica", False),
        ("foreign table", False),
        ("read before the drain", False),
        ("pair not draining", False),
    ],
    ids=str,
)
def test_streams_closed_only_when_every_replica_positively_reports_none(name: str, closed: bool) -> None:
    got, why = _case(name)
    assert got is closed, why
    assert why


def test_reports_are_read_only_while_a_pair_drains() -> None:
    _world, table, _ = _draining_world()
    assert wants_reports(table)
    assert not wants_reports(None)
    serving = table.model_copy(update={"pairs": tuple(p for p in table.pairs if p.state is PairState.SERVING)})
    assert not wants_reports(serving)


def _clear(world: World, table: RoutingTable, **kw: object) -> RouterStreams:
    return RouterStreams(read_at=world.now, replicas=(ReplicaStreams("a", _report(table, **kw)),))  # type: ignore[arg-type]


def test_plan_deletes_a_drained_pair_once_the_routers_report_no_stream_and_not_before() -> None:
    world, table, index = _draining_world()
    pair = _pair_id(table)
    world.router_streams = _clear(world, table, streams={pair: 2})
    plan = world.tick(1)
    assert plan.deletes == ()
    assert plan.requeue_after <= 3.0  # looks again soon instead of at the drainTimeout deadline
    world.router_streams = _clear(world, world.routing)
    plan = world.tick(1)
    assert {d.name for d in plan.deletes} == {p.name for p in world.pods.values() if p.pair_index == index}
    assert all("routers report no open stream" in d.reason for d in plan.deletes)


def test_plan_without_reports_keeps_the_timer() -> None:
    world, _table, index = _draining_world()
    world.router_streams = RouterStreams(read_at=world.now, replicas=(ReplicaStreams("a", None, "unreachable"),))
    for _ in range(5):  # 25 s < drainTimeout (30 s)
        assert world.tick(5).deletes == ()
    draining_pods = {p.name for p in world.pods.values() if p.pair_index == index}
    plan = world.tick(5)
    assert {d.name for d in plan.deletes} == draining_pods
    assert all("drainTimeout passed" in d.reason for d in plan.deletes)


def test_a_converged_pool_with_reports_configured_plans_nothing() -> None:
    """Zero writes when nothing changed: a pool with no draining pair and reports configured is quiet."""
    world = World(make_pool().pairs(2).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 2)
    world.router_streams = RouterStreams(read_at=T0)
    world.tick()
    plan = world.tick()
    assert (plan.creates, plan.deletes, plan.events) == ((), (), ())
    assert plan.requeue_after == 300.0
