"""What the router measures of one request for its SLO counter (``tandem_router_slo_requests_total``).

Owns the per-request measurements the judgement needs and nothing else: the prompt's token count (the
prefill leg's ``usage.prompt_tokens`` when the engine reports it, the router's estimate otherwise), the
first- and last-token times, and the output token count of a stream. The judgement itself (budgets by prompt
size, TPOT, what a failure counts as) is :func:`tandem.core.capacity.judge_request`, the one rule the
planner and the benchmarks define; this module never decides met or missed.

Output tokens of a stream: ``usage.completion_tokens`` of the last event when the engine sends one
(``stream_options.include_usage``), else the number of SSE ``data:`` events other than ``[DONE]``. vLLM
sends one event per token, plus a role-only first event on chat streams and a usage event when asked, so the
count is at most two above the tokens: the per-request TPOT is then slightly low, never inflated.

Must not: parse every event as JSON (the relay is the hot path; only the last event is parsed), or buffer
a stream (only the bytes of the event being read are held, bounded by :data:`MAX_EVENT_BYTES`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

MAX_EVENT_BYTES: Final = 1 << 16
"""Longest SSE event held for the usage check (a usage event is well under 1 KiB); a longer one is still
counted, from its first bytes, but not held or parsed."""
_DONE: Final = b"[DONE]"


def usage_count(answer: Any, key: str) -> int | None:
    """``answer["usage"][key]`` when it is a non-negative int (an engine's JSON answer), else None."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class StreamTokens:
    """Counts a relayed SSE stream's output tokens, chunk by chunk (module docstring).

    Events end with a blank line (``\\n\\n``); a chunk may end inside one, so the unfinished tail is carried.
    """

    events: int = 0
    usage_tokens: int | None = None
    _tail: bytes = field(default=b"", repr=False)
    _long: bool | None = field(default=None, repr=False)
    """Inside an event longer than :data:`MAX_EVENT_BYTES`: whether it is a token event (None: not inside one).
    Only its last byte is held then, so a blank line split across two chunks is still seen."""

    def feed(self, chunk: bytes) -> None:
        parts = (self._tail + chunk).split(b"\n\n")
        self._tail = parts.pop()
        for event in parts:
            if self._long is not None:  # the end of the long event
                self.events += self._long
                self._long = None
                continue
            self._event(event)
        if self._long is None and len(self._tail) > MAX_EVENT_BYTES:
            self._long = self._is_token_event(self._tail)
        if self._long is not None:
            self._tail = self._tail[-1:]

    @staticmethod
    def _is_token_event(raw: bytes) -> bool:
        line = raw.strip()
        return line.startswith(b"data:") and line[5:].strip() != _DONE

    def _event(self, raw: bytes) -> None:
        if not self._is_token_event(raw):
            return
        payload = raw.strip()[5:].strip()
        self.events += 1
        if b'"usage"' in payload:
            try:
                tokens = usage_count(json.loads(payload), "completion_tokens")
            except ValueError:
                tokens = None
            if tokens is not None:
                self.usage_tokens = tokens

    @property
    def tokens(self) -> int:
        """Output tokens of the stream so far (the engine's usage when it sent one, else the event count)."""
        if self._long is not None:  # a stream that ended inside a long event
            self.events += self._long
            self._long = None
        elif self._tail.strip():
            self._event(self._tail)  # a stream that ended without the final blank line
        self._tail = b""
        return self.usage_tokens if self.usage_tokens is not None else self.events
