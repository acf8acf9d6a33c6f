"""Real P/D through `tandem router`: router -> prefill -> decode over each connector (issue 16).

The engines are the ones Tandem's builders produce for examples/speed-pool.yaml: with NixlConnector and no
cache, and as shipped (MooncakeConnector, the example MooncakeCache wired in; the router runs its Mooncake
leg: concurrent prefill and decode, the decode pointed at the prefill's bootstrap server). The weights are
random, so the text is nonsense, but greedy decoding (temperature 0) is deterministic: the router's
disaggregated answer must equal what one engine computes alone, streamed and not, and the decode engine
must have taken the prompt's KV from the prefill engine instead of computing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import metric_value, post_json, post_stream

# Long enough to span several 128-token KV blocks, so the transfer is more than one partial block.
PROMPT = "class Scheduler:\n    def schedule(self, requests):\n        return sorted(requests)\n" * 12
MAX_TOKENS = 12


def _greedy(served_name: str, **extra: Any) -> dict[str, Any]:
    body = {"model": served_name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    return {**body, **extra}


@dataclass(frozen=True)
class Pair:
    router: str
    prefill: BuiltEngine
    decode: BuiltEngine


FIXTURES = {
    "NixlConnector": ("router", "prefill", "decode"),
    "MooncakeConnector": ("mooncake_router", "mooncake_prefill", "mooncake_decode"),
}


@pytest.fixture(scope="module", params=list(FIXTURES))
def pair(request: pytest.FixtureRequest) -> Pair:
    """The router and its pair of real engines, per connector (the session fixtures of conftest.py)."""
    router, prefill, decode = (request.getfixturevalue(name) for name in FIXTURES[request.param])
    return Pair(router=router, prefill=prefill, decode=decode)


@pytest.fixture(scope="module")
def single_engine_text(pair: Pair, served_name: str) -> str:
    """The reference: one engine serving the whole request (no kv_transfer_params, so no P/D)."""
    out = post_json(f"{pair.prefill.engine.url}/v1/completions", _greedy(served_name))
    text: str = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == MAX_TOKENS
    return text


def test_router_pd_returns_the_single_engine_text(pair: Pair, served_name: str, single_engine_text: str) -> None:
    out = post_json(f"{pair.router}/v1/completions", _greedy(served_name))
    assert out["choices"][0]["text"] == single_engine_text
    assert out["usage"]["completion_tokens"] == MAX_TOKENS


def test_router_pd_streams_the_single_engine_text(pair: Pair, served_name: str, single_engine_text: str) -> None:
    events = post_stream(f"{pair.router}/v1/completions", _greedy(served_name, stream=True))
    text = "".join(choice["text"] for event in events for choice in event.get("choices", []))
    assert len(events) > 1
    assert text == single_engine_text


def test_decode_took_the_prompt_from_external_kv_transfer(pair: Pair, served_name: str) -> None:
    decode = pair.decode.engine
    before = metric_value(decode.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    # A prompt no engine has seen: the decode engine's prefix cache cannot serve any of it locally.
    post_json(f"{pair.router}/v1/completions", _greedy(served_name, prompt=PROMPT.replace("Scheduler", "Allocator")))
    after = metric_value(decode.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    assert after > before
