"""Unit tests of tandem.core.capacity.judge_request: the per-request SLO result the router counts."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.capacity import TPOT_SLO_S, judge_request, ttft_budget

MID = 135_168  # half-way between 8k and 262k tokens: budget 2 s


@pytest.mark.parametrize(
    ("prompt", "kwargs", "want"),
    [
        pytest.param(
            1_000, {"ttft_s": 0.9, "output_tokens": 11, "decode_s": 0.15}, ("met", "met"), id="short both met"
        ),
        pytest.param(
            1_000, {"ttft_s": 1.01, "output_tokens": 11, "decode_s": 0.15}, ("missed", "met"), id="1 s budget"
        ),
        pytest.param(MID, {"ttft_s": 1.9, "output_tokens": 2, "decode_s": 0.01}, ("met", "met"), id="2 s at half-way"),
        pytest.param(MID, {"ttft_s": 2.1, "output_tokens": 2, "decode_s": 0.01}, ("missed", "met"), id="over 2 s"),
        pytest.param(300_000, {"ttft_s": 2.99, "output_tokens": 1}, ("met", "met"), id="3 s past max context"),
        pytest.param(
            1_000, {"ttft_s": 0.1, "output_tokens": 101, "decode_s": 100 * 0.02}, ("met", "missed"), id="20 ms TPOT"
        ),
        pytest.param(
            1_000,
            {"ttft_s": 0.1, "output_tokens": 101, "decode_s": 100 * TPOT_SLO_S},
            ("met", "met"),
            id="TPOT at the SLO meets it",
        ),
        pytest.param(1_000, {"ttft_s": 0.1, "output_tokens": 1}, ("met", "met"), id="one token has no TPOT"),
        pytest.param(1_000, {"failure": "rejected"}, ("rejected", "rejected"), id="reject counts for both"),
        pytest.param(1_000, {"failure": "timeout"}, ("timeout", "timeout"), id="timeout counts for both"),
        pytest.param(1_000, {"failure": "error"}, ("error", "error"), id="error counts for both"),
        pytest.param(1_000, {"abandoned_after_s": 0.5}, (None, None), id="left early: nothing known"),
        pytest.param(1_000, {"abandoned_after_s": 1.5}, ("missed", None), id="left after the budget: TTFT missed"),
        pytest.param(
            1_000, {"abandoned_after_s": 5.0, "ttft_s": 0.3}, ("met", None), id="left mid-stream: TTFT as seen"
        ),
    ],
)
def test_judge_request_by_prompt_size(prompt: int, kwargs: dict[str, Any], want: tuple[str | None, str | None]) -> None:
    got = judge_request(prompt, **kwargs)
    assert (got.get("ttft"), got.get("tpot")) == want


def test_judge_request_uses_the_capacity_budget() -> None:
    for tokens in (0, 8_192, 50_000, 200_000, 262_144):
        budget = ttft_budget(tokens)
        assert judge_request(tokens, ttft_s=budget, output_tokens=1)["ttft"] == "met"
        assert judge_request(tokens, ttft_s=budget + 1e-6, output_tokens=1)["ttft"] == "missed"


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"failure": "missed"}, id="missed is not a failure"),
        pytest.param({}, id="finished without a TTFT"),
        pytest.param({"ttft_s": 0.1, "output_tokens": 5}, id="tokens without a decode time"),
    ],
)
def test_judge_request_refuses_inputs_it_cannot_judge(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        judge_request(1_000, **kwargs)
