"""Is the canary worse than stable? Error rates and latency histograms of one window, compared (pure).

What it owns: turning the counts of one analysis window (errors and requests, or a latency histogram
with its ``_sum``/``_count``) of both revisions into a :class:`Comparison`: the p-value of the
one-sided test (``core.stats``), the effect size, and whether the canary is worse by the gate's rules.
``core.gates`` turns a Comparison into a verdict (and adds the gate's absolute condition, if any).

What it must not do: I/O, parse query results (``core.gates`` does), or read the clock.

Rules (α = 1 − ``confidencePercent``/100):

- **Errors**: worse when Fisher's exact test (the z-test above ``core.stats.FISHER_MAX_ERRORS``) gives
  ``p < α``. Counts are rounded to integers (``increase()`` extrapolates: 39.6 requests → 40).
- **Errors, sequential** (a ``window: Step`` gate: every look sees the step's cumulative counts): Wald's
  likelihood ratio ``Λ`` of "stable's rate + ``errorIncreasePermille``" against "stable's rate", mixed half and
  half with larger increases (2×, 4×, … the effect) so a gross regression fails at once
  (``core.stats.errors_mixture_sprt``); worse when ``Λ > 1/α``, at the gate's own ``α`` whatever the look (Ville's
  inequality bounds the false alarms over all looks; ``p = min(1, 1/Λ)``). Its power is Wald's acceptance
  bound ``1 − (1 − α)·Λ``: at ``Λ ≤ β/(1 − α)`` the test accepts "not worse by the effect" with error ≤ β, so a
  power floor of 80 % passes a window exactly where Wald's test would accept. Why not Fisher at
  ``α/(j(j+1))``: at look 20 that level is 0.01/420, and W5's errors canary (+1 point on 0.47 %, 1.6
  requests/s) needed a median 1,207 canary requests to fail it against 758 for the sequential mixture (Monte
  Carlo, 200 runs each; docs/design/009).
  **Truncation.** Wald's test has an indifference zone: a canary worse by about half the effect drifts between
  its bounds, and W5's seed 16 (+1 point, realised 1.1 % against 0.53 %) was Underpowered for all 48 looks of a
  24-minute step. So, with a power floor, a look that has decided neither way at a size where a single
  one-sided test of the canary's requests (Fisher, as above, at ``α``) has the floor's power against the effect
  runs that test instead: worse at ``p < α``, else "not worse" with that power, which lets the step pass. It adds
  a level-``α`` test at each undecided look past that size (usually one: the step ends there unless another gate
  holds it). Monte Carlo at 99 % with a 99 % floor (stable 0.5 %, 48 canary and 1,680 stable requests a look, 60
  looks, 1,500 runs each; truncation near 2,000 canary requests): good canaries failed 0.13 % → 0.93 %, +1-point
  canaries passed 0.9 % → 1.5 %, and none was left undecided (4.4 % and 4.7 % had been).
- **Latency**: two tests, Bonferroni-combined so together they keep ``α``: the rank-sum test over the
  buckets (sees any shift of the distribution that crosses bucket bounds) and a z-test on the means
  from ``_sum/_count`` with a variance bounded from the buckets (sees a shift that stays inside one
  bucket, such as TPOT × 1.3 inside vLLM's first TPOT bucket of 0-10 ms, where every quantile
  interpolates to the same value for both revisions). ``p = min(1, k·min(p_rank, p_mean))`` with ``k``
  the number of informative tests (a rank test over one tie group returns 1 and is not counted); worse when
  ``p < α`` **and** ``mean_canary / mean_stable > maxMeanRatioPercent/100``, so a significant but tiny
  shift (a big stable arm makes 1 % significant) does not fail. Bucket bounds the revisions do not
  share are merged away (a new vLLM version may change its buckets): the test runs on the common bounds.
  The mean test's variance per arm is at least the variance **between the revision's pairs** (their per-pair
  ``_sum``/``_count``), when it has two or more, and a canary on fewer pairs borrows the spread of stable's:
  requests sharing a pair's queue are not independent. The mean test then reads Student's t (Welch–Satterthwaite
  degrees of freedom), and the rank test takes the same design effect (``compare_latency``). From ten stable pairs
  on (``SPREAD_MIN_PAIRS``) their measured spread replaces the per-request bound instead of adding to it: inside
  vLLM's first TPOT bucket the bound was 2–4× looser than what W5's 70 pairs showed (``_mean_variances``).

- **Local prefix-hit ratio** (``LocalKVHitRatio``): worse when the canary's token-weighted hit ratio is
  significantly below ``minRatioPercent``/100 × stable's (``core.stats.ratio_below``: a score test whose
  variance is bounded from the tokens looked up and the longest prompt the pool admits, ``q_max``). The null
  already allows the tolerated drop, so ``p < α`` alone decides. The bound is loose on purpose: the counters
  cannot say how the tokens split into requests, and a window's ratio is dominated by its longest prompts.

**Power** (``core.stats.errors_power``, ``core.stats.mean_power``): with every comparison comes the
chance that this window's test would have called the canary worse had it been worse by the gate's effect
size — errors: stable's rate + ``error_increase``; hit ratio: a canary with no local hits; latency: stable's
mean × ``maxMeanRatioPercent``/100, at ``α/2`` (the Bonferroni share of the mean test; the rank test only adds
power, so this is a lower bound). A "not worse" from a window with little power is absence of evidence:
``core.gates`` turns it into NoData ``Underpowered`` when the gate sets ``minPowerPercent``.

Worked example (TPOT, ``confidencePercent: 99``, ``maxMeanRatioPercent: 110``): stable 6,000 requests
with mean 7.0 ms, canary 300 with mean 9.1 ms, all in the first bucket [0, 10 ms]. The rank test
sees one tie group (``p_rank = 1``, not counted). The variance bound is (10 − 7)·7 = 21 ms² for stable
and (10 − 9.1)·9.1 = 8.2 ms² for the canary: ``z = 2.1/√(8.2/300 + 21/6000) = 11.97``,
``p = p_mean ≈ 3e-33 < 0.01`` and ``9.1/7.0 = 1.30 > 1.10`` → worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.core.pairfit import WorkFit, fit_pair_work
from tandem.core.stats import (
    errors_mixture_sprt,
    errors_power,
    errors_sprt,
    mean_greater,
    mean_power,
    one_pair_variance,
    pair_mean_variance,
    proportion_greater,
    rank_sum_greater,
    ratio_below,
    ratio_below_power,
    variance_bound,
)


@dataclass(frozen=True)
class Comparison:
    """The outcome of one canary-vs-stable test."""

    worse: bool
    """The canary is significantly worse and (for latency) beyond the allowed mean ratio."""
    p_value: float
    ratio: float
    """Canary / stable: error rates, or latency means (``inf`` when stable's is 0 and the canary's is not)."""
    summary: str
    """One line with the numbers behind ``worse``, for the verdict."""
    power: float | None = None
    """Chance that this window's test flags a canary worse by the gate's effect size (module docstring);
    None when no effect size was given or the data cannot say (e.g. no shared finite bucket)."""


@dataclass(frozen=True)
class ErrorCounts:
    """Errors and requests of one revision in the window (``increase()`` values, may be fractional)."""

    requests: float
    errors: float


@dataclass(frozen=True)
class LatencyHistogram:
    """One revision's histogram in the window: ``le`` → cumulative count (``+Inf`` included), _count, _sum."""

    cumulative: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count) pairs in ascending order of bound; the last bound is ``inf``."""
    count: float
    total: float
    """The ``_sum`` (seconds)."""

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else math.nan


def alpha(confidence_percent: float) -> float:
    """Significance level of a confidence in percent: 99 → 0.01."""
    return 1.0 - confidence_percent / 100.0


def _ratio(canary: float, stable: float) -> float:
    if stable > 0:
        return canary / stable
    return math.inf if canary > 0 else 1.0


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


@dataclass(frozen=True)
class HitCounts:
    """Prompt tokens one revision's instances looked up in their prefix cache over the window, and found."""

    queried: float
    hits: float

    @property
    def ratio(self) -> float:
        """Hits / queried, clamped to [0, 1] (``increase()`` extrapolates each counter on its own); NaN when
        nothing was looked up."""
        if self.queried <= 0:
            return math.nan
        return min(1.0, max(0.0, self.hits / self.queried))


def compare_hit_ratios(
    canary: HitCounts,
    stable: HitCounts,
    *,
    confidence_percent: float,
    min_ratio_percent: float,
    max_prompt_tokens: float,
) -> Comparison:
    """Is the canary's local prefix-hit ratio significantly below ``min_ratio_percent`` % of stable's (module
    docstring)? A window in which either revision looked nothing up is not evidence: ``p = 1``, power 0.

    Example (a good canary's noisy window at the demo's 50 % step): canary 0.12 over 400 k tokens, stable 0.30
    over 900 k, ρ = 0.9, q_max = 131,072 → ``z = (0.27 − 0.12) / √(0.197 × 0.328 + 0.81 × 0.21 × 0.146) = 0.50``,
    ``p = 0.31``: not worse, where ``result >= baseline * 0.9`` failed it."""
    share = min_ratio_percent / 100.0
    level = alpha(confidence_percent)
    r_c, r_s = canary.ratio, stable.ratio
    if math.isnan(r_c) or math.isnan(r_s):
        p, power = 1.0, 0.0
    else:
        p = ratio_below(r_c, canary.queried, r_s, stable.queried, share, max_prompt_tokens)
        power = ratio_below_power(r_s, canary.queried, stable.queried, share, max_prompt_tokens, level)
    worse = p < level
    ratio = _ratio(r_c, r_s) if not (math.isnan(r_c) or math.isnan(r_s)) else 1.0
    summary = (
        f"hit ratio {r_c:.3g} of {canary.queried:.4g} tokens vs stable {r_s:.3g} of {stable.queried:.4g} "
        f"(x{ratio:.3g}, allowed x{share:g}, prompts ≤ {max_prompt_tokens:.0f} tokens): "
        f"p={p:.3g} {'<' if worse else '≥'} {level:g}, power {_pct(power)} against no hits"
    )
    return Comparison(worse, p, ratio, summary, power)


def compare_error_rates(
    canary: ErrorCounts,
    stable: ErrorCounts,
    *,
    confidence_percent: float,
    error_increase: float | None = None,
    sequential: bool = False,
    power_floor: float = 0.0,
) -> Comparison:
    """Is the canary's error rate significantly higher than stable's (module docstring)?

    ``error_increase`` (a rate, 0.01 = +1 point) is the effect the power is computed for. ``sequential``:
    the counts are a step's cumulative ones, looked at again and again — Wald's test (module docstring).
    ``power_floor`` (the gate's ``minPowerPercent``/100, 0 = off) truncates Wald's test where a fixed-sample
    test of the canary's requests has that power (module docstring, "Errors, sequential").
    Example: 1 error in 40 canary requests, 30 in 6,000 stable, 99 % → Fisher ``p = 0.19 ≥ 0.01``: not worse;
    power against +1 point ``P(Bin(40, 0.015) ≥ 3) ≈ 0.02``.
    """
    n1, n2 = max(1, round(canary.requests)), max(1, round(stable.requests))
    a, c = min(n1, max(0, round(canary.errors))), min(n2, max(0, round(stable.errors)))
    level = alpha(confidence_percent)
    if sequential:
        if error_increase is None:
            raise ValueError("a sequential errors test needs the effect size (error_increase)")
        return _sequential_error_rates(a, n1, c, n2, level, error_increase, power_floor)
    p = proportion_greater(a, n1, c, n2)
    worse = p < level
    ratio = _ratio(a / n1, c / n2)
    power = errors_power(n1, c, n2, error_increase, level) if error_increase is not None else None
    summary = (
        f"errors {a}/{n1} ({_pct(a / n1)}) vs stable {c}/{n2} ({_pct(c / n2)}): "
        f"p={p:.3g} {'<' if worse else '≥'} {level:g}"
        + (f", power {_pct(power)} at +{100 * error_increase:g} pt" if power is not None and error_increase else "")
    )
    return Comparison(worse, p, ratio, summary, power)


def _sequential_error_rates(
    a: int, n1: int, c: int, n2: int, level: float, increase: float, floor: float
) -> Comparison:
    """Wald's sequential test of a step's cumulative errors (module docstring, ``core.stats.errors_sprt``),
    truncated at the fixed-sample size of the power ``floor`` while it has decided neither way."""
    llr = errors_mixture_sprt(a, n1, c, n2, increase)  # decides: also quick against a gross regression
    p = min(1.0, math.exp(-llr))
    worse = p < level
    at_effect = errors_sprt(a, n1, c, n2, increase)  # the power is about the named effect
    power = min(1.0, max(0.0, 1.0 - (1.0 - level) * math.exp(min(at_effect, 700.0))))
    head = f"errors {a}/{n1} ({_pct(a / n1)}) vs stable {c}/{n2} ({_pct(c / n2)}): "
    sequential = f"sequential ln LR {llr:.3g} {'>' if worse else '≤'} {math.log(1.0 / level):.3g}"
    if not worse and floor > 0.0 and power < floor:
        fixed = errors_power(n1, c, n2, increase, level)
        if fixed >= floor:  # undecided, at a size where a single test has the floor's power: it decides
            p = proportion_greater(a, n1, c, n2)
            worse = p < level
            summary = (
                f"{head}{sequential} undecided; truncated (a fixed test of {n1} requests has power "
                f"{_pct(fixed)}): p={p:.3g} {'<' if worse else '≥'} {level:g}"
            )
            return Comparison(worse, p, _ratio(a / n1, c / n2), summary, fixed)
    summary = f"{head}{sequential}, power {_pct(power)} at +{100 * increase:g} pt"
    return Comparison(worse, p, _ratio(a / n1, c / n2), summary, power)


def common_buckets(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> tuple[tuple[float, ...], list[float], list[float]]:
    """The finite bounds both histograms share, and each one's per-bucket counts on them (last = +Inf).

    Cumulative counts are read at the shared bounds; a count that decreases (per-series ``increase()``
    extrapolation) is clamped to 0.
    Example: ``[(0.1, 2), (0.2, 5), (inf, 6)]`` and ``[(0.2, 4), (inf, 4)]`` → bounds ``(0.2,)``,
    counts ``[5, 1]`` and ``[4, 0]``.
    """
    shared = sorted(set(le for le, _ in a) & set(le for le, _ in b))
    if not shared or shared[-1] != math.inf:
        raise ValueError("both histograms need a +Inf bucket")

    def per_bucket(h: Sequence[tuple[float, float]]) -> list[float]:
        at = dict(h)
        out, before = [], 0.0
        for le in shared:
            out.append(max(0.0, at[le] - before))
            before = max(before, at[le])
        return out

    return tuple(shared[:-1]), per_bucket(a), per_bucket(b)


@dataclass(frozen=True)
class UncachedWork:
    """Uncached prompt tokens per request of each revision in the window (``compare.normalize``)."""

    canary: float
    stable: float
    canary_fetched: float | None = None
    """Of ``canary``, the tokens per request the shared tier supplied (``external_prefix_cache_hits``; None: not
    known). The proportional scaling counts them as work, the line through stable's pairs prices them itself."""
    stable_fetched: float | None = None
    """Stable's, for the record and the verdict's reader: the fit itself reads each stable pair's own fetched tokens
    (:attr:`PairLatencies.stable_fetched`), and it is asked only when both revisions answer."""

    def point(self, fit: WorkFit) -> tuple[float, float | None]:
        """Where the canary sits on ``fit``: its prefilled and fetched tokens per request, or its local misses when
        the fit counts fetched tokens as prefilled (:attr:`WorkFit.merged`)."""
        if fit.merged or self.canary_fetched is None:
            return self.canary, None
        return max(0.0, self.canary - self.canary_fetched), self.canary_fetched

    def ratios(self, fit: WorkFit) -> tuple[tuple[str, float], ...]:
        """The canary's work over stable's, per kind of work the line prices apart (``local misses``,
        ``prefilled``, ``fetched``), from the revisions' own counters: the bounds the line's prediction is held
        between (:func:`compare_latency`, whose verdict names the one that held it). With TTFT = a + b·P + c·F and
        a, b, c ≥ 0 (:mod:`tandem.core.pairfit` keeps them so), the canary's TTFT over stable's lies between the
        smallest and the largest of 1, P_c/P_s and F_c/F_s (the mediant inequality), whatever per-pair answers
        drew the line. Local misses alone (``merged`` fit, or fetched tokens not known) give one ratio, misses
        over misses. Example (W5 at the full rate, seed 18, good canary): 9,285 prefilled + 8,309 fetched tokens
        per request against stable's 5,737 + 10,660 → misses ×1.07, prefilled ×1.62: a line at 1,281 ms over
        stable's 918 ms (×1.40) is within the bounds; misses alone held it to 985 ms and read the identical
        canary ×1.43 slower, which failed it."""
        misses = self.canary / self.stable if self.stable > 0 else 1.0
        if fit.merged or self.canary_fetched is None or self.stable_fetched is None:
            return (("local misses", misses),)
        parts = (
            ("prefilled", self.canary - self.canary_fetched, self.stable - self.stable_fetched),
            ("fetched", self.canary_fetched, self.stable_fetched),
        )
        return (("local misses", misses), *((name, c / s) for name, c, s in parts if s > 0))

    @property
    def factor(self) -> float:
        """How many times stable's prefill work per request the canary did, never below 1: a canary with *more*
        uncached tokens per request (a colder prefix cache, or a slice of keys with longer prompts) may be
        that much slower without being worse; one with fewer is judged as is (TTFT has a fixed part — queueing,
        the first decode step, the P→D transfer — so scaling it down would fail a warm canary for nothing).
        1 when stable did no uncached work (nothing to scale by)."""
        if self.stable <= 0 or not math.isfinite(self.canary) or not math.isfinite(self.stable):
            return 1.0
        return max(1.0, self.canary / self.stable)


@dataclass(frozen=True)
class PairLatencies:
    """Each pair's ``(requests, latency sum)`` in the window, per revision: the pairs are the independent units of
    a latency mean (``core.stats.pair_mean_variance``). An empty side means "not known" (per-request variance
    only)."""

    canary: tuple[tuple[float, float], ...] = ()
    stable: tuple[tuple[float, float], ...] = ()
    stable_uncached: tuple[float, ...] = ()
    """Uncached prompt tokens (local misses) of each of ``stable``'s pairs, same order (empty: not known): a TTFT
    gate's stable pairs fitted on their work (:func:`work_fit`)."""
    stable_fetched: tuple[float, ...] = ()
    """Of those, the tokens each pair fetched from the shared tier, same order (empty: not known)."""


def _pair_count(pairs: tuple[tuple[float, float], ...]) -> int:
    return sum(1 for n, _ in pairs if n > 0)


SPREAD_MIN_PAIRS = 10
"""Stable pairs with requests from which their spread replaces the per-request bucket bound (9 degrees of freedom):
fewer say too little about a pair's variance to trust it over a bound."""
SPREAD_FLOOR = 0.01
"""A measured spread never counts for less than this share of the per-request bound over ``n``: pairs that agree to
the last digit (a frozen or forged exporter) do not make a mean exact."""


def _typical_size(pairs: Sequence[float]) -> float:
    """``Σn_i²/Σn_i``: the size of the pair whose mean's variance ``core.stats.one_pair_variance`` states."""
    return sum(n * n for n in pairs) / sum(pairs)


def _mean_variances(
    v1: float,
    n1: float,
    v2: float,
    n2: float,
    pairs: PairLatencies,
    scale: float,
    fit: WorkFit | None = None,
    work: tuple[float, float | None] = (0.0, None),
    baseline: float | None = None,
) -> tuple[float, float, float]:
    """Each arm's variance of its mean, and the degrees of freedom of their sum (Welch-Satterthwaite).

    With fewer than ``SPREAD_MIN_PAIRS`` stable pairs each is at least the per-request bound over ``n`` (no degrees
    of freedom lost: a bound, not an estimate). Stable's is also at least the variance between its pairs (``k − 1``
    degrees of freedom); the canary's at least its own between-pair variance and at least what the spread of
    stable's pairs implies for the canary's (``core.stats.one_pair_variance`` × ``Σn_i²/N²``; one pair of all
    ``n`` when the canary's per-pair answer is missing), since a canary on one or two pairs cannot show its own
    spread.

    With ``SPREAD_MIN_PAIRS`` or more stable pairs their spread is measured well enough to replace the bound, which
    is loose where it matters most: inside vLLM's first TPOT bucket [0, 10 ms] a mean of 1.6 ms allows a
    per-request sd of 3.7 ms, where W5's 70 stable pairs of ~100 requests showed pair means within sd 0.08–0.18 ms
    (bench/results/w5-full-rate-seed1-latency.md). Stable's variance is then its between-pair estimate, the
    canary's the borrowed one (and its own spread once it too has ``SPREAD_MIN_PAIRS`` pairs), scaled up by how much
    smaller the canary's pairs are than stable's: a pair mean's variance ``σ_b² + σ_w²/n`` grows at most as ``1/n``,
    and no per-request bound covers the ``σ_w²`` part any more. Neither goes below ``SPREAD_FLOOR`` × its bound.

    ``fit`` (a TTFT gate's stable pairs fitted on their uncached work, :mod:`tandem.core.pairfit`): stable's side is
    the line's prediction at the canary's ``work`` per request, so its variance is the prediction's, and the spread
    the canary borrows is one pair's around the line (relative, times the square of ``baseline``, the mean the canary
    is held to: the prediction, or the bound it was clamped to), both with ``k − 2`` degrees of freedom (``k − 3`` when
    the fit also prices the fetched tokens)."""
    k1, k2 = _pair_count(pairs.canary), _pair_count(pairs.stable)
    between2: float | None
    one_pair: float | None
    if fit is not None:
        held = baseline if baseline is not None else fit.predict(*work)
        between2, one_pair = fit.prediction_variance(*work), fit.one_pair * held**2
        spread_scale, df2 = 1.0, fit.pairs - fit.parameters
    else:
        between2 = pair_mean_variance(pairs.stable)
        one_pair, spread_scale, df2 = one_pair_variance(pairs.stable, between2), scale, k2 - 1
    measured = k2 >= SPREAD_MIN_PAIRS and between2 is not None and one_pair is not None
    floor = SPREAD_FLOOR if measured else 1.0
    var1, f1 = floor * v1 / n1, math.inf
    var2, f2 = floor * v2 / n2, math.inf
    if between2 is not None and between2 * spread_scale**2 > var2:
        var2, f2 = between2 * spread_scale**2, float(df2)
    between1 = pair_mean_variance(pairs.canary)
    if between1 is not None and between1 > var1 and (not measured or k1 >= SPREAD_MIN_PAIRS):
        var1, f1 = between1, float(k1 - 1)
    if one_pair is not None:
        sizes = [n for n, _ in pairs.canary if n > 0] or [n1]
        smaller = (
            max(1.0, _typical_size([n for n, _ in pairs.stable if n > 0]) / _typical_size(sizes)) if measured else 1.0
        )
        borrowed = one_pair * spread_scale**2 * smaller * sum(n * n for n in sizes) / sum(sizes) ** 2
        if borrowed > var1:
            var1, f1 = borrowed, float(df2)
    spread = (var1 * var1 / f1 if math.isfinite(f1) else 0.0) + (var2 * var2 / f2 if math.isfinite(f2) else 0.0)
    df = (var1 + var2) ** 2 / spread if spread > 0 else math.inf
    return var1, var2, df


def work_fit(work: UncachedWork | None, pairs: PairLatencies | None) -> WorkFit | None:
    """The line through stable's pairs (:mod:`tandem.core.pairfit`) that a TTFT gate's canary is held to, or None
    for the proportional scaling (:attr:`UncachedWork.factor`): fewer than ``SPREAD_MIN_PAIRS`` stable pairs with
    per-pair cache counters, a fit that cannot be made, or a canary whose work per request lies outside the stable
    pairs' range. The line is evidence only where stable's pairs are: a cold canary's work (W5: 68 k tokens per
    request against stable pairs' 8–34 k) would be an extrapolation, and prefill and its queue grow faster than
    linearly with the prompt.

    With the shared tier's counters on both sides (the canary's and each stable pair's fetched tokens), the fit
    separates the tokens prefilled from the tokens fetched, and the range is the prefilled tokens': a cold canary
    misses locally what the shared tier mostly holds, and fetching costs a fraction of computing (W5, seeds 3–4:
    with local misses as the work a good canary read ×0.8 of the line, a TTFT × 1.5 one ×1.2)."""
    if work is None or pairs is None or not pairs.stable_uncached or _pair_count(pairs.stable) < SPREAD_MIN_PAIRS:
        return None
    fetched = pairs.stable_fetched if work.canary_fetched is not None else ()
    fit = fit_pair_work(pairs.stable, pairs.stable_uncached, fetched)
    if fit is None or fit.pairs < SPREAD_MIN_PAIRS:
        return None
    x, _ = work.point(fit)
    return fit if fit.lowest <= x <= fit.highest else None


def _where(work: UncachedWork, fit: WorkFit) -> str:
    x, f = work.point(fit)
    if f is None:
        return f"{x:.4g} uncached tokens/request"
    return f"{x:.4g} prefilled + {f:.4g} fetched tokens/request"


def _where_stable(fit: WorkFit) -> str:
    return f"{fit.work:.4g}" + ("" if fit.merged else f" + {fit.fetched:.4g}")


def _slopes(fit: WorkFit) -> str:
    if fit.merged:
        return f"{1e6 * fit.slope:.3g} µs/token"
    return f"{1e6 * fit.slope:.3g} µs/prefilled, {1e6 * fit.fetch_slope:.3g} µs/fetched token"


def compare_latency(
    canary: LatencyHistogram,
    stable: LatencyHistogram,
    *,
    confidence_percent: float,
    max_mean_ratio_percent: float,
    work: UncachedWork | None = None,
    pairs: PairLatencies | None = None,
) -> Comparison:
    """Is the canary slower than stable, significantly and by more than the allowed ratio (module docstring)?

    ``work`` (TTFT with ``compare.normalize: UncachedPromptTokens``): with a factor ``w`` > 1 the canary is
    compared with stable's mean scaled by ``w`` — the null is "no slower per uncached prompt token" — by the mean
    test alone (the rank test's null, one distribution for both, does not hold for a canary doing more work).
    Example (W5 at the full rate, identical canary 60 s into its step): canary 63 requests, mean 2.86 s,
    52.5 k uncached tokens per request; stable 3,980 requests, mean 0.902 s, 16.3 k → ``w`` = 3.22, ratio
    2.86 / (0.902 × 3.22) = 0.98: not worse, where the unnormalised means differ ×3.2.
    With ``SPREAD_MIN_PAIRS`` stable pairs whose uncached tokens are known (``pairs.stable_uncached``) and a canary
    inside their range of work per request, stable's side is instead the line through its pairs' mean TTFT against
    their work (:func:`work_fit`), at the canary's work, kept between ``stable mean × min(1, x_c/x̄)`` and
    ``× max(1, x_c/x̄)``, by the mean test alone (the canary's keys are not stable's mix either). Example (W5 at
    the full rate, seed 1, TTFT × 1.5 canary, warm): 93 requests at 36.4 k tokens/request, mean 2.70 s; stable's
    70 pairs at 17.0 k, mean 0.98 s, slope 36 µs/token → line 1.68 s, ratio 1.61, where the proportional scaling
    (× 36.4/17.0 = 2.14 → 2.10 s) read × 1.29. With the shared tier's counters the line prices the canary's fetched
    tokens apart from its prefilled ones (:func:`work_fit`, :mod:`tandem.core.pairfit`), and the bounds are the
    revisions' own ratios of prefilled and of fetched tokens (:meth:`UncachedWork.ratios`).

    ``pairs``: each arm's mean-test variance is the larger of the per-request bound and the variance between its
    pairs (``design effect`` ``d`` = between / (bound / n), at least 1), so a window where one busy pair's queue
    slowed all of its requests is not read as hundreds of independent slow requests. Example: canary pairs with
    means 330, 120 and 120 ms over 900 requests each (mean 190 ms), stable's three at 131 ms, a per-request bound
    of 0.27 s² for both → between-pair variance 0.0049 s², ``d`` = 0.0049 × 2,700 / 0.27 = 49 for the canary, 1
    for stable; the mean test's ``z`` falls from 4.2 to 0.83, p = 0.24 on Student's t with 2 degrees of freedom
    (three canary pairs estimated the spread). A canary on one pair (every first step) has no spread of its own:
    it borrows what stable's pairs show for one pair's mean. The power takes the same variances and t."""
    bounds, c_counts, s_counts = common_buckets(canary.cumulative, stable.cumulative)
    w = work.factor if work is not None else 1.0
    m1, stable_mean = canary.mean, stable.mean
    m2 = stable_mean * w
    fit = work_fit(work, pairs)
    clamp = ""
    if fit is not None and work is not None and math.isfinite(stable_mean):
        # Between stable's mean × the smallest and × the largest of 1 and the revisions' own work ratios
        # (UncachedWork.ratios): a forged per-pair answer cannot excuse more than those counters do, and the line
        # cannot claim TTFT has no fixed part. The verdict names the bound that held it.
        named = (("stable's mean", 1.0), *work.ratios(fit))
        at = work.point(fit)
        line = fit.predict(*at)
        lowest, highest = min(named, key=lambda r: r[1]), max(named, key=lambda r: r[1])
        low, high = stable_mean * lowest[1], stable_mean * highest[1]
        m2 = min(max(line, low), high)
        if m2 != line:
            name, ratio = highest if m2 == high else lowest
            if name == "stable's mean":
                bound = name
            elif name == "local misses":
                bound = f"the local misses' ratio x{ratio:.3g} (the proportional scaling)"
            else:
                bound = f"the {name} tokens' ratio x{ratio:.3g}"
            clamp = f"; the line said {1000 * line:.4g} ms, held to {bound}"
    power: float | None = None
    d1 = d2 = 1.0
    df = math.inf
    p_mean = 1.0
    if bounds and canary.count > 0 and stable.count > 0 and math.isfinite(m1) and math.isfinite(m2):
        v1 = variance_bound(bounds, c_counts, m1)
        v2 = variance_bound(bounds, s_counts, stable_mean) * (m2 / stable_mean if stable_mean > 0 else w) ** 2
        v_alt = v2  # the canary as stable shifted: stable's per-request variance...
        if pairs is not None and v1 > 0 and v2 > 0 and w > 0:
            var1, var2, df = _mean_variances(
                v1, canary.count, v2, stable.count, pairs, w, fit, work.point(fit) if fit and work else (0.0, None), m2
            )
            d1, d2 = var1 * canary.count / v1, var2 * stable.count / v2
            v1, v2, v_alt = v1 * d1, v2 * d2, v2 * d1  # ...with the canary's pairs' design effect
        p_mean = mean_greater(m1, v1, canary.count, m2, v2, stable.count, df)
        power = mean_power(
            m2,
            v2,
            canary.count,
            stable.count,
            max_mean_ratio_percent / 100.0,
            alpha(confidence_percent) / 2,
            var1=v_alt,
            df=df,
        )
    # The rank statistic's variance, like the difference of means, sums a canary part (∝ 1/n1) and a stable
    # part (∝ 1/n2): each takes its arm's design effect, weighted by its share of 1/n1 + 1/n2.
    n1, n2 = canary.count, stable.count
    # A design effect below 1 (pairs tighter than the bucket bound) is the mean test's: ``rank_sum_greater`` takes
    # at least 1, since ranks carry nothing about the spread inside a bucket.
    d_rank = (d1 * n2 + d2 * n1) / (n1 + n2) if n1 > 0 and n2 > 0 else 1.0
    # The rank test's null, one distribution for both, holds neither for a canary doing more work per request nor
    # for one held to stable's line: its keys' prompts are not stable's mix, so the mean test alone decides.
    p_rank = rank_sum_greater(c_counts, s_counts, d_rank, df) if w <= 1.0 and fit is None else 1.0
    informative = [x for x in (p_rank, p_mean) if x < 1.0]
    p = min(1.0, len(informative) * min(informative)) if informative else 1.0
    level = alpha(confidence_percent)
    ratio = _ratio(m1, m2) if math.isfinite(m1) and math.isfinite(m2) else 1.0
    allowed = max_mean_ratio_percent / 100.0
    worse = p < level and ratio > allowed
    if fit is not None and work is not None:
        scaled = (
            f" on its pairs' line at {_where(work, fit)} = {1000 * m2:.4g} ms "
            f"({fit.pairs} pairs, {_slopes(fit)}, stable at {_where_stable(fit)}{clamp})"
        )
    elif work is not None:
        scaled = f" x{w:.3g} = {1000 * m2:.4g} ms for {work.canary:.4g} vs {work.stable:.4g} uncached tokens/request"
    else:
        scaled = ""
    spread = (
        f"; pairs {_pair_count(pairs.canary)} vs {_pair_count(pairs.stable)}, "
        f"variance x{d1:.3g} vs x{d2:.3g} between pairs" + (f", t with {df:.3g} df" if math.isfinite(df) else "")
        if pairs is not None
        else ""
    )
    summary = (
        f"mean {1000 * m1:.4g} ms vs stable {1000 * stable_mean:.4g} ms{scaled} (x{ratio:.3g}, allowed x{allowed:g}): "
        f"p={p:.3g} {'<' if p < level else '≥'} {level:g} (rank {p_rank:.3g}, mean {p_mean:.3g})"
        + (f", power {_pct(power)} at x{allowed:g}" if power is not None else "")
        + spread
    )
    return Comparison(worse, p, ratio, summary, power)


__all__ = [
    "Comparison",
    "ErrorCounts",
    "HitCounts",
    "LatencyHistogram",
    "PairLatencies",
    "UncachedWork",
    "alpha",
    "common_buckets",
    "compare_error_rates",
    "compare_hit_ratios",
    "compare_latency",
    "work_fit",
]
