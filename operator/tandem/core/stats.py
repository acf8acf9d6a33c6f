"""One-sided tests of a canary against stable: error counts and latency histograms (pure math).

What it owns: the small statistics canary gates need, written with ``math`` only (the operator image
stays slim: no scipy, no numpy in ``core``). Every function takes counts and returns a p-value or a
bound; deciding what a p-value means for a gate is ``core.comparison``'s job.

What it must not do: I/O, read the clock, or look at gates and queries.

Conventions: every test is **one-sided, "canary worse"** (more errors, slower), so a canary that is
better than stable never fails; counts may be non-integers (Prometheus ``increase()`` extrapolates)
and are used as weights where the formula allows it (rank sums, means), rounded where it does not
(Fisher's exact test needs integers).

Formulas
--------
- **Fisher's exact test** (:func:`fisher_greater`): canary ``a`` errors in ``n1`` requests, stable
  ``c`` in ``n2``; with ``K = a + c`` errors in ``N = n1 + n2`` requests the canary's error count is
  hypergeometric under H0 and ``p = P(X ≥ a) = Σ_{x=a}^{min(K,n1)} C(K,x)·C(N−K,n1−x) / C(N,n1)``,
  each term through ``math.lgamma``.
- **Two proportions, continuity-corrected z** (:func:`two_proportion_greater`), for large counts:
  ``z = (a/n1 − c/n2 − (1/n1 + 1/n2)/2) / √(p̂(1−p̂)(1/n1 + 1/n2))`` with ``p̂ = K/N``; ``p = Φ̄(z)``.
- **Mann-Whitney U over histogram buckets** (:func:`rank_sum_greater`): all observations in one
  bucket are tied and share its mid-rank ``R_i = T_<i + (t_i + 1)/2`` (``t_i`` = both arms' count in
  bucket ``i``, ``T_<i`` the count below it). ``U = Σ c_i·R_i − n1(n1+1)/2``, ``E[U] = n1·n2/2``,
  ``Var[U] = n1·n2/12 · ((N+1) − Σ(t_i³ − t_i)/(N(N−1)))`` (tie correction), ``z = (U − E[U] − ½)/√Var``.
- **Means with a variance bound** (:func:`mean_greater`): the means come exactly from ``_sum/_count``;
  the variance is bounded from the buckets (:func:`variance_bound`), so the z-test on the difference
  of means is conservative: ``z = (m1 − m2)/√(v1/n1 + v2/n2)``.
- **Between pairs** (:func:`pair_mean_variance`): the variance of a revision's mean estimated from its pairs'
  means, ``k/(k−1)·Σ(s_i − m·n_i)²/N²``; ``core.comparison`` takes the larger of it and the per-request bound,
  because requests that share a pair's queue are not independent.
- **Power** (:func:`errors_power`, :func:`mean_power`): the probability that the test above rejects at
  level ``α`` *if* the canary were worse by a given effect — what a "not worse" answer is worth. A window
  too small to see the effect says nothing about it (docs/design/009, "Power floor").
  Errors: stable's count is taken as observed, the critical canary count ``a*`` is the smallest ``a``
  with ``proportion_greater(a, n1, c, n2) < α``, and the power is ``P(Bin(n1, c/n2 + δ) ≥ a*)``, exact
  for the test the gate runs, given stable's arm. Means: ``Φ̄(z_α − (m2·(r − 1))/√(v/n1 + v/n2))`` with
  stable's variance bound ``v`` for both arms (the canary as stable, shifted by the effect).

Worked example (the lady tasting tea, Fisher 1935): canary 3 errors in 4, stable 1 in 4 →
``p = (C(4,3)·C(4,1) + C(4,4)·C(4,0)) / C(8,4) = (16 + 1)/70 = 0.2429``: not significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Final

FISHER_MAX_ERRORS: Final = 10_000
"""Above this many errors in both arms Fisher's sum gets long; the z-test is then accurate anyway."""
_TAIL_EPS: Final = 1e-17
"""Stop summing hypergeometric terms once they fall below this share of the running sum."""


def normal_sf(z: float) -> float:
    """``P(Z > z)`` for a standard normal Z: ``erfc(z/√2)/2``. Example: ``normal_sf(1.6449) ≈ 0.05``."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def student_t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom (``math.inf``: the normal). A z-statistic whose
    variance was estimated from few units (pairs) takes this tail instead of the normal's.
    Example: ``student_t_sf(2.92, 2) ≈ 0.05`` (the normal's 5 % point is 1.64)."""
    if not math.isfinite(df) or df > 1e6:
        return normal_sf(t)
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(a: int, n1: int, c: int, n2: int) -> float:
    """One-sided Fisher exact p-value that the canary's error rate (a/n1) exceeds stable's (c/n2).

    Example: 1 error in 40 canary requests against 30 in 6,000 stable (0.5 %): K = 31, N = 6,040,
    ``p = 1 − C(6009,40)/C(6040,40) ≈ 0.186`` — one error in 40 is what 0.5 % produces one time in five.
    """
    _check_counts(a, n1, c, n2)
    k, n = a + c, n1 + n2
    if a == 0:
        return 1.0
    hi = min(k, n1)
    log_denominator = _log_comb(n, n1)
    total = 0.0
    for x in range(a, hi + 1):
        term = math.exp(_log_comb(k, x) + _log_comb(n - k, n1 - x) - log_denominator)
        total += term
        if term < _TAIL_EPS * total:
            break  # past the mode terms only shrink: the rest of the tail is negligible
    return min(1.0, total)


def two_proportion_greater(a: int, n1: int, c: int, n2: int) -> float:
    """One-sided p-value of the continuity-corrected two-proportion z-test (canary rate > stable rate).

    Example: 60 errors in 4,000 canary requests (1.5 %) against 500 in 100,000 (0.5 %):
    p̂ = 560/104,000 = 0.005385, ``z = (0.015 − 0.005 − 0.000130)/√(0.005385·0.994615·0.000260) = 8.36``,
    ``p ≈ 3e-17``.
    """
    _check_counts(a, n1, c, n2)
    k, n = a + c, n1 + n2
    if k in (0, n):
        return 1.0  # every request errs or none does: no difference can show
    pooled = k / n
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z = (a / n1 - c / n2 - 0.5 * (1 / n1 + 1 / n2)) / se
    return normal_sf(z)


def proportion_greater(a: int, n1: int, c: int, n2: int) -> float:
    """Fisher's exact test up to :data:`FISHER_MAX_ERRORS` errors in both arms, the z-test above it."""
    if a + c <= FISHER_MAX_ERRORS:
        return fisher_greater(a, n1, c, n2)
    return two_proportion_greater(a, n1, c, n2)


def _check_counts(a: int, n1: int, c: int, n2: int) -> None:
    if n1 <= 0 or n2 <= 0 or not 0 <= a <= n1 or not 0 <= c <= n2:
        raise ValueError(f"need 0 ≤ errors ≤ requests and requests > 0, got {a}/{n1} and {c}/{n2}")


def rank_sum_greater(
    canary: Sequence[float], stable: Sequence[float], design_effect: float = 1.0, df: float = math.inf
) -> float:
    """One-sided Mann-Whitney p-value that canary observations rank above stable's (normal approximation).

    ``canary`` and ``stable`` are per-bucket (non-cumulative) counts over the same ordered buckets.
    Returns 1.0 when there is nothing to compare (an empty arm, or every observation in one bucket).
    ``design_effect`` (≥ 1) multiplies ``Var[U]``: observations that are not independent (requests sharing a
    pair's queue) carry less evidence than their count; ``core.comparison`` passes the one the pairs' means show,
    and the degrees of freedom of that estimate (``df``: the z takes :func:`student_t_sf`).

    Example: canary ``[0, 2, 2]``, stable ``[2, 2, 0]``: mid-ranks 1.5, 4.5, 7.5; ``U = 2·4.5 + 2·7.5 − 10
    = 14``, ``E[U] = 8``, ``Σ(t³−t) = 6 + 60 + 6 = 72``, ``Var = 16/12·(9 − 72/56) = 10.29``,
    ``z = (14 − 8 − 0.5)/3.207 = 1.715`` → ``p = 0.0432``.
    """
    if len(canary) != len(stable):
        raise ValueError("canary and stable must have the same buckets")
    if any(x < 0 for x in canary) or any(x < 0 for x in stable):
        raise ValueError("bucket counts must be ≥ 0")
    n1, n2 = float(sum(canary)), float(sum(stable))
    n = n1 + n2
    if n1 <= 0 or n2 <= 0 or n <= 1:
        return 1.0
    below = 0.0
    rank_sum = 0.0
    ties = 0.0
    for c_i, s_i in zip(canary, stable, strict=True):
        t = c_i + s_i
        rank_sum += c_i * (below + (t + 1) / 2)
        ties += t**3 - t
        below += t
    u = rank_sum - n1 * (n1 + 1) / 2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) * max(1.0, design_effect)
    if variance <= 0:
        return 1.0
    return student_t_sf((u - n1 * n2 / 2 - 0.5) / math.sqrt(variance), df)


def variance_bound(bounds: Sequence[float], counts: Sequence[float], mean: float) -> float:
    """An upper bound on the variance of a histogram's observations, given their exact mean.

    ``bounds`` are the buckets' upper bounds (ascending, finite, > 0); ``counts`` has one more entry, the
    ``+Inf`` bucket, which is taken as ``[last, 2·last]`` (vLLM's last bounds, 80 s and 2,560 s, are far
    beyond anything a gate passes). Inside bucket ``[lo, hi]`` with conditional mean ``μ`` the
    Bhatia-Davis inequality gives ``E[X²] ≤ μ(lo + hi) − lo·hi``; the ``μ`` that maximize ``Σ p·E[X²]``
    under ``Σ p·μ = mean`` are found greedily (raise ``μ`` first where ``lo + hi`` is largest), and the
    bound is that maximum minus ``mean²``. It never underestimates, so a z-test built on it is
    conservative; bucket widths are its price.

    Example: every TPOT observation in vLLM's first bucket ``[0, 10 ms]`` with mean 7 ms →
    ``(10 − 7)·(7 − 0) = 21 ms²`` (sd 4.6 ms, where the true one might be 1 ms).
    """
    if len(counts) != len(bounds) + 1:
        raise ValueError("counts need one entry per bound plus the +Inf bucket")
    total = float(sum(counts))
    if total <= 0:
        return 0.0
    edges = [0.0, *bounds, 2 * bounds[-1]]
    buckets = [(edges[i], edges[i + 1], counts[i] / total) for i in range(len(counts)) if counts[i] > 0]
    low_mean = sum(p * lo for lo, _, p in buckets)
    high_mean = sum(p * hi for _, hi, p in buckets)
    mean = min(max(mean, low_mean), high_mean)  # _sum and the buckets can disagree slightly in a window
    second = sum(p * lo * lo for lo, _, p in buckets)  # every μ at its bucket's lower edge: E[X²] = lo²
    left = mean - low_mean
    for lo, hi, p in sorted(buckets, key=lambda b: b[0] + b[1], reverse=True):
        if left <= 0:
            break
        raise_by = min(left, p * (hi - lo))  # how much of the mean this bucket absorbs
        second += raise_by * (lo + hi)  # E[X²] grows by Δ(pμ)·(lo + hi) under Bhatia-Davis
        left -= raise_by
    return max(0.0, second - mean * mean)


def mean_greater(
    mean1: float, var1: float, n1: float, mean2: float, var2: float, n2: float, df: float = math.inf
) -> float:
    """One-sided p-value that the canary's mean exceeds stable's: ``z = (m1 − m2)/√(v1/n1 + v2/n2)``, against the
    normal, or Student's t with ``df`` when a variance was estimated from few pairs.

    Example: TPOT means 9.1 ms (canary, 300 requests) and 7.0 ms (stable, 6,000), both bounded at
    21 ms² → ``z = 2.1/√(21/300 + 21/6000) = 7.74`` → ``p ≈ 5e-15``.
    """
    if n1 <= 0 or n2 <= 0:
        return 1.0
    se2 = var1 / n1 + var2 / n2
    if se2 <= 0:
        return 0.0 if mean1 > mean2 else 1.0
    return student_t_sf((mean1 - mean2) / math.sqrt(se2), df)


def normal_isf(p: float) -> float:
    """The ``z`` with ``P(Z > z) = p`` (inverse of :func:`normal_sf`). Example: ``normal_isf(0.01) ≈ 2.3263``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"need 0 < p < 1, got {p}")
    return NormalDist().inv_cdf(1.0 - p)


def _log_binom_pmf(k: int, n: int, p: float) -> float:
    return _log_comb(n, k) + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X ≥ k)`` for ``X ~ Bin(n, p)``, summed from the tail nearer ``k`` (terms shrink away from the mode).

    Example: ``binomial_sf(4, 60, 0.015) ≈ 0.0127`` — the W5 errors canary (1.5 %) shows 4 errors in 60
    requests about one time in 80.
    """
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"need n ≥ 0 and 0 ≤ p ≤ 1, got n={n}, p={p}")
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    mode = (n + 1) * p
    if k > mode:  # the upper tail is the small side: sum it upwards
        total = 0.0
        for x in range(k, n + 1):
            term = math.exp(_log_binom_pmf(x, n, p))
            total += term
            if term < _TAIL_EPS * total:
                break
        return min(1.0, total)
    below = 0.0  # P(X ≤ k − 1), summed downwards from k − 1
    for x in range(k - 1, -1, -1):
        term = math.exp(_log_binom_pmf(x, n, p))
        below += term
        if term < _TAIL_EPS * below:
            break
    return max(0.0, 1.0 - below)


def errors_power(n1: int, c: int, n2: int, increase: float, alpha: float) -> float:
    """Power of :func:`proportion_greater` at level ``alpha`` against a canary error rate of stable's + ``increase``.

    Stable's ``c`` errors in ``n2`` requests are taken as observed; the critical canary count is found by
    bisection (the p-value falls as the canary's errors rise), and the power is the binomial chance of
    reaching it (module docstring).

    Example: stable 30 errors in 6,000 (0.5 %), canary 60 requests, +1 point (1.5 %), α = 0.01: the
    critical count is 3 errors (``p = 0.0041``; 2 errors give ``p = 0.040``), and
    ``P(Bin(60, 0.015) ≥ 3) ≈ 0.061``: a "not worse" from such a window is worth little. 1,500 canary
    requests give 0.90.
    """
    _check_counts(0, n1, c, n2)
    if not 0.0 < increase <= 1.0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need 0 < increase ≤ 1 and 0 < alpha < 1, got {increase}, {alpha}")
    rate = min(1.0, c / n2 + increase)
    if proportion_greater(n1, n1, c, n2) >= alpha:
        return 0.0  # not even every canary request failing would reject
    lo, hi = 0, n1  # p(lo) ≥ alpha > p(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if proportion_greater(mid, n1, c, n2) < alpha:
            hi = mid
        else:
            lo = mid
    return binomial_sf(hi, n1, rate)


def errors_sprt(a: int, n1: int, c: int, n2: int, increase: float) -> float:
    """Wald's log-likelihood ratio of the canary's errors: a rate of stable's + ``increase`` against stable's.

    ``ln Λ = a·ln(p1/p0) + (n1 − a)·ln((1 − p1)/(1 − p0))`` with ``p0 = (c + ½)/(n2 + 1)`` (stable's rate,
    half an error added so a stable arm without errors still has a rate) and ``p1 = p0 + increase``. Under
    ``p0`` the ratio ``Λ`` is a non-negative martingale in the canary's requests, so by Ville's inequality it
    ever reaches ``1/α`` with probability at most ``α``, **however often it is looked at**: the test of a
    ``window: Step`` errors gate, whose every look sees the step's cumulative counts (docs/design/009).
    Stable's rate is a plug-in; its arm is many times the canary's, and W5's Monte Carlo at 1.6 canary
    requests/s (1,000 good canaries, two Failures needed) false-alarmed 3 times.

    Example: stable 47 errors in 10,000 (p0 = 0.475 %), +1 point (p1 = 1.475 %), canary 12 errors in 700:
    ``12·ln(3.1055) + 688·ln(0.98525/0.99525) = 13.60 − 6.95 = 6.65 ≥ ln 100 = 4.61``: worse at 99 %.
    """
    p0 = _sprt_stable_rate(a, n1, c, n2, increase)
    p1 = min(p0 + increase, 1.0 - 1e-12)
    if p1 <= p0:  # stable failing all of > 10^11 requests: no worse rate to test against
        return 0.0
    return a * math.log(p1 / p0) + (n1 - a) * math.log((1.0 - p1) / (1.0 - p0))


def _sprt_stable_rate(a: int, n1: int, c: int, n2: int, increase: float) -> float:
    """The checked counts' null rate ``p0 = (c + ½)/(n2 + 1)`` of :func:`errors_sprt` (always in (0, 1))."""
    _check_counts(a, n1, c, n2)
    if not 0.0 < increase < 1.0:
        raise ValueError(f"need 0 < increase < 1, got {increase}")
    return (c + 0.5) / (n2 + 1)


def errors_mixture_sprt(a: int, n1: int, c: int, n2: int, increase: float) -> float:
    """``ln`` of a mixture of :func:`errors_sprt` ratios: half the weight on ``increase``, the other half spread
    evenly over ``2·increase, 4·increase, …`` (while the rate stays below 1).

    A single alternative is weak against a large regression: each error adds at most ``ln(p1/p0)``, so a canary
    failing 36 % of its requests against stable's 0.5 % crossed ``ln 100`` only after 14 requests at +1 point.
    A mixture of martingales is a martingale, so Ville's bound still holds; the price is ``ln 2`` on the named
    effect (≈ 810 instead of ≈ 705 requests expected at +1 point on 0.47 %), and a gross regression
    fails at its first look. Example: 4 errors in 8 against 0 in 110 → ``ln Λ = 13.9 > ln 100`` (the +1-point
    ratio alone: 4.64).
    """
    p0 = _sprt_stable_rate(a, n1, c, n2, increase)
    larger = []
    d = 2 * increase
    while p0 + d < 1.0:
        larger.append(d)
        d *= 2
    weighted = [(0.5 if larger else 1.0, increase)] + [(0.5 / len(larger), x) for x in larger]
    terms = [math.log(w) + errors_sprt(a, n1, c, n2, x) for w, x in weighted]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def mean_power(
    mean2: float,
    var2: float,
    n1: float,
    n2: float,
    ratio: float,
    alpha: float,
    *,
    var1: float | None = None,
    df: float = math.inf,
) -> float:
    """Power of :func:`mean_greater` at level ``alpha`` against a canary mean of ``ratio × mean2``.

    Both arms take stable's variance (bound) ``var2``: under the alternative the canary is stable shifted —
    unless ``var1`` gives the canary's own (its pairs make it wider, ``core.comparison``); with ``df`` the
    critical value and the tail are Student's t.
    Example: TPOT mean 7 ms, bound 21 ms², canary 300 requests, stable 6,000, ratio 1.1, α = 0.005 →
    ``se = √(21/300 + 21/6000) = 0.271 ms``, ``z = 0.7/0.271 = 2.58`` → ``Φ̄(2.576 − 2.58) ≈ 0.50``.
    """
    if n1 <= 0 or n2 <= 0 or not 0.0 < alpha < 1.0:
        return 0.0
    shift = mean2 * (ratio - 1.0)
    se = math.sqrt((var2 if var1 is None else var1) / n1 + var2 / n2)
    if se <= 0:
        return 1.0 if shift > 0 else 0.0
    return student_t_sf(student_t_isf(alpha, df) - shift / se, df)


def student_t_isf(p: float, df: float) -> float:
    """The ``t`` with ``P(T > t) = p`` (inverse of :func:`student_t_sf`, by bisection; the normal's for infinite
    ``df``). Example: ``student_t_isf(0.05, 2) ≈ 2.920``."""
    if not math.isfinite(df) or df > 1e6:
        return normal_isf(p)
    if not 0.0 < p < 1.0:
        raise ValueError(f"need 0 < p < 1, got {p}")
    lo, hi = -1.0, 1.0
    while student_t_sf(lo, df) < p:
        lo *= 2.0
    while student_t_sf(hi, df) > p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if student_t_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


def pair_mean_variance(pairs: Sequence[tuple[float, float]]) -> float | None:
    """The variance of a revision's mean ``m = Σs_i / Σn_i`` estimated between its pairs (a cluster-robust,
    "sandwich" estimate), or None with fewer than two pairs that served requests.

    ``pairs`` holds each pair's ``(n_i, s_i)``: requests and the sum of their latencies in the window.
    ``V̂ = k/(k − 1) · Σ(s_i − m·n_i)² / N²`` over the ``k`` pairs with ``n_i > 0``, ``N = Σn_i``.
    Why: requests on one pair share its queue — one long prompt delays every request behind it — so they are
    not independent, and the per-request variance over ``N`` (:func:`mean_greater`'s ``v/n``) understates how
    much the mean moves from window to window. The pairs are the independent units; the spread of their means
    says how much. Example: three pairs of 900 requests with means 330, 120 and 120 ms (m = 190 ms) →
    ``V̂ = 1.5 × 900² × (140² + 70² + 70²) / 2,700² = 4,900 ms²`` (se 70 ms, where 900 requests per pair with a
    per-request sd of 300 ms would give se 5.8 ms).
    """
    used = [(n, s) for n, s in pairs if n > 0]
    k = len(used)
    if k < 2:
        return None
    total_n = sum(n for n, _ in used)
    mean = sum(s for _, s in used) / total_n
    return k / (k - 1) * sum((s - mean * n) ** 2 for n, s in used) / (total_n * total_n)


def one_pair_variance(pairs: Sequence[tuple[float, float]], between: float | None = None) -> float | None:
    """The variance of one pair's mean latency, from the spread of the revision's pairs, or None with fewer than two
    pairs that served requests: ``V̂·N²/Σn_i²`` with ``V̂`` from :func:`pair_mean_variance`, which estimates
    ``σ_b²·Σn_i²/N² + σ_w²/N`` (``σ_b²`` the pair's own effect — its queue, its cache —, ``σ_w²`` the requests'),
    so this is ``σ_b² + σ_w²·N/Σn_i²``: the variance of the mean of a pair of ``Σn_i²/N`` requests, the pairs'
    typical size. A canary on one pair has no spread of its own to measure; under "no worse" its pair is one draw
    of the same pairs, so its mean varies this much (with pairs of similar size: the router gives each the same
    share of keys).
    Example: stable pairs as in :func:`pair_mean_variance` (V̂ = 0.0049 s², three pairs of 900) → ``0.0147 s²``
    (one pair's mean has sd 121 ms). ``between``: :func:`pair_mean_variance` of ``pairs`` when the caller has it.
    """
    if between is None:
        between = pair_mean_variance(pairs)
    if between is None:
        return None
    sizes = [n for n, _ in pairs if n > 0]
    total = sum(sizes)
    return between * total * total / sum(n * n for n in sizes)


def token_ratio_variance(ratio: float, tokens: float, max_tokens: float) -> float:
    """An upper bound on the variance of a token-weighted ratio ``r̂ = Σh_i / Σq_i`` over a window of requests
    whose prompts are at most ``max_tokens`` long, ``tokens = Σq_i``: ``r(1 − r) · min(1, q_max / Q)``.

    Why it holds: ``r̂`` is the ``q``-weighted mean of per-request fractions ``x_i = h_i / q_i ∈ [0, 1]``, so
    ``Var(r̂) ≈ Σq_i² Var(x) / Q² ≤ q_max · Var_q(x) / Q`` (``Σq_i² ≤ q_max · Q``), and a [0, 1] variable with
    mean ``r`` has variance at most ``r(1 − r)`` (Bhatia–Davis); no ratio varies more than that, hence the
    ``min``. ``Q / q_max`` is the fewest requests the window can hold: the bound treats each as that long.
    Example: r = 0.3, Q = 1.65 M tokens, q_max = 131,072 → ``0.21 × 0.0794 = 0.0167`` (sd 0.129).
    """
    r = min(1.0, max(0.0, ratio))
    share = 1.0 if tokens <= 0 else min(1.0, max_tokens / tokens)
    return r * (1.0 - r) * share


def ratio_below(
    canary_ratio: float,
    canary_tokens: float,
    stable_ratio: float,
    stable_tokens: float,
    share: float,
    max_tokens: float,
) -> float:
    """One-sided p-value that the canary's token-weighted ratio is below ``share`` × stable's (a score test).

    ``z = (ρ r_s − r_c) / √(V(ρ r_s, Q_c) + ρ² V(r_s, Q_s))`` with ``V`` = :func:`token_ratio_variance`: the
    canary's variance is taken at the null boundary ``r_c = ρ r_s``, not at its own estimate, or a canary with no
    hits at all (variance 0 at its estimate) would look certain from a single request.
    Example: canary 0.0 over 1.65 M tokens, stable 0.3 over 16.5 M, ρ = 0.9, q_max = 131,072 →
    ``z = 0.27 / √(0.01566 + 0.81 × 0.00167) = 2.07`` → ``p = 0.019``.
    """
    null = share * stable_ratio
    var = token_ratio_variance(null, canary_tokens, max_tokens) + share * share * token_ratio_variance(
        stable_ratio, stable_tokens, max_tokens
    )
    gap = null - canary_ratio
    if var <= 0:
        return 0.0 if gap > 0 else 1.0
    return normal_sf(gap / math.sqrt(var))


def ratio_below_power(
    stable_ratio: float, canary_tokens: float, stable_tokens: float, share: float, max_tokens: float, alpha: float
) -> float:
    """Power of :func:`ratio_below` at level ``alpha`` against a canary with no hits at all (``r_c = 0``: a broken
    prefix cache). That canary's estimate is exactly 0, so only stable's estimate varies: the test flags it when
    ``ρ r̂_s > z_α σ₀`` (``σ₀`` the test's standard error at the null boundary).
    Example (as :func:`ratio_below`, α = 0.01): ``σ₀ = 0.1304``, ``z_α σ₀ = 0.303`` against ``ρ r_s = 0.27`` with
    sd ``0.9 × 0.0409 = 0.0368`` → ``Φ̄(0.90) ≈ 0.18``.
    """
    if not 0.0 < alpha < 1.0:
        return 0.0
    null = share * stable_ratio
    v_stable = token_ratio_variance(stable_ratio, stable_tokens, max_tokens)
    sd0 = math.sqrt(token_ratio_variance(null, canary_tokens, max_tokens) + share * share * v_stable)
    critical = normal_isf(alpha) * sd0
    sd_alt = share * math.sqrt(v_stable)
    if sd_alt <= 0:
        return 1.0 if null > critical else 0.0
    return normal_sf((critical - null) / sd_alt)


__all__ = [
    "FISHER_MAX_ERRORS",
    "binomial_sf",
    "errors_mixture_sprt",
    "errors_power",
    "errors_sprt",
    "fisher_greater",
    "mean_greater",
    "mean_power",
    "normal_isf",
    "normal_sf",
    "one_pair_variance",
    "pair_mean_variance",
    "proportion_greater",
    "rank_sum_greater",
    "ratio_below",
    "ratio_below_power",
    "student_t_isf",
    "student_t_sf",
    "token_ratio_variance",
    "two_proportion_greater",
    "variance_bound",
]
