"""A capacity profile learned from the pool's own engines, bounded by the declared one (issue 18 item 2):
`tandem.core.capacity.learn_profile` and its use by work planning."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core.autoscale import AutoscalePolicy, AutoscaleState, ScaleContext, compute_desired_pairs
from tandem.core.capacity import (
    MIN_LEARN_PREFILLS,
    TPOT_SLO_S,
    CapacityProfile,
    DecodePoint,
    EngineObservation,
    PrefillPoint,
    WorkDemand,
    learn_profile,
)
from tests.unit.core.test_autoscale_work import snapshot, spec

DECLARED = CapacityProfile(
    version="v1",
    prefill=(PrefillPoint(2_000, 20_000), PrefillPoint(6_000, 12_000)),
    decode=(DecodePoint(4_000, 64, 3_600), DecodePoint(8_000, 48, 2_800)),
    load_time_s=240,
)
# 1.5 req/s of 6,000-token prompts, no cache hits: 9,000 uncached tok/s; 4,000 generated tok/s over 1.5 req/s
# makes a mean context of 6,000 + 2,667 / 2 ≈ 7,333 tokens
DEMAND = WorkDemand(
    request_rate=1.5,
    prompt_tokens_per_s=9_000,
    hit_ratio=0.0,
    generation_tokens_per_s=4_000,
    decode_streams=64,
)
INTERVAL = 30.0


def seen(**kw: float | int | None) -> EngineObservation:
    base: dict[str, float | int | None] = {"prefill_busy": 1.5, "prefills_per_s": 40 / INTERVAL, "prefill_instances": 2}
    return EngineObservation(**{**base, **kw})  # type: ignore[arg-type]


def test_the_docstring_example_prefill_learns_the_slower_rate() -> None:
    got = learn_profile(DECLARED, DEMAND, seen(), INTERVAL)
    assert got.profile.prefill_rate(6_000) == pytest.approx(6_000)
    assert got.prefill_note == "learned 6,000 tok/s (declared 12,000) at 6,000 tok"
    assert got.decode_note == "declared" and got.profile.decode == DECLARED.decode
    assert got.learned


def test_prefill_phase_is_capped_at_the_instances_serving() -> None:
    """Four prefills sharing each of two instances sum to more phase-seconds than the instances have."""
    got = learn_profile(DECLARED, DEMAND, seen(prefill_busy=3.0), INTERVAL)
    assert got.profile.prefill_rate(6_000) == pytest.approx(4_500)  # 9,000 / min(3, 2), not 9,000 / 3


@pytest.mark.parametrize(
    "observation",
    [
        pytest.param(seen(prefill_busy=0.5), id="faster than declared"),
        pytest.param(seen(prefills_per_s=(MIN_LEARN_PREFILLS - 1) / INTERVAL), id="too few prefills"),
        pytest.param(seen(prefill_busy=None), id="no phase series"),
        pytest.param(seen(prefill_busy=math.nan), id="NaN phase"),
        pytest.param(seen(prefill_busy=0.0), id="no prefill phase"),
        pytest.param(seen(prefills_per_s=math.inf), id="infinite count"),
    ],
)
def test_prefill_keeps_the_declared_profile_without_evidence_of_less(observation: EngineObservation) -> None:
    got = learn_profile(DECLARED, DEMAND, observation, INTERVAL)
    assert got.profile == DECLARED
    assert (got.prefill_note, got.decode_note) == ("declared", "declared")
    assert not got.learned


def test_decode_learns_fewer_streams_from_a_slow_inter_token_latency() -> None:
    got = learn_profile(
        DECLARED, DEMAND, seen(prefill_busy=None, mean_itl_s=0.025, decode_running_per_instance=32), INTERVAL
    )
    ctx = DEMAND.mean_context_tokens
    streams, tps = got.profile.decode_capacity(ctx)
    assert streams == pytest.approx(32 * TPOT_SLO_S / 0.025)  # 21.3 streams at the SLO
    assert tps == pytest.approx(32 / 0.025)  # the 1,280 tok/s the batch delivered
    assert got.decode_note == "learned 21.3 streams (declared 50.7), ITL 25.0 ms"
    assert got.profile.prefill == DECLARED.prefill


@pytest.mark.parametrize(
    ("itl", "running", "note"),
    [
        pytest.param(0.012, 32.0, "declared", id="within the SLO: nothing learned"),
        pytest.param(0.025, 0.5, "declared", id="less than one stream per instance"),
        pytest.param(0.016, 60.0, "declared", id="60 streams within the SLO"),
        pytest.param(math.inf, 32.0, "declared", id="infinite latency is not a number"),
        pytest.param(0.030, math.nan, "declared", id="no running gauge"),
        # 60 × 16.7 / 30 = 33.3 streams at the SLO, under the declared 50.7: learned
        pytest.param(0.030, 60.0, "learned 33.3 streams (declared 50.7), ITL 30.0 ms", id="slow at a big batch"),
    ],
)
def test_decode_learning_needs_a_slow_latency_at_a_real_batch(itl: float, running: float, note: str) -> None:
    observation = seen(prefill_busy=None, mean_itl_s=itl, decode_running_per_instance=running)
    assert learn_profile(DECLARED, DEMAND, observation, INTERVAL).decode_note == note


@given(
    busy=st.floats(0.01, 50.0),
    instances=st.integers(1, 20),
    itl=st.floats(0.001, 1.0),
    running=st.floats(0.0, 200.0),
    prompt=st.floats(100.0, 200_000.0),
    hit=st.floats(0.0, 0.99),
)
@settings(max_examples=150, deadline=None)
def test_a_learned_profile_never_claims_more_than_declared(
    busy: float, instances: int, itl: float, running: float, prompt: float, hit: float
) -> None:
    demand = replace(DEMAND, prompt_tokens_per_s=DEMAND.request_rate * prompt, hit_ratio=hit)
    observation = EngineObservation(
        prefill_busy=busy,
        prefills_per_s=2.0,
        prefill_instances=instances,
        mean_itl_s=itl,
        decode_running_per_instance=running,
    )
    got = learn_profile(DECLARED, demand, observation, INTERVAL)
    assert (
        got.profile.prefill_rate(demand.mean_prompt_tokens) <= DECLARED.prefill_rate(demand.mean_prompt_tokens) + 1e-9
    )
    ctx = demand.mean_context_tokens
    assert got.profile.decode_capacity(ctx)[0] <= DECLARED.decode_capacity(ctx)[0] + 1e-9
    assert len(got.prefill_note) <= 64 and len(got.decode_note) <= 64


# --- in work planning ---------------------------------------------------------------------------------


def plan(cur: int, learn: bool = True, **pool: float) -> tuple[int, dict[str, str]]:
    """One evaluation of the test spec (16,000 declared uncached tok/s at 8,192 tokens; 32 streams) at 4 req/s of
    8,000-token prompts, 30 streams, with the engines' measurements ``pool``."""
    policy = AutoscalePolicy.from_spec(spec(learnFromEngines=learn))
    snap = snapshot(4.0, cur, streams=30.0)
    snap = replace(snap, pool=replace(snap.pool, **pool))
    decision, _ = compute_desired_pairs(
        policy, ScaleContext(current_pairs=cur, ready_pairs=cur), snap, AutoscaleState(since=-1e9), 0.0
    )
    return decision.desired_pairs, decision.metrics


def test_work_planning_sizes_on_engines_slower_than_declared() -> None:
    declared_pairs, declared = plan(4)
    assert declared_pairs == 4 and declared["prefillProfile"] == "declared"  # 32,000 tok/s / 16,000 → a = 2 → 4
    # the engines spent 4 s of prefill phase per second on 4 instances: 8,000 tok/s each, half the declared rate
    slower_pairs, slower = plan(4, prefill_busy=4.0, prefills_rate=4.0)
    assert slower["prefillProfile"] == "learned 8,000 tok/s (declared 16,000) at 8,000 tok"
    assert slower_pairs > declared_pairs
    assert slower["prefillNeed"].split()[0] != declared["prefillNeed"].split()[0]


def test_work_planning_never_shrinks_on_engines_faster_than_declared() -> None:
    assert plan(4, prefill_busy=1.0, prefills_rate=4.0) == plan(4)
    assert plan(4, itl_mean_s=0.005) == plan(4)


def test_work_planning_adds_decode_for_a_slow_inter_token_latency() -> None:
    base_pairs, _ = plan(4)
    # 30 streams on 4 decode instances at 40 ms per token: 7.5 × 16.7 / 40 = 3.1 streams per instance at the SLO
    pairs, metrics = plan(4, itl_mean_s=0.040)
    assert metrics["decodeProfile"].startswith("learned 3.1 streams (declared 32.0)")
    assert pairs > base_pairs


def test_learning_is_off_unless_the_pool_asks_for_it() -> None:
    """Off by default: batched prefills measure slower than the instance is (docs/design/012), so a pool with an
    accurate profile would be over-provisioned."""
    work = AutoscalePolicy.from_spec(spec()).work
    assert work is not None and not work.learn
    slow = {"prefill_busy": 4.0, "prefills_rate": 4.0, "itl_mean_s": 0.040}
    pairs, metrics = plan(4, learn=False, **slow)
    assert (pairs, metrics["prefillProfile"], metrics["decodeProfile"]) == (4, "declared", "declared")
    assert plan(4, learn=True, **slow)[0] > pairs
