"""What the router measures for its SLO counter: output tokens of a relayed stream, usage counts (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.router.slo import StreamTokens, usage_count


def sse(*events: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


TOKENS = [{"choices": [{"index": 0, "text": f" t{i}"}]} for i in range(5)]
LONG = [TOKENS[0], {"choices": [{"index": 0, "text": "x" * (1 << 17)}]}, TOKENS[1]]
WITH_USAGE = [*TOKENS, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}]


@pytest.mark.parametrize(
    ("body", "split", "want"),
    [
        pytest.param(sse(*TOKENS), 0, 5, id="one chunk"),
        pytest.param(sse(*TOKENS), 7, 5, id="chunks split inside events"),
        pytest.param(sse(*TOKENS), 1, 5, id="byte by byte"),
        pytest.param(sse(*WITH_USAGE), 3, 4, id="engine usage wins over the event count"),
        pytest.param(sse(*TOKENS, done=False), 0, 5, id="no DONE"),
        pytest.param(sse(*TOKENS, done=False)[:-2], 0, 5, id="last event without its blank line"),
        pytest.param(b": keep-alive\n\n" + sse(*TOKENS[:2]), 0, 2, id="comments are not tokens"),
        pytest.param(b"data: [DONE]\n\n", 0, 0, id="empty stream"),
        pytest.param(sse(*LONG), 0, 3, id="an event over the bound is counted"),
        pytest.param(sse(*LONG), 4096, 3, id="an event over the bound, in chunks"),
        pytest.param(sse(*LONG, done=False)[:-2], 1000, 3, id="a stream ending inside a long event"),
        pytest.param(b": " + b"x" * (1 << 17) + b"\n\n" + sse(*TOKENS[:1]), 4096, 1, id="a long comment is not"),
    ],
)
def test_stream_tokens_counts_output_tokens(body: bytes, split: int, want: int) -> None:
    counter = StreamTokens()
    chunks = [body] if not split else [body[i : i + split] for i in range(0, len(body), split)]
    for chunk in chunks:
        counter.feed(chunk)
    assert counter.tokens == want


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param({"usage": {"prompt_tokens": 12}}, 12, id="count"),
        pytest.param({"usage": {"prompt_tokens": -1}}, None, id="negative"),
        pytest.param({"usage": {"prompt_tokens": True}}, None, id="bool is not a count"),
        pytest.param({"usage": {"prompt_tokens": "12"}}, None, id="string"),
        pytest.param({"usage": None}, None, id="no usage"),
        pytest.param([1], None, id="not an object"),
    ],
)
def test_usage_count_reads_only_counts(answer: Any, want: int | None) -> None:
    assert usage_count(answer, "prompt_tokens") == want


def test_stream_tokens_sees_a_long_events_blank_line_split_across_chunks() -> None:
    body = sse(*LONG)
    end = body.index(b"\n\n", len(b"data: ") + (1 << 17))  # the long event's blank line
    for cut in (end + 1, end, end + 2):  # between its two newlines, just before, just after
        counter = StreamTokens()
        counter.feed(body[:cut])
        counter.feed(body[cut:])
        assert counter.tokens == 3, cut
