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
    """``ȳ``: stable's mean latency (seconds), where the line passes through ``x̄``."""
    work: float
    """``x̄``: stable's uncached prompt tokens per request."""
    slope: float
    """``b``: seconds per uncached prompt token per request."""
    mean_variance: float
    """``Var(ȳ)`` from the residuals: the variance of stable's mean around the line."""
    slope_variance: float
    one_pair: float
    """The variance of one pair's mean around the line *relative to the line* (the pairs' typical size,
    ``Σn_i²/N``): a pair on heavier keys varies more in seconds (TTFT noise is multiplicative: a queue behind a
    long prompt delays in proportion), so the canary's pairs borrow it times the square of their own prediction."""
    pairs: int
    """``k``: pairs in the fit (degrees of freedom ``k − 2``)."""
    lowest: float
    """The least uncached work per request of a pair in the fit: the line is evidence from here..."""
    highest: float
    """...to here (``core.comparison.work_fit`` does not extrapolate)."""

    def predict(self, work: float) -> float:
        """The line at ``work`` uncached tokens per request."""
        return self.mean + self.slope * (work - self.work)

    def prediction_variance(self, work: float) -> float:
        """The variance of :meth:`predict` at ``work``: grows with the distance from stable's own work."""
        return self.mean_variance + (work - self.work) ** 2 * self.slope_variance


def fit_pair_work(pairs: Sequence[tuple[float, float]], uncached: Sequence[float]) -> WorkFit | None:
    """The fit over the pairs with requests (``pairs``: ``(n_i, latency sum)``; ``uncached``: the uncached prompt
    tokens of the same pairs, same order), or None when it cannot be made: lengths that differ, a negative or
    non-finite value, fewer than three pairs with requests, or pairs that all did the same work per request (no
    slope to fit)."""
    if len(pairs) != len(uncached):
        return None
    rows = [(n, s / n, u / n) for (n, s), u in zip(pairs, uncached, strict=True) if n > 0]
    if any(not (math.isfinite(v) and v >= 0) for row in rows for v in row):
        return None
    k = len(rows)
    if k < 3:
        return None
    total = sum(n for n, _, _ in rows)
    y_bar = sum(n * y for n, y, _ in rows) / total
    x_bar = sum(n * x for n, _, x in rows) / total
    sxx = sum(n * (x - x_bar) ** 2 for n, _, x in rows)
    if not sxx > 0:
        return None
    slope = sum(n * (x - x_bar) * (y - y_bar) for n, y, x in rows) / sxx
    line = [(n, x, y_bar + slope * (x - x_bar), y) for n, y, x in rows]
    if any(not fitted > 0 for _, _, fitted, _ in line):
        return None  # a line through zero inside stable's own range: TTFT has a fixed part, so no line at all
    inflate = k / (k - 2)
    residuals = [(n, x, y - fitted, fitted) for n, x, fitted, y in line]
    mean_variance = inflate * sum(n * n * r * r for n, _, r, _ in residuals) / (total * total)
    slope_variance = inflate * sum(n * n * (x - x_bar) ** 2 * r * r for n, x, r, _ in residuals) / (sxx * sxx)
    relative = inflate * sum(n * n * (r / fitted) ** 2 for n, _, r, fitted in residuals)
    one_pair = relative / sum(n * n for n, _, _ in rows)
    xs = [x for _, _, x in rows]
    return WorkFit(y_bar, x_bar, slope, mean_variance, slope_variance, one_pair, k, min(xs), max(xs))


__all__ = ["WorkFit", "fit_pair_work"]
