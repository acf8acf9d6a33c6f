"""Canary-vs-stable comparisons (``core.comparison``): table tests and seeded statistical properties.

The properties sample requests from the same kind of distributions the W5 benchmark meets (lognormal
TPOT around 7 ms, inside vLLM's first TPOT bucket; lognormal TTFT around 0.6 s; 0.5 % stable errors)
and bucket them with vLLM's real bounds (reference/vllm-0.32-cpu-metrics.txt). Seeds are fixed, so
every run sees the same samples.
"""

from __future__ import annotations

import bisect
import math
import random

import pytest

from tandem.core import comparison as cmp

TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
TRIALS = 200
CANARY_REQUESTS = 40
"""W5: about 40 canary requests per 60 s window at 5 % of the speed pool's peak."""
STABLE_REQUESTS = 700


def histogram(values: list[float], bounds: tuple[float, ...]) -> cmp.LatencyHistogram:
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    cumulative, running = [], 0
    for le, c in zip((*bounds, math.inf), counts, strict=True):
        running += c
        cumulative.append((le, float(running)))
    return cmp.LatencyHistogram(tuple(cumulative), float(len(values)), sum(values))


def lognormal(rng: random.Random, n: int, median: float, sigma: float, scale: float = 1.0) -> list[float]:
    return [scale * median * math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(n)]


TPOT = (0.006, 0.1)  # median 6 ms, × 1.3 = 7.8 ms: over 99 % of either revision's requests in the first bucket
TTFT = (0.6, 0.5)


def latency_trial(seed: int, dist: tuple[float, float], bounds: tuple[float, ...], scale: float) -> cmp.Comparison:
    rng = random.Random(seed)
    canary = histogram(lognormal(rng, CANARY_REQUESTS, *dist, scale=scale), bounds)
    stable = histogram(lognormal(rng, STABLE_REQUESTS, *dist), bounds)
    return cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=110)


def error_trial(seed: int, canary_rate: float, stable_rate: float = 0.005) -> cmp.Comparison:
    rng = random.Random(seed)
    canary_errors = sum(rng.random() < canary_rate for _ in range(CANARY_REQUESTS * 10))
    stable_errors = sum(rng.random() < stable_rate for _ in range(STABLE_REQUESTS * 10))
    return cmp.compare_error_rates(
        cmp.ErrorCounts(CANARY_REQUESTS * 10, canary_errors),
        cmp.ErrorCounts(STABLE_REQUESTS * 10, stable_errors),
        confidence_percent=99,
    )


# --- (a) identical canary and stable: false alarms at most about alpha ------------------------------


@pytest.mark.parametrize(
    ("dist", "bounds", "confidence"),
    [
        pytest.param(TPOT, TPOT_BOUNDS, 95, id="TPOT in the first bucket, 95 %"),
        pytest.param(TTFT, TTFT_BOUNDS, 95, id="TTFT across buckets, 95 %"),
        pytest.param(TTFT, TTFT_BOUNDS, 99, id="TTFT across buckets, 99 %"),
    ],
)
def test_identical_latency_is_significant_at_most_about_alpha(
    dist: tuple[float, float], bounds: tuple[float, ...], confidence: int
) -> None:
    # max ratio 100 %: only significance decides, so this measures the test's own false-alarm rate.
    alarms = 0
    for seed in range(TRIALS):
        rng = random.Random(seed)
        canary = histogram(lognormal(rng, CANARY_REQUESTS, *dist), bounds)
        stable = histogram(lognormal(rng, STABLE_REQUESTS, *dist), bounds)
        result = cmp.compare_latency(canary, stable, confidence_percent=confidence, max_mean_ratio_percent=100)
        alarms += result.worse
    assert alarms <= 2 * cmp.alpha(confidence) * TRIALS


@pytest.mark.parametrize(
    ("dist", "bounds"),
    [pytest.param(TPOT, TPOT_BOUNDS, id="TPOT"), pytest.param(TTFT, TTFT_BOUNDS, id="TTFT")],
)
def test_identical_latency_fails_at_most_alpha_with_the_default_ratio(
    dist: tuple[float, float], bounds: tuple[float, ...]
) -> None:
    """The gate's rule (99 %, mean ratio > 110 %) on W5-sized windows of a good canary."""
    failures = sum(latency_trial(seed, dist, bounds, 1.0).worse for seed in range(TRIALS))
    assert failures <= cmp.alpha(99) * TRIALS


@pytest.mark.parametrize("confidence", [pytest.param(95, id="95 %"), pytest.param(99, id="99 %")])
def test_identical_error_rates_are_significant_at_most_about_alpha(confidence: int) -> None:
    alarms = 0
    for seed in range(TRIALS):
        rng = random.Random(seed)
        a = sum(rng.random() < 0.005 for _ in range(400))
        c = sum(rng.random() < 0.005 for _ in range(7000))
        alarms += cmp.compare_error_rates(
            cmp.ErrorCounts(400, a), cmp.ErrorCounts(7000, c), confidence_percent=confidence
        ).worse
    assert alarms <= 2 * cmp.alpha(confidence) * TRIALS


# --- (b) real regressions with realistic sample sizes are detected ---------------------------------


@pytest.mark.parametrize(
    ("dist", "bounds", "scale"),
    [
        pytest.param(TPOT, TPOT_BOUNDS, 1.3, id="TPOT x 1.3 inside the first bucket"),
        pytest.param(TTFT, TTFT_BOUNDS, 1.5, id="TTFT x 1.5"),
    ],
)
def test_latency_regression_is_detected_in_one_window(
    dist: tuple[float, float], bounds: tuple[float, ...], scale: float
) -> None:
    results = [latency_trial(seed, dist, bounds, scale) for seed in range(TRIALS)]
    detected = sum(r.worse for r in results)
    assert detected >= 0.95 * TRIALS, [r.summary for r in results if not r.worse][:3]


def test_tpot_quantiles_cannot_see_what_the_mean_test_sees() -> None:
    """Why means: with p90 inside vLLM's first bucket the bucket counts of × 1.3 are nearly those of stable."""
    rng = random.Random(7)
    stable = histogram(lognormal(rng, 4000, *TPOT), TPOT_BOUNDS)
    canary = histogram(lognormal(rng, 4000, *TPOT, scale=1.3), TPOT_BOUNDS)
    assert canary.cumulative[0][1] / canary.count > 0.99 and stable.cumulative[0][1] / stable.count > 0.99
    assert canary.mean / stable.mean == pytest.approx(1.3, rel=0.02)
    result = cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=110)
    assert result.worse and "mean" in result.summary


def test_error_regression_is_detected() -> None:
    detected = sum(error_trial(seed, canary_rate=0.05).worse for seed in range(TRIALS))
    assert detected >= 0.95 * TRIALS


# --- (c) one error in 40 is not a failure -------------------------------------------------------


@pytest.mark.parametrize(
    ("canary", "stable", "want_worse"),
    [
        pytest.param(cmp.ErrorCounts(40, 1), cmp.ErrorCounts(6000, 30), False, id="1 in 40 vs 0.5 %: noise"),
        pytest.param(cmp.ErrorCounts(40, 2), cmp.ErrorCounts(6000, 30), False, id="2 in 40 vs 0.5 %: p 0.019"),
        pytest.param(cmp.ErrorCounts(40, 4), cmp.ErrorCounts(6000, 30), True, id="4 in 40 vs 0.5 %"),
        pytest.param(cmp.ErrorCounts(40, 0), cmp.ErrorCounts(6000, 30), False, id="no canary error"),
        pytest.param(cmp.ErrorCounts(39.6, 1.2), cmp.ErrorCounts(6000.4, 29.8), False, id="increase() fractions"),
        pytest.param(cmp.ErrorCounts(2000, 40), cmp.ErrorCounts(6000, 30), True, id="2 % vs 0.5 % over 2000"),
    ],
)
def test_compare_error_rates(canary: cmp.ErrorCounts, stable: cmp.ErrorCounts, want_worse: bool) -> None:
    result = cmp.compare_error_rates(canary, stable, confidence_percent=99)
    assert result.worse is want_worse
    assert "errors" in result.summary and "p=" in result.summary


def test_one_error_in_40_is_noise_over_many_windows() -> None:
    """(c) as a property: a good canary at 0.5 % never fails on an error count from one W5-sized window."""
    for seed in range(TRIALS):
        rng = random.Random(seed)
        a = sum(rng.random() < 0.005 for _ in range(CANARY_REQUESTS))
        c = sum(rng.random() < 0.005 for _ in range(STABLE_REQUESTS))
        result = cmp.compare_error_rates(
            cmp.ErrorCounts(CANARY_REQUESTS, a), cmp.ErrorCounts(STABLE_REQUESTS, c), confidence_percent=99
        )
        assert not result.worse or a >= 3, result.summary


# --- effect size and buckets --------------------------------------------------------------------


def test_a_significant_but_small_shift_does_not_fail() -> None:
    rng = random.Random(3)
    stable = histogram(lognormal(rng, 100_000, *TTFT), TTFT_BOUNDS)
    canary = histogram(lognormal(rng, 50_000, *TTFT, scale=1.05), TTFT_BOUNDS)
    result = cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=110)
    assert result.p_value < 0.01 and 1.0 < result.ratio < 1.1
    assert not result.worse


def test_a_faster_canary_never_fails() -> None:
    rng = random.Random(5)
    stable = histogram(lognormal(rng, 700, *TTFT), TTFT_BOUNDS)
    canary = histogram(lognormal(rng, 700, *TTFT, scale=0.5), TTFT_BOUNDS)
    result = cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=100)
    assert not result.worse and result.p_value > 0.5


@pytest.mark.parametrize(
    ("a", "b", "want_bounds", "want_a", "want_b"),
    [
        pytest.param(
            [(0.1, 2.0), (0.2, 5.0), (math.inf, 6.0)],
            [(0.2, 4.0), (math.inf, 4.0)],
            (0.2,),
            [5.0, 1.0],
            [4.0, 0.0],
            id="bounds only one revision has are merged away",
        ),
        pytest.param(
            [(0.1, 3.0), (0.2, 2.9), (math.inf, 3.0)],
            [(0.1, 1.0), (0.2, 1.0), (math.inf, 1.0)],
            (0.1, 0.2),
            [3.0, 0.0, 0.0],
            [1.0, 0.0, 0.0],
            id="a decreasing cumulative count is clamped",
        ),
    ],
)
def test_common_buckets(
    a: list[tuple[float, float]],
    b: list[tuple[float, float]],
    want_bounds: tuple[float, ...],
    want_a: list[float],
    want_b: list[float],
) -> None:
    assert cmp.common_buckets(a, b) == (want_bounds, want_a, want_b)


def test_common_buckets_need_inf() -> None:
    with pytest.raises(ValueError, match="Inf"):
        cmp.common_buckets([(0.1, 1.0)], [(0.1, 1.0)])


def test_tpot_worked_example_of_the_module_docstring() -> None:
    stable = cmp.LatencyHistogram(((0.01, 6000.0), (0.025, 6000.0), (math.inf, 6000.0)), 6000.0, 6000 * 0.007)
    canary = cmp.LatencyHistogram(((0.01, 300.0), (0.025, 300.0), (math.inf, 300.0)), 300.0, 300 * 0.0091)
    result = cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=110)
    assert result.worse and result.ratio == pytest.approx(1.3)
    assert result.p_value == pytest.approx(2.68e-33, rel=0.01)
    assert "rank 1" in result.summary


# --- power: what a "not worse" answer is worth -------------------------------------------------------


def test_latency_power_is_a_lower_bound_of_how_often_the_effect_is_seen() -> None:
    """A canary slower by exactly the allowed ratio is flagged significant at least as often as the reported
    power says (the power uses the variance bound and the mean test alone, both conservative)."""
    seen, powers = 0, []
    for seed in range(TRIALS):
        rng = random.Random(seed)
        canary = histogram(lognormal(rng, 400, *TTFT, scale=1.1), TTFT_BOUNDS)
        stable = histogram(lognormal(rng, 4000, *TTFT), TTFT_BOUNDS)
        result = cmp.compare_latency(canary, stable, confidence_percent=99, max_mean_ratio_percent=110)
        assert result.power is not None and "power" in result.summary
        powers.append(result.power)
        seen += result.p_value < 0.01
    mean_power = sum(powers) / len(powers)
    assert 0.05 < mean_power < 0.95, mean_power  # a case where the bound says something
    assert seen / TRIALS >= mean_power - 3 * math.sqrt(mean_power * (1 - mean_power) / TRIALS)


def test_error_power_predicts_how_often_the_effect_is_seen() -> None:
    """Canaries at stable's rate + 1 point: the share flagged matches the mean reported power."""
    seen, powers = 0, []
    for seed in range(TRIALS):
        rng = random.Random(seed)
        a = sum(rng.random() < 0.015 for _ in range(800))
        c = sum(rng.random() < 0.005 for _ in range(20_000))
        result = cmp.compare_error_rates(
            cmp.ErrorCounts(800, a), cmp.ErrorCounts(20_000, c), confidence_percent=99, error_increase=0.01
        )
        assert result.power is not None and "power" in result.summary
        powers.append(result.power)
        seen += result.worse
    mean_power = sum(powers) / len(powers)
    assert 0.2 < mean_power < 0.95, mean_power
    assert abs(seen / TRIALS - mean_power) < 0.1


def test_a_w5_sized_window_has_almost_no_power_against_one_point_of_errors() -> None:
    """Why the power floor exists: 60 canary requests cannot see 0.5 % → 1.5 % (docs/design/009)."""
    result = cmp.compare_error_rates(
        cmp.ErrorCounts(60, 1), cmp.ErrorCounts(6000, 30), confidence_percent=99, error_increase=0.01
    )
    assert not result.worse and result.power is not None and result.power < 0.1
    assert "power 6.15 % at +1 pt" in result.summary


def test_without_an_effect_size_error_comparisons_report_no_power() -> None:
    result = cmp.compare_error_rates(cmp.ErrorCounts(60, 1), cmp.ErrorCounts(6000, 30), confidence_percent=99)
    assert result.power is None and "power" not in result.summary
