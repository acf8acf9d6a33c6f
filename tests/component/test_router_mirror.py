"""tandem router with a mirrored canary (`revisions.canaryMirror`, a `setMirrorPairs` step) on loopback doubles: the
user is always answered by stable, the canary pair gets a non-streamed copy of exactly its pair-count keys, and a
copy that fails, or finds the canary full, never touches the user's request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tandem.router.proxy import HEADER_PAIR
from tandem.routing import Admission, Pair, Revisions, RoutingTable, compute_pair_weights, mirror_pair, routing_key
from tandem_lab.dev.enginedouble import Behaviour, output_tokens, prompt_key
from tests.component.test_router import Lab, _samples, make_table

CANARY = "speed-p3"


async def _mirror_table(lab: Lab, admission: Admission | None = None) -> RoutingTable:
    stable = await lab.pairs(3)
    canary = await lab.pairs(1, revision="r2")
    weights = compute_pair_weights([*stable, *canary], "r2", 0)
    pairs: list[Pair] = [p.model_copy(update={"weight": weights[p.id]}) for p in [*stable, *canary]]
    fields: dict[str, Any] = {
        "revisions": Revisions(stable="r1", canary="r2", canary_weight_percent=0, canary_mirror=True)
    }
    if admission is not None:
        fields["admission"] = admission
    return make_table(pairs, **fields)


def _mirrored(table: RoutingTable, prompt: str) -> bool:
    return mirror_pair(table, routing_key(prompt, table.hash.prefix_chars)).pair is not None


async def _settle(lab: Lab, count: int) -> None:
    """Wait until the canary's decode double has seen ``count`` copies (they run after the user's answer)."""
    for _ in range(200):
        if len(lab.decode[CANARY].requests) >= count and len(lab.prefill[CANARY].requests) >= count:
            return
        await asyncio.sleep(0.02)


async def _metrics(lab: Lab, client: aiohttp.ClientSession) -> str:
    assert lab.router is not None
    async with client.get(f"http://127.0.0.1:{lab.router.metrics_port}/metrics") as resp:
        return await resp.text()


async def test_the_canary_gets_a_copy_of_its_keys_and_the_user_is_answered_by_stable(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    table = await _mirror_table(lab)
    await lab.start(table)
    prompts = [f"mirror key {i}" for i in range(48)]
    want = {p for p in prompts if _mirrored(table, p)}
    assert 3 <= len(want) <= 24  # about a quarter of the keys: one pair of four by pair count
    for i, prompt in enumerate(prompts):
        stream = i % 2 == 0
        body: dict[str, Any] = {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        async with client.post(lab.url + "/v1/completions", json=body, headers={"X-Request-Id": f"u{i}"}) as resp:
            assert resp.status == 200
            assert resp.headers[HEADER_PAIR] != CANARY
            raw = await resp.text()
        if not stream:
            assert json.loads(raw)["choices"][0]["text"] == "".join(output_tokens(prompt_key(body), 4))
    await _settle(lab, len(want))
    prefill, decode = lab.prefill[CANARY].requests, lab.decode[CANARY].requests
    assert {r.body["prompt"] for r in decode} == want
    assert len(decode) == len(prefill) == len(want)
    for leg in (*prefill, *decode):
        assert leg.request_id is not None and leg.request_id.endswith("-mirror")
        assert "stream_options" not in leg.body
        assert leg.body.get("stream", False) is False
    text = await _metrics(lab, client)
    mirrors = _samples(text, "tandem_router_mirror_requests_total")
    assert sum(mirrors.values()) == len(want)
    assert all(dict(labels)["outcome"] == "ok" and dict(labels)["pair"] == CANARY for labels in mirrors)
    served = _samples(text, "tandem_router_requests_total")
    assert sum(served.values()) == len(prompts)  # copies are not client requests
    assert all(dict(labels)["revision"] == "r1" for labels in served)


async def test_a_failing_canary_copy_never_reaches_the_user(lab: Lab, client: aiohttp.ClientSession) -> None:
    table = await _mirror_table(lab)
    await lab.start(table)
    lab.prefill[CANARY].behaviour = Behaviour(status=500)
    prompts = [p for p in (f"failing {i}" for i in range(200)) if _mirrored(table, p)][:4]
    for prompt in prompts:
        async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as resp:
            assert resp.status == 200
    await _settle(lab, 0)
    for _ in range(200):
        mirrors = _samples(await _metrics(lab, client), "tandem_router_mirror_requests_total")
        if sum(mirrors.values()) >= len(prompts):
            break
        await asyncio.sleep(0.02)
    assert {dict(labels)["outcome"]: v for labels, v in mirrors.items()} == {"prefill_error": len(prompts)}
    assert not lab.decode[CANARY].requests


async def test_a_full_canary_pair_gets_no_copy(lab: Lab, client: aiohttp.ClientSession) -> None:
    table = await _mirror_table(lab, Admission(max_in_flight=1, max_queued=1))
    router = await lab.start(table)
    lab.decode[CANARY].behaviour = Behaviour(stall_s=1.0)  # the first copy holds the canary's only slot
    prompts = [p for p in (f"full {i}" for i in range(200)) if _mirrored(table, p)][:2]
    for prompt in prompts:
        async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as resp:
            assert resp.status == 200
    outcomes: dict[str, float] = {}
    for _ in range(200):
        mirrors = _samples(await _metrics(lab, client), "tandem_router_mirror_requests_total")
        outcomes = {dict(labels)["outcome"]: v for labels, v in mirrors.items()}
        if sum(outcomes.values()) >= 2:
            break
        await asyncio.sleep(0.02)
    assert outcomes == {"skipped_full": 1, "ok": 1}
    assert len(lab.prefill[CANARY].requests) == 1
    assert router.router.loads.for_table(table) == {}  # the copy's hold is released
