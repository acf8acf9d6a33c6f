"""The P:D step under work planning follows the work's per-role need, not the latency pressures (issue 18: a
pool-wide TTFT p95 is the prefill time of long prompts, so the pressure rule called such pools prefill-bound
for ever)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.api.pool import AutoscalingSpec
from tandem.core.autoscale import (
    REASON_RATIO_AT_BOUNDS,
    REASON_RATIO_BALANCED,
    REASON_RATIO_DECODE_BOUND,
    REASON_RATIO_DWELL,
    REASON_RATIO_NO_DATA,
    REASON_RATIO_PREFILL_BOUND,
    RatioState,
    compute_role_ratio,
    equivalent_pairs,
    ratio_pairs,
)
from tests.unit.core.factories_autoscale import make_snapshot, scaled_examples

DWELL = 300.0


def work_spec(max_prefill: int = 16, max_decode: int = 16) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate(
        {
            "enabled": True,
            "minPairs": 1,
            "maxPairs": 40,
            "targets": {"ttftP95Ms": 1000, "tpotP90Ms": 16, "kvCacheUtilizationPercent": 80},
            "scaleDown": {"stabilizationWindow": "300s"},
            "ratio": {"enabled": True, "maxPrefill": max_prefill, "maxDecode": max_decode},
            "capacityProfile": {
                "prefill": [{"promptTokens": 8192, "uncachedTokensPerSecond": 16000}],
                "decode": [{"contextTokens": 10000, "streams": 32, "tokensPerSecond": 2000}],
                "loadTime": "240s",
            },
        }
    )


# TTFT p95 three times its target, TPOT and KV far below theirs: the pressure rule's "prefill-bound"
PREFILL_PRESSURE = make_snapshot(8).latency(ttft=3.0, tpot=0.004).kv(0.1).obj()


def evaluate(
    need: tuple[float, float] | None,
    shape: tuple[int, int],
    *,
    until: float = 2 * DWELL,
    spec: AutoscalingSpec | None = None,
) -> list[tuple[float, tuple[int, int], str]]:
    """Evaluations every 30 s for ``until`` seconds; each (time, shape after, reason)."""
    spec = spec or work_spec()
    state, now, out = RatioState(), 0.0, []
    while now <= until:
        decision, state = compute_role_ratio(spec, shape, PREFILL_PRESSURE, state, now, need=need)
        shape = decision.shape
        out.append((now, shape, decision.reason))
        now += 30.0
    return out


def test_a_work_need_at_the_pools_ratio_keeps_the_shape_whatever_the_ttft_p95_says() -> None:
    log = evaluate((13.0, 3.5), (4, 1))  # 3.71 prefill per decode: within 10 % of 4P:1D
    assert {shape for _, shape, _ in log} == {(4, 1)}
    assert {reason for *_, reason in log} == {REASON_RATIO_BALANCED}


def test_a_prefill_heavy_need_moves_one_prefill_instance_after_the_dwell() -> None:
    log = evaluate((12.0, 2.0), (4, 1))  # 6 per decode
    changes = [(t, shape, reason) for t, shape, reason in log if shape != (4, 1)]
    assert changes[0][1:] == ((5, 1), REASON_RATIO_PREFILL_BOUND)
    assert changes[0][0] >= DWELL
    assert all(reason == REASON_RATIO_DWELL for t, _, reason in log if t < changes[0][0])


def test_a_decode_heavy_need_moves_toward_decode() -> None:
    log = evaluate((4.0, 4.0), (4, 1), until=4 * DWELL)  # 1 per decode against 4
    seen = [((4, 1), ""), *[(shape, reason) for _, shape, reason in log]]
    changes = [c for prev, c in itertools.pairwise(seen) if c[0] != prev[0]]
    # one decode more per group, in lowest terms (4P:2D is 2P:1D), then 1P:1D, and there it stays
    assert changes == [((2, 1), REASON_RATIO_DECODE_BOUND), ((1, 1), REASON_RATIO_DECODE_BOUND)]


def test_work_planning_without_this_evaluations_need_changes_nothing() -> None:
    """No fallback to the pressure rule: its prefill-bound reading is the one the work planner replaced."""
    log = evaluate(None, (4, 1))
    assert {(shape, reason) for _, shape, reason in log} == {((4, 1), REASON_RATIO_NO_DATA)}


@pytest.mark.parametrize("need", [(0.0, 3.0), (3.0, 0.0), (math.nan, 1.0), (math.inf, 1.0), (-1.0, 2.0)])
def test_an_unusable_need_changes_nothing(need: tuple[float, float]) -> None:
    assert {reason for *_, reason in evaluate(need, (2, 1))} == {REASON_RATIO_NO_DATA}


def test_at_the_bounds_the_shape_stays() -> None:
    log = evaluate((40.0, 1.0), (4, 1), spec=work_spec(max_prefill=4))
    assert {shape for _, shape, _ in log} == {(4, 1)}
    assert REASON_RATIO_AT_BOUNDS in {reason for *_, reason in log}


@scaled_examples(0.5)
@given(
    need=st.tuples(st.floats(0.5, 60.0), st.floats(0.5, 60.0)),
    shape=st.tuples(st.integers(1, 16), st.integers(1, 16)),
)
def test_the_ratio_converges_on_the_works_and_never_flaps(need: tuple[float, float], shape: tuple[int, int]) -> None:
    """Under a steady need every change moves toward the need's ratio, changes are a dwell apart, and the
    shape it settles on is within one step of the best one inside the bounds (no oscillation)."""
    log = evaluate(need, shape, until=40 * DWELL)
    target = math.log(need[0] / need[1])
    previous, changes = shape, []
    for t, now_shape, _ in log:
        if now_shape != previous:
            before = abs(math.log(previous[0] / previous[1]) - target)
            after = abs(math.log(now_shape[0] / now_shape[1]) - target)
            assert after < before, (previous, now_shape, need)
            changes.append(t)
            previous = now_shape
    assert all(b - a >= DWELL for a, b in itertools.pairwise(changes))
    last = [shape for t, shape, _ in log if t > 35 * DWELL]
    assert len(set(last)) == 1  # settled


def test_a_pd_change_keeps_the_pair_count_under_work_planning() -> None:
    """Groups take the new P:D as they cycle, so converting the count as if all changed would add groups."""
    assert ratio_pairs(4, (4, 1), (3, 1), (9.6, 3.5)) == 4
    assert ratio_pairs(10, (2, 1), (1, 1), None) == equivalent_pairs(10, (2, 1), (1, 1)) == 20
