"""Wald's sequential errors test of ``window: Step`` gates (``core.stats.errors_sprt``, ``core.comparison``).

A step gate looks at the step's cumulative counts every interval. The properties replay such steps with
W5's rates at the full request rate (stable 0.47 % errors, ≈ 78 stable and 1.6 canary requests/s on the
first 2 % step, looks every 30 s after a 90 s first one) from fixed seeds, and judge the whole step: false
alarms over every look, requests a bad canary serves before it fails, and what a powered "not worse" means.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tandem.core import comparison as cmp
from tandem.core import stats
from tandem.core.gates import look_confidence

STABLE_RATE = 0.0047
INCREASE = 0.01
LOOKS = 60  # 30 minutes of 30 s looks


def step(seed: int, canary_rate: float) -> list[tuple[int, int, int, int]]:
    """The cumulative (canary errors, canary requests, stable errors, stable requests) at each look."""
    rng = random.Random(seed)
    a = n1 = c = n2 = 0
    out = []
    for j in range(LOOKS):
        seconds = 90 if j == 0 else 30
        k1 = max(0, round(rng.gauss(1.6 * seconds, math.sqrt(1.6 * seconds))))
        k2 = round(78 * seconds)
        a += sum(rng.random() < canary_rate for _ in range(k1))
        c += sum(rng.random() < STABLE_RATE for _ in range(k2))
        n1, n2 = n1 + k1, n2 + k2
        out.append((a, n1, c, n2))
    return out


def sequential(counts: tuple[int, int, int, int], floor: float = 0.0) -> cmp.Comparison:
    a, n1, c, n2 = counts
    return cmp.compare_error_rates(
        cmp.ErrorCounts(n1, a),
        cmp.ErrorCounts(n2, c),
        confidence_percent=99,
        error_increase=INCREASE,
        sequential=True,
        power_floor=floor,
    )


def first_failure(looks: list[tuple[int, int, int, int]]) -> int | None:
    """Canary requests at the first look the sequential test calls worse (None: never in the step)."""
    return next((counts[1] for counts in looks if sequential(counts).worse), None)


def test_the_worked_example_of_the_docstring() -> None:
    assert stats.errors_sprt(12, 700, 47, 10_000, 0.01) == pytest.approx(6.65, abs=0.005)
    result = sequential((12, 700, 47, 10_000))  # decided by the mixture: ln(½·e^6.65 + 1/12·e^5.84 + …) = 6.03
    assert stats.errors_mixture_sprt(12, 700, 47, 10_000, 0.01) == pytest.approx(6.03, abs=0.005)
    assert result.worse and result.p_value == pytest.approx(math.exp(-6.03), rel=0.01)
    assert "sequential ln LR 6.03 > 4.61" in result.summary and "power 0.00 %" in result.summary


def test_a_gross_regression_fails_at_its_first_look() -> None:
    """A single +1-point alternative adds at most ln(p1/p0) per error: 4 errors in 8 against 0 in 110 gave 4.64
    and 4/11 against 1/154 only 2.77 (the tiny W5 with a 30 % erroring canary held for three looks). The mixture
    over larger increases sees such a canary at once."""
    assert stats.errors_sprt(4, 11, 1, 154, 0.01) < math.log(100)
    assert stats.errors_mixture_sprt(4, 8, 0, 110, 0.01) == pytest.approx(13.93, abs=0.01)
    assert sequential((4, 11, 1, 154)).worse
    assert sequential((4, 8, 0, 110)).worse


def test_a_good_canary_looked_at_every_30_s_for_30_minutes_false_alarms_at_most_about_alpha() -> None:
    """Ville's inequality: over all 60 looks of a step, not per look."""
    runs = 300
    alarms = sum(first_failure(step(seed, STABLE_RATE)) is not None for seed in range(runs))
    assert alarms <= 2 * 0.01 * runs, alarms


def test_a_bad_canary_fails_on_about_half_the_requests_the_alpha_spending_fisher_test_needs() -> None:
    """Why Step errors gates run Wald's test: Fisher at α/(j(j+1)) is strict at late looks (docs/design/009)."""
    runs = 100
    wald, fisher = [], []
    for seed in range(runs):
        looks = step(seed, STABLE_RATE + INCREASE)
        wald.append(first_failure(looks))
        fisher.append(
            next(
                (
                    n1
                    for j, (a, n1, c, n2) in enumerate(looks, start=1)
                    if cmp.compare_error_rates(
                        cmp.ErrorCounts(n1, a), cmp.ErrorCounts(n2, c), confidence_percent=look_confidence(99, j)
                    ).worse
                ),
                None,
            )
        )
    assert all(n is not None for n in wald), "every +1 point canary fails within the 30-minute step"
    caught_wald = [n for n in wald if n is not None]
    caught_fisher = [n if n is not None else 10**9 for n in fisher]
    assert statistics.median(caught_wald) < 0.7 * statistics.median(caught_fisher)
    assert 400 < statistics.median(caught_wald) < 1_100  # ≈ ln(100) / KL(p1 ‖ p0) ≈ 705


def test_power_is_walds_acceptance_bound() -> None:
    """A powered "not worse" (≥ 80 %) is where Wald's test would accept: rare for a bad canary, the usual end for
    a good one once its step has a few hundred requests."""
    runs = 200
    bad_accepted = 0
    good_accepted_by = []
    for seed in range(runs):
        bad = step(seed, STABLE_RATE + INCREASE)
        bad_accepted += any(not (r := sequential(x)).worse and r.power is not None and r.power >= 0.8 for x in bad[:20])
        good = step(10_000 + seed, STABLE_RATE)
        good_accepted_by.append(
            next((x[1] for x in good if (r := sequential(x)).power is not None and r.power >= 0.8), None)
        )
    assert bad_accepted <= 0.2 * runs, bad_accepted
    reached = [n for n in good_accepted_by if n is not None]
    assert len(reached) >= 0.9 * runs
    assert statistics.median(reached) < 600


def test_power_starts_at_alpha_and_is_clipped() -> None:
    nothing = sequential((0, 1, 0, 1_000))
    assert not nothing.worse and nothing.power is not None and nothing.power == pytest.approx(0.01, abs=0.01)
    against = sequential((30, 300, 5, 10_000))
    assert against.worse and against.power == 0.0
    clean = sequential((0, 5_000, 47, 10_000))
    assert not clean.worse and clean.power is not None and 0.99 < clean.power <= 1.0


def test_a_sequential_comparison_needs_the_effect_size() -> None:
    with pytest.raises(ValueError, match="effect size"):
        cmp.compare_error_rates(
            cmp.ErrorCounts(60, 1), cmp.ErrorCounts(6000, 30), confidence_percent=99, sequential=True
        )


@pytest.mark.parametrize(("a", "n1", "c", "n2"), [(-1, 10, 0, 10), (11, 10, 0, 10), (0, 0, 0, 10), (0, 10, 0, 0)])
def test_errors_sprt_rejects_impossible_counts(a: int, n1: int, c: int, n2: int) -> None:
    with pytest.raises(ValueError):
        stats.errors_sprt(a, n1, c, n2, 0.01)


def test_a_stable_arm_without_errors_still_has_a_rate() -> None:
    """Half an error keeps ``p0 > 0``: a canary with a few errors against a clean stable is not infinitely worse."""
    assert math.isfinite(stats.errors_sprt(3, 300, 0, 6_000, 0.01))
    assert stats.errors_sprt(0, 300, 0, 6_000, 0.01) < 0


SEED_16 = ((21, 1_948, 540, 103_242), (26, 2_346, 651, 123_215))
"""W5 seed 16's errors canary (+1 point) at looks 36 and 48 of a step it spent Underpowered (full-window run)."""


def test_an_undecided_step_is_decided_by_one_test_once_that_test_has_the_floors_power() -> None:
    """Wald's indifference zone: a +1-point canary that realised +0.55 point held its step for 24 minutes."""
    before, after = (sequential(x, floor=0.99) for x in SEED_16)
    assert not before.worse and before.power is not None and before.power < 0.99  # 1,948 requests: not yet
    assert "truncated" not in before.summary
    assert after.worse and after.p_value < 0.01 and after.power is not None and after.power >= 0.99
    assert "undecided; truncated (a fixed test of 2346 requests has power 99.51 %): p=0.000555 < 0.01" in after.summary
    alone = sequential(SEED_16[1])  # without a floor Wald's test alone: still undecided
    assert not alone.worse and alone.power is not None and alone.power < 0.5


def test_a_truncated_not_worse_is_powered_and_one_worse_needs_significance() -> None:
    """18 errors in 2,346 (0.77 %) is undecided by Wald but not significant: a powered pass; 22 (0.94 %) is."""
    held = sequential((18, 2_346, 651, 123_215), floor=0.99)
    assert not held.worse and held.power is not None and held.power >= 0.99 and "p=0.0816 ≥ 0.01" in held.summary
    assert sequential((22, 2_346, 651, 123_215), floor=0.99).worse
    decided = sequential((14, 2_346, 651, 123_215), floor=0.99)  # Wald accepted: its own power, no single test
    assert not decided.worse and "truncated" not in decided.summary and decided.power is not None
    assert decided.power > 0.999


def test_truncation_leaves_no_step_undecided_and_keeps_false_alarms_within_two_alpha() -> None:
    """Every 30-minute step ends decided, at a cost in false alarms bounded by the one added test per run."""
    runs = 150
    good = [[sequential(x, floor=0.99) for x in step(seed, STABLE_RATE)] for seed in range(runs)]
    alarms = sum(any(r.worse for r in looks) for looks in good)
    assert alarms <= 2 * 2 * 0.01 * runs, alarms
    half = [[sequential(x, floor=0.99) for x in step(20_000 + seed, STABLE_RATE + INCREASE / 2)] for seed in range(50)]
    undecided = [looks for looks in half if all(not r.worse and (r.power or 0.0) < 0.99 for r in looks[-5:])]
    assert not undecided, len(undecided)
