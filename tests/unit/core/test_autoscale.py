"""The pair autoscaling policy: table tests for each rule, hypothesis properties for its invariants."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tandem.api.pool import AutoscalingSpec
from tandem.api.pool_status import ScalingDecision
from tandem.core.autoscale import (
    METRIC_IN_FLIGHT_DECODE,
    METRIC_KV_CACHE,
    REASON_AT_MAX_PAIRS,
    REASON_AT_MIN_PAIRS,
    REASON_DISABLED,
    REASON_HOLD_CAPACITY_FIRST,
    REASON_HOLD_CAPACITY_PENDING,
    REASON_HOLD_NO_DATA,
    REASON_HOLD_NO_TARGETS,
    REASON_HOLD_PARTIAL_DATA,
    REASON_HOLD_SERVICE_BOUND,
    REASON_HOLD_STABILIZING,
    REASON_HOLD_STEP_LIMIT,
    REASON_HOLD_WITHIN_TOLERANCE,
    REASON_LIMITED_BY_CAPACITY,
    REASON_RATIO_AT_BOUNDS,
    REASON_RATIO_BALANCED,
    REASON_RATIO_DECODE_BOUND,
    REASON_RATIO_DISABLED,
    REASON_RATIO_DWELL,
    REASON_RATIO_NO_DATA,
    REASON_RATIO_PREFILL_BOUND,
    REASON_RATIO_ROLLOUT,
    REASON_SCALE_DOWN_IDLE,
    REASON_SCALE_DOWN_MAX_PAIRS,
    REASON_SCALE_UP_IN_FLIGHT,
    REASON_SCALE_UP_KV_CACHE,
    REASON_SCALE_UP_MIN_PAIRS,
    REASON_SCALE_UP_TPOT,
    REASON_SCALE_UP_TTFT,
    AutoscaleDecision,
    AutoscalePolicy,
    AutoscaleState,
    LearnedCeiling,
    MetricsSnapshot,
    RatioState,
    Recommendation,
    ScaleContext,
    ScaleEvent,
    compute_desired_pairs,
    compute_role_ratio,
    equivalent_pairs,
)
from tests.unit.core.factories_autoscale import (
    WARM,
    Loop,
    Plant,
    make_autoscaling,
    make_snapshot,
    no_data,
    reference_autoscaling,
    reversals,
    scaled_examples,
)

NOW = 10_000.0
KV_ONLY = make_autoscaling().targets(kv_percent=80)
SLO = make_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16, kv_percent=80)


def ctx(current: int = 10, ready: int | None = None, **kw: object) -> ScaleContext:
    return ScaleContext(current_pairs=current, ready_pairs=current if ready is None else ready, **kw)  # type: ignore[arg-type]


def decide(
    spec: AutoscalingSpec | AutoscalePolicy,
    context: ScaleContext,
    snap: MetricsSnapshot,
    state: AutoscaleState = WARM,
    now: float = NOW,
) -> tuple[AutoscaleDecision, AutoscaleState]:
    return compute_desired_pairs(spec, context, snap, state, now)


@dataclass(frozen=True)
class Case:
    spec: AutoscalingSpec
    context: ScaleContext
    snap: MetricsSnapshot
    state: AutoscaleState
    want_pairs: int
    want_reason: str


@dataclass(frozen=True)
class RatioCase:
    spec: AutoscalingSpec
    shape: tuple[int, int]
    snap: MetricsSnapshot
    state: RatioState
    hold: bool
    want_shape: tuple[int, int]
    want_reason: str


# --- table: one rule per row ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Case(
                SLO.bounds(1, 12).scale_up(pairs=100).obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=1.5, tpot=0.012).kv(0.3).obj(),
                WARM,
                12,
                REASON_SCALE_UP_TTFT,
            ),
            id="scale up on TTFT keeps within maxPairs",
        ),
        pytest.param(
            Case(
                make_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16, kv_percent=80).obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=3.0, tpot=0.012).kv(0.3).obj(),
                WARM,
                20,
                REASON_SCALE_UP_TTFT,
            ),
            id="scale up on TTFT is step-limited to max(4 pairs, 100 %)",
        ),
        pytest.param(
            Case(
                SLO.scale_up(pairs=100, percent=1000).obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=10.0, tpot=0.012).kv(0.3).obj(),
                WARM,
                20,
                REASON_SCALE_UP_TTFT,
            ),
            id="a saturated latency at most doubles the ready pairs",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=0.5, tpot=0.024).kv(0.3).obj(),
                WARM,
                15,
                REASON_SCALE_UP_TPOT,
            ),
            id="scale up on TPOT",
        ),
        pytest.param(
            Case(KV_ONLY.obj(), ctx(10), make_snapshot(10).kv(0.96).obj(), WARM, 12, REASON_SCALE_UP_KV_CACHE),
            id="scale up on KV cache is ceil(10 x 1.2) = 12 without float drift",
        ),
        pytest.param(
            Case(
                make_autoscaling().targets(in_flight=32).obj(),
                ctx(10),
                make_snapshot(10).in_flight(prefill=2, decode=40).obj(),
                WARM,
                13,
                REASON_SCALE_UP_IN_FLIGHT,
            ),
            id="scale up on decode in-flight",
        ),
        pytest.param(
            Case(KV_ONLY.obj(), ctx(10), make_snapshot(10).kv(0.88).obj(), WARM, 10, REASON_HOLD_WITHIN_TOLERANCE),
            id="ratio exactly 1 + tolerance holds",
        ),
        pytest.param(
            Case(KV_ONLY.obj(), ctx(10), make_snapshot(10).kv(0.4).obj(), WARM, 9, REASON_SCALE_DOWN_IDLE),
            id="scale down is step-limited to max(1 pair, 10 %) per 60 s",
        ),
        pytest.param(
            Case(
                KV_ONLY.scale_down(pairs=1, percent=50).obj(),
                ctx(10),
                make_snapshot(10).kv(0.2).obj(),
                WARM,
                5,
                REASON_SCALE_DOWN_IDLE,
            ),
            id="scale down by 50 % when maxPercent allows it",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(), ctx(10), make_snapshot(10).kv(0.4).obj(), AutoscaleState(), 10, REASON_HOLD_STABILIZING
            ),
            id="after a restart scale-down waits a full down window",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=0.5, tpot=0.0155).kv(0.3).obj(),
                WARM,
                10,
                REASON_HOLD_WITHIN_TOLERANCE,
            ),
            id="latency inside the dead band vetoes a KV scale-down",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=0.3, tpot=0.010).kv(0.3).obj(),
                WARM,
                9,
                REASON_SCALE_DOWN_IDLE,
            ),
            id="latency below target has no opinion: KV decides",
        ),
        pytest.param(
            Case(
                make_autoscaling().targets(ttft_p95_ms=1000).obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=0.5).obj(),
                WARM,
                9,
                REASON_SCALE_DOWN_IDLE,
            ),
            id="latency-only targets fall back to the proportional rule",
        ),
        pytest.param(Case(SLO.obj(), ctx(10), no_data(10), WARM, 10, REASON_HOLD_NO_DATA), id="NaN everywhere holds"),
        pytest.param(
            Case(SLO.obj(), ctx(10), MetricsSnapshot(), WARM, 10, REASON_HOLD_NO_DATA), id="empty snapshot holds"
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10, ready=0),
                make_snapshot(0).latency(ttft=5.0, tpot=0.1).obj(),
                WARM,
                10,
                REASON_HOLD_NO_DATA,
            ),
            id="no serving pairs holds even with latency",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(10),
                make_snapshot(10).kv(0.96).missing("decode", 2).obj(),
                WARM,
                12,
                REASON_SCALE_UP_KV_CACHE,
            ),
            id="partial data allows scale-up",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(10),
                make_snapshot(10).kv(0.2).missing("decode", 1).obj(),
                WARM,
                10,
                REASON_HOLD_PARTIAL_DATA,
            ),
            id="partial data never scales down",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(10),
                make_snapshot(10).kv(0.2).missing("decode", 1, "kv_cache_utilization").obj(),
                WARM,
                10,
                REASON_HOLD_PARTIAL_DATA,
            ),
            id="one NaN gauge is partial data",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10),
                make_snapshot(10).latency(tpot=0.010).kv(0.2).obj(),
                WARM,
                10,
                REASON_HOLD_PARTIAL_DATA,
            ),
            id="a missing configured pool latency is partial data",
        ),
        pytest.param(
            Case(SLO.bounds(4, 20).obj(), ctx(2), no_data(2), WARM, 4, REASON_SCALE_UP_MIN_PAIRS),
            id="below minPairs scales up without data",
        ),
        pytest.param(
            Case(SLO.bounds(1, 12).obj(), ctx(20), no_data(20), WARM, 12, REASON_SCALE_DOWN_MAX_PAIRS),
            id="above maxPairs scales down without data",
        ),
        pytest.param(
            Case(
                SLO.bounds(1, 12).obj(),
                ctx(20, hold_scale_down=True),
                no_data(20),
                WARM,
                20,
                REASON_HOLD_CAPACITY_FIRST,
            ),
            id="above maxPairs holds during a rollback",
        ),
        pytest.param(
            Case(
                SLO.bounds(1, 10).obj(),
                ctx(10),
                make_snapshot(10).latency(ttft=2.0, tpot=0.012).kv(0.3).obj(),
                WARM,
                10,
                REASON_AT_MAX_PAIRS,
            ),
            id="at maxPairs",
        ),
        pytest.param(
            Case(KV_ONLY.bounds(10, 20).obj(), ctx(10), make_snapshot(10).kv(0.1).obj(), WARM, 10, REASON_AT_MIN_PAIRS),
            id="at minPairs",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10, max_placeable_pairs=11, surge_pairs=1),
                make_snapshot(10).latency(ttft=2.0, tpot=0.012).kv(0.3).obj(),
                WARM,
                12,
                REASON_SCALE_UP_TTFT,
            ),
            id="scale up stops at placeable + surge",
        ),
        pytest.param(
            Case(
                SLO.obj(),
                ctx(10, max_placeable_pairs=8, surge_pairs=1),
                make_snapshot(10).latency(ttft=2.0, tpot=0.012).kv(0.3).obj(),
                WARM,
                10,
                REASON_LIMITED_BY_CAPACITY,
            ),
            id="lost GPU capacity neither adds nor removes pairs",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(10, hold_scale_down=True),
                make_snapshot(10).kv(0.2).obj(),
                WARM,
                10,
                REASON_HOLD_CAPACITY_FIRST,
            ),
            id="hold flag blocks scale-down",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(10, hold_scale_down=True),
                make_snapshot(10).kv(0.96).obj(),
                WARM,
                12,
                REASON_SCALE_UP_KV_CACHE,
            ),
            id="hold flag allows scale-up",
        ),
        pytest.param(
            Case(
                SLO.disabled().obj(),
                ctx(3),
                make_snapshot(3).latency(ttft=9.0, tpot=0.1).kv(1.0).obj(),
                WARM,
                3,
                REASON_DISABLED,
            ),
            id="disabled never changes pairs.replicas",
        ),
        pytest.param(
            Case(make_autoscaling().obj(), ctx(10), make_snapshot(10).obj(), WARM, 10, REASON_HOLD_NO_TARGETS),
            id="no targets holds",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(),
                ctx(15, ready=10),
                make_snapshot(10).kv(0.96).obj(),
                WARM,
                15,
                REASON_HOLD_CAPACITY_PENDING,
            ),
            id="pending pairs cover an over-target metric: hold, never down",
        ),
        pytest.param(
            Case(
                KV_ONLY.obj(), ctx(8, ready=10), make_snapshot(10).kv(0.68).obj(), WARM, 8, REASON_HOLD_WITHIN_TOLERANCE
            ),
            id="a below-target metric never scales up",
        ),
    ],
)
def test_compute_desired_pairs_table(case: Case) -> None:
    decision, _ = decide(case.spec, case.context, case.snap, case.state)
    assert (decision.desired_pairs, decision.reason) == (case.want_pairs, case.want_reason), decision.message
    assert decision.from_pairs == case.context.current_pairs


def test_compute_desired_pairs_worked_example_of_the_design_doc() -> None:
    """The reference fleet example (module docstring and docs/design/004-autoscaling.md)."""
    spec = reference_autoscaling().obj()
    snap = make_snapshot(60).latency(ttft=1.35, tpot=0.014).kv(0.42).obj()
    decision, state = decide(spec, ctx(60, max_placeable_pairs=94, surge_pairs=1), snap, AutoscaleState(), 0.0)
    assert (decision.desired_pairs, decision.reason, decision.recommendation) == (81, REASON_SCALE_UP_TTFT, 81)
    assert decision.metrics["ttftP95"] == "1.35s (target 1s)"
    assert decision.metrics[METRIC_KV_CACHE] == "0.42 (target 0.378 learned)"
    assert [(c.metric, round(c.value, 3)) for c in state.learned] == [(METRIC_KV_CACHE, 0.378)]


@pytest.mark.parametrize(
    ("snap", "want_pairs", "want_reason"),
    [
        pytest.param(
            make_snapshot(10).latency(ttft=1.6).in_flight(prefill=0.3, decode=2).kv(0.79).obj(),
            10,
            REASON_HOLD_SERVICE_BOUND,
            id="no queue at prefill: a TTFT breach more pairs cannot fix holds",
        ),
        pytest.param(
            make_snapshot(10).latency(ttft=1.6).in_flight(prefill=0.3, decode=2).kv(0.5).obj(),
            9,
            REASON_SCALE_DOWN_IDLE,
            id="...and no longer vetoes the load metrics' scale-down",
        ),
        pytest.param(
            make_snapshot(10).latency(ttft=1.6).in_flight(prefill=0.6, decode=2).kv(0.79).obj(),
            16,
            REASON_SCALE_UP_TTFT,
            id="a prefill queue: the breach scales up",
        ),
        pytest.param(
            make_snapshot(10).latency(ttft=1.6).in_flight(prefill=0.3, decode=2).kv(0.79).missing("prefill", 1).obj(),
            16,
            REASON_SCALE_UP_TTFT,
            id="partial prefill data: the guard does not apply",
        ),
        pytest.param(
            make_snapshot(10).latency(ttft=1.6).kv(0.79).obj(),
            16,
            REASON_SCALE_UP_TTFT,
            id="no in-flight gauges: the guard does not apply",
        ),
    ],
)
def test_compute_desired_pairs_ttft_breach_without_a_prefill_queue_has_no_opinion(
    snap: MetricsSnapshot, want_pairs: int, want_reason: str
) -> None:
    """A TTFT p95 over target while prefill instances hold < 0.5 requests each is service time (long uncached
    prompts), not queueing: ordering pairs would run to maxPairs and veto every scale-down (fleet benchmark
    W2: 6,725 GPUh for Tandem vs 4,301 for static peak before this rule, 3,022 after)."""
    spec = make_autoscaling().targets(ttft_p95_ms=1000, kv_percent=80).scale_down(window="0s").obj()
    decision, state = decide(spec, ctx(10), snap)
    assert (decision.desired_pairs, decision.reason) == (want_pairs, want_reason), decision.message
    if want_reason == REASON_HOLD_SERVICE_BOUND:
        assert "no queue for more pairs to cut" in decision.message and "0.3 requests each" in decision.message
        assert state.learned == ()  # a service-bound breach teaches no load ceiling


@pytest.mark.parametrize(
    ("percent", "want_pairs", "want_reason"),
    [
        pytest.param(0, 16, REASON_SCALE_UP_TTFT, id="0 turns the rule off: every breach scales up"),
        pytest.param(25, 16, REASON_SCALE_UP_TTFT, id="0.3 in flight is a queue above a 0.25 threshold"),
        pytest.param(200, 10, REASON_HOLD_SERVICE_BOUND, id="2 requests: 0.3 in flight is service bound"),
    ],
)
def test_the_service_bound_threshold_comes_from_the_spec(percent: int, want_pairs: int, want_reason: str) -> None:
    """spec.autoscaling.ttftServiceBoundInFlightPercent sets the threshold (default 50 = 0.5 requests)."""
    spec = make_autoscaling().targets(ttft_p95_ms=1000, kv_percent=80).scale_down(window="0s").obj()
    assert AutoscalePolicy.from_spec(spec).service_bound_in_flight == 0.5
    spec = spec.model_copy(update={"ttft_service_bound_in_flight_percent": percent})
    snap = make_snapshot(10).latency(ttft=1.6).in_flight(prefill=0.3, decode=2).kv(0.79).obj()
    decision, _ = decide(spec, ctx(10), snap)
    assert (decision.desired_pairs, decision.reason) == (want_pairs, want_reason), decision.message


# --- windows, step budgets, restarts --------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "state", "snap", "want_pairs", "want_reason"),
    [
        pytest.param(
            KV_ONLY.obj(),
            replace(WARM, recommendations=(Recommendation(NOW - 100, 10),)),
            make_snapshot(10).kv(0.4).obj(),
            10,
            REASON_HOLD_STABILIZING,
            id="down window keeps the highest recommendation",
        ),
        pytest.param(
            KV_ONLY.obj(),
            replace(WARM, recommendations=(Recommendation(NOW - 301, 10),)),
            make_snapshot(10).kv(0.4).obj(),
            9,
            REASON_SCALE_DOWN_IDLE,
            id="a recommendation older than the down window is forgotten",
        ),
        pytest.param(
            KV_ONLY.scale_up(window="60s").obj(),
            replace(WARM, recommendations=(Recommendation(NOW - 30, 10),)),
            make_snapshot(10).kv(0.96).obj(),
            10,
            REASON_HOLD_STABILIZING,
            id="up window keeps the lowest recommendation",
        ),
        pytest.param(
            KV_ONLY.scale_up(pairs=4, percent=1).obj(),
            replace(WARM, scale_events=(ScaleEvent(NOW - 5, 4),)),
            make_snapshot(14, decode=1).kv(1.0).obj(),
            14,
            REASON_HOLD_STEP_LIMIT,
            id="scale-ups in one period share the step budget",
        ),
        pytest.param(
            KV_ONLY.scale_up(pairs=4, percent=1).obj(),
            replace(WARM, scale_events=(ScaleEvent(NOW - 16, 4),)),
            make_snapshot(14).kv(1.0).obj(),
            18,
            REASON_SCALE_UP_KV_CACHE,
            id="a new period gives a new step budget",
        ),
        pytest.param(
            KV_ONLY.obj(),
            replace(WARM, scale_events=(ScaleEvent(NOW - 30, -1),)),
            make_snapshot(9).kv(0.2).obj(),
            9,
            REASON_HOLD_STEP_LIMIT,
            id="one scale-down per 60 s period at 10 pairs",
        ),
        pytest.param(
            KV_ONLY.obj(),
            replace(WARM, down_blocked_until=NOW + 1),
            make_snapshot(10).kv(0.2).obj(),
            10,
            REASON_HOLD_STABILIZING,
            id="a restarted down window blocks scale-down",
        ),
    ],
)
def test_compute_desired_pairs_windows_and_steps(
    spec: AutoscalingSpec, state: AutoscaleState, snap: MetricsSnapshot, want_pairs: int, want_reason: str
) -> None:
    current = len({s.pair for s in snap.instances})
    decision, _ = decide(spec, ctx(current), snap, state)
    assert (decision.desired_pairs, decision.reason) == (want_pairs, want_reason), decision.message


@pytest.mark.parametrize(
    "interruption",
    [
        pytest.param(no_data(10), id="no data restarts the down window"),
        pytest.param(make_snapshot(10).kv(0.2).missing("decode", 3).obj(), id="partial data restarts the down window"),
    ],
)
def test_compute_desired_pairs_interruption_restarts_down_window(interruption: MetricsSnapshot) -> None:
    spec = KV_ONLY.obj()
    low = make_snapshot(10).kv(0.2).obj()
    _, state = decide(spec, ctx(10), interruption, WARM, now=0.0)
    held, state = decide(spec, ctx(10), low, state, now=299.0)
    assert (held.desired_pairs, held.reason) == (10, REASON_HOLD_STABILIZING)
    moved, _ = decide(spec, ctx(10), low, state, now=300.0)
    assert (moved.desired_pairs, moved.reason) == (9, REASON_SCALE_DOWN_IDLE)


def test_compute_desired_pairs_restart_waits_full_window_then_scales_down() -> None:
    spec, low = KV_ONLY.obj(), make_snapshot(10).kv(0.2).obj()
    state = AutoscaleState()
    for t in range(0, 300, 30):
        decision, state = decide(spec, ctx(10), low, state, now=float(t))
        assert decision.desired_pairs == 10, t
    decision, _ = decide(spec, ctx(10), low, state, now=300.0)
    assert decision.reason == REASON_SCALE_DOWN_IDLE


def test_compute_desired_pairs_load_step_with_slow_loading_pairs_does_not_run_away() -> None:
    """2× demand while new pairs take 10 min to load: one doubling, then HoldCapacityPending until Ready."""
    loop = Loop(reference_autoscaling().bounds(1, 200).policy(), Plant(), current=40, load_s=600.0)
    loop.run(lambda t: 40.0 if t < 3600 else 80.0, until=3 * 3600.0)
    assert loop.log == [(3600.0, 40, 80, REASON_SCALE_UP_TTFT)]
    loading = [d.reason for d in loop.decisions if 3600 < d.at < 4200]
    assert set(loading) == {REASON_HOLD_CAPACITY_PENDING}


# --- learned ceilings -----------------------------------------------------------------------------


def test_compute_desired_pairs_breach_stops_return_to_breaching_count() -> None:
    """TPOT-bound decode, loose KV target, a latency curve so steep that a 10 % step jumps over the band:
    one breach (48 pairs), then never back to the breaching count, settled at 52 (inside the band)."""
    loop = Loop(SLO.bounds(1, 200).policy(), Plant(steep=16.0, service=0.2), current=95)
    loop.run(lambda _: 50.0, until=3 * 3600.0)
    ups = [(t, before) for t, before, after, _ in loop.log if after > before]
    assert ups == [(630.0, 48)], loop.log
    assert all(after > 48 for t, _, after, _ in loop.log if t >= 630.0), loop.log
    assert loop.current == 52
    assert not [t for t, *_ in loop.log if t > 3600.0], loop.log


def test_compute_desired_pairs_learned_ceiling_keeps_pool_above_breach_count() -> None:
    """After a breach at 10 pairs with KV 0.4, KV falling with the added pairs no longer pulls to ≤ 10."""
    _, state = decide(SLO.obj(), ctx(10), make_snapshot(10).latency(ttft=0.5, tpot=0.020).kv(0.4).obj(), WARM)
    assert [(c.metric, round(c.value, 3)) for c in state.learned] == [(METRIC_KV_CACHE, 0.36)]
    calm = make_snapshot(15).latency(ttft=0.5, tpot=0.010).kv(0.4 * 10 / 15).obj()
    with_ceiling, _ = decide(SLO.obj(), ctx(15), calm, replace(state, since=-1e9, recommendations=()))
    without, _ = decide(SLO.obj(), ctx(15), calm, WARM)
    assert (with_ceiling.recommendation, without.recommendation) == (12, 5)


def test_compute_desired_pairs_learned_ceiling_relaxes_after_hold_then_drops() -> None:
    policy = KV_ONLY.targets(tpot_p90_ms=16, kv_percent=80).policy(learn_hold_s=600.0)
    state = replace(WARM, learned=(LearnedCeiling(METRIC_KV_CACHE, 0.7, learned_at=0.0, relaxed_at=0.0),))
    calm = make_snapshot(10).latency(tpot=0.008).kv(0.5).obj()
    _, held = decide(policy, ctx(10), calm, state, now=599.0)
    assert held.learned[0].value == pytest.approx(0.7)
    _, relaxed = decide(policy, ctx(10), calm, state, now=600.0)
    assert relaxed.learned[0].value == pytest.approx(0.77)
    _, still = decide(policy, ctx(10), calm, relaxed, now=899.0)
    assert still.learned == relaxed.learned
    _, dropped = decide(policy, ctx(10), calm, relaxed, now=900.0)
    assert dropped.learned == ()


def test_compute_desired_pairs_learns_only_from_complete_data_and_configured_targets() -> None:
    breach = make_snapshot(10).latency(ttft=2.0, tpot=0.01).kv(0.3).in_flight(prefill=3, decode=20)
    _, state = decide(SLO.obj(), ctx(10), breach.obj(), WARM)
    assert [c.metric for c in state.learned] == [METRIC_KV_CACHE]
    _, state = decide(SLO.targets(ttft_p95_ms=1000, kv_percent=80, in_flight=32).obj(), ctx(10), breach.obj(), WARM)
    assert [c.metric for c in state.learned] == [METRIC_KV_CACHE, METRIC_IN_FLIGHT_DECODE]
    _, state = decide(SLO.obj(), ctx(10), breach.missing("decode", 1).obj(), WARM)
    assert state.learned == ()
    assert replace(WARM, learned=(LearnedCeiling(METRIC_KV_CACHE, 0.3, 0, 0),)).without_learned().learned == ()


def test_compute_desired_pairs_degenerate_values_never_overflow() -> None:
    """A subnormal gauge at a breach, or a degenerate ceiling in an old state, stays finite (found by hypothesis)."""
    breach = make_snapshot(10).latency(ttft=2.0, tpot=0.01).kv(5e-324).obj()
    _, state = decide(SLO.obj(), ctx(10), breach, WARM)
    assert [(c.metric, round(c.value, 9)) for c in state.learned] == [(METRIC_KV_CACHE, 0.04)]
    tiny = replace(WARM, learned=(LearnedCeiling(METRIC_KV_CACHE, 5e-324, NOW, NOW),))
    decision, _ = decide(SLO.obj(), ctx(10), make_snapshot(10).latency(ttft=0.5, tpot=0.01).kv(1.0).obj(), tiny)
    assert (decision.desired_pairs, decision.reason) == (20, REASON_SCALE_UP_KV_CACHE)  # step limit: 100 %


# --- status and events ----------------------------------------------------------------------------


def test_autoscale_decision_to_status_fits_the_status_schema() -> None:
    snap = make_snapshot(60).latency(ttft=1.35, tpot=0.014).kv(0.42).hit(0.9).missing("decode", 2).obj()
    spec = reference_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16, kv_percent=80, in_flight=32).obj()
    decision, _ = decide(spec, ctx(60, max_placeable_pairs=61), snap)
    status = decision.to_status(datetime(2026, 1, 1, tzinfo=UTC))
    assert isinstance(status, ScalingDecision)
    assert (status.from_pairs, status.to_pairs, status.reason) == (60, 62, REASON_SCALE_UP_TTFT)
    assert status.metrics["data"] == "partial: kvCacheUtilization 58/60, inFlightDecode 58/60"
    assert status.metrics["limitedBy"] == "capacity"
    assert decision.warning and decision.key == (60, 62, REASON_SCALE_UP_TTFT)


# --- P:D ratio ------------------------------------------------------------------------------------

RATIO = make_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16, kv_percent=80).ratio((1, 3), (1, 3))


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).obj(),
                RatioState("prefill", NOW - 300),
                False,
                (2, 1),
                REASON_RATIO_PREFILL_BOUND,
            ),
            id="prefill at target and decode idle for the dwell: one more prefill",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=0.5, tpot=0.018).kv(0.3).obj(),
                RatioState("decode", NOW - 300),
                False,
                (1, 2),
                REASON_RATIO_DECODE_BOUND,
            ),
            id="decode-bound: one more decode",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (2, 2),
                make_snapshot(10).latency(ttft=0.5, tpot=0.018).kv(0.3).obj(),
                RatioState("decode", NOW - 300),
                False,
                (1, 2),
                REASON_RATIO_DECODE_BOUND,
            ),
            id="decode-bound from 2P:2D goes to the shape closest to the ideal ratio",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).obj(),
                RatioState("prefill", NOW - 100),
                False,
                (1, 1),
                REASON_RATIO_DWELL,
            ),
            id="a young verdict waits for the dwell",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).obj(),
                RatioState("decode", NOW - 1000),
                False,
                (1, 1),
                REASON_RATIO_DWELL,
            ),
            id="a flipped verdict restarts the dwell",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.0155).kv(0.3).obj(),
                RatioState("prefill", NOW - 1000),
                False,
                (1, 1),
                REASON_RATIO_BALANCED,
            ),
            id="both roles at target is balanced",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (2, 1),
                make_snapshot(10).latency(ttft=0.75, tpot=0.016).kv(0.3).obj(),
                RatioState("decode", NOW - 1000),
                False,
                (2, 1),
                REASON_RATIO_AT_BOUNDS,
            ),
            id="after 1P:1D to 2P:1D a decode-leaning pool does not flap back",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (3, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).obj(),
                RatioState("prefill", NOW - 1000),
                False,
                (3, 1),
                REASON_RATIO_AT_BOUNDS,
            ),
            id="maxPrefill reached",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).missing("decode", 1).obj(),
                RatioState("prefill", NOW - 1000),
                False,
                (1, 1),
                REASON_RATIO_NO_DATA,
            ),
            id="partial data holds the ratio",
        ),
        pytest.param(
            RatioCase(
                RATIO.obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).kv(0.3).obj(),
                RatioState("prefill", NOW - 1000),
                True,
                (1, 1),
                REASON_RATIO_ROLLOUT,
            ),
            id="a shape rollout in progress holds the ratio",
        ),
        pytest.param(
            RatioCase(
                make_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16).obj(),
                (1, 1),
                make_snapshot(10).latency(ttft=1.0, tpot=0.008).obj(),
                RatioState("prefill", NOW - 1000),
                False,
                (1, 1),
                REASON_RATIO_DISABLED,
            ),
            id="disabled",
        ),
    ],
)
def test_compute_role_ratio_table(case: RatioCase) -> None:
    decision, _ = compute_role_ratio(case.spec, case.shape, case.snap, case.state, NOW, hold=case.hold)
    assert (decision.shape, decision.reason) == (case.want_shape, case.want_reason), decision.message
    assert decision.changed == (case.want_shape != case.shape)


@pytest.mark.parametrize(
    ("pairs", "old", "new", "want_pairs"),
    [
        pytest.param(10, (1, 1), (2, 1), 10, id="1P1D to 2P1D keeps decode instances"),
        pytest.param(10, (2, 1), (1, 1), 20, id="2P1D to 1P1D keeps prefill instances"),
        pytest.param(9, (1, 2), (1, 3), 9, id="1P2D to 1P3D keeps prefill instances"),
        pytest.param(0, (1, 1), (2, 1), 0, id="zero stays zero"),
    ],
)
def test_equivalent_pairs_keeps_every_role(
    pairs: int, old: tuple[int, int], new: tuple[int, int], want_pairs: int
) -> None:
    got = equivalent_pairs(pairs, old, new)
    assert got == want_pairs
    assert got * new[0] >= pairs * old[0] and got * new[1] >= pairs * old[1]


# --- properties -----------------------------------------------------------------------------------

gauge = st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 1.0))
latency = st.one_of(st.none(), st.just(math.nan), st.floats(0.05, 10.0))
per_token = st.one_of(st.none(), st.just(math.nan), st.floats(0.004, 0.1))
count = st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 80.0))


@st.composite
def specs(draw: st.DrawFn) -> AutoscalingSpec:
    lo = draw(st.integers(0, 20))
    hi = draw(st.integers(max(lo, 1), 60))
    factory = (
        make_autoscaling()
        .targets(
            ttft_p95_ms=draw(st.sampled_from([None, 1000, 3000])),
            tpot_p90_ms=draw(st.sampled_from([None, 16])),
            kv_percent=draw(st.sampled_from([None, 50, 80])),
            in_flight=draw(st.sampled_from([None, 32])),
        )
        .bounds(lo, hi)
        .tolerance(draw(st.sampled_from([0, 5, 10, 20])))
        .scale_up(
            window=draw(st.sampled_from(["0s", "30s", "60s"])),
            period=draw(st.sampled_from(["15s", "60s"])),
            pairs=draw(st.integers(1, 8)),
            percent=draw(st.sampled_from([1, 50, 100, 200])),
        )
        .scale_down(
            window=draw(st.sampled_from(["0s", "60s", "300s"])),
            period=draw(st.sampled_from(["15s", "60s"])),
            pairs=draw(st.integers(1, 4)),
            percent=draw(st.sampled_from([1, 10, 50])),
        )
    )
    return factory.obj()


@st.composite
def snapshots(draw: st.DrawFn, pairs: int) -> MetricsSnapshot:
    factory = (
        make_snapshot(pairs)
        .latency(ttft=draw(latency), tpot=draw(per_token))
        .kv(draw(gauge))
        .gauges("prefill", running=draw(count), waiting=draw(count))
        .gauges("decode", running=draw(count), waiting=draw(count))
    )
    if draw(st.booleans()):
        factory = factory.missing(draw(st.sampled_from(["prefill", "decode"])), draw(st.integers(0, pairs)))
    return factory.obj()


@st.composite
def contexts(draw: st.DrawFn, lo: int, hi: int) -> ScaleContext:
    current = draw(st.integers(lo, hi))
    return ScaleContext(
        current_pairs=current,
        ready_pairs=draw(st.integers(0, current)),
        max_placeable_pairs=draw(st.one_of(st.none(), st.integers(0, hi + 5))),
        surge_pairs=draw(st.integers(0, 3)),
        hold_scale_down=draw(st.booleans()),
    )


@st.composite
def histories(draw: st.DrawFn) -> AutoscaleState:
    """A state as a previous run could leave it (any recommendations, events, windows, ceilings)."""
    recs = draw(st.lists(st.tuples(st.floats(NOW - 400, NOW), st.integers(0, 80)), max_size=12))
    events = draw(st.lists(st.tuples(st.floats(NOW - 100, NOW), st.integers(-5, 5).filter(bool)), max_size=4))
    return AutoscaleState(
        since=draw(st.one_of(st.none(), st.floats(NOW - 1000, NOW))),
        down_blocked_until=draw(st.floats(NOW - 500, NOW + 500)),
        recommendations=tuple(Recommendation(t, n) for t, n in sorted(recs)),
        scale_events=tuple(ScaleEvent(t, d) for t, d in sorted(events)),
        learned=draw(
            st.sampled_from([(), (LearnedCeiling(METRIC_KV_CACHE, 0.3, NOW - 100, NOW - 100),)]),
        ),
    )


@st.composite
def one_evaluation(draw: st.DrawFn) -> tuple[AutoscalingSpec, ScaleContext, MetricsSnapshot, AutoscaleState]:
    spec = draw(specs())
    context = draw(contexts(spec.min_pairs, spec.max_pairs))
    return spec, context, draw(snapshots(context.ready_pairs)), draw(histories())


@scaled_examples(1.0)
@given(one_evaluation())
def test_compute_desired_pairs_respects_bounds_capacity_and_partial_data(
    case: tuple[AutoscalingSpec, ScaleContext, MetricsSnapshot, AutoscaleState],
) -> None:
    spec, context, snap, state = case
    decision, _ = compute_desired_pairs(spec, context, snap, state, NOW)
    cur, new = context.current_pairs, decision.desired_pairs
    assert spec.min_pairs <= new <= spec.max_pairs
    if context.max_placeable_pairs is not None:
        assert new <= max(cur, context.max_placeable_pairs + context.surge_pairs)
    if decision.data != "complete" or context.hold_scale_down:
        assert new >= cur, decision.message
    if decision.data == "none":
        assert new == cur
    decision.to_status(datetime(2026, 1, 1, tzinfo=UTC))  # always fits the status schema


@scaled_examples(1.0)
@given(one_evaluation(), st.booleans())
def test_compute_desired_pairs_is_idempotent_and_a_repeated_hold_holds(
    case: tuple[AutoscalingSpec, ScaleContext, MetricsSnapshot, AutoscaleState], nodata: bool
) -> None:
    spec, context, snap, state = case
    if nodata:
        snap = no_data(context.ready_pairs)
    first = compute_desired_pairs(spec, context, snap, state, NOW)
    assert compute_desired_pairs(spec, context, snap, state, NOW) == first
    decision, after = first
    if not decision.changed:
        again, _ = compute_desired_pairs(spec, context, snap, after, NOW)
        assert (again.desired_pairs, again.reason) == (decision.desired_pairs, decision.reason)


@scaled_examples(1.0)
@given(st.data())
def test_compute_desired_pairs_holds_on_no_data(data: st.DataObject) -> None:
    spec = data.draw(specs())
    context = data.draw(contexts(spec.min_pairs, spec.max_pairs))
    state = data.draw(histories())
    decision, after = compute_desired_pairs(spec, context, no_data(context.ready_pairs), state, NOW)
    assert decision.desired_pairs == context.current_pairs
    assert decision.reason in (REASON_HOLD_NO_DATA, REASON_HOLD_NO_TARGETS, REASON_LIMITED_BY_CAPACITY)
    if decision.reason == REASON_HOLD_NO_DATA:
        assert after.down_blocked_until >= NOW + AutoscalePolicy.from_spec(spec).scale_down.window_s


@scaled_examples(1.0)
@given(st.data())
def test_compute_desired_pairs_moves_out_of_bounds_counts_to_the_nearest_bound(data: st.DataObject) -> None:
    spec = data.draw(specs())
    current = data.draw(st.integers(0, 80))
    context = ScaleContext(current_pairs=current, ready_pairs=current)
    decision, _ = compute_desired_pairs(spec, context, data.draw(snapshots(current)), WARM, NOW)
    if current < spec.min_pairs:
        assert decision.desired_pairs == spec.min_pairs
    elif current > spec.max_pairs:
        assert decision.desired_pairs == spec.max_pairs
    else:
        assert spec.min_pairs <= decision.desired_pairs <= spec.max_pairs


def _step_limit_ok(policy: AutoscalePolicy, log: list[tuple[float, int, int, str]]) -> None:
    """Each change stays inside HPA's budget for its period, recomputed from the applied changes alone."""
    for i, (t, before, after, _) in enumerate(log):
        rule = policy.scale_up if after > before else policy.scale_down
        in_period = [(b, a) for (s, b, a, _) in log[:i] if s > t - rule.period_s]
        start = before - sum(a - b for b, a in in_period)
        if after > before:
            assert after <= max(start + rule.max_pairs, math.ceil(start * (1 + rule.max_percent / 100))), (t, log)
        else:
            assert after >= min(start - rule.max_pairs, math.floor(start * (1 - rule.max_percent / 100))), (t, log)


@scaled_examples(0.5)
@given(st.data())
def test_compute_desired_pairs_never_exceeds_step_limits(data: st.DataObject) -> None:
    spec = data.draw(specs())
    policy = AutoscalePolicy.from_spec(spec)
    current = data.draw(st.integers(spec.min_pairs, spec.max_pairs))
    state, log, now = AutoscaleState(), [], 0.0
    for _ in range(data.draw(st.integers(5, 30))):
        snap = data.draw(snapshots(current))
        context = ScaleContext(current_pairs=current, ready_pairs=current, hold_scale_down=data.draw(st.booleans()))
        decision, state = compute_desired_pairs(policy, context, snap, state, now)
        if decision.changed:
            log.append((now, current, decision.desired_pairs, decision.reason))
            current = decision.desired_pairs
        now += data.draw(st.sampled_from([5.0, 15.0, 30.0, 60.0]))
    _step_limit_ok(policy, log)


@scaled_examples(1.0)
@given(one_evaluation(), st.integers(20, 60))
def test_compute_desired_pairs_constant_input_moves_one_way_then_stays(
    case: tuple[AutoscalingSpec, ScaleContext, MetricsSnapshot, AutoscaleState], periods: int
) -> None:
    """A steady snapshot (same values, same ready pairs) never reverses and, once settled, stays."""
    spec, context, snap, _ = case
    state, current, counts = AutoscaleState(), context.current_pairs, []
    for i in range(periods):
        decision, state = compute_desired_pairs(spec, replace(context, current_pairs=current), snap, state, 30.0 * i)
        current = decision.desired_pairs
        counts.append(current)
    changes = [b - a for a, b in itertools.pairwise(counts) if b != a]
    assert all(c > 0 for c in changes) or all(c < 0 for c in changes), counts
    settled = counts.index(counts[-1])
    assert all(c == counts[-1] for c in counts[settled:]), counts


@scaled_examples(1.0)
@given(one_evaluation())
def test_compute_desired_pairs_constant_input_changes_once_without_step_limits(
    case: tuple[AutoscalingSpec, ScaleContext, MetricsSnapshot, AutoscaleState],
) -> None:
    spec, context, snap, _ = case
    spec = spec.model_copy(
        update={
            "scale_up": spec.scale_up.model_copy(update={"max_pairs": 512, "stabilization_window": "0s"}),
            "scale_down": spec.scale_down.model_copy(update={"max_pairs": 512, "stabilization_window": "0s"}),
        }
    )
    state, current, changes = WARM, context.current_pairs, 0
    for i in range(20):
        decision, state = compute_desired_pairs(spec, replace(context, current_pairs=current), snap, state, 30.0 * i)
        changes += decision.changed
        current = decision.desired_pairs
    assert changes <= 1


@scaled_examples(0.2)
@given(
    demand=st.floats(10.0, 80.0),
    start=st.integers(5, 120),
    steep=st.sampled_from([2.0, 3.0, 8.0]),
    kv_per_x=st.floats(0.2, 0.9),
    load_s=st.sampled_from([0.0, 60.0, 300.0]),
)
def test_compute_desired_pairs_steady_demand_settles_without_oscillation(
    demand: float, start: int, steep: float, kv_per_x: float, load_s: float
) -> None:
    """Closed loop at a steady demand (3 h), from any start: scale-downs that end in an SLO breach (a
    down→up reversal) are at least one learn-hold period apart, and nothing changes in the last hour.

    Not claimed here: ≤ 1 reversal per 10 min. From a deep overload the first breach teaches a loose
    ceiling, so one probe breach can follow the cold-start trim within minutes (see the design doc).
    """
    policy = SLO.bounds(1, 200).policy()
    loop = Loop(policy, Plant(steep=steep, kv_per_x=kv_per_x), current=start, load_s=load_s)
    loop.run(lambda _: demand, until=3 * 3600.0)
    troughs = [t for t, kind in reversals(loop.log) if kind == "up"]
    assert all(b - a >= policy.learn_hold_s for a, b in itertools.pairwise(troughs)), loop.log
    assert not [t for t, *_ in loop.log if t > 2 * 3600.0], loop.log
    _step_limit_ok(loop.policy, loop.log)


@scaled_examples(0.3)
@given(
    spike_after=st.integers(0, 20).map(lambda k: 30.0 * k),
    factor=st.floats(1.3, 8.0),
    interval=st.sampled_from([15.0, 30.0]),
    base=st.floats(20.0, 60.0),
)
def test_compute_desired_pairs_spike_then_drop_mp09(
    spike_after: float, factor: float, interval: float, base: float
) -> None:
    """MP-09: from a settled pool, a 30 s spike then a drop → 0 scale-downs inside the down window after
    the last recommendation that asked for more, and ≤ 1 oscillation (direction reversal) per 10 min."""
    policy = reference_autoscaling().bounds(1, 200).policy()
    loop = Loop(policy, Plant(), current=math.ceil(base), interval=interval)
    loop.run(lambda _: base, until=2 * 3600.0)  # settle (learned ceilings included)
    assert not [t for t, *_ in loop.log if t > 3600.0], loop.log
    spike_at = loop.now + spike_after

    def demand(t: float) -> float:
        return base * factor if spike_at <= t < spike_at + 30.0 else base

    first = len(loop.log)
    loop.run(demand, until=spike_at + 1800.0)
    after = loop.log[first:]
    asked_more = [d.at for d in loop.decisions if d.at >= spike_at and (d.recommendation or 0) > d.from_pairs]
    downs = [t for t, before, now_pairs, _ in after if now_pairs < before]
    if asked_more:
        assert all(t >= max(asked_more) + policy.scale_down.window_s for t in downs), after
    flips = [t for t, _ in reversals(after)]
    assert all(b - a >= 600 for a, b in itertools.pairwise(flips)), after


@scaled_examples(0.5)
@given(
    p=st.floats(0.1, 3.0),
    d=st.floats(0.1, 3.0),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    bounds=st.tuples(st.integers(1, 4), st.integers(1, 4)),
)
def test_compute_role_ratio_stays_in_bounds_and_moves_one_instance_per_dwell(
    p: float, d: float, shape: tuple[int, int], bounds: tuple[int, int]
) -> None:
    spec = RATIO.ratio((1, bounds[0]), (1, bounds[1])).obj()
    assume(shape[0] <= bounds[0] and shape[1] <= bounds[1])
    snap = make_snapshot(10).latency(ttft=p, tpot=0.016 * d).kv(0.2).obj()
    state, now, changes = RatioState(), 0.0, []
    for _ in range(40):
        decision, state = compute_role_ratio(spec, shape, snap, state, now)
        if decision.changed:
            (p0, d0), (p2, d2) = shape, decision.shape
            assert 1 <= p2 <= bounds[0] and 1 <= d2 <= bounds[1]
            steps = {(p0 + 1, d0), (p0, d0 - 1)} if p2 * d0 > p0 * d2 else {(p0, d0 + 1), (p0 - 1, d0)}
            assert any((p2 * k, d2 * k) in steps for k in range(1, 17)), (shape, decision.shape)
            want = REASON_RATIO_PREFILL_BOUND if p2 * d0 > p0 * d2 else REASON_RATIO_DECODE_BOUND
            assert decision.reason == want
            changes.append(now)
            shape = decision.shape
        now += 30.0
    assert all(b - a >= 300 for a, b in itertools.pairwise(changes))
