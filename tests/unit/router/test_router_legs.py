"""Leg construction per connector and what the router reads from a client body (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.router import legs
from tandem.router.request import (
    IMAGE_TOKEN_ESTIMATE,
    KIND_CHAT,
    KIND_COMPLETION,
    BadRequest,
    estimate_tokens,
    parse_request,
)

NIXL_P = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(
            {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}},
            {"model": "m", "prompt": "hi", "max_tokens": 1, "stream": False, "kv_transfer_params": NIXL_P},
            id="streamed completion: one token, not streamed, no stream_options",
        ),
        pytest.param(
            {"prompt": "hi", "max_tokens": 64, "min_tokens": 8},
            {"prompt": "hi", "max_tokens": 1, "stream": False, "kv_transfer_params": NIXL_P},
            id="min_tokens dropped (vLLM needs min <= max)",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 50},
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": 1,
                "max_tokens": 1,
                "stream": False,
                "kv_transfer_params": NIXL_P,
            },
            id="chat: max_completion_tokens capped too",
        ),
        pytest.param(
            {"prompt": "hi", "kv_transfer_params": {"client": "value"}},
            {"prompt": "hi", "max_tokens": 1, "stream": False, "kv_transfer_params": NIXL_P},
            id="client kv_transfer_params replaced",
        ),
    ],
)
def test_build_prefill_body_nixl(body: dict[str, Any], want: dict[str, Any]) -> None:
    before = dict(body)
    assert legs.build_prefill_body(body, legs.nixl_prefill_params()) == want
    assert body == before  # the client body is never changed in place


def test_nixl_decode_body_carries_prefill_params_verbatim() -> None:
    returned = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "future_field": {"x": [1]}}
    kv = legs.nixl_decode_params({"id": "cmpl-1", "kv_transfer_params": returned})
    body = {"prompt": "hi", "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True}, "min_tokens": 2}
    decode = legs.build_decode_body(body, kv)
    assert decode["kv_transfer_params"] is returned
    assert {k: v for k, v in decode.items() if k != "kv_transfer_params"} == body


@pytest.mark.parametrize(
    "response",
    [
        pytest.param({"id": "x"}, id="missing"),
        pytest.param({"kv_transfer_params": None}, id="null"),
        pytest.param(["not", "an", "object"], id="not an object"),
    ],
)
def test_nixl_decode_params_refuses_prefill_without_params(response: Any) -> None:
    with pytest.raises(legs.LegProtocolError):
        legs.nixl_decode_params(response)


def test_mooncake_legs_share_one_transfer_id() -> None:
    p = legs.mooncake_prefill_params("xfer-1")
    d = legs.mooncake_decode_params("xfer-1", legs.bootstrap_addr("10.0.0.1:8000", 8998), "eng-0")
    assert p == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "xfer-1"}
    assert d == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": "xfer-1",
        "remote_bootstrap_addr": "http://10.0.0.1:8998",
        "remote_engine_id": "eng-0",
    }
    assert legs.mooncake_decode_params("xfer-1", "http://h:1", "e", dp_rank=3)["remote_dp_rank"] == 3


@pytest.mark.parametrize(
    ("query", "rank", "want"),
    [
        pytest.param({"0": {"engine_id": "a", "worker_addr": {}}}, 0, "a", id="rank 0"),
        pytest.param({"0": {"engine_id": "a"}, "1": {"engine_id": "b"}}, 1, "b", id="rank 1"),
        pytest.param({"0": {"engine_id": "a"}}, 1, None, id="rank missing"),
        pytest.param({"0": {}}, 0, None, id="no engine id"),
        pytest.param([], 0, None, id="not an object"),
    ],
)
def test_engine_id_for_rank(query: Any, rank: int, want: str | None) -> None:
    if want is None:
        with pytest.raises(legs.LegProtocolError):
            legs.engine_id_for_rank(query, rank)
    else:
        assert legs.engine_id_for_rank(query, rank) == want


@pytest.mark.parametrize(
    ("text", "want_tokens"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("abcd", 1, id="4 bytes"),
        pytest.param("abcde", 2, id="5 bytes rounds up"),
        pytest.param("日本語", 3, id="CJK: 9 bytes"),
    ],
)
def test_estimate_tokens_is_ceil_bytes_over_four(text: str, want_tokens: int) -> None:
    assert estimate_tokens(text) == want_tokens


@pytest.mark.parametrize(
    ("kind", "body", "want_text", "want_tokens", "want_images", "want_stream"),
    [
        pytest.param(KIND_COMPLETION, {"prompt": "a" * 40}, "a" * 40, 10, False, False, id="string prompt"),
        pytest.param(KIND_COMPLETION, {"prompt": ["first", "second"]}, "first", 2, False, False, id="prompt list"),
        pytest.param(KIND_COMPLETION, {"prompt": [1, 2, 3], "stream": True}, "1,2,3", 3, False, True, id="token ids"),
        pytest.param(
            KIND_CHAT,
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
            "system\nbe brief\nuser\nhi",
            6,
            False,
            False,
            id="chat text",
        ),
        pytest.param(
            KIND_CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": "x"}}],
                    }
                ]
            },
            "user\nwhat",
            3 + IMAGE_TOKEN_ESTIMATE,
            True,
            False,
            id="chat with image",
        ),
    ],
)
def test_parse_request(
    kind: str, body: dict[str, Any], want_text: str, want_tokens: int, want_images: bool, want_stream: bool
) -> None:
    req = parse_request(kind, body)
    assert (req.routing_text, req.prompt_tokens, req.has_images, req.stream) == (
        want_text,
        want_tokens,
        want_images,
        want_stream,
    )


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        pytest.param(KIND_COMPLETION, [], id="not an object"),
        pytest.param(KIND_COMPLETION, {"max_tokens": 3}, id="no prompt"),
        pytest.param(KIND_COMPLETION, {"prompt": 3}, id="prompt not text"),
        pytest.param(KIND_CHAT, {"messages": []}, id="no messages"),
        pytest.param(KIND_CHAT, {"messages": ["x"]}, id="message not an object"),
        pytest.param(KIND_CHAT, {"messages": [{"role": "user", "content": "x"}], "model": 3}, id="model not text"),
    ],
)
def test_parse_request_refuses_unroutable_bodies(kind: str, body: Any) -> None:
    with pytest.raises(BadRequest):
        parse_request(kind, body)
