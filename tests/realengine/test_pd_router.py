"""Real P/D through `tandem router`: router -> prefill -> decode over NixlConnector (issue 16).

The engines are the ones Tandem's builders produce for examples/speed-pool.yaml (NixlConnector); the
weights are random, so the text is nonsense, but greedy decoding (temperature 0) is deterministic: the
router's disaggregated answer must equal what one engine computes alone, streamed and not, and the decode
engine must have taken the prompt's KV from the prefill engine instead of computing it.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def single_engine_text(prefill: BuiltEngine, served_name: str) -> str:
    """The reference: one engine serving the whole request (no kv_transfer_params, so no P/D)."""
    out = post_json(f"{prefill.engine.url}/v1/completions", _greedy(served_name))
    text: str = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == MAX_TOKENS
    return text


def test_router_pd_returns_the_single_engine_text(router: str, served_name: str, single_engine_text: str) -> None:
    out = post_json(f"{router}/v1/completions", _greedy(served_name))
    assert out["choices"][0]["text"] == single_engine_text
    assert out["usage"]["completion_tokens"] == MAX_TOKENS


def test_router_pd_streams_the_single_engine_text(router: str, served_name: str, single_engine_text: str) -> None:
    events = post_stream(f"{router}/v1/completions", _greedy(served_name, stream=True))
    text = "".join(choice["text"] for event in events for choice in event.get("choices", []))
    assert len(events) > 1
    assert text == single_engine_text


def test_decode_took_the_prompt_from_external_kv_transfer(
    router: str, served_name: str, decode: BuiltEngine, single_engine_text: str
) -> None:
    before = metric_value(decode.engine.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    # A prompt no engine has seen: the decode engine's prefix cache cannot serve any of it locally.
    post_json(f"{router}/v1/completions", _greedy(served_name, prompt=PROMPT.replace("Scheduler", "Allocator")))
    after = metric_value(decode.engine.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    assert after > before
