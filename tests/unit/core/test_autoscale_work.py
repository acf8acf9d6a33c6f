"""Work planning in compute_desired_pairs (spec.autoscaling.capacityProfile): scale-up ahead of the load,
scale-down bounded by the lead time, no data holds, bounds and step limits as for the metric rule."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.pool import AutoscalingSpec
from tandem.core.autoscale import (
    REASON_AT_MAX_PAIRS,
    REASON_HOLD_LEAD_TIME,
    REASON_HOLD_NO_DATA,
    REASON_HOLD_WORK_COVERED,
    REASON_SCALE_DOWN_WORK,
    REASON_SCALE_UP_AHEAD,
    REASON_SCALE_UP_WORK,
    SIGNAL_MODEL,
    SIGNAL_ROUTER,
    AutoscaleDecision,
    AutoscalePolicy,
    AutoscaleState,
    InstanceSample,
    MetricsSnapshot,
    PoolSample,
    ScaleContext,
    compute_desired_pairs,
)

WARM = AutoscaleState(since=-1e9)


def spec(max_pairs: int = 40, load_time: str = "240s", **profile: Any) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate(
        {
            "enabled": True,
            "minPairs": 1,
            "maxPairs": max_pairs,
            "scaleUp": {"stabilizationWindow": "0s", "period": "15s", "maxPairs": 100, "maxPercent": 1000},
            "scaleDown": {"stabilizationWindow": "300s", "period": "60s", "maxPairs": 2, "maxPercent": 10},
            "capacityProfile": {
                "prefill": [{"promptTokens": 8192, "uncachedTokensPerSecond": 16000}],
                "decode": [{"contextTokens": 10000, "streams": 32, "tokensPerSecond": 2000}],
                "loadTime": load_time,
                "burstHeadroomPercent": 0,
                **profile,
            },
        }
    )


def snapshot(
    rate: float, pairs: int, *, prompt: float = 8000.0, streams: float = 0.0, waiting: float = 0.0
) -> MetricsSnapshot:
    inst = [
        InstanceSample(pair=f"p{i}", role="prefill", running=0.0, waiting=waiting / max(pairs, 1)) for i in range(pairs)
    ]
    inst += [
        InstanceSample(pair=f"p{i}", role="decode", running=streams / max(pairs, 1), waiting=0.0) for i in range(pairs)
    ]
    return MetricsSnapshot(
        instances=tuple(inst),
        pool=PoolSample(
            request_rate=rate,
            prompt_tokens_rate=rate * prompt,
            cache_hit_ratio=0.0,
            generation_tokens_rate=rate * 10.0,
            ttft_attainment=1.0,
            tpot_attainment=1.0,
        ),
        expected_prefill=pairs,
        expected_decode=pairs,
    )


def run(
    policy: AutoscalePolicy, cur: int, snap: MetricsSnapshot, state: AutoscaleState, now: float
) -> tuple[AutoscaleDecision, AutoscaleState]:
    return compute_desired_pairs(policy, ScaleContext(current_pairs=cur, ready_pairs=cur), snap, state, now)


@pytest.mark.parametrize(
    ("rate", "cur", "want_pairs", "want_reason"),
    [
        pytest.param(4.0, 1, 4, REASON_SCALE_UP_WORK, id="a=2 needs 4 prefill instances"),
        pytest.param(4.0, 4, 4, REASON_HOLD_WORK_COVERED, id="covered holds"),
        pytest.param(100.0, 10, 40, REASON_SCALE_UP_WORK, id="capped at maxPairs"),
    ],
)
def test_work_plan_scales_to_the_model_need(rate: float, cur: int, want_pairs: int, want_reason: str) -> None:
    policy = AutoscalePolicy.from_spec(spec())
    decision, _ = run(policy, cur, snapshot(rate, cur), WARM, 0.0)
    assert decision.desired_pairs == want_pairs
    assert decision.reason == want_reason


def test_work_plan_holds_without_data() -> None:
    policy = AutoscalePolicy.from_spec(spec())
    snap = MetricsSnapshot(pool=PoolSample(request_rate=None), expected_prefill=2, expected_decode=2)
    decision, state = run(policy, 2, snap, WARM, 0.0)
    assert (decision.desired_pairs, decision.reason) == (2, REASON_HOLD_NO_DATA)
    assert state.down_blocked_until > 0


def test_work_plan_scales_up_ahead_of_a_ramp() -> None:
    policy = AutoscalePolicy.from_spec(spec())
    state, cur = WARM, 1
    reasons = []
    for i in range(30):  # the rate rises 0.1 req/s every 30 s
        snap = snapshot(1.0 + 0.1 * i, cur)
        decision, state = run(policy, cur, snap, state, i * 30.0)
        reasons.append(decision.reason)
        cur = decision.desired_pairs
    assert REASON_SCALE_UP_AHEAD in reasons
    now_need, _ = run(policy, cur, snapshot(1.0 + 0.1 * 29, cur), state, 29 * 30.0 + 1)
    assert cur > int(now_need.metrics["pairsNeeded"].split()[0])  # capacity above today's need: ahead


def test_work_plan_scale_down_waits_for_the_lead_time() -> None:
    policy = AutoscalePolicy.from_spec(spec(load_time="600s"))
    decision, state = run(policy, 7, snapshot(10.0, 7), WARM, 0.0)
    assert (decision.desired_pairs, decision.reason) == (7, REASON_HOLD_WORK_COVERED)  # a = 5 needs 7 at 99 %
    cur = 7
    t = 0.0
    seen = []
    while t < 1500.0:
        t += 30.0
        decision, state = run(policy, cur, snapshot(1.0, cur), state, t)
        seen.append((t, decision.reason))
        cur = decision.desired_pairs
    holds = [s for s, r in seen if r == REASON_HOLD_LEAD_TIME]
    downs = [s for s, r in seen if r == REASON_SCALE_DOWN_WORK]
    assert holds and downs
    assert min(downs) > 600.0  # not before the peak is a lead time old
    assert cur < 7


@given(rate=st.floats(0.01, 10.0), cur=st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_work_plan_never_sits_at_max_pairs_when_the_model_needs_less(rate: float, cur: int) -> None:
    policy = AutoscalePolicy.from_spec(spec())
    decision, _ = run(policy, cur, snapshot(rate, cur), WARM, 0.0)
    needed = int(decision.metrics["pairsNeeded"].split()[2])  # "<now> now, <ahead> ahead, ..."
    if needed < 40:
        assert decision.reason != REASON_AT_MAX_PAIRS
    assert 1 <= decision.desired_pairs <= 40


def with_router(
    snap: MetricsSnapshot, ttft: float | None, tpot: float | None, unserved: float | None = None
) -> MetricsSnapshot:
    pool = replace(snap.pool, ttft_attainment=ttft, tpot_attainment=tpot, unserved_share=unserved)
    return replace(snap, pool=pool)


@pytest.mark.parametrize(
    ("ttft", "tpot", "unserved", "waiting", "want_prefill", "want_decode", "want_signal"),
    [
        pytest.param(None, None, None, 0.0, 1.0, 1.0, SIGNAL_MODEL, id="no router series: model alone, unchanged"),
        pytest.param(1.0, 1.0, 0.0, 0.0, 1.0, 1.0, SIGNAL_ROUTER, id="router at target: no correction"),
        pytest.param(0.95, 1.0, 0.0, 2.0, 1.08, 1.0, SIGNAL_ROUTER, id="TTFT short while prefill queues: raised"),
        pytest.param(
            0.95, 1.0, 0.05, 0.0, 1.08, 1.0, SIGNAL_ROUTER, id="TTFT short from rejects the engines never queued"
        ),
        pytest.param(0.95, 1.0, 0.0, 0.0, 1.0, 1.0, SIGNAL_ROUTER, id="TTFT short with no queue: service time, kept"),
        pytest.param(1.0, 0.90, 0.0, 0.0, 1.0, 1.1, SIGNAL_ROUTER, id="TPOT short: decode raised, step capped"),
        pytest.param(None, 0.90, None, 0.0, 1.0, 1.1, SIGNAL_ROUTER, id="one SLO answered is the router's signal"),
    ],
)
def test_work_plan_corrects_on_router_attainment(
    ttft: float | None,
    tpot: float | None,
    unserved: float | None,
    waiting: float,
    want_prefill: float,
    want_decode: float,
    want_signal: str,
) -> None:
    policy = AutoscalePolicy.from_spec(spec())
    snap = with_router(snapshot(4.0, 4, waiting=waiting), ttft, tpot, unserved)
    decision, state = run(policy, 4, snap, WARM, 0.0)
    assert state.work is not None
    assert state.work.prefill_correction == pytest.approx(want_prefill)
    assert state.work.decode_correction == pytest.approx(want_decode)
    assert decision.metrics["signal"] == want_signal
    assert want_signal in decision.message


def test_work_plan_rejects_raise_the_pairs_the_engines_alone_would_not() -> None:
    """Overload the admission cap turned into rejects: the engines show no queue, the router's attainment
    does, and the pool grows within a few evaluations where the model alone would hold."""
    policy = AutoscalePolicy.from_spec(spec())
    model_only = router = WARM
    cur_model = cur_router = 4
    for i in range(10):
        d1, model_only = run(policy, cur_model, snapshot(4.0, cur_model), model_only, i * 30.0)
        snap = with_router(snapshot(4.0, cur_router), 0.90, 0.90, 0.10)
        d2, router = run(policy, cur_router, snap, router, i * 30.0)
        cur_model, cur_router = d1.desired_pairs, d2.desired_pairs
    assert cur_model == 4
    assert cur_router > 4


@pytest.mark.parametrize(
    ("measured", "want_first_down_after"),
    [
        pytest.param(None, 600.0, id="declared 600 s: the peak is kept 600 s"),
        pytest.param(120.0, 120.0, id="measured 120 s: the peak is kept 120 s, not 600 s"),
        pytest.param(900.0, 600.0, id="measured 900 s is bounded by the declared 600 s"),
    ],
)
def test_work_plan_scale_down_follows_the_measured_load_time(
    measured: float | None, want_first_down_after: float
) -> None:
    policy = AutoscalePolicy.from_spec(spec(load_time="600s"))

    def step(cur: int, rate: float, state: AutoscaleState, t: float) -> tuple[AutoscaleDecision, AutoscaleState]:
        context = ScaleContext(current_pairs=cur, ready_pairs=cur, measured_load_s=measured)
        return compute_desired_pairs(policy, context, snapshot(rate, cur), state, t)

    decision, state = step(7, 10.0, WARM, 0.0)
    cur, t, downs = 7, 0.0, []
    while t < 1500.0:
        t += 30.0
        decision, state = step(cur, 1.0, state, t)
        if decision.reason == REASON_SCALE_DOWN_WORK:
            downs.append(t)
        cur = decision.desired_pairs
    assert downs
    assert want_first_down_after < min(downs) <= want_first_down_after + 60.0


@pytest.mark.parametrize(
    ("groups", "want_pairs", "want_reason"),
    [
        pytest.param((), 4, REASON_HOLD_WORK_COVERED, id="all groups already 2P:1D: four hold 8P"),
        pytest.param(((1, 1),) * 4, 6, REASON_SCALE_UP_WORK, id="four 1P:1D hold 4P: two 2P:1D more"),
        pytest.param(((2, 1),) * 2 + ((1, 1),) * 2, 5, REASON_SCALE_UP_WORK, id="half replaced: one more"),
    ],
)
def test_work_plan_counts_groups_in_their_own_shape_while_they_cycle(
    groups: tuple[tuple[int, int], ...], want_pairs: int, want_reason: str
) -> None:
    """Issue 18 item 5: after a 1P:1D → 2P:1D change the groups take the new shape one at a time, so a
    prefill-bound need (8 instances) is sized on the groups as they are, not as if all were 2P:1D already."""
    policy = AutoscalePolicy.from_spec(spec())
    context = ScaleContext(current_pairs=4, ready_pairs=4, shape=(2, 1), group_shapes=groups)
    decision, _ = compute_desired_pairs(policy, context, snapshot(12.0, 4), WARM, 0.0)  # 8 prefill instances
    assert (decision.desired_pairs, decision.reason) == (want_pairs, want_reason)
