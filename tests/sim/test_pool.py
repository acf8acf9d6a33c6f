"""The fleet benchmark scores the speed pool's traffic: prompts above its limit are routed away and counted."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.runner import stream, ttft_target_ms
from tandem_lab.sim.scenarios import ScenarioConfig, build_workload, split_pool
from tandem_lab.sim.workload import infinite_cache_hits
from tests.sim.simhelpers import tiny_workload


@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param({"scale": 0.004, "compress": 48.0, "days": 2.0}, id="W2 two days"),
        pytest.param({"scale": 0.01, "compress": 24.0, "days": 1.0}, id="W2 one day"),
    ],
)
def test_speed_pool_keeps_prompts_up_to_its_limit_and_counts_the_rest(knobs: dict[str, float]) -> None:
    p = load_params()
    built = build_workload(ScenarioConfig("W2", **knobs), p, stream(3, "arrivals"), stream(3, "generator"))
    wl, info = built.workload, built.info
    routed = info["routed_long_context"]
    assert int(wl.input_tokens.max()) <= p.pool.max_prompt_tokens
    assert routed["requests"] > 0  # TraceLab-like sessions grow past 128 k
    assert len(wl) + routed["requests"] == info["offered_requests"]
    assert info["pool"] == "speed" and info["routed_images"] == 0


def test_subset_bound_equals_an_infinite_cache_replay() -> None:
    p = load_params()
    built = build_workload(
        ScenarioConfig("W2", scale=0.004, compress=48.0, days=2.0), p, stream(3, "arrivals"), stream(3, "generator")
    )
    wl = built.workload
    assert wl.bound_hit_blocks is not None
    replay, _ = infinite_cache_hits(replace(wl, bound_hit_blocks=None))
    assert np.array_equal(wl.bound_hit_blocks, replay)


def test_traces_below_the_limit_pass_through_unchanged() -> None:
    wl = tiny_workload([0.0, 1.0], [1024, 2048], [10, 10], [[1, 2], [1, 2, 3, 4]])
    sub, info = split_pool(wl, load_params(), generated=False)
    assert sub is wl and info["routed_long_context"]["requests"] == 0


@pytest.mark.parametrize(
    ("p95_input", "want_ms"),
    [
        pytest.param(4_000, 1000, id="short prompts: 1 s"),
        pytest.param(123_627, 1909, id="speed pool p95: 1 + 2 x (123627 - 8192) / (262144 - 8192)"),
        pytest.param(262_144, 3000, id="at the pool's max context: 3 s"),
    ],
)
def test_tandem_ttft_target_is_the_budget_at_the_p95_input(p95_input: int, want_ms: int) -> None:
    wl = tiny_workload([0.0], [p95_input], [10], [[1]])
    assert ttft_target_ms(wl, load_params()) == want_ms


def test_partial_prefills_follow_vllm_knobs() -> None:
    p = load_params()
    assert p.instance.prefill_concurrency == 16384 // 4096
    fcfs = load_params(overrides={"instance": {"long_prefill_token_threshold": 0}})
    assert fcfs.instance.prefill_concurrency == 1
    explicit = load_params(overrides={"instance": {"prefill_concurrency": 2}})
    assert explicit.instance.prefill_concurrency == 2
