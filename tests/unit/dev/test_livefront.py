"""The live data plane's pure parts: the prompts a router sees for trace arrivals, and request ids."""

from __future__ import annotations

import pytest

from tandem.router.request import KIND_CHAT, KIND_COMPLETION, parse_request
from tandem.routing import routing_key
from tandem_lab.dev.livefront import BLOCK_CHARS, block_word, leg_of, prompt_text, request_body
from tandem_lab.sim.live import Arrival

SPEED_PREFIX_CHARS = 1000
"""The example speed pool's ``routing.prefixChars``."""


def arrival(blocks: list[int], input_tokens: int | None = None, images: bool = False) -> Arrival:
    tokens = input_tokens if input_tokens is not None else 512 * len(blocks)
    return Arrival(t=0.0, input_tokens=tokens, output_tokens=40, blocks=blocks, key=0, has_images=images)


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [
        pytest.param(512 * 3, [1, 2, 3], id="whole blocks"),
        pytest.param(700, [1, 2], id="a partial last block"),
        pytest.param(1, [9], id="one token"),
        pytest.param(131_073, list(range(257)), id="just past the speed pool's bound"),
    ],
)
def test_the_routers_token_estimate_of_a_prompt_is_the_arrivals_prompt_length(tokens: int, blocks: list[int]) -> None:
    path, body = request_body(7, arrival(blocks, tokens), "m")
    parsed = parse_request(KIND_COMPLETION, body)
    assert path == "/v1/completions"
    assert parsed.prompt_tokens == max(tokens, -(-len(body["prompt"]) // 4))
    assert parsed.prompt_tokens - tokens <= (BLOCK_CHARS + 16) // 4  # at most one block word sticks out


def test_requests_of_one_conversation_share_the_speed_pools_key_and_others_do_not() -> None:
    first_turn = prompt_text(1, arrival([0, 11, 12]))
    next_turn = prompt_text(2, arrival([0, 11, 12, 13, 14]))
    other = prompt_text(3, arrival([0, 21, 22]))
    key = lambda text: routing_key(text, SPEED_PREFIX_CHARS)  # noqa: E731
    assert key(first_turn) == key(next_turn)
    assert key(first_turn) != key(other)  # block 0 is shared by every request: the key must reach block 1


def test_block_words_have_a_fixed_width_and_differ_per_block() -> None:
    words = {block_word(b) for b in (0, 1, 2**60 + 5, 2**70)}
    assert len(words) == 4
    assert {len(w) for w in words} == {BLOCK_CHARS}


def test_an_arrival_with_images_is_a_chat_with_an_image_part() -> None:
    path, body = request_body(3, arrival([1, 2], images=True), "m")
    parsed = parse_request(KIND_CHAT, body)
    assert path == "/v1/chat/completions"
    assert parsed.has_images and parsed.stream
    assert body["max_tokens"] == 40


@pytest.mark.parametrize(
    ("request_id", "want"),
    [
        pytest.param("live-7", (7, False), id="a request"),
        pytest.param("live-", None, id="no serial"),
        pytest.param("live-4x", None, id="not a number"),
        pytest.param("abc-42", None, id="foreign id"),
        pytest.param("live-7-mirror", (7, True), id="the router's copy of it"),
        pytest.param("live--mirror", None, id="a copy of nothing"),
        pytest.param("live-7-mirror-mirror", None, id="a copy of a copy"),
        pytest.param("abc-7-mirror", None, id="a foreign id's copy"),
    ],
)
def test_leg_of_tells_a_request_from_its_mirror_copy(request_id: str, want: tuple[int, bool] | None) -> None:
    assert leg_of(request_id) == want
