"""When a draining pair may go before its ``drainTimeout``: every router replica reports no open stream.

Why: a pair drains so that streams already open on it can finish; until the routers reported, the
operator waited the whole ``drainTimeout`` (minutes of GPUs held for streams that ended in seconds).
Each router replica serves its open streams (``tandem.routing.streams``); the reconcile reads every
replica the router Service's EndpointSlices list (``tandem.adapters.routerstreams``) into
:class:`RouterStreams`, and :func:`streams_closed` decides here, purely.

Safety first — anything not positively known keeps the timer:

- no reports configured or readable this pass, no replica listed, any replica unreachable or answering
  something invalid → not closed (wait for ``drainTimeout``);
- a replica that does not route with the table the operator published (another fingerprint, or the pool
  missing) → not closed: it may still send new requests to the pair;
- a replica with requests still walking an older table (``olderTableRequests`` > 0) → not closed: such a
  request may still pick the pair;
- integrity (``tandem.core.integrity`` rule 2): only a drain start the operator vetted counts, only its
  own published table (``own_table``) in which the pair is ``draining``, and only reports read at or after
  the drain began. So a forged report (an EndpointSlice pointing elsewhere, a fake replica) can end a
  drain early, never delete a pair before its drain began or one that is not draining.

Worked example: p3 drains since 12:00:00, drainTimeout 10 min; at 12:00:40 both replicas answer with the
published fingerprint, no older-table request and no stream on p3 → p3's pods are deleted at 12:00:40;
had one replica timed out, p3 would wait (re-read every :data:`DRAIN_POLL_SECONDS`) up to 12:10:00.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from tandem.routing.streams import StreamsReport
from tandem.routing.table import PairState, RoutingTable

DRAIN_POLL_SECONDS: Final = 3.0
"""How often a pool with a draining pair re-reads the routers' reports (when they are configured): a pair
is deleted within about this long after its last stream ended, for a few small GETs per replica."""


@dataclass(frozen=True)
class ReplicaStreams:
    """One router replica's answer this pass: its report, or why there is none."""

    address: str
    report: StreamsReport | None
    problem: str = ""


@dataclass(frozen=True)
class RouterStreams:
    """Every router replica's answer, read once in one pass (``problem``: the replicas could not be listed)."""

    read_at: datetime
    replicas: tuple[ReplicaStreams, ...] = ()
    problem: str = ""


def streams_closed(
    streams: RouterStreams | None,
    *,
    pool_key: str,
    pair_id: str,
    table: RoutingTable | None,
    own_table: bool,
    draining_since: datetime,
) -> tuple[bool, str]:
    """(True when every router replica reports no open stream on ``pair_id``; why not, otherwise).

    ``pool_key`` is ``namespace/pool``; ``table`` the routing table observed this pass (the published one).
    """
    if streams is None:
        return False, "no router reports configured"
    if streams.problem:
        return False, f"router replicas unknown: {streams.problem}"
    if not own_table or table is None:
        return False, "the published routing table is not the operator's own"
    if not any(p.id == pair_id and p.state is PairState.DRAINING for p in table.pairs):
        return False, "the published table does not list the pair as draining"
    if streams.read_at < draining_since:
        return False, "reports older than the drain"
    if not streams.replicas:
        return False, "no router replica listed"
    fingerprint = table.fingerprint()
    for replica in streams.replicas:
        report = replica.report
        if report is None:
            return False, f"router {replica.address}: {replica.problem or 'no report'}"
        pool = report.pools.get(pool_key)
        if pool is None:
            return False, f"router {replica.address} does not route pool {pool_key}"
        if pool.fingerprint != fingerprint:
            return False, f"router {replica.address} routes with another table"
        if pool.older_table_requests:
            return False, f"router {replica.address} has {pool.older_table_requests} request(s) on an older table"
        if n := pool.open_streams.get(pair_id, 0):
            return False, f"router {replica.address} has {n} open stream(s) on {pair_id}"
    return True, f"{len(streams.replicas)} router replica(s) report no open stream"


def wants_reports(table: RoutingTable | None) -> bool:
    """Whether a pass should read the routers at all: only while the published table drains a pair."""
    return table is not None and any(p.state is PairState.DRAINING for p in table.pairs)


__all__ = [
    "DRAIN_POLL_SECONDS",
    "ReplicaStreams",
    "RouterStreams",
    "streams_closed",
    "wants_reports",
]
