"""tandem router end to end on loopback: the router, engine doubles and routing-table files.

Every server binds 127.0.0.1 on an ephemeral port; each test sends a bounded number of requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem.router.proxy import HEADER_PAIR, UPSTREAM_MESSAGE_CHARS, RouterConfig, upstream_message
from tandem.router.server import RunningRouter, start_router
from tandem.router.tables import REASON_UNREADABLE, FileSource, TableStore
from tandem.routing import (
    Admission,
    Endpoint,
    ImagesMatch,
    KvTransfer,
    Match,
    Pair,
    PairState,
    Revisions,
    RoutingTable,
    candidates,
    compute_pair_weights,
    routing_key,
)
from tandem_lab.dev.enginedouble import Behaviour, EngineDouble, output_tokens, prompt_key

MODEL = "double-model"


class Lab:
    """Doubles for N pairs, a table file naming them, and a router reading it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.path = tmp / "speed-routing.json"
        self.prefill: dict[str, EngineDouble] = {}
        self.decode: dict[str, EngineDouble] = {}
        self.router: RunningRouter | None = None
        self.source: FileSource | None = None
        self.table: RoutingTable | None = None

    async def pairs(
        self,
        n: int,
        *,
        revision: str = "r1",
        state: PairState = PairState.SERVING,
        kv: KvTransfer | None = None,
    ) -> list[Pair]:
        out = []
        for _ in range(n):
            i = len(self.prefill)
            pid = f"speed-p{i}"
            mooncake = kv is not None and kv.connector == "MooncakeConnector"
            dp = kv.data_parallel_size if kv is not None else 1
            moriio = kv.moriio_mode if kv is not None and kv.connector == "MoRIIOConnector" else None
            p = await EngineDouble(
                name=f"{pid}-prefill",
                bootstrap_port=0 if mooncake else None,
                data_parallel_size=dp,
                moriio_mode=moriio,
            ).start()
            d = await EngineDouble(name=f"{pid}-decode", moriio_mode=moriio).start()
            self.prefill[pid], self.decode[pid] = p, d
            if mooncake and kv is not None:
                kv = kv.model_copy(update={"bootstrap_port": p.bootstrap_port})
            out.append(
                Pair(
                    id=pid,
                    index=i,
                    revision=revision,
                    state=state,
                    prefill=(Endpoint(pod=f"{pid}-prefill-0", address=p.address),),
                    decode=(Endpoint(pod=f"{pid}-decode-0", address=d.address),),
                    kv_transfer=kv,
                )
            )
        return out

    def write(self, table: RoutingTable) -> None:
        self.table = table
        self.path.write_text(table.to_json())

    async def start(self, table: RoutingTable, config: RouterConfig | None = None) -> RunningRouter:
        self.write(table)
        self.source = FileSource([self.path], interval_s=3600)  # tests poll by hand
        # Engine scrapes: one round at start-up, then only when a test calls scrape_once().
        config = dataclasses.replace(config or RouterConfig(prefill_timeout_s=5), scrape_interval_s=3600)
        self.router = await start_router([self.source], config=config)
        return self.router

    @property
    def url(self) -> str:
        assert self.router is not None
        return f"http://127.0.0.1:{self.router.port}"

    async def close(self) -> None:
        if self.router is not None:
            await self.router.stop()
        for double in [*self.prefill.values(), *self.decode.values()]:
            await double.stop()

    def all_requests(self) -> int:
        return sum(len(d.requests) for d in [*self.prefill.values(), *self.decode.values()])


def make_table(pairs: list[Pair], **fields: Any) -> RoutingTable:
    base: dict[str, Any] = {
        "pool": "speed",
        "namespace": "ml",
        "traffic_class": "speed",
        "admission": Admission(max_in_flight=8, max_queued=8),
        "revisions": Revisions(stable="r1"),
        "pairs": tuple(pairs),
    }
    return RoutingTable(**(base | fields))


def winner(table: RoutingTable, prompt: str) -> str:
    """The pair tandem.routing puts first for ``prompt`` (idle loads)."""
    return candidates(routing_key(prompt, table.hash.prefix_chars), table.pairs)[0].id


def sse_text(raw: str, chat: bool) -> tuple[str, list[dict[str, Any]]]:
    """(concatenated text, parsed events) of an SSE body; ``[DONE]`` is not an event."""
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    key = "delta" if chat else None
    text = ""
    for event in events:
        for choice in event.get("choices", []):
            text += choice[key].get("content", "") if key else choice.get("text", "")
    return text, events


# --- P then D ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "stream"),
    [
        pytest.param("/v1/completions", False, id="completion"),
        pytest.param("/v1/completions", True, id="completion streamed"),
        pytest.param("/v1/chat/completions", False, id="chat"),
        pytest.param("/v1/chat/completions", True, id="chat streamed"),
    ],
)
async def test_router_runs_prefill_then_decode_with_params_verbatim(
    lab: Lab, client: aiohttp.ClientSession, path: str, stream: bool
) -> None:
    pairs = await lab.pairs(1)
    await lab.start(make_table(pairs))
    chat = "chat" in path
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "stream": stream, "min_tokens": 2}
    body |= {"messages": [{"role": "user", "content": "tell me"}]} if chat else {"prompt": "tell me"}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with client.post(lab.url + path, json=body, headers={"X-Request-Id": "req-42"}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Request-Id"] == "req-42"
        raw = await resp.text()
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    assert [len(p.requests), len(d.requests)] == [1, 1]
    prefill, decode = p.requests[0], d.requests[0]
    assert prefill.request_id == decode.request_id == "req-42"
    assert prefill.body["max_tokens"] == 1 and prefill.body["stream"] is False
    assert "stream_options" not in prefill.body and "min_tokens" not in prefill.body
    assert prefill.kv_transfer_params == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    issued = p._prefill_params({}, "req-42")  # what the prefill double returned for this request id
    assert decode.kv_transfer_params == issued
    assert {k: v for k, v in decode.body.items() if k != "kv_transfer_params"} == body
    want = "".join(output_tokens(prompt_key(body), 6))  # what one engine alone would answer
    if stream:
        text, _ = sse_text(raw, chat)
        assert raw.rstrip().endswith("data: [DONE]")
    else:
        choice = json.loads(raw)["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    assert text == want


async def test_router_generates_one_request_id_for_both_legs(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1)
    await lab.start(make_table(pairs))
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as resp:
        assert resp.status == 200
        rid = resp.headers["X-Request-Id"]
    assert rid.startswith("tandem-")
    assert lab.prefill["speed-p0"].requests[0].request_id == lab.decode["speed-p0"].requests[0].request_id == rid


async def test_router_mooncake_legs_share_transfer_id_and_cache_query(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1, kv=KvTransfer(connector="MooncakeConnector"))
    await lab.start(make_table(pairs))
    for i in range(2):
        async with client.post(lab.url + "/v1/completions", json={"prompt": f"m{i}", "max_tokens": 3}) as resp:
            assert resp.status == 200
            assert json.loads(await resp.text())["choices"][0]["text"] == "".join(
                output_tokens(prompt_key({"prompt": f"m{i}"}), 3)
            )
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    for prefill, decode in zip(p.requests, d.requests, strict=True):
        tid = prefill.kv_transfer_params["transfer_id"]
        assert tid.startswith("xfer-")
        assert prefill.kv_transfer_params == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
        assert decode.kv_transfer_params == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": tid,
            "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}",
            "remote_engine_id": p.engine_id,
        }
    assert p.requests[0].kv_transfer_params["transfer_id"] != p.requests[1].kv_transfer_params["transfer_id"]


async def test_router_mooncake_data_parallel_ranks_rotate(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1, kv=KvTransfer(connector="MooncakeConnector", data_parallel_size=2))
    await lab.start(make_table(pairs))
    for i in range(2):
        async with client.post(lab.url + "/v1/completions", json={"prompt": f"dp{i}", "max_tokens": 1}) as resp:
            assert resp.status == 200
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    ranks = [int(r.headers["x-data-parallel-rank"]) for r in p.requests]
    assert sorted(ranks) == [0, 1]
    for rank, decode in zip(ranks, d.requests, strict=True):
        assert decode.kv_transfer_params["remote_dp_rank"] == rank
        assert decode.kv_transfer_params["remote_engine_id"] == (f"{p.engine_id}-dp1" if rank else p.engine_id)


async def test_router_mooncake_aborts_decode_when_prefill_fails(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1, kv=KvTransfer(connector="MooncakeConnector"))
    await lab.start(make_table(pairs))
    p, d = lab.prefill["speed-p0"], lab.decode["speed-p0"]
    p.behaviour = Behaviour(status=500, stall_s=0.3)  # decode is in flight when the prefill fails
    d.behaviour = Behaviour(stall_s=10)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "prefill_failed"
    for _ in range(100):
        if d.aborted:
            break
        await asyncio.sleep(0.02)
    assert d.aborted == 1


async def test_router_logs_the_engines_reason_for_a_failed_leg(
    lab: Lab, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A decode leg's 5xx is the client's 502 (never walked: the prefill's KV is on that pair), and the log line
    carries the engine's own message, which the client does not see."""
    pairs = await lab.pairs(1)
    await lab.start(make_table(pairs))
    d = lab.decode["speed-p0"]
    d.behaviour = Behaviour(status=503)
    caplog.set_level(logging.WARNING, logger="tandem.router.proxy")
    async with client.post(
        lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, headers={"X-Request-Id": "req-7"}
    ) as resp:
        assert resp.status == 502
        body = await resp.json()
    assert body["error"]["code"] == "decode_failed" and "scripted" not in body["error"]["message"]
    [line] = [r.getMessage() for r in caplog.records if "req-7" in r.getMessage()]
    assert "decode leg answered 503 (engine: " in line and f"{d.name} answers 503 (scripted)" in line, line


def test_upstream_message_is_one_short_line() -> None:
    assert upstream_message(b'{"error": {"message": "KV transfer failed", "code": 500}}') == "KV transfer failed"
    assert upstream_message(b'{"message": "busy"}') == "busy"
    assert upstream_message(b"Internal Server Error\n\x1b[31m") == "Internal Server Error [31m"
    assert upstream_message(b"") == ""
    long = upstream_message(("x" * 1000).encode())
    assert len(long) == UPSTREAM_MESSAGE_CHARS and long.endswith("…")


# --- locality, canary, lifecycle -----------------------------------------------------------------


async def test_router_sends_one_prefix_to_one_pair(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(4)
    table = make_table(pairs)
    await lab.start(table)
    prefix = "system: you are terse. " * 60  # longer than prefixChars (1000)
    seen = set()
    for i in range(6):
        async with client.post(
            lab.url + "/v1/completions", json={"prompt": prefix + f"turn {i}", "max_tokens": 1}
        ) as resp:
            assert resp.status == 200
            seen.add(resp.headers[HEADER_PAIR])
    assert seen == {winner(table, prefix)}


async def test_router_canary_weight_50_splits_keys_as_the_table_says(lab: Lab, client: aiohttp.ClientSession) -> None:
    stable = await lab.pairs(2)
    canary = await lab.pairs(2, revision="r2")
    warming = await lab.pairs(1, revision="r2", state=PairState.WARMING)
    draining = await lab.pairs(1, state=PairState.DRAINING)
    weights = compute_pair_weights([*stable, *canary], "r2", 50)
    weighted = [p.model_copy(update={"weight": weights[p.id]}) for p in [*stable, *canary]]
    table = make_table(
        [*weighted, *warming, *draining], revisions=Revisions(stable="r1", canary="r2", canary_weight_percent=50)
    )
    await lab.start(table)
    got: dict[str, str] = {}
    for i in range(40):
        prompt = f"key {i}"
        async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as resp:
            assert resp.status == 200
            got[prompt] = resp.headers[HEADER_PAIR]
    assert got == {prompt: winner(table, prompt) for prompt in got}
    revision = {p.id: p.revision for p in table.pairs}
    canary_share = sum(1 for pid in got.values() if revision[pid] == "r2")
    assert 0 < canary_share < 40
    idle = [warming[0].id, draining[0].id]
    assert all(not lab.prefill[pid].requests and not lab.decode[pid].requests for pid in idle)


# --- fast reject and walk ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param("429", id="prefill 429"),
        pytest.param("503", id="prefill 503"),
        pytest.param("refused", id="prefill refuses connections"),
        pytest.param("stall", id="prefill times out"),
    ],
)
async def test_router_walks_past_a_rejecting_prefill_with_no_client_errors(
    lab: Lab, client: aiohttp.ClientSession, failure: str
) -> None:
    pairs = await lab.pairs(3)
    table = make_table(pairs)
    await lab.start(table, RouterConfig(prefill_timeout_s=0.3))
    bad = "speed-p1"
    p = lab.prefill[bad]
    if failure == "refused":
        await p.stop()
    else:
        p.behaviour = Behaviour(status=int(failure)) if failure != "stall" else Behaviour(stall_s=2)
    prompts = [f"walk {i}" for i in range(12)]
    first_bad = [x for x in prompts if winner(table, x) == bad]
    assert first_bad, "the sample must hit the failing pair first at least once"
    statuses = []
    for prompt in prompts:
        async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as resp:
            statuses.append(resp.status)
            assert resp.headers[HEADER_PAIR] != bad
    assert statuses == [200] * len(prompts)
    assert not lab.decode[bad].requests  # never a decode on the pair whose prefill failed
    assert lab.router is not None and lab.router.metrics_port is not None
    text = await (await client.get(f"http://127.0.0.1:{lab.router.metrics_port}/metrics")).text()
    rejects = _samples(text, "tandem_router_fast_rejects_total")
    assert sum(v for labels, v in rejects.items() if dict(labels)["pair"] == bad) == len(first_bad)


async def test_router_all_full_answers_reject_status_with_retry_after(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(2)
    table = make_table(pairs, admission=Admission(max_in_flight=8, max_queued=8, reject_status=503))
    await lab.start(table)
    for double in lab.prefill.values():
        double.behaviour = Behaviour(status=429)
    async with client.post(
        lab.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    ) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        err = (await resp.json())["error"]
        assert err["code"] == "all_pairs_full" and err["type"] == "service_unavailable_error"
    assert all(not d.requests for d in lab.decode.values())
    assert sum(len(d.requests) for d in lab.prefill.values()) == 2  # each pair tried once
    assert lab.router is not None and lab.router.metrics_port is not None
    text = await (await client.get(f"http://127.0.0.1:{lab.router.metrics_port}/metrics")).text()
    assert _samples(text, "tandem_router_client_rejects_total") == {
        (("pool", "ml/speed"), ("reason", "all_pairs_full")): 1.0
    }
    reasons = {dict(labels)["reason"] for labels in _samples(text, "tandem_router_fast_rejects_total")}
    assert reasons == {"Prefill429"}  # the walk's Excluded skips are not counted a second time


async def test_router_pool_without_serving_pair_answers_503(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(2, state=PairState.DRAINING)
    await lab.start(make_table(pairs))
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "no_serving_pair"
    assert lab.all_requests() == 0


async def test_router_own_admission_rejects_without_calling_the_engine(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1)
    await lab.start(make_table(pairs, admission=Admission(max_in_flight=1, max_queued=1)))
    lab.decode["speed-p0"].behaviour = Behaviour(tokens_per_s=20)
    body = {"prompt": "slow", "max_tokens": 8, "stream": True}
    async with client.post(lab.url + "/v1/completions", json=body) as first:
        assert first.status == 200
        await first.content.readline()  # the first stream is open: the pair holds one request
        async with client.post(lab.url + "/v1/completions", json={"prompt": "other", "max_tokens": 1}) as second:
            assert second.status == 429
            assert second.headers["Retry-After"] == "1"
        await first.read()
    assert len(lab.prefill["speed-p0"].requests) == 1


# --- failures after the decode started -----------------------------------------------------------


async def test_router_engine_dying_mid_stream_gives_clean_error_and_no_retry(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    pairs = await lab.pairs(2)
    table = make_table(pairs)
    await lab.start(table)
    for double in lab.decode.values():
        double.behaviour = Behaviour(die_after_tokens=3)
    async with client.post(
        lab.url + "/v1/completions", json={"prompt": "die", "max_tokens": 10, "stream": True}
    ) as resp:
        assert resp.status == 200
        raw = await resp.text()
    text, events = sse_text(raw, chat=False)
    assert text == "".join(output_tokens(prompt_key({"prompt": "die"}), 3))
    assert events[-1]["error"]["code"] == "stream_broken"
    assert "[DONE]" not in raw
    assert lab.all_requests() == 2  # one prefill, one decode: no retry


async def test_router_engine_dying_before_a_whole_answer_is_502(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(2)
    await lab.start(make_table(pairs))
    for double in lab.decode.values():
        double.behaviour = Behaviour(die_after_tokens=0)
    async with client.post(lab.url + "/v1/completions", json={"prompt": "die", "max_tokens": 4}) as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["type"] == "upstream_error"
    assert lab.all_requests() == 2


# --- API surface and tables ----------------------------------------------------------------------


async def test_router_models_and_openai_errors(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1)
    await lab.start(make_table(pairs, served_model_name="org/model"))
    models = await (await client.get(lab.url + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["org/model"]
    async with client.post(lab.url + "/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "model_not_found"
    async with client.post(lab.url + "/v1/completions", data=b"{nope") as resp:
        assert resp.status == 400
        assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
    assert lab.all_requests() == 0


async def test_router_reloads_changed_table_and_keeps_last_good(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(2)
    only_p0 = make_table([pairs[0]])
    router = await lab.start(only_p0)
    assert lab.source is not None
    fingerprint = router.store.snapshot[0].fingerprint

    lab.write(make_table([pairs[1].model_copy(update={"index": 0, "id": "speed-p1"})]))
    _bump_mtime(lab.path)
    lab.source.poll(router.store)
    assert router.store.snapshot[0].fingerprint != fingerprint
    async with client.post(lab.url + "/v1/completions", json={"prompt": "after reload", "max_tokens": 1}) as resp:
        assert resp.headers[HEADER_PAIR] == "speed-p1"
    good = router.store.snapshot

    lab.path.write_text('{"apiVersion": "tandem.dev/routing-v2"}')
    _bump_mtime(lab.path)
    lab.source.poll(router.store)
    lab.path.unlink()
    lab.source.poll(router.store)
    assert router.store.snapshot is good
    assert router.metrics_port is not None
    text = await (await client.get(f"http://127.0.0.1:{router.metrics_port}/metrics")).text()
    offers = {dict(labels)["result"]: v for labels, v in _samples(text, "tandem_router_table_offers_total").items()}
    assert offers == {"ok": 2.0, "UnknownVersion": 1.0, REASON_UNREADABLE: 1.0}
    info = _samples(text, "tandem_router_table_info")
    assert [dict(labels)["fingerprint"] for labels in info] == [good[0].fingerprint]


async def test_router_health_listener_is_separate(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1)
    router = await lab.start(make_table(pairs))
    assert router.metrics_port is not None and router.metrics_port != router.port
    base = f"http://127.0.0.1:{router.metrics_port}"
    assert (await client.get(base + "/health")).status == 200
    assert (await (await client.get(base + "/ready")).json()) == {"ready": True, "tables": 1}
    assert (await client.get(lab.url + "/metrics")).status == 404  # not on the request listener


def _bump_mtime(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_router_concurrent_streams_respect_admission_and_release_counts(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    pairs = await lab.pairs(2)
    table = make_table(pairs, admission=Admission(max_in_flight=2, max_queued=2))
    router = await lab.start(table)
    for double in lab.decode.values():
        double.behaviour = Behaviour(tokens_per_s=100)

    async def one(i: int) -> int:
        body = {"prompt": f"concurrent {i}", "max_tokens": 5, "stream": True}
        async with client.post(lab.url + "/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status

    statuses = await asyncio.gather(*(one(i) for i in range(12)))
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 4  # two pairs x two slots were free at the start
    assert max(d.max_running for d in lab.decode.values()) <= 2
    assert router.router.loads.for_table(table) == {}  # every pair idle again
    assert sum(len(d.requests) for d in lab.decode.values()) == statuses.count(200)


async def test_router_classifies_between_pools_from_two_table_files(lab: Lab, client: aiohttp.ClientSession) -> None:
    text_pair, image_pair = await lab.pairs(2)
    speed = make_table([text_pair], match=Match(images=ImagesMatch.FORBIDDEN))
    images = make_table(
        [image_pair.model_copy(update={"id": "images-p0", "index": 0})],
        pool="images",
        traffic_class="images",
        match=Match(images=ImagesMatch.REQUIRED),
    )
    (lab.tmp / "speed.json").write_text(speed.to_json())
    (lab.tmp / "images.json").write_text(images.to_json())
    lab.router = await start_router([FileSource([lab.tmp / "speed.json", lab.tmp / "images.json"])])
    with_image = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    for content, want in [("plain text", "speed-p0"), (with_image, "images-p0")]:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        async with client.post(lab.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers[HEADER_PAIR] == want
    assert [len(lab.decode["speed-p0"].requests), len(lab.decode["speed-p1"].requests)] == [1, 1]


def test_file_source_reloads_on_content_change_only(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    first = make_table([])
    path.write_text(first.to_json())
    store = TableStore()
    offers: list[str | None] = []
    store.listeners.append(lambda _source, reason, _live: offers.append(reason))
    source = FileSource([path])
    source.load_once(store)
    _bump_mtime(path)  # touched, same content: no offer
    source.poll(store)
    assert offers == [None]
    path.write_text(first.to_json(indent=None))  # other bytes, same table: offered, no swap
    _bump_mtime(path)
    before = store.snapshot
    source.poll(store)
    assert offers == [None, None] and store.snapshot is before
    path.write_text(make_table([], priority=5).to_json())
    _bump_mtime(path)
    source.poll(store)
    assert store.snapshot is not before and store.snapshot[0].table.priority == 5


async def test_router_keeps_a_prefix_on_one_prefill_instance_of_a_pair_of_several(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    """A pair group of three prefill instances: a conversation's turns enter the instance its key picks
    (``tandem.routing.pick_instance``, the simulator's rule), not the idlest one, so its prefix stays cached
    there; other prefixes spread over the instances."""
    (base,) = await lab.pairs(1)
    extra = [await EngineDouble(name=f"speed-p0-prefill-{i}").start() for i in (1, 2)]
    doubles = [lab.prefill["speed-p0"], *extra]
    lab.prefill.update({f"speed-p0-extra-{i}": d for i, d in enumerate(extra, start=1)})
    more = (Endpoint(pod=f"speed-p0-prefill-{i}", address=d.address) for i, d in enumerate(extra, start=1))
    prefill = (*base.prefill, *more)
    await lab.start(make_table([base.model_copy(update={"prefill": prefill})]))

    async def served_by(prompt: str) -> int:
        before = [len(d.requests) for d in doubles]
        async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as resp:
            assert resp.status == 200
        hit = [i for i, d in enumerate(doubles) if len(d.requests) > before[i]]
        assert len(hit) == 1, hit
        return hit[0]

    prefix = "system: you are terse. " * 60  # longer than prefixChars (1000)
    turns = {await served_by(prefix + f"turn {i}") for i in range(6)}
    assert len(turns) == 1
    others = {await served_by(f"conversation {n}: " * 80) for n in range(24)}
    assert len(others) >= 2  # 24 keys on one instance of three would be a 3^-23 chance
