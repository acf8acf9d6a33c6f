"""The router's open-streams report (``GET /streams``) that closes the operator's drain loop.

A stream that began before its pair turned draining is counted until its last byte, and as a request on an
older table while it holds that table; new requests avoid the draining pair; the report empties when the
stream ends. Loopback only: the router, engine doubles and a table file.
"""

from __future__ import annotations

import aiohttp

from tandem.router.admission import Loads
from tandem.router.drainreport import build_report
from tandem.router.proxy import HEADER_PAIR
from tandem.router.tables import TableStore
from tandem.routing import Endpoint, Pair, PairState
from tandem.routing.streams import STREAMS_PATH, StreamsReport
from tandem_lab.dev.enginedouble import Behaviour
from tests.component.test_router import Lab, _bump_mtime, make_table


async def _report(client: aiohttp.ClientSession, lab: Lab) -> StreamsReport:
    assert lab.router is not None
    async with client.get(f"http://127.0.0.1:{lab.router.metrics_port}{STREAMS_PATH}") as resp:
        assert resp.status == 200
        return StreamsReport.model_validate_json(await resp.read())


async def test_streams_report_counts_a_stream_across_its_pair_turning_draining(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    pairs = await lab.pairs(2)
    router = await lab.start(make_table([pairs[0]]))
    assert lab.source is not None
    lab.decode["speed-p0"].behaviour = Behaviour(tokens_per_s=20.0)
    body = {"prompt": "a long answer", "max_tokens": 12, "stream": True}
    async with client.post(lab.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers[HEADER_PAIR] == "speed-p0"
        await resp.content.readline()  # the stream is open on speed-p0
        before = (await _report(client, lab)).pools["ml/speed"]
        assert before.open_streams == {"speed-p0": 1}
        assert before.older_table_requests == 0
        assert before.fingerprint == router.store.snapshot[0].fingerprint

        draining = pairs[0].model_copy(update={"state": PairState.DRAINING, "draining_since": "2026-12-01T00:00:00Z"})
        lab.write(make_table([draining, pairs[1]]))
        _bump_mtime(lab.path)
        lab.source.poll(router.store)
        during = (await _report(client, lab)).pools["ml/speed"]
        assert during.fingerprint == router.store.snapshot[0].fingerprint != before.fingerprint
        assert during.open_streams == {"speed-p0": 1}  # began before the drain: still counted
        assert during.older_table_requests == 1  # and it walks a table that is no longer live

        async with client.post(lab.url + "/v1/completions", json={"prompt": "new", "max_tokens": 1}) as new:
            assert new.status == 200 and new.headers[HEADER_PAIR] == "speed-p1"
        rest = await resp.read()
    assert b"[DONE]" in rest
    after = (await _report(client, lab)).pools["ml/speed"]
    assert after.open_streams == {} and after.older_table_requests == 0


def test_report_counts_holds_on_the_live_table_and_on_older_ones() -> None:
    store = TableStore()
    pair = Pair(
        id="speed-p0",
        index=0,
        revision="r1",
        state=PairState.SERVING,
        prefill=(Endpoint(pod="a", address="127.0.0.1:1"),),
        decode=(Endpoint(pod="b", address="127.0.0.1:2"),),
    )
    table = make_table([pair])
    store.offer("file", table.to_json())
    live = store.snapshot[0].table
    loads = Loads()
    assert build_report(store, loads).pools["ml/speed"].open_streams == {}
    with loads.hold_pair(live, "speed-p0"), loads.hold_pair(table, "speed-p0"):
        pool = build_report(store, loads).pools["ml/speed"]
        assert pool.open_streams == {"speed-p0": 2}
        assert pool.older_table_requests == 1  # ``table`` is an equal but other object: not the live one
    pool = build_report(store, loads).pools["ml/speed"]
    assert pool.open_streams == {} and pool.older_table_requests == 0
