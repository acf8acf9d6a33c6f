"""A mirrored canary (`setMirrorPairs`, `revisions.canaryMirror`) through `tandem router` against real prefill and
decode engines over NixlConnector.

The table has two pairs on the same real engines: the stable revision's `speed-p0` and the canary's `speed-p1`
at 0 %, mirrored. A user's streamed request whose key the canary owns by pair count is answered by stable (the
single-engine text), and the router sends the canary a non-streamed copy that runs the whole P/D protocol: the
real decode engine counts two finished requests, both with their prompt's KV from the prefill engine, and the
router counts one mirror copy, `ok`. A key the canary does not own is served once and copied never. This is the
path the canary's gates read: vLLM's own metrics count the copies.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tandem.routing import RoutingTable, mirror_pair, routing_key
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import (
    LOOPBACK,
    REPO,
    metric_value,
    post_json,
    post_stream,
)
from tests.realengine.routerproc import example_pair, router_on, warm_pd

MAX_TOKENS = 6
BASE = "def mirror(pool, revision):\n    copies = pool.canary.pairs\n" * 5


@dataclass(frozen=True)
class MirrorRouter:
    url: str
    metrics: str
    table: RoutingTable


def _table(prefill: BuiltEngine, decode: BuiltEngine, served_name: str) -> dict[str, object]:
    table = json.loads((REPO / "examples" / "router" / "speed-routing.json").read_text())
    engines = (f"{LOOPBACK}:{prefill.engine.port}", f"{LOOPBACK}:{decode.engine.port}")
    pairs = [example_pair(0, "v32", 100, *engines), example_pair(1, "v33", 0, *engines)]  # the example's NIXL
    table.update(
        pairs=pairs,
        servedModelName=served_name,
        revisions={"stable": "v32", "canary": "v33", "canaryWeightPercent": 0, "canaryMirror": True},
    )
    return table


@pytest.fixture(scope="module")
def mirror_router(
    prefill: BuiltEngine, decode: BuiltEngine, served_name: str, scratch: Path, logs: Path
) -> Iterator[MirrorRouter]:
    table = _table(prefill, decode, served_name)
    with router_on(table, "router-mirror", scratch, logs) as (url, metrics):
        warm_pd(url, served_name, prefill, decode)
        yield MirrorRouter(url, metrics, RoutingTable.model_validate(table))


def _prompt(table: RoutingTable, mirrored: bool) -> str:
    """An unseen prompt whose key the mirrored canary pair owns (or does not) by pair count."""
    for i in range(1_000):
        prompt = f"# variant {i}\n" + BASE
        if (mirror_pair(table, routing_key(prompt, table.hash.prefix_chars)).pair is not None) == mirrored:
            return prompt
    raise AssertionError("no such prompt in 1,000 variants")


def _router_copies(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return metric_value(text, "tandem_router_mirror_requests_total", outcome="ok")


def _finished(decode: BuiltEngine) -> float:
    return metric_value(decode.engine.metrics(), "vllm:request_success_total")


def _external(decode: BuiltEngine) -> float:
    return metric_value(decode.engine.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


def _settle(mirror_router: MirrorRouter, decode: BuiltEngine, copies: float, finished: float) -> None:
    """Wait for the copy (it runs after the user's answer) to finish on the engine and in the router's count."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _router_copies(mirror_router.metrics) >= copies and _finished(decode) >= finished:
            return
        time.sleep(0.5)


@pytest.mark.parametrize("mirrored", [True, False], ids=["canary's key: copied", "stable's key: not copied"])
def test_the_canary_gets_a_real_pd_copy_of_its_keys_only(
    mirror_router: MirrorRouter, prefill: BuiltEngine, decode: BuiltEngine, served_name: str, mirrored: bool
) -> None:
    prompt = _prompt(mirror_router.table, mirrored)
    body = {"model": served_name, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    alone = post_json(f"{prefill.engine.url}/v1/completions", body)["choices"][0]["text"]
    copies, finished, external = _router_copies(mirror_router.metrics), _finished(decode), _external(decode)
    events = post_stream(f"{mirror_router.url}/v1/completions", {**body, "stream": True})
    assert "".join(choice["text"] for event in events for choice in event.get("choices", [])) == alone
    want = 1 if mirrored else 0
    _settle(mirror_router, decode, copies + want, finished + 1 + want)
    time.sleep(1.0)  # a copy that should not exist gets the time to show up
    assert _router_copies(mirror_router.metrics) == copies + want
    assert _finished(decode) == finished + 1 + want  # the engine counted the copy: what the gates read
    assert _external(decode) > external  # the P/D path, for the user's request and the copy
