"""The router's per-request SLO counter (``tandem_router_slo_requests_total``) through its aiohttp app.

Loopback only: the router, engine doubles and a table file. Each test drives requests to one outcome and
reads the router's ``/metrics``: served requests judged on their own TTFT and TPOT, rejects, timeouts and
the pool's failures counted as such, labels bounded to pool and revision.
"""

from __future__ import annotations

import aiohttp
import pytest

from tandem.router.proxy import RouterConfig
from tandem_lab.dev.enginedouble import Behaviour
from tests.component.test_router import Lab, _samples, make_table

SLO = "tandem_router_slo_requests_total"


async def _slo(lab: Lab, client: aiohttp.ClientSession) -> dict[tuple[str, str, str], float]:
    """(revision, slo, result) → count, for pool ml/speed (the only pool in these tests)."""
    assert lab.router is not None and lab.router.metrics_port is not None
    text = await (await client.get(f"http://127.0.0.1:{lab.router.metrics_port}/metrics")).text()
    out = {}
    for labels, value in _samples(text, SLO).items():
        d = dict(labels)
        assert set(d) == {"pool", "revision", "slo", "result"}  # no per-pair label: bounded cardinality
        assert d["pool"] == "ml/speed"
        out[(d["revision"], d["slo"], d["result"])] = value
    return out


@pytest.mark.parametrize("stream", [pytest.param(False, id="whole"), pytest.param(True, id="streamed")])
async def test_router_slo_counts_served_requests_as_met(lab: Lab, client: aiohttp.ClientSession, stream: bool) -> None:
    await lab.start(make_table(await lab.pairs(2)))
    for i in range(3):
        body = {"prompt": f"fast {i}", "max_tokens": 4, "stream": stream}
        async with client.post(lab.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
    assert await _slo(lab, client) == {("r1", "ttft", "met"): 3.0, ("r1", "tpot", "met"): 3.0}


async def test_router_slo_ttft_over_its_budget_is_missed(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(1)))
    lab.prefill["speed-p0"].behaviour = Behaviour(stall_s=1.2)  # a short prompt's budget is 1 s
    async with client.post(lab.url + "/v1/completions", json={"prompt": "slow prefill", "max_tokens": 2}) as resp:
        assert resp.status == 200
    assert await _slo(lab, client) == {("r1", "ttft", "missed"): 1.0, ("r1", "tpot", "met"): 1.0}


async def test_router_slo_slow_stream_misses_tpot(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(1)))
    lab.decode["speed-p0"].behaviour = Behaviour(tokens_per_s=20.0)  # 50 ms per token, SLO 16.7 ms
    body = {"prompt": "slow decode", "max_tokens": 4, "stream": True}
    async with client.post(lab.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    assert await _slo(lab, client) == {("r1", "ttft", "met"): 1.0, ("r1", "tpot", "missed"): 1.0}


async def test_router_slo_counts_rejects_after_the_walk(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(2)))
    for double in lab.prefill.values():
        double.behaviour = Behaviour(status=429)
    for i in range(2):
        async with client.post(lab.url + "/v1/completions", json={"prompt": f"full {i}", "max_tokens": 1}) as resp:
            assert resp.status == 429
    # a reject has no pair, so no revision: the pool's attainment still sees it
    assert await _slo(lab, client) == {("", "ttft", "rejected"): 2.0, ("", "tpot", "rejected"): 2.0}


async def test_router_slo_counts_a_walk_of_timeouts_as_timeout(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(2)), RouterConfig(prefill_timeout_s=0.2))
    for double in lab.prefill.values():
        double.behaviour = Behaviour(stall_s=1.0)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "stalled", "max_tokens": 1}) as resp:
        assert resp.status == 429
    assert await _slo(lab, client) == {("", "ttft", "timeout"): 1.0, ("", "tpot", "timeout"): 1.0}


async def test_router_slo_counts_pool_failures_as_errors(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(1)))
    lab.decode["speed-p0"].behaviour = Behaviour(die_after_tokens=0)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "dies", "max_tokens": 4}) as resp:
        assert resp.status == 502
    assert await _slo(lab, client) == {("r1", "ttft", "error"): 1.0, ("r1", "tpot", "error"): 1.0}


async def test_router_slo_leaves_out_the_clients_own_errors(lab: Lab, client: aiohttp.ClientSession) -> None:
    await lab.start(make_table(await lab.pairs(1)))
    lab.prefill["speed-p0"].behaviour = Behaviour(status=400)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "bad", "max_tokens": 1}) as resp:
        assert resp.status == 400
    async with client.post(lab.url + "/v1/completions", json={"no": "prompt"}) as resp:
        assert resp.status == 400
    assert await _slo(lab, client) == {}
