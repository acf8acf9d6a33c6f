"""The open-streams report this router replica serves to the operator (``GET /streams``).

Why: the operator deletes a draining pair once every router replica reports no open stream on it
(``tandem.core.drains``); the contract is ``tandem.routing.streams``. Counts come from
:class:`tandem.router.admission.Loads`, which a request holds from the moment it chose a pair (in the same
event-loop step as reading the live table, so nothing can pick a pair unseen) until its last byte: a
stream that started before its pair turned draining is counted like any other.

Served on the health/metrics listener's own thread: ``Loads.open_streams`` copies the counts atomically,
and the table snapshot is an immutable tuple, so nothing here touches the request loop.

Must not: decide anything (the operator does), or block.
"""

from __future__ import annotations

from aiohttp import web

from tandem.router.admission import Loads
from tandem.router.tables import TableStore
from tandem.routing.streams import STREAMS_PATH, PoolStreams, StreamsReport


def build_report(store: TableStore, loads: Loads) -> StreamsReport:
    """The report for every live table: its fingerprint, holds per pair, requests on an older table."""
    # Tables first, then the counts. The loop thread reads a table and holds its pair in one step, and a
    # swap runs on that thread too, so once ``live`` shows the new table every request that read an older
    # one already holds a pair: the counts taken next include it (as a hold on an older table). The other
    # order could miss a request that read the old table between the two reads.
    live = store.snapshot
    pairs, tables = loads.open_streams()
    live_ids = {(t.table.namespace, t.table.pool): id(t.table) for t in live}
    pools: dict[str, PoolStreams] = {}
    for loaded in live:
        ns, pool = loaded.table.namespace, loaded.table.pool
        streams = {pair: n for (p_ns, p_pool, pair), n in pairs.items() if (p_ns, p_pool) == (ns, pool) and n > 0}
        older = sum(
            n
            for (t_ns, t_pool, tid), n in tables.items()
            if (t_ns, t_pool) == (ns, pool) and tid != live_ids[(ns, pool)]
        )
        pools[f"{ns}/{pool}"] = PoolStreams(
            fingerprint=loaded.fingerprint, open_streams=streams, older_table_requests=older
        )
    return StreamsReport(pools=pools)


def add_streams_route(app: web.Application, store: TableStore, loads: Loads) -> None:
    """Serve :func:`build_report` at ``/streams`` on ``app`` (the health/metrics listener)."""

    async def streams(_: web.Request) -> web.Response:
        report = build_report(store, loads)
        return web.json_response(report.model_dump(mode="json", by_alias=True))

    app.router.add_get(STREAMS_PATH, streams)
