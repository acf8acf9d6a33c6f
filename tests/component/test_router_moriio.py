"""tandem router with MoRIIOConnector pairs on loopback: both modes, against engine doubles that check each leg
the way vLLM's MoRIIO connector reads it (``docs/design/014-moriio.md``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tandem.router import legs
from tandem.router.proxy import HEADER_PAIR
from tandem.routing import KvTransfer
from tandem_lab.dev.enginedouble import (
    MORIIO_HANDSHAKE_PORT,
    MORIIO_NOTIFY_PORT,
    Behaviour,
    EngineDouble,
    output_tokens,
    prompt_key,
)
from tests.component.test_router import MODEL, Lab, make_table, sse_text, winner

HOST = "127.0.0.1"


def _moriio(mode: str, **fields: Any) -> KvTransfer:
    return KvTransfer(connector="MoRIIOConnector", moriio_mode=mode, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["Write", "Read"])
@pytest.mark.parametrize(
    ("path", "stream"),
    [
        pytest.param("/v1/completions", False, id="completion"),
        pytest.param("/v1/completions", True, id="completion streamed"),
        pytest.param("/v1/chat/completions", False, id="chat"),
        pytest.param("/v1/chat/completions", True, id="chat streamed"),
    ],
)
async def test_router_moriio_legs_carry_one_transfer_id_and_each_others_address(
    lab: Lab, client: aiohttp.ClientSession, mode: str, path: str, stream: bool
) -> None:
    pairs = await lab.pairs(1, kv=_moriio(mode))
    await lab.start(make_table(pairs))
    chat = "chat" in path
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "stream": stream, "min_tokens": 2}
    body |= {"messages": [{"role": "user", "content": "mori"}]} if chat else {"prompt": "mori"}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with client.post(lab.url + path, json=body, headers={"X-Request-Id": "req-7"}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Request-Id"] == "req-7"
        raw = await resp.text()
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    assert [len(p.requests), len(d.requests)] == [1, 1]
    prefill, decode = p.requests[0], d.requests[0]
    assert prefill.request_id == decode.request_id == "req-7"
    assert prefill.body["max_tokens"] == 1 and prefill.body["stream"] is False
    assert "stream_options" not in prefill.body and "min_tokens" not in prefill.body
    tid = prefill.kv_transfer_params["transfer_id"]
    assert tid.startswith("xfer-")
    ports = (MORIIO_HANDSHAKE_PORT, MORIIO_NOTIFY_PORT)
    assert prefill.kv_transfer_params == legs.moriio_prefill_params(tid, HOST, *ports)
    write_params = legs.moriio_decode_params(tid, HOST, *ports)
    if mode == "Write":
        assert decode.kv_transfer_params == write_params
    else:  # what the prefill double answered (vLLM's request_finished), verbatim
        issued = p._prefill_params(prefill.kv_transfer_params, "req-7")
        assert decode.kv_transfer_params == {**write_params, **(issued or {})}
        assert decode.kv_transfer_params["remote_engine_id"] == f"{HOST}:{MORIIO_HANDSHAKE_PORT}"
    assert decode.kv_transfer_params["transfer_id"] == tid
    assert {k: v for k, v in decode.body.items() if k != "kv_transfer_params"} == body
    want = "".join(output_tokens(prompt_key(body), 5))
    if stream:
        text, _ = sse_text(raw, chat)
        assert raw.rstrip().endswith("data: [DONE]")
    else:
        choice = json.loads(raw)["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    assert text == want


async def test_router_moriio_write_aborts_decode_when_prefill_fails(lab: Lab, client: aiohttp.ClientSession) -> None:
    """Write mode sends the decode at once; a failed prefill must not leave it waiting for KV that never comes
    (vLLM holds it until `recv_abort_timeout`)."""
    pairs = await lab.pairs(1, kv=_moriio("Write"))
    await lab.start(make_table(pairs))
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    p.behaviour = Behaviour(status=500, stall_s=0.3)  # the decode is in flight when the prefill fails
    d.behaviour = Behaviour(stall_s=10)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "prefill_failed"
    for _ in range(100):
        if d.aborted:
            break
        await asyncio.sleep(0.02)
    assert d.aborted == 1


async def test_router_moriio_read_sends_no_decode_when_prefill_fails(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1, kv=_moriio("Read"))
    await lab.start(make_table(pairs))
    lab.prefill["speed-p0"].behaviour = Behaviour(status=500)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "prefill_failed"
    assert lab.decode["speed-p0"].requests == []


@pytest.mark.parametrize("mode", ["Write", "Read"])
async def test_router_moriio_walks_past_a_rejecting_prefill(lab: Lab, client: aiohttp.ClientSession, mode: str) -> None:
    pairs = await lab.pairs(2, kv=_moriio(mode))
    table = make_table(pairs)
    await lab.start(table)
    first = winner(table, "walk me")
    lab.prefill[first].behaviour = Behaviour(status=503)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "walk me", "max_tokens": 2}) as resp:
        assert resp.status == 200
        served = resp.headers[HEADER_PAIR]
    assert served != first
    p, d = lab.prefill[served], lab.decode[served]
    assert d.requests[-1].kv_transfer_params["transfer_id"] == p.requests[-1].kv_transfer_params["transfer_id"]


async def test_router_moriio_write_pins_the_data_parallel_rank_on_both_legs(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    pairs = await lab.pairs(1, kv=_moriio("Write", data_parallel_size=2))
    await lab.start(make_table(pairs))
    for i in range(2):
        async with client.post(lab.url + "/v1/completions", json={"prompt": f"dp{i}", "max_tokens": 1}) as resp:
            assert resp.status == 200
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    ranks = [int(r.headers["x-data-parallel-rank"]) for r in p.requests]
    assert sorted(ranks) == [0, 1]
    for rank, decode in zip(ranks, d.requests, strict=True):
        assert decode.kv_transfer_params["remote_dp_rank"] == rank
        assert decode.kv_transfer_params["remote_dp_size"] == 2


@pytest.mark.parametrize(
    ("mode", "kv"),
    [
        pytest.param(
            "Write", {"do_remote_decode": True, "transfer_id": "t"}, id="Write prefill without the decode's address"
        ),
        pytest.param(
            "Write", {"do_remote_prefill": True, "transfer_id": "t"}, id="Write decode without the prefill's address"
        ),
        pytest.param(
            "Read",
            {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "e", "remote_block_ids": [[1]]},
            id="Read decode with blocks but no address",
        ),
    ],
)
async def test_engine_double_fails_a_moriio_leg_vllm_could_not_use(
    client: aiohttp.ClientSession, mode: str, kv: dict[str, Any]
) -> None:
    """The double's checks are what make the router tests above meaningful: without them a leg missing a field
    would pass."""
    double = await EngineDouble(moriio_mode=mode).start()
    try:
        body = {"prompt": "x", "max_tokens": 2, "kv_transfer_params": kv}
        async with client.post(f"http://{double.address}/v1/completions", json=body) as resp:
            assert resp.status == 500
            assert "MoRIIOConnector" in (await resp.json())["error"]["message"]
    finally:
        await double.stop()
