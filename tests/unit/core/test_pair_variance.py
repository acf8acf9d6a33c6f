"""Latency means whose requests share a pair's queue (docs/design/009, "Pairs as the unit"; issue 17).

A good canary through the router failed ``ttft-p95`` at ×1.44 its mean with p = 0.002 while its rank test said
p = 1: one busy pair's queue had delayed every request behind a long prompt. Requests on one pair are not
independent, so the comparison takes each revision's per-pair ``_sum``/``_count`` and lets the spread between
pairs widen the test (and a canary on one pair borrow stable's spread).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random

import pytest

from tandem.core import gates as g
from tandem.core.comparison import Comparison, LatencyHistogram, PairLatencies, common_buckets, compare_latency
from tandem.core.stats import (
    mean_greater,
    mean_power,
    normal_sf,
    one_pair_variance,
    pair_mean_variance,
    rank_sum_greater,
    student_t_isf,
    student_t_sf,
)
from tandem.enginemetrics import TPOT_BUCKETS, TTFT_BUCKETS
from tests.fakes import prometheus as fp
from tests.unit.core.test_gate_statistics import WINDOW, arm, res, tpot_gate

THREE_CANARY = ((900.0, 297.0), (900.0, 108.0), (900.0, 108.0))  # means 330, 120, 120 ms → 190 ms
THREE_STABLE = ((900.0, 117.9),) * 3  # 131 ms each
CANARY_HIST = LatencyHistogram(
    ((0.1, 1000.0), (0.25, 2000.0), (0.5, 2500.0), (1.0, 2700.0), (math.inf, 2700.0)), 2700.0, 513.0
)
STABLE_HIST = LatencyHistogram(
    ((0.1, 1200.0), (0.25, 2200.0), (0.5, 2600.0), (1.0, 2700.0), (math.inf, 2700.0)), 2700.0, 353.7
)


def test_pair_mean_variance_worked_example() -> None:
    assert pair_mean_variance(THREE_CANARY) == pytest.approx(0.0049)
    assert pair_mean_variance(THREE_STABLE) == pytest.approx(0.0, abs=1e-12)
    assert pair_mean_variance(((900.0, 297.0),)) is None  # one pair: nothing to spread
    assert pair_mean_variance(((900.0, 297.0), (0.0, 0.0))) is None  # a pair without requests does not count
    assert one_pair_variance(THREE_CANARY) == pytest.approx(0.0147)


@pytest.mark.parametrize(
    ("t", "df", "want"),
    [
        (2.92, 2, 0.5 - 2.92 / (2 * math.sqrt(2.92**2 + 2))),  # df = 2 has a closed form
        (6.965, 2, 0.5 - 6.965 / (2 * math.sqrt(6.965**2 + 2))),
        (1.0, 1, 0.25),  # Cauchy
        (1.5, 1, 0.5 - math.atan(1.5) / math.pi),
        (-1.0, 1, 0.75),
        (0.0, 5, 0.5),
        (2.042, 30, 0.025),  # table value
        (3.0, math.inf, normal_sf(3.0)),
    ],
)
def test_student_t_tail(t: float, df: float, want: float) -> None:
    assert student_t_sf(t, df) == pytest.approx(want, rel=2e-3)


def test_fewer_degrees_of_freedom_and_a_design_effect_weaken_the_evidence() -> None:
    assert rank_sum_greater([0, 2, 2], [2, 2, 0]) == pytest.approx(0.0432, abs=1e-4)
    assert rank_sum_greater([0, 2, 2], [2, 2, 0], design_effect=4.0) == pytest.approx(normal_sf(5.5 / 6.414), 1e-3)
    assert rank_sum_greater([0, 2, 2], [2, 2, 0], df=2) > 0.0432
    assert mean_greater(9.1, 21, 300, 7.0, 21, 6000, df=3) > mean_greater(9.1, 21, 300, 7.0, 21, 6000)


def _judge(pairs: PairLatencies | None = None) -> Comparison:
    """The module's example histograms (mean 190 against 131 ms, 2,700 requests each) at 99 %, ratio 120 %."""
    return compare_latency(CANARY_HIST, STABLE_HIST, confidence_percent=99, max_mean_ratio_percent=120, pairs=pairs)


def test_a_slow_pair_is_not_hundreds_of_slow_requests() -> None:
    """The worked example of ``compare_latency``: the mean test's z falls from 4.2 to 0.83."""
    plain = _judge()
    paired = _judge(PairLatencies(THREE_CANARY, THREE_STABLE))
    assert "mean 2.45e-18" in plain.summary
    assert "variance x170 vs x1 between pairs, t with 2.01 df" in paired.summary
    assert "(rank 0.259, mean 0.244)" in paired.summary and not paired.worse


def test_pairs_that_agree_change_nothing() -> None:
    """No spread between pairs beyond what the per-request bound allows: the same test as without pairs."""
    even = ((900.0, 171.0),) * 3
    plain = _judge()
    paired = _judge(PairLatencies(even, ((900.0, 117.9),) * 3))
    assert (paired.worse, paired.p_value) == (plain.worse, plain.p_value)
    assert "x1 vs x1 between pairs" in paired.summary and " df" not in paired.summary


def test_a_one_pair_canary_borrows_the_spread_of_stables_pairs() -> None:
    spread_stable = ((900.0, 297.0 * 131 / 190), (900.0, 108.0 * 131 / 190), (900.0, 108.0 * 131 / 190))
    one = ((2700.0, 513.0),)
    alone = _judge(PairLatencies(one, ()))
    borrowed = _judge(PairLatencies(one, spread_stable))
    missing = _judge(PairLatencies((), spread_stable))
    assert "x1 vs x1" in alone.summary  # one pair, no stable spread: per request, as before
    assert borrowed.summary.split("pairs 1 vs 3, ")[1].startswith("variance x")
    assert "variance x1 " not in borrowed.summary
    # a canary without a per-pair answer is taken as one pair: the same as telling it
    assert missing.summary.split("(rank")[1] == borrowed.summary.split("(rank")[1].replace("pairs 1 vs", "pairs 0 vs")


def test_a_pair_that_served_nothing_in_the_window_is_not_counted() -> None:
    """A pair with no requests in the window (just created, or drained) adds nothing to the variance and is not
    named in the verdict's pair counts either."""
    with_idle = _judge(PairLatencies(THREE_CANARY, (*THREE_STABLE, (0.0, 0.0))))
    without = _judge(PairLatencies(THREE_CANARY, THREE_STABLE))
    assert "pairs 3 vs 3," in with_idle.summary
    assert with_idle.summary == without.summary


def _histogram(
    bounds: tuple[float, ...], pairs: list[list[float]]
) -> tuple[LatencyHistogram, tuple[tuple[float, float], ...]]:
    """One revision's window from each pair's latencies: the histogram at ``bounds`` and each pair's (n, sum)."""
    counts = [0.0] * (len(bounds) + 1)
    for xs in pairs:
        for x in xs:
            counts[bisect.bisect_left(bounds, x)] += 1
    cumulative, c = [], 0.0
    for bound, k in zip((*bounds, math.inf), counts, strict=True):
        c += k
        cumulative.append((bound, c))
    per = tuple((float(len(xs)), sum(xs)) for xs in pairs)
    return LatencyHistogram(tuple(cumulative), sum(n for n, _ in per), sum(t for _, t in per)), per


def _window(
    rng: random.Random, pairs: int, n: int, mult: float, pair_delay_s: float
) -> tuple[LatencyHistogram, tuple[tuple[float, float], ...]]:
    """One revision's TTFT window: each pair's requests share one queue delay (exponential, mean pair_delay_s)."""
    samples = []
    for _ in range(pairs):
        shared = rng.expovariate(1 / pair_delay_s) if pair_delay_s > 0 else 0.0
        samples.append([(0.08 * rng.lognormvariate(0, 0.6) + shared * rng.uniform(0.5, 1.5)) * mult for _ in range(n)])
    return _histogram(TTFT_BUCKETS, samples)


def _failures(
    canary_pairs: int, stable_pairs: int, mult: float, pair_delay_s: float, trials: int = 200
) -> tuple[int, int]:
    rng = random.Random(7)
    plain = paired = 0
    for _ in range(trials):
        c, cp = _window(rng, canary_pairs, 300, mult, pair_delay_s)
        s, sp = _window(rng, stable_pairs, 300, 1.0, pair_delay_s)
        plain += compare_latency(c, s, confidence_percent=99.0, max_mean_ratio_percent=120.0).worse
        paired += compare_latency(
            c, s, confidence_percent=99.0, max_mean_ratio_percent=120.0, pairs=PairLatencies(cp, sp)
        ).worse
    return plain, paired


def test_identical_revisions_with_shared_pair_queues() -> None:
    """Each pair's window shares an exponential queue delay (mean 60 ms on 80 ms of prefill): the per-request
    test calls an identical canary worse in 45 of 200 windows; with pairs as the unit, at three canary pairs, in 2.
    A canary on one pair against three stable pairs stays above the level (three pairs say little about a skewed
    pair effect) but well below the per-request test (26 against 49 of 200 with this seed)."""
    plain, paired = _failures(3, 3, 1.0, 0.06)
    assert plain >= 30 and paired <= 6, (plain, paired)
    plain, paired = _failures(1, 3, 1.0, 0.06)
    assert paired <= 0.6 * plain, (plain, paired)


def test_without_shared_queues_the_pairs_cost_no_power() -> None:
    plain, paired = _failures(1, 3, 1.3, 0.0)
    assert plain >= 180 and paired >= plain - 10, (plain, paired)
    assert _failures(3, 3, 1.0, 0.0) == (0, 0)


# --- the per-pair answers (core.gates.pair_latencies) ------------------------------------------------


def _answers(
    counts: fp.Reply, sums: fp.Reply, totals: tuple[float, float] = (1800.0, 405.0)
) -> tuple[tuple[float, float], ...]:
    return g.pair_latencies(res(counts, "pair-count-q"), res(sums, "pair-sum-q"), totals, WINDOW)


def test_pair_answers_are_read_by_pair_label() -> None:
    got = _answers(fp.by_pair({"speed-p2": 900, "speed-p1": 900}), fp.by_pair({"speed-p1": 297, "speed-p2": 108}))
    assert got == ((900.0, 297.0), (900.0, 108.0))
    # totals may differ a little: the queries run one after another
    assert _answers(fp.by_pair({"a": 900, "b": 940}), fp.by_pair({"a": 297, "b": 120}), (1800.0, 405.0)) != ()


@pytest.mark.parametrize(
    ("counts", "sums"),
    [
        pytest.param(fp.empty(), fp.empty(), id="no series"),
        pytest.param(fp.by_pair({"a": 900, "b": -1}), fp.by_pair({"a": 297, "b": 108}), id="negative count"),
        pytest.param(fp.by_pair({"a": 900, "b": 900}), fp.by_pair({"a": 297, "b": "NaN"}), id="NaN sum"),
        pytest.param(fp.by_pair({"a": 900, "b": 900}), fp.by_pair({"a": 297, "c": 108}), id="different pairs"),
        pytest.param(fp.multi(900, 900), fp.multi(297, 108), id="no pair label twice"),
        pytest.param(fp.by_pair({"a": 900, "b": 900}), fp.by_pair({"a": 2970, "b": 108}), id="sums off the total"),
        pytest.param(fp.by_pair({"a": 90, "b": 90}), fp.by_pair({"a": 297, "b": 108}), id="counts off the total"),
        pytest.param(fp.by_pair({"a": 900, "b": 900}), fp.http(503), id="Prometheus down"),
        pytest.param(fp.stale(600, 900), fp.by_pair({"a": 405}), id="stale"),
    ],
)
def test_unusable_pair_answers_leave_the_per_request_test(counts: fp.Reply, sums: fp.Reply) -> None:
    """A broken per-pair answer, or one off the revision's totals, is dropped (what the comparison then does with a
    dropped answer: ``core.gates.pair_latencies``)."""
    assert _answers(counts, sums) == ()


def test_a_forged_spread_off_the_totals_cannot_hide_a_slow_canary() -> None:
    """The gate end to end: per-pair sums that add up to ten times the revision's cannot make a slow canary pass."""
    canary = arm(2700.0, buckets=[("0.1", 1000.0), ("0.25", 2000.0), ("1", 2700.0), ("+Inf", 2700.0)], total=513.0)
    stable = arm(2700.0, buckets=[("0.1", 1200.0), ("0.25", 2200.0), ("1", 2700.0), ("+Inf", 2700.0)], total=353.7)
    forged = {
        "pair_counts": res(fp.by_pair({"a": 1350, "b": 1350}), "pc"),
        "pair_sums": res(fp.by_pair({"a": 5000, "b": 130}), "ps"),
    }
    gate = tpot_gate()
    honest = g.evaluate_gate(gate, res(fp.value(0.2)), res(fp.value(0.13)), WINDOW, g.GateSamples(canary, stable))
    tampered = g.evaluate_gate(
        gate,
        res(fp.value(0.2)),
        res(fp.value(0.13)),
        WINDOW,
        g.GateSamples(dataclasses.replace(canary, **forged), stable),
    )
    assert honest.verdict == tampered.verdict == "Failure", (honest.condition, tampered.condition)


@pytest.mark.parametrize(("p", "df"), [(0.05, 2), (0.01, 2), (0.005, 6.64), (0.995, 4), (0.3, 1)])
def test_student_t_quantile_inverts_the_tail(p: float, df: float) -> None:
    assert student_t_sf(student_t_isf(p, df), df) == pytest.approx(p, rel=1e-6)
    assert student_t_isf(0.05, 2) == pytest.approx(2.920, abs=1e-3)


def test_power_takes_the_canarys_wider_variance_and_the_t_tail() -> None:
    base = mean_power(7.0, 21.0, 300, 6000, 1.1, 0.005)
    assert base == pytest.approx(0.50, abs=0.01)  # the docstring's example
    assert mean_power(7.0, 21.0, 300, 6000, 1.1, 0.005, var1=84.0) < base
    assert mean_power(7.0, 21.0, 300, 6000, 1.1, 0.005, df=3) < base


# --- many stable pairs: their spread replaces the bucket bound (SPREAD_MIN_PAIRS) -------------------------------


def _tpot_fleet(
    rng: random.Random, sizes: list[int], mult: float, pair_sd: float = 0.1
) -> tuple[LatencyHistogram, tuple[tuple[float, float], ...]]:
    """One revision's TPOT window as W5's full rate showed it: pair means around 1.6 ms (sd ``pair_sd`` ms between
    pairs: their batches and contexts differ), requests lognormal around their pair's mean, everything inside vLLM's
    first TPOT bucket [0, 10 ms]."""
    samples = []
    for n in sizes:
        centre = max(0.2, rng.gauss(1.6, pair_sd)) * mult / 1000
        samples.append([centre * rng.lognormvariate(-0.02, 0.2) for _ in range(n)])
    return _histogram(TPOT_BUCKETS, samples)


def _tpot_worse(rng: random.Random, stable_pairs: int, mult: float) -> Comparison:
    """A canary on two pairs of 60 requests each against ``stable_pairs`` of 100, at 99 %, ratio 110 %."""
    c, cp = _tpot_fleet(rng, [60, 60], mult)
    s, sp = _tpot_fleet(rng, [100] * stable_pairs, 1.0)
    return compare_latency(c, s, confidence_percent=99.0, max_mean_ratio_percent=110.0, pairs=PairLatencies(cp, sp))


def test_seventy_stable_pairs_measure_the_spread_the_first_tpot_bucket_hides() -> None:
    """W5 at the full rate: TPOT × 1.3 on a two-pair canary, every request inside [0, 10 ms]. The bucket bound
    allows a per-request sd of ~3.7 ms around 1.6 ms; 70 stable pairs show their means within ~0.1 ms. With them
    the test fails the regression in most 30-s windows; with nine stable pairs it keeps the bound and cannot."""
    rng = random.Random(11)
    many = [_tpot_worse(rng, 70, 1.3) for _ in range(100)]
    few = [_tpot_worse(rng, 9, 1.3) for _ in range(100)]
    assert sum(c.worse for c in many) >= 80, [c.summary for c in many[:3]]
    assert sum(c.worse for c in few) == 0, [c.summary for c in few[:3]]
    assert "variance x0.0" in many[0].summary  # far below the per-request bound, and the verdict says so


def test_seventy_stable_pairs_do_not_fail_an_identical_canary() -> None:
    """The measured spread is an estimate, not a bound: an identical canary's two pairs are draws of the same pairs,
    and the test stays at its level (99 %: at most 1 % of windows; 4 of 400 allowed for chance)."""
    rng = random.Random(12)
    false = sum(_tpot_worse(rng, 70, 1.0).worse for _ in range(400))
    assert false <= 4, false


def test_a_zero_spread_is_no_measure() -> None:
    """Seventy stable pairs with exactly equal means (a forged or a frozen exporter) do not make the test exact:
    each arm's variance stays at 1 % of its per-request bound (``SPREAD_FLOOR``)."""
    rng = random.Random(13)
    c, cp = _tpot_fleet(rng, [60, 60], 1.3)
    s, _ = _tpot_fleet(rng, [100] * 70, 1.0)
    flat = tuple((100.0, s.total / 70) for _ in range(70))
    got = compare_latency(c, s, confidence_percent=99.0, max_mean_ratio_percent=110.0, pairs=PairLatencies(cp, flat))
    assert "variance x0.01 vs x0.01 between pairs" in got.summary, got.summary
    assert got.p_value > 0


def test_pairs_tighter_than_the_bound_do_not_sharpen_the_rank_test() -> None:
    """Seventy stable pairs of the same TTFT distribution spread less than the per-request bound allows (design
    effect below 1), which the mean test may use; ranks carry nothing about the spread inside a bucket, so the rank
    test (``rank_sum_greater`` takes a design effect of at least 1) is never read as more certain than over
    independent requests."""
    rng = random.Random(14)
    c, cp = _window(rng, 2, 60, 1.15, 0.0)
    s, sp = _window(rng, 70, 100, 1.0, 0.0)
    got = compare_latency(c, s, confidence_percent=99.0, max_mean_ratio_percent=110.0, pairs=PairLatencies(cp, sp))
    assert "variance x0." in got.summary, got.summary  # the measured spread is below the bound
    _, c_counts, s_counts = common_buckets(c.cumulative, s.cumulative)
    p_rank = float(got.summary.split("(rank ")[1].split(",")[0])
    assert p_rank >= rank_sum_greater(c_counts, s_counts), got.summary
