"""Stable pairs' mean TTFT as a line in their uncached prompt work: the baseline a canary's TTFT is held to (pure).

What it owns: the weighted least-squares fit of each stable pair's mean latency on its uncached prompt tokens per
request, what the fit predicts for the canary's work per request, and how uncertain that prediction and one pair's
mean around the line are. ``core.comparison`` uses it for a TTFT gate with ``compare.normalize:
UncachedPromptTokens`` once stable has ``SPREAD_MIN_PAIRS`` pairs with per-pair cache counters.

Why: each pair serves its own slice of keys, and with them its own prompt lengths and hit ratio, so stable pairs'
mean TTFT differs persistently between pairs (W5 at the full rate: 70 pairs, their spread 0.3–1.2× the
per-request bound), and a canary's pairs hold other keys again. Comparing the canary's mean with stable's mean
scaled by ``max(1, work ratio)`` leaves all of that spread in the test. The line takes out the part that prefill work
explains; what is left (the residuals) is the spread a canary pair's mean shows around the line when its version is
no slower, and the prediction at the canary's own work is the mean it should have. Its intercept is the fixed part of
TTFT (queueing, the first decode step, the KV transfer), which a proportional scaling cannot represent.

What it must not do: I/O, parse query answers (``core.gates`` does), or decide (``core.comparison`` does).

The fit, pairs ``i`` with ``n_i`` requests, mean ``y_i`` and uncached tokens per request ``x_i``, weights ``n_i``
(the revision's mean is the ``n``-weighted mean of its pairs' means, so the fitted line passes through it):
``b = Σn_i(x_i − x̄)(y_i − ȳ) / Σn_i(x_i − x̄)²``, ``a = ȳ − b·x̄``, residuals ``r_i = y_i − a − b·x_i``. The
variances are "sandwich" estimates over the pairs, as ``core.stats.pair_mean_variance`` is, with ``k − 2`` degrees of
freedom (two parameters spent): ``Var(ȳ) = k/(k−2)·Σn_i²r_i²/N²``, ``Var(b) = k/(k−2)·Σn_i²(x_i − x̄)²r_i² /
(Σn_i(x_i − x̄)²)²``, the prediction at ``x`` ``Var(ȳ) + (x − x̄)²·Var(b)`` (``ȳ`` and ``b`` are uncorrelated once
``x`` is centred), and one pair's mean around the line relative to it, ``k/(k−2)·Σn_i²(r_i/ŷ_i)²/Σn_i²`` (as
``core.stats.one_pair_variance``, on ``r_i/ŷ_i``: TTFT's noise grows with the mean).

**The shared tier's part** (``fetched``: each pair's ``external_prefix_cache_hits``, the tokens its prefill instances
fetched through the KV connector after a local miss): a pair's local misses are partly *prefilled* (computed) and
partly *fetched*, and fetching a block costs a fraction of computing it. A new canary pair misses locally what the
shared tier mostly holds, so with local misses as the work a good canary sat at ×0.8 of the line (W5 at the full rate,
seeds 3–4: 25–38 k tokens fetched per request against stable pairs' 5–22 k). With ``fetched`` the fit is a plane,
``y = ȳ + b·(x − x̄) + c·(f − f̄)`` on prefilled ``x`` and fetched ``f`` tokens per request, with the sandwich
covariance of ``(b, c)`` and ``k − 3`` degrees of freedom, and ``c`` kept within ``[0, b]``: a fetched token costs at
least nothing and at most what computing it would. Where the unconstrained ``c`` falls outside, the better of the two
bounds' one-slope lines stands: on the prefilled tokens (``c = 0``) or on the local misses (``c = b``, the line without
the shared tier's counters). W5 seed 3, stable's 75 pairs at one window: ``b`` = 107 µs and ``c`` = 13.5 µs per token.

Worked example: three pairs of 100 requests with 10 k, 20 k and 30 k uncached tokens per request and mean TTFT 0.3,
0.5 and 0.7 s lie on ``0.1 s + 20 µs/token``; with means 0.31, 0.48 and 0.71 s the residuals are +0.01, −0.02,
+0.01 s and the prediction for a canary at 40 k tokens/request is 0.1 + 0.8 = 0.9 s (x̄ = 20 k, ȳ = 0.5 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkFit:
    """The fitted line and its uncertainty (module docstring)."""

    mean: float
    """``ȳ``: stable's mean latency (seconds), where the line passes through ``x̄`` (and ``f̄``)."""
    work: float
    """``x̄``: stable's prompt tokens prefilled per request (``merged``: its local misses per request)."""
    slope: float
    """``b``: seconds per prefilled prompt token per request."""
    mean_variance: float
    """``Var(ȳ)`` from the residuals: the variance of stable's mean around the line."""
    slope_variance: float
    one_pair: float
    """The variance of one pair's mean around the line *relative to the line* (the pairs' typical size,
    ``Σn_i²/N``): a pair on heavier keys varies more in seconds (TTFT noise is multiplicative: a queue behind a
    long prompt delays in proportion), so the canary's pairs borrow it times the square of their own prediction."""
    pairs: int
    """``k``: pairs in the fit."""
    lowest: float
    """The least work per request of a pair in the fit (as :attr:`work` counts it): the line is evidence from
    here..."""
    highest: float
    """...to here (``core.comparison.work_fit`` does not extrapolate)."""
    fetched: float = 0.0
    """``f̄``: stable's prompt tokens per request fetched from the shared tier after a local miss."""
    fetch_slope: float = 0.0
    """``c``: seconds per fetched token per request, within ``[0, b]``."""
    fetch_variance: float = 0.0
    covariance: float = 0.0
    """``Cov(b, c)``."""
    parameters: int = 2
    """Parameters fitted (``k − parameters`` degrees of freedom): 3 with the fetch term, else 2."""
    merged: bool = False
    """The fetch term hit its upper bound ``c = b``: fetched tokens count as prefilled ones, one slope for the local
    misses (the line without the shared tier's counters)."""

    def predict(self, work: float, fetched: float | None = None) -> float:
        """The line at ``work`` prefilled and ``fetched`` fetched tokens per request (``fetched`` None: at
        stable's own ``f̄``; ignored when :attr:`merged`, where ``work`` is the local misses)."""
        df = 0.0 if fetched is None or self.merged else fetched - self.fetched
        return self.mean + self.slope * (work - self.work) + self.fetch_slope * df

    def prediction_variance(self, work: float, fetched: float | None = None) -> float:
        """The variance of :meth:`predict`: grows with the distance from stable's own work."""
        dx = work - self.work
        df = 0.0 if fetched is None or self.merged else fetched - self.fetched
        return (
            self.mean_variance
            + dx * dx * self.slope_variance
            + 2 * dx * df * self.covariance
            + df * df * self.fetch_variance
        )


_Row = tuple[float, float, float, float]
"""``(n_i, y_i, x_i, f_i)``: requests, mean latency, prefilled and fetched tokens per request."""


def _weighted_mean(rows: Sequence[_Row], column: int) -> float:
    return sum(r[0] * r[column] for r in rows) / sum(r[0] for r in rows)


def _spread(rows: Sequence[_Row], fitted: Sequence[float], parameters: int) -> tuple[float, float] | None:
    """``Var(ȳ)`` and one pair's relative variance around ``fitted``, or None when a fitted mean is not positive
    (a line through zero inside stable's own range: TTFT has a fixed part, so no line at all)."""
    if any(not f > 0 for f in fitted):
        return None
    k, total = len(rows), sum(r[0] for r in rows)
    inflate = k / (k - parameters)
    residuals = [(r[0], r[1] - f, f) for r, f in zip(rows, fitted, strict=True)]
    mean_variance = inflate * sum(n * n * e * e for n, e, _ in residuals) / (total * total)
    relative = inflate * sum(n * n * (e / f) ** 2 for n, e, f in residuals)
    return mean_variance, relative / sum(r[0] * r[0] for r in rows)


def _one_slope(rows: Sequence[_Row], merged: bool) -> WorkFit | None:
    """The line on one work variable: the prefilled tokens, or (``merged``) prefilled plus fetched."""
    xs = [r[2] + r[3] if merged else r[2] for r in rows]
    total = sum(r[0] for r in rows)
    y_bar = _weighted_mean(rows, 1)
    x_bar = sum(r[0] * x for r, x in zip(rows, xs, strict=True)) / total
    sxx = sum(r[0] * (x - x_bar) ** 2 for r, x in zip(rows, xs, strict=True))
    if not sxx > 0:
        return None
    slope = sum(r[0] * (x - x_bar) * (r[1] - y_bar) for r, x in zip(rows, xs, strict=True)) / sxx
    fitted = [y_bar + slope * (x - x_bar) for x in xs]
    spread = _spread(rows, fitted, 2)
    if spread is None:
        return None
    inflate = len(rows) / (len(rows) - 2)
    slope_variance = (
        inflate
        * sum(r[0] ** 2 * (x - x_bar) ** 2 * (r[1] - f) ** 2 for r, x, f in zip(rows, xs, fitted, strict=True))
        / (sxx * sxx)
    )
    f_bar = _weighted_mean(rows, 3)
    fetch = (slope, slope_variance, slope_variance) if merged else (0.0, 0.0, 0.0)
    return WorkFit(
        y_bar,
        x_bar,
        slope,
        spread[0],
        slope_variance,
        spread[1],
        len(rows),
        min(xs),
        max(xs),
        f_bar,
        fetch[0],
        fetch[1],
        fetch[2],
        2,
        merged,
    )


def _two_slopes(rows: Sequence[_Row]) -> WorkFit | None:
    """The plane on prefilled and fetched tokens, when its fetch slope lies within ``[0, b]``; else None."""
    k = len(rows)
    if k < 4:
        return None
    y_bar, x_bar, f_bar = _weighted_mean(rows, 1), _weighted_mean(rows, 2), _weighted_mean(rows, 3)
    z = [(r[2] - x_bar, r[3] - f_bar) for r in rows]
    sxx = sum(r[0] * a * a for r, (a, _) in zip(rows, z, strict=True))
    sff = sum(r[0] * c * c for r, (_, c) in zip(rows, z, strict=True))
    sxf = sum(r[0] * a * c for r, (a, c) in zip(rows, z, strict=True))
    det = sxx * sff - sxf * sxf
    if not (sxx > 0 and sff > 0 and det > 1e-9 * sxx * sff):
        return None  # no fetch spread to learn from, or fetched and prefilled move together
    sxy = sum(r[0] * a * (r[1] - y_bar) for r, (a, _) in zip(rows, z, strict=True))
    sfy = sum(r[0] * c * (r[1] - y_bar) for r, (_, c) in zip(rows, z, strict=True))
    b = (sff * sxy - sxf * sfy) / det
    c = (sxx * sfy - sxf * sxy) / det
    if not 0.0 <= c <= b:
        return None
    fitted = [y_bar + b * a + c * e for a, e in z]
    spread = _spread(rows, fitted, 3)
    if spread is None:
        return None
    # Sandwich: A⁻¹ M A⁻¹ with A = [[sxx, sxf], [sxf, sff]] and M = k/(k−3)·Σ n_i² r_i² z_i z_iᵀ.
    inflate = k / (k - 3)
    m = [[0.0, 0.0], [0.0, 0.0]]
    for r, (a, e), fit in zip(rows, z, fitted, strict=True):
        w = inflate * (r[0] * (r[1] - fit)) ** 2
        m[0][0] += w * a * a
        m[0][1] += w * a * e
        m[1][1] += w * e * e
    inv = [[sff / det, -sxf / det], [-sxf / det, sxx / det]]

    def v(i: int, j: int) -> float:
        return sum(inv[i][p] * m[min(p, q)][max(p, q)] * inv[q][j] for p in range(2) for q in range(2))

    xs = [r[2] for r in rows]
    return WorkFit(
        y_bar, x_bar, b, spread[0], v(0, 0), spread[1], k, min(xs), max(xs), f_bar, c, v(1, 1), v(0, 1), 3, False
    )


def fit_pair_work(
    pairs: Sequence[tuple[float, float]], uncached: Sequence[float], fetched: Sequence[float] = ()
) -> WorkFit | None:
    """The fit over the pairs with requests (``pairs``: ``(n_i, latency sum)``; ``uncached``: the prompt tokens
    the same pairs missed in their local prefix cache, same order; ``fetched``: of those, the tokens the shared tier
    supplied — empty when not known), or None when it cannot be made: lengths that differ, a negative or non-finite
    value, more fetched than missed, fewer than three pairs with requests, or pairs that all did the same work per
    request (no slope to fit).

    With ``fetched``: TTFT on the tokens *prefilled* (missed − fetched) and the tokens fetched, the fetch slope kept
    within ``[0, b]`` (a fetched token costs at least nothing and at most what computing it would): at a bound, the
    one-slope line on the prefilled tokens (``c = 0``) or on the local misses (``c = b``, :attr:`WorkFit.merged`),
    whichever fits the pairs better (:func:`_bound`). Without it, the line on the local misses."""
    if len(pairs) != len(uncached) or (fetched and len(fetched) != len(pairs)):
        return None
    shared = fetched or [0.0] * len(pairs)
    rows = [(n, s / n, (u - f) / n, f / n) for (n, s), u, f in zip(pairs, uncached, shared, strict=True) if n > 0]
    if any(not (math.isfinite(v) and v >= 0) for row in rows for v in row):
        return None
    if len(rows) < 3:
        return None
    if not fetched:
        return _one_slope(rows, merged=True)
    two = _two_slopes(rows)
    if two is not None:
        return two
    # The unconstrained fetch slope fell outside [0, b] (or could not be fitted): the better-fitting bound.
    prefilled = _one_slope(rows, merged=False)
    merged = _one_slope(rows, merged=True)
    return _bound(rows, prefilled, merged)


def _bound(rows: Sequence[_Row], prefilled: WorkFit | None, merged: WorkFit | None) -> WorkFit | None:
    """Of the two one-slope lines, the one with the smaller weighted residual sum of squares: with the unconstrained
    optimum outside ``0 ≤ c ≤ b``, the constrained one lies on one of the two bounds, and the least squares over both
    bounds pick it."""
    fits = [f for f in (prefilled, merged) if f is not None]
    if not fits:
        return None

    def rss(fit: WorkFit) -> float:
        return sum(r[0] * (r[1] - fit.predict(r[2] + r[3] if fit.merged else r[2], r[3])) ** 2 for r in rows)

    return min(fits, key=rss)


__all__ = ["WorkFit", "fit_pair_work"]
