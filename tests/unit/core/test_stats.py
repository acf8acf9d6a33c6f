"""The one-sided tests of ``core.stats`` against values computed by hand (each case says how).

Hand computations:

- Fisher, lady tasting tea (Fisher 1935): canary 3/4, stable 1/4, K = 4, N = 8:
  P(X ≥ 3) = (C(4,3)·C(4,1) + C(4,4)·C(4,0)) / C(8,4) = (16 + 1) / 70 = 0.242857.
- Fisher, canary 7/10 vs stable 2/10: K = 9, N = 20, C(20,10) = 184,756;
  x = 7: C(9,7)·C(11,3) = 36·165 = 5,940; x = 8: 9·55 = 495; x = 9: 1·11 = 11 → 6,446 / 184,756 = 0.034889.
- Fisher, one error in 40 vs 30 in 6,000: only x ≥ 1 counts, P = 1 − C(6009,40)/C(6040,40) (exact integers).
- z with continuity correction, 30/1,000 vs 20/1,000: p̂ = 0.025, se = √(0.025·0.975·0.002) = 0.0069821,
  z = (0.03 − 0.02 − 0.001)/0.0069821 = 1.28900 → Φ̄ = 0.09870.
- Rank sum, canary [0, 2, 2] vs stable [2, 2, 0]: see ``core.stats.rank_sum_greater`` → 0.04318.
- Normal tail: Φ̄(1.644854) = 0.05, Φ̄(2.326348) = 0.01 (any z table).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core import stats


@pytest.mark.parametrize(
    ("z", "want"),
    [
        pytest.param(0.0, 0.5, id="median"),
        pytest.param(1.644854, 0.05, id="one-sided 95 %"),
        pytest.param(2.326348, 0.01, id="one-sided 99 %"),
        pytest.param(-1.644854, 0.95, id="left of the mean"),
    ],
)
def test_normal_sf_matches_the_z_table(z: float, want: float) -> None:
    assert stats.normal_sf(z) == pytest.approx(want, abs=1e-6)


def _exact_one_error_in_40() -> float:
    return float(1 - Fraction(math.comb(6009, 40), math.comb(6040, 40)))


@pytest.mark.parametrize(
    ("a", "n1", "c", "n2", "want"),
    [
        pytest.param(3, 4, 1, 4, 17 / 70, id="lady tasting tea 3/4 vs 1/4"),
        pytest.param(7, 10, 2, 10, 6446 / 184756, id="7/10 vs 2/10"),
        pytest.param(1, 40, 30, 6000, _exact_one_error_in_40(), id="1/40 vs 0.5 % of 6000"),
        pytest.param(0, 40, 30, 6000, 1.0, id="no canary error"),
        pytest.param(4, 4, 0, 4, 1 / 70, id="all canary, no stable errors"),
        pytest.param(0, 10, 0, 10, 1.0, id="no errors at all"),
    ],
)
def test_fisher_greater_matches_hand_computation(a: int, n1: int, c: int, n2: int, want: float) -> None:
    assert stats.fisher_greater(a, n1, c, n2) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    ("a", "n1", "c", "n2", "want"),
    [
        pytest.param(30, 1000, 20, 1000, 0.09870, id="3 % vs 2 % of 1000"),
        pytest.param(60, 4000, 500, 100_000, stats.normal_sf(8.364222), id="1.5 % vs 0.5 %"),
        pytest.param(0, 100, 0, 100, 1.0, id="no errors at all"),
        pytest.param(100, 100, 100, 100, 1.0, id="every request errs"),
    ],
)
def test_two_proportion_greater_matches_hand_computation(a: int, n1: int, c: int, n2: int, want: float) -> None:
    assert stats.two_proportion_greater(a, n1, c, n2) == pytest.approx(want, rel=1e-4)


def test_proportion_greater_switches_to_the_z_test_for_many_errors() -> None:
    a, n1, c, n2 = 6_000, 600_000, 5_000, 600_000
    assert a + c > stats.FISHER_MAX_ERRORS
    assert stats.proportion_greater(a, n1, c, n2) == stats.two_proportion_greater(a, n1, c, n2)
    assert stats.proportion_greater(3, 4, 1, 4) == stats.fisher_greater(3, 4, 1, 4)


def test_fisher_and_z_agree_for_large_counts() -> None:
    fisher = stats.fisher_greater(130, 20_000, 100, 20_000)
    z = stats.two_proportion_greater(130, 20_000, 100, 20_000)
    assert fisher == pytest.approx(z, rel=0.1)


@pytest.mark.parametrize(
    ("a", "n1", "c", "n2"),
    [
        pytest.param(5, 4, 0, 4, id="more errors than requests"),
        pytest.param(0, 0, 0, 4, id="no canary requests"),
        pytest.param(-1, 4, 0, 4, id="negative errors"),
    ],
)
def test_proportion_tests_reject_impossible_counts(a: int, n1: int, c: int, n2: int) -> None:
    with pytest.raises(ValueError, match="errors"):
        stats.fisher_greater(a, n1, c, n2)


@pytest.mark.parametrize(
    ("canary", "stable", "want"),
    [
        pytest.param([0, 2, 2], [2, 2, 0], 0.043179, id="worked example"),
        pytest.param([5, 0], [5, 0], 1.0, id="everything in one bucket carries no information"),
        pytest.param([0, 0], [3, 4], 1.0, id="empty canary"),
        pytest.param(
            [0, 10],
            [10, 0],
            stats.normal_sf((100 - 50 - 0.5) / math.sqrt(100 / 12 * (21 - 1980 / 380))),
            id="canary entirely slower",
        ),
    ],
)
def test_rank_sum_greater_matches_hand_computation(canary: list[float], stable: list[float], want: float) -> None:
    assert stats.rank_sum_greater(canary, stable) == pytest.approx(want, rel=1e-4)


def test_rank_sum_greater_is_one_sided() -> None:
    assert stats.rank_sum_greater([10, 0], [0, 10]) > 0.999  # canary faster: never "slower"
    assert stats.rank_sum_greater([3, 3, 3], [30, 30, 30]) > 0.5  # same shape: no evidence


def _pairwise_u(canary: list[int], stable: list[int]) -> float:
    """U from its definition: pairs (canary, stable) with canary in a higher bucket, ties count ½."""
    u = 0.0
    for i, ci in enumerate(canary):
        for j, sj in enumerate(stable):
            u += ci * sj * (1.0 if i > j else 0.5 if i == j else 0.0)
    return u


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=2, max_size=8).filter(
        lambda rows: sum(r[0] for r in rows) > 0 and sum(r[1] for r in rows) > 0
    )
)
def test_rank_sum_statistic_equals_the_pairwise_definition(rows: list[tuple[int, int]]) -> None:
    canary, stable = [r[0] for r in rows], [r[1] for r in rows]
    n1, n2 = sum(canary), sum(stable)
    n = n1 + n2
    ties = sum((c + s) ** 3 - (c + s) for c, s in rows)
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    p = stats.rank_sum_greater(canary, stable)
    if var <= 0:
        assert p == 1.0
    else:
        want = stats.normal_sf((_pairwise_u(canary, stable) - n1 * n2 / 2 - 0.5) / math.sqrt(var))
        assert p == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("bounds", "counts", "mean", "want"),
    [
        pytest.param([0.01, 0.025], [10, 0, 0], 0.007, 21e-6, id="first bucket, Bhatia-Davis (10-7)(7-0) ms2"),
        pytest.param([1.0, 2.0], [5, 0, 5], 2.5, 2.25, id="+Inf bucket taken as [2, 4]"),
        pytest.param([1.0, 2.0], [0, 4, 0], 1.0, 0.0, id="mean at the bucket edge: a point mass"),
        pytest.param([1.0], [0, 0], 0.5, 0.0, id="no observations"),
    ],
)
def test_variance_bound_matches_hand_computation(
    bounds: list[float], counts: list[float], mean: float, want: float
) -> None:
    assert stats.variance_bound(bounds, counts, mean) == pytest.approx(want, rel=1e-9, abs=1e-15)


BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 60))
def test_variance_bound_never_underestimates(seed: int, n: int) -> None:
    rng = random.Random(seed)
    edges = (0.0, *BOUNDS, 2 * BOUNDS[-1])
    values = []
    for _ in range(n):
        i = rng.randrange(len(edges) - 1)
        values.append(rng.uniform(edges[i], edges[i + 1]))
    counts = [0.0] * (len(BOUNDS) + 1)
    for v in values:
        counts[sum(1 for b in BOUNDS if b < v)] += 1
    mean = sum(values) / n
    population_var = sum((v - mean) ** 2 for v in values) / n
    assert stats.variance_bound(BOUNDS, counts, mean) >= population_var - 1e-12


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param((0.0091, 21e-6, 300, 0.007, 21e-6, 6000), stats.normal_sf(7.745967), id="docstring example"),
        pytest.param((0.007, 21e-6, 300, 0.007, 21e-6, 6000), 0.5, id="equal means"),
        pytest.param((0.008, 0.0, 10, 0.007, 0.0, 10), 0.0, id="no variance, higher mean"),
        pytest.param((0.008, 1e-6, 0, 0.007, 1e-6, 10), 1.0, id="empty canary"),
    ],
)
def test_mean_greater(args: tuple[float, float, float, float, float, float], want: float) -> None:
    assert stats.mean_greater(*args) == pytest.approx(want, rel=1e-5, abs=1e-300)


# --- power ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.5, 0.05, 0.01, 0.005, 1e-6])
def test_normal_isf_inverts_normal_sf(p: float) -> None:
    assert stats.normal_sf(stats.normal_isf(p)) == pytest.approx(p, rel=1e-9)


def _binomial_sf_exact(k: int, n: int, p: Fraction) -> float:
    return float(sum(math.comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(k, n + 1)))


@pytest.mark.parametrize(
    ("k", "n", "p"),
    [
        pytest.param(3, 60, Fraction(15, 1000), id="above the mode: upper tail summed"),
        pytest.param(1, 60, Fraction(15, 1000), id="at the mode"),
        pytest.param(20, 100, Fraction(3, 10), id="below the mode: 1 - lower tail"),
        pytest.param(0, 10, Fraction(1, 2), id="k = 0"),
        pytest.param(10, 10, Fraction(1, 2), id="k = n"),
        pytest.param(11, 10, Fraction(1, 2), id="k > n"),
    ],
)
def test_binomial_sf_matches_the_exact_sum(k: int, n: int, p: Fraction) -> None:
    assert stats.binomial_sf(k, n, float(p)) == pytest.approx(_binomial_sf_exact(k, n, p), rel=1e-9, abs=1e-15)


def test_errors_power_is_the_binomial_chance_of_the_critical_count() -> None:
    # Docstring example: stable 30/6,000, canary 60 requests, +1 point, α = 0.01. The critical count is the
    # smallest canary error count whose Fisher p is below α: 3 (p(2) = 0.040, p(3) = 0.0041).
    assert stats.fisher_greater(2, 60, 30, 6000) >= 0.01 > stats.fisher_greater(3, 60, 30, 6000)
    want = _binomial_sf_exact(3, 60, Fraction(15, 1000))  # 0.0615
    assert stats.errors_power(60, 30, 6000, 0.01, 0.01) == pytest.approx(want, rel=1e-9)


def test_errors_power_grows_with_the_canary_sample() -> None:
    powers = [stats.errors_power(n, 30, 6000, 0.01, 0.01) for n in (60, 300, 1000, 3000)]
    assert powers == sorted(powers) and powers[0] < 0.1 and powers[-1] > 0.99


def test_errors_power_is_zero_when_no_count_could_reject() -> None:
    # 5 canary requests against a stable arm of 5 requests with 5 errors: nothing the canary does is "worse".
    assert stats.errors_power(5, 5, 5, 0.01, 0.01) == 0.0


def test_errors_power_matches_the_rejection_rate_of_the_test() -> None:
    """Monte Carlo: canaries drawn at stable's rate + 1 point are rejected about as often as the power says."""
    rng = random.Random(7)
    n1, c, n2, alpha = 400, 50, 10_000, 0.01
    power = stats.errors_power(n1, c, n2, 0.01, alpha)
    rate = c / n2 + 0.01
    trials = 4000
    rejected = sum(
        stats.proportion_greater(sum(rng.random() < rate for _ in range(n1)), n1, c, n2) < alpha for _ in range(trials)
    )
    assert 0.2 < power < 0.8  # a case where the check means something
    assert abs(rejected / trials - power) < 4 * math.sqrt(power * (1 - power) / trials)


def test_mean_power_worked_example() -> None:
    # TPOT 7 ms, bound 21 ms², canary 300, stable 6,000, ratio 1.1, α = 0.005:
    # se = √(21e-6/300 + 21e-6/6000) = 2.7111e-4 s, shift 0.7 ms → z = 2.58199; Φ̄(2.575829 − 2.58199) = 0.50246.
    assert stats.mean_power(0.007, 21e-6, 300, 6000, 1.1, 0.005) == pytest.approx(0.50246, abs=1e-4)


def test_mean_power_matches_the_rejection_rate_of_the_test() -> None:
    rng = random.Random(11)
    m2, v, n1, n2, ratio, alpha = 0.2, 0.04, 600, 5000, 1.1, 0.005
    power = stats.mean_power(m2, v, n1, n2, ratio, alpha)
    trials = 4000
    rejected = 0
    for _ in range(trials):
        m_canary = rng.gauss(m2 * ratio, math.sqrt(v / n1))
        m_stable = rng.gauss(m2, math.sqrt(v / n2))
        rejected += stats.mean_greater(m_canary, v, n1, m_stable, v, n2) < alpha
    assert 0.2 < power < 0.8
    assert abs(rejected / trials - power) < 4 * math.sqrt(power * (1 - power) / trials)


def test_mean_power_without_data_is_zero() -> None:
    assert stats.mean_power(0.2, 0.04, 0, 5000, 1.1, 0.005) == 0.0
