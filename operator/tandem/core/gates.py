"""Gate verdicts: one Prometheus query result (or one eval Job) → Success, Failure, NoData or Error.

What it owns: the verdict rules of testing.md §5 and their PascalCase reasons (``REASON_*``), the
resolution of a gate's queries (canary, baseline when a condition reads ``baseline`` or the gate
compares, and the sample queries), the sample floor (``minSamples``), the statistical comparison with
stable (``compare``), and the eval-gate verdict. Every verdict carries the value, the baseline, the
condition and the resolved query, so no verdict is unexplained (landscape.md §6).

What it must not do: query anything, read the clock (``now`` comes in a :class:`SampleWindow`), or
ever turn an empty, NaN, stale, partial, infinite or multi-series result into a pass.

Rules, first match wins, applied to the canary result and then to the baseline result:

==  =====================================================  =========  ======================
 #  the result                                             verdict    reason
==  =====================================================  =========  ======================
 1  no condition, or one that does not compile             Error      ``InvalidQuery``
 2  connection refused, DNS, timeout, unparsable body      Error      ``MetricsUnavailable``
 3  HTTP 400 or 422 (bad query, execution error)           Error      ``InvalidQuery``
 4  any other HTTP status (5xx, 401, 429...)               Error      ``MetricsUnavailable``
 5  ``warnings`` present (partial data)                    NoData     ``Partial``
 6  result type other than vector or scalar                NoData     ``InvalidQueryResult``
 7  no series                                              NoData     ``Empty``
 8  more than one series (never pick one)                  NoData     ``InvalidQueryResult``
 9  ``NaN`` (e.g. 0/0 at zero traffic)                     NoData     ``NaN``
10  ``+Inf`` / ``-Inf``                                    NoData     ``InvalidQueryResult``
11  taken before step start + initialDelay, or its rate    NoData     ``TooEarly``
    window reaches back before the step started
12  sample age (either way) > 2 × scrape interval; the     NoData     ``Stale``
    age of the inputs' newest raw sample when known
    (``QueryResult.sample_time``), else of the answer
==  =====================================================  =========  ======================

A baseline NoData gets the reason prefixed with ``Baseline`` (``BaselineEmpty``...); a baseline Error
keeps its reason, so an invalid baseline query pauses the analysis like an invalid canary query.
When both results are invalid the more severe wins: InvalidQuery, then MetricsUnavailable, then the
canary's NoData, then the baseline's.

With both results valid, the conditions decide (CEL, variables ``result`` and ``baseline``, doubles):

- only ``successCondition``: true → Success (``SuccessConditionMet``), false → Failure
  (``SuccessConditionNotMet``);
- only ``failureCondition``: true → Failure (``FailureConditionMet``), false → Success
  (``FailureConditionNotMet``);
- both: failure true → Failure; else success true → Success; neither → NoData ``Inconclusive``
  (Argo's Inconclusive: hold, never pass);
- a condition that errors or is not boolean (``result == 1`` compares a double with an int and errors
  in CEL: write ``1.0``) → Error ``InvalidQuery``: a broken condition pauses like a broken query.

**Sample size.** A template gate with ``minSamples > 0`` (default 20) also queries the canary's request
count in the window (``core.promql.template_sample_queries``); the count result passes the same validity
rules, and a count below ``minSamples`` → NoData ``TooFewSamples`` (never Failure). With ``compare``
stable's count is checked as well (``BaselineTooFewSamples``). Without sample answers (a caller that
did not query them) the floor is not checked.

**Comparison** (``compare``, ``core.comparison``): after the sample floor, the window's counts of both
revisions (errors and requests, histogram buckets, ``_sum`` and ``_count``, or the prefix-cache tokens looked
up and found) are tested; an invalid answer stops the gate by the rules above (stable's NoData with the
``Baseline`` prefix), and so do hit counts with no tokens looked up or a negative count (NoData
``InvalidQueryResult``). Then:

=====================  ===================================  =========  ==========================
 canary worse?          the gate's conditions (if any)       verdict    reason
=====================  ===================================  =========  ==========================
 no, power < floor      (any)                                NoData     ``Underpowered``
 no                     (any)                                Success    ``NotSignificantlyWorse``
 yes                    none, or they give Failure           Failure    ``SignificantlyWorse``
 yes                    they give Success (floor not hit)    Success    ``WorseWithinCondition``
 yes                    both conditions, neither holds       NoData     ``Inconclusive``
=====================  ===================================  =========  ==========================

**Step windows** (``compare.window: Step``): the caller renders the gate's ``${interval}`` as the time since
the step started (``core.gaterun.step_range``; the first look is still at ``initialDelay``), so each look sees
the whole step so far,
and the comparison runs at the look's share of ``α``: ``α/(j(j+1))`` at look ``j``
(:attr:`SampleWindow.look`, :func:`look_confidence`), which sums to ``α`` over any number of looks.
An ``ErrorRate`` gate is the exception: it runs Wald's sequential test at the gate's own ``α``, valid at
every look by construction (``core.comparison``, "Errors, sequential"), truncated at the power floor: an
undecided look whose canary requests would give one test that power runs that test instead.

The power floor (``compare.minPowerPercent``, off at 0) applies only to a "not worse" answer: a window
whose test had less than that chance of seeing a canary worse by the gate's effect size
(``core.comparison``) proves nothing, so it is NoData ``Underpowered`` — the step waits for a window that
could have failed (or for ``noDataDeadline``) instead of counting it toward ``successStreak``.

The comparison's numbers are appended to the verdict's ``condition``, e.g.
``failure: result > 0.01; errors 1/40 (2.50 %) vs stable 30/6000 (0.50 %): p=0.187 ≥ 0.01, power 2.21 %
at +1 pt``.

Worked example: ``successCondition: result <= 0.5`` on ``TTFTP90``; Prometheus answers
``{"resultType": "vector", "result": [{"metric": {}, "value": [1700000100, "0.475"]}]}``; the step
started at 1700000000 with ``initialDelay: 60s``, scrape interval 15 s, now 1700000101 → the sample is
100 s after the start (≥ 60 s), 1 s old (≤ 30 s), finite, single → ``result = 0.475`` → Success
(``SuccessConditionMet``, value ``"0.475"``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from celpy import celtypes

from tandem.api.celenv import CelError, compile_check, evaluate
from tandem.api.pool import AnalysisSpec, EvalGate, MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.api.quantity import parse_duration
from tandem.core.comparison import (
    Comparison,
    ErrorCounts,
    HitCounts,
    LatencyHistogram,
    PairLatencies,
    UncachedWork,
    compare_error_rates,
    compare_hit_ratios,
    compare_latency,
)
from tandem.core.promql import (
    LABEL_PAIR,
    GateRole,
    QueryRenderError,
    QueryResult,
    QueryStatus,
    QueryVars,
    SampleQueries,
    gate_query_text,
    gate_role,
    parse_sample_value,
    render_query,
    template_sample_queries,
)

Verdict = Literal["Success", "Failure", "NoData", "Error"]
VERDICT_SUCCESS: Final = "Success"
VERDICT_FAILURE: Final = "Failure"
VERDICT_NO_DATA: Final = "NoData"
VERDICT_ERROR: Final = "Error"

# Success / Failure
REASON_SUCCESS_CONDITION_MET: Final = "SuccessConditionMet"
REASON_SUCCESS_CONDITION_NOT_MET: Final = "SuccessConditionNotMet"
REASON_FAILURE_CONDITION_MET: Final = "FailureConditionMet"
REASON_FAILURE_CONDITION_NOT_MET: Final = "FailureConditionNotMet"
# NoData
REASON_EMPTY: Final = "Empty"
REASON_NAN: Final = "NaN"
REASON_STALE: Final = "Stale"
REASON_PARTIAL: Final = "Partial"
REASON_TOO_EARLY: Final = "TooEarly"
REASON_INCONCLUSIVE: Final = "Inconclusive"
REASON_INVALID_QUERY_RESULT: Final = "InvalidQueryResult"
REASON_TOO_FEW_SAMPLES: Final = "TooFewSamples"
# Statistical comparison (``compare``)
REASON_SIGNIFICANTLY_WORSE: Final = "SignificantlyWorse"
REASON_NOT_SIGNIFICANTLY_WORSE: Final = "NotSignificantlyWorse"
REASON_WORSE_WITHIN_CONDITION: Final = "WorseWithinCondition"
REASON_UNDERPOWERED: Final = "Underpowered"
BASELINE_PREFIX: Final = "Baseline"
# Error
REASON_INVALID_QUERY: Final = "InvalidQuery"
REASON_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
# Eval gate
EVAL_GATE_NAME: Final = "eval"
REASON_SCORE_AT_OR_ABOVE_THRESHOLD: Final = "ScoreAtOrAboveThreshold"
REASON_SCORE_BELOW_THRESHOLD: Final = "ScoreBelowThreshold"
REASON_EVAL_RUNNING: Final = "EvalRunning"
REASON_EVAL_FAILED: Final = "EvalFailed"
REASON_EVAL_NO_RESULT: Final = "EvalNoResult"
REASON_EVAL_DEADLINE_EXCEEDED: Final = "EvalDeadlineExceeded"

INVALID_QUERY_HTTP_STATUSES: Final = frozenset({400, 422})
_VALUE_CHARS: Final = 64
_CONDITION_CHARS: Final = 1024
_QUERY_CHARS: Final = 4096
_BASELINE_WORD = re.compile(r"\bbaseline\b")


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleWindow:
    """When a sample counts: after the step started and its initial delay, and fresh.

    ``now`` and ``step_started_at`` must be timezone-aware. ``rate_window_s`` is the range of the
    query's ``rate()`` (the rendered ``${interval}``): the whole window must lie inside the step.
    """

    now: datetime
    step_started_at: datetime
    initial_delay_s: float = 0.0
    max_age_s: float = 60.0
    """2 × the scrape interval (testing.md §5)."""
    rate_window_s: float = 0.0
    interval_s: float = 0.0
    """The analysis ``interval``: the spacing of looks, which numbers them for a ``window: Step`` gate."""

    @property
    def look(self) -> int:
        """This evaluation's number within the step (1 = the first, at ``initialDelay``): ``1 + ⌊elapsed /
        interval⌋``. Evaluations at least ``interval`` apart get distinct numbers, each ≥ its true count, so
        spending ``α/(j(j+1))`` at look ``j`` never spends more than ``α`` over a step."""
        if self.interval_s <= 0:
            return 1
        elapsed = (self.now - self.step_started_at).total_seconds() - self.initial_delay_s
        return 1 + max(0, math.floor(elapsed / self.interval_s + 1e-9))

    @property
    def not_before(self) -> datetime:
        """The earliest sample timestamp that counts."""
        return self.step_started_at + timedelta(seconds=max(self.initial_delay_s, self.rate_window_s))

    @classmethod
    def for_analysis(
        cls,
        spec: AnalysisSpec,
        *,
        now: datetime,
        step_started_at: datetime,
        scrape_interval_s: float,
        rate_window_s: float = 0.0,
    ) -> SampleWindow:
        """The window of an analysis step: ``initialDelay`` from the spec, max age 2 × scrape interval."""
        return cls(
            now=now,
            step_started_at=step_started_at,
            initial_delay_s=parse_duration(spec.initial_delay),
            max_age_s=2 * scrape_interval_s,
            rate_window_s=rate_window_s,
            interval_s=parse_duration(spec.interval),
        )


@dataclass(frozen=True)
class GateQueries:
    """The resolved queries of one gate."""

    canary: str
    baseline: str | None
    """Set when a condition reads ``baseline`` or the gate compares with stable."""
    canary_samples: SampleQueries | None = None
    """The canary's counts (rendered): set for a template gate with ``minSamples > 0`` or ``compare``."""
    stable_samples: SampleQueries | None = None
    """Stable's counts (rendered): set for a gate with ``compare``."""

    def texts(self) -> tuple[str, ...]:
        """Every query to send, each once."""
        out = [self.canary, self.baseline or ""]
        for s in (self.canary_samples, self.stable_samples):
            if s is not None:
                out += s.texts()
        return tuple(dict.fromkeys(q for q in out if q))


@dataclass(frozen=True)
class SampleResults:
    """The answers to one revision's :class:`~tandem.core.promql.SampleQueries`."""

    count: QueryResult
    errors: QueryResult | None = None
    buckets: QueryResult | None = None
    sum: QueryResult | None = None
    uncached: QueryResult | None = None
    prompt_tokens: QueryResult | None = None
    hit_tokens: QueryResult | None = None
    pair_counts: QueryResult | None = None
    pair_sums: QueryResult | None = None
    pair_uncached: QueryResult | None = None
    fetched: QueryResult | None = None
    pair_fetched: QueryResult | None = None


@dataclass(frozen=True)
class GateSamples:
    """The answers to a gate's sample queries: the canary's, and stable's when the gate compares."""

    canary: SampleResults
    stable: SampleResults | None = None


def _sample_results(queries: SampleQueries, results: Mapping[str, QueryResult]) -> SampleResults:
    def get(q: str | None) -> QueryResult | None:
        return results[q] if q is not None else None

    return SampleResults(
        results[queries.count],
        get(queries.errors),
        get(queries.buckets),
        get(queries.sum),
        get(queries.uncached),
        get(queries.prompt_tokens),
        get(queries.hit_tokens),
        get(queries.pair_counts),
        get(queries.pair_sums),
        get(queries.pair_uncached),
        get(queries.fetched),
        get(queries.pair_fetched),
    )


def gate_samples(queries: GateQueries, results: Mapping[str, QueryResult]) -> GateSamples | None:
    """The sample answers of a gate from the answers by query text (None when the gate has no sample queries)."""
    if queries.canary_samples is None:
        return None
    stable = _sample_results(queries.stable_samples, results) if queries.stable_samples is not None else None
    return GateSamples(_sample_results(queries.canary_samples, results), stable)


def references_baseline(gate: MetricGate) -> bool:
    """True when the success or failure condition reads the ``baseline`` variable."""
    return any(_BASELINE_WORD.search(c) for c in (gate.success_condition, gate.failure_condition) if c)


def uses_baseline(gate: MetricGate) -> bool:
    """True when the gate needs stable's value: a condition reads ``baseline``, or the gate compares."""
    return references_baseline(gate) or gate.compare is not None


def step_window(gate: MetricGate) -> bool:
    """True for a ``compare.window: Step`` gate: it queries the whole step (``core.gaterun.step_range``), its test
    holds its α over every look, and one Failure of it fails the step (``core.analysis``, rule 4)."""
    return gate.compare is not None and gate.compare.window == "Step"


def counts_samples(gate: MetricGate) -> bool:
    """True when the gate queries request counts: a template gate with ``minSamples > 0`` or ``compare``."""
    return gate.template is not None and (gate.min_samples > 0 or gate.compare is not None)


def resolve_gate_queries(
    gate: MetricGate,
    *,
    namespace: str,
    pool: str,
    canary_revision: str,
    stable_revision: str | None,
    interval: str,
) -> GateQueries:
    """Render the gate's query for the canary (and for the stable revision when ``baseline`` is used).

    Raises :class:`~tandem.core.promql.QueryRenderError`; turn it into a verdict with
    :func:`invalid_query_verdict`.
    """
    text = gate_query_text(gate.template, gate.query)
    role: GateRole = gate_role(gate.template, gate.role)
    canary_vars = QueryVars(namespace, pool, canary_revision, role, interval)
    canary = render_query(text, canary_vars)
    baseline = None
    stable_vars = None
    if uses_baseline(gate):
        if not stable_revision:
            raise QueryRenderError("the gate reads baseline or compares with stable but there is no stable revision")
        stable_vars = QueryVars(namespace, pool, stable_revision, role, interval)
        baseline = render_query(text, stable_vars)
    canary_samples = stable_samples = None
    if counts_samples(gate):
        assert gate.template is not None
        unrendered = template_sample_queries(gate.template, gate.compare.normalize if gate.compare else "None")
        if gate.compare is None:  # only the sample size
            unrendered = SampleQueries(unrendered.count)
        canary_samples = _render_samples(unrendered, canary_vars)
        if gate.compare is not None and stable_vars is not None:
            stable_samples = _render_samples(unrendered, stable_vars)
    return GateQueries(canary, baseline, canary_samples, stable_samples)


def _render_samples(queries: SampleQueries, variables: QueryVars) -> SampleQueries:
    return replace(
        queries,
        **{f.name: render_query(q, variables) for f in fields(queries) if (q := getattr(queries, f.name)) is not None},
    )


# --- verdicts -------------------------------------------------------------------------------------


def condition_text(gate: MetricGate) -> str:
    """The gate's conditions as shown in a verdict."""
    parts = []
    if gate.success_condition:
        parts.append(f"success: {gate.success_condition}")
    if gate.failure_condition:
        parts.append(f"failure: {gate.failure_condition}")
    return _clip("; ".join(parts), _CONDITION_CHARS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _verdict(
    name: str,
    verdict: Verdict,
    reason: str,
    *,
    value: str = "",
    baseline: str = "",
    condition: str = "",
    query: str = "",
    evaluated_at: datetime | None = None,
) -> GateVerdict:
    return GateVerdict(
        name=name,
        verdict=verdict,
        reason=reason,
        value=_clip(value, _VALUE_CHARS),
        baseline=_clip(baseline, _VALUE_CHARS),
        condition=_clip(condition, _CONDITION_CHARS),
        query=_clip(query, _QUERY_CHARS),
        evaluated_at=evaluated_at,
    )


def invalid_query_verdict(gate: MetricGate, *, query: str = "", now: datetime | None = None) -> GateVerdict:
    """Error ``InvalidQuery`` for a gate whose query could not even be rendered."""
    return _verdict(
        gate.name,
        VERDICT_ERROR,
        REASON_INVALID_QUERY,
        condition=condition_text(gate),
        query=query or (gate.query or gate.template or ""),
        evaluated_at=now,
    )


@dataclass(frozen=True)
class _Checked:
    """One result after the validity rules: a value, or the verdict/reason that stops evaluation."""

    value: float | None
    shown: str  # what the verdict shows as the value
    at: datetime | None
    verdict: Verdict | None = None
    reason: str = ""


def _check(result: QueryResult, window: SampleWindow) -> _Checked:
    if result.status in (QueryStatus.REFUSED, QueryStatus.TIMEOUT, QueryStatus.UNPARSABLE):
        return _Checked(None, "", None, VERDICT_ERROR, REASON_METRICS_UNAVAILABLE)
    if result.status is QueryStatus.HTTP_ERROR or result.http_status != 200:
        if result.http_status in INVALID_QUERY_HTTP_STATUSES:
            return _Checked(None, "", None, VERDICT_ERROR, REASON_INVALID_QUERY)
        return _Checked(None, "", None, VERDICT_ERROR, REASON_METRICS_UNAVAILABLE)
    if result.warnings:
        return _Checked(None, "", None, VERDICT_NO_DATA, REASON_PARTIAL)
    if result.result_type not in ("vector", "scalar"):
        return _Checked(None, result.result_type, None, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT)
    if not result.series:
        return _Checked(None, "", None, VERDICT_NO_DATA, REASON_EMPTY)
    if len(result.series) > 1:
        return _Checked(None, f"{len(result.series)} series", None, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT)
    sample = result.series[0]
    try:
        value = parse_sample_value(sample.value)
        at = datetime.fromtimestamp(sample.timestamp, UTC)
    except (ValueError, OverflowError, OSError):
        return _Checked(None, str(sample.value), None, VERDICT_ERROR, REASON_METRICS_UNAVAILABLE)
    if math.isnan(value):
        return _Checked(None, sample.value, at, VERDICT_NO_DATA, REASON_NAN)
    if math.isinf(value):
        return _Checked(None, sample.value, at, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT)
    stamps = [at]
    if result.sample_time is not None:
        # The inputs' own newest sample (core.promql.freshness_query): a real instant query stamps every
        # answer with the evaluation time, so only this says whether the series still updates.
        try:
            if result.sample_time <= 0:  # no input has a current sample
                raise ValueError("no current sample")
            at = datetime.fromtimestamp(result.sample_time, UTC)
        except (ValueError, OverflowError, OSError):
            return _Checked(None, sample.value, None, VERDICT_NO_DATA, REASON_STALE)
        stamps.append(at)
    if at < window.not_before:
        return _Checked(None, sample.value, at, VERDICT_NO_DATA, REASON_TOO_EARLY)
    if any(abs((window.now - t).total_seconds()) > window.max_age_s for t in stamps):
        return _Checked(None, sample.value, at, VERDICT_NO_DATA, REASON_STALE)
    return _Checked(value, sample.value, at)


def _severity(checked: _Checked, *, is_baseline: bool) -> int:
    if checked.verdict == VERDICT_ERROR:
        return 4 if checked.reason == REASON_INVALID_QUERY else 3
    if checked.verdict == VERDICT_NO_DATA:
        return 1 if is_baseline else 2
    return 0


def _condition_holds(condition: str, variables: Mapping[str, float]) -> bool | None:
    """True/False, or None when the condition errors or is not boolean."""
    try:
        out = evaluate(condition, variables)
    except CelError:
        return None
    if not isinstance(out, celtypes.BoolType):
        return None
    return bool(out)


def _check_buckets(result: QueryResult, window: SampleWindow) -> tuple[_Checked, tuple[tuple[float, float], ...]]:
    """A ``sum by (le)`` answer: every series must pass :func:`_check`, carry a distinct ``le``, and one be +Inf."""
    whole = replace(result, series=result.series[:1])
    first = _check(whole, window)
    if first.verdict is not None:
        return first, ()
    pairs: dict[float, float] = {}
    for series in result.series:
        checked = _check(replace(result, series=(series,)), window)
        if checked.verdict is not None:
            return checked, ()
        try:
            bound = parse_sample_value(series.labels.get("le", ""))
        except ValueError:
            bound = math.nan
        if math.isnan(bound) or bound in pairs:
            return _Checked(
                None, f"le={series.labels.get('le', '')!r}", None, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT
            ), ()
        assert checked.value is not None
        pairs[bound] = checked.value
    if math.inf not in pairs:
        return _Checked(None, "no +Inf bucket", None, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT), ()
    return first, tuple(sorted(pairs.items()))


def uncached_work(
    canary: SampleResults,
    stable: SampleResults,
    counts: tuple[float, float],
    window: SampleWindow,
) -> UncachedWork | None:
    """Uncached prompt tokens per request of both revisions (``compare.normalize: UncachedPromptTokens``), or
    None when either answer is missing or unusable — the comparison then runs unadjusted, as without
    ``normalize``, so bad or absent cache counters can only make the gate stricter, never hide a regression.
    The shared tier's part of them (``fetched``) comes along when both revisions answer it with a value no larger
    than their uncached tokens; otherwise it is None (not known) and every local miss counts as work.

    Example: 3.3 M uncached tokens over 63 canary requests and 65 M over 3,980 stable ones →
    ``UncachedWork(52_381, 16_332)``: the cold canary prefills ×3.2 the tokens per request."""
    if canary.uncached is None or stable.uncached is None:
        return None
    values: list[float] = []
    fetched: list[float] = []
    for result, part, n in ((canary.uncached, canary.fetched, counts[0]), (stable.uncached, stable.fetched, counts[1])):
        checked = _check(result, window)
        if checked.verdict is not None or checked.value is None or checked.value < 0 or n <= 0:
            return None
        values.append(checked.value / n)
        got = _check(part, window) if part is not None else None
        if got is not None and got.verdict is None and got.value is not None and 0 <= got.value <= checked.value:
            fetched.append(got.value / n)
    if len(fetched) != 2:
        return UncachedWork(values[0], values[1])
    return UncachedWork(values[0], values[1], fetched[0], fetched[1])


PAIR_TOTALS_TOLERANCE: Final = 0.05
"""How far the per-pair answers may sum from the revision's totals (relative, plus one request or second): the
queries are evaluated one after another, so a scrape may land between them."""


def _by_pair(result: QueryResult, window: SampleWindow) -> dict[str, float] | None:
    values: dict[str, float] = {}
    for series in result.series:
        checked = _check(replace(result, series=(series,)), window)
        pair = series.labels.get(LABEL_PAIR, "")
        if checked.verdict is not None or checked.value is None or checked.value < 0 or pair in values:
            return None
        values[pair] = checked.value
    return values


def pair_latencies(
    counts: QueryResult | None, sums: QueryResult | None, totals: tuple[float, float], window: SampleWindow
) -> tuple[tuple[float, float], ...]:
    """One revision's ``(requests, latency sum)`` per pair, or ``()`` when the answers are missing or unusable:
    a failed or stale series, a negative or non-finite value, a pair twice, the two answers naming different
    pairs, or totals more than :data:`PAIR_TOTALS_TOLERANCE` away from the revision's ``_count``/``_sum``.
    What the checks guarantee, and what they do not: an answer that does not add up to the revision's totals
    is never believed. A dropped *stable* answer leaves stable's per-request variance (the stricter test); a
    dropped *canary* answer counts the canary as one pair, which still borrows the spread of stable's pairs
    (``core.comparison``), as a one-pair canary does. A spread that does add up to the totals is believed: an
    exporter that can write consistent per-pair series can widen the test, as it could forge the totals.

    Example: ``pair="speed-p1"`` 900 requests / 297 s and ``pair="speed-p2"`` 900 / 108 s against totals
    (1,800, 405) → ``((900, 297), (900, 108))``."""
    if counts is None or sums is None or not counts.series:
        return ()
    n_by, s_by = _by_pair(counts, window), _by_pair(sums, window)
    if n_by is None or s_by is None or n_by.keys() != s_by.keys():
        return ()
    for got, want in ((sum(n_by.values()), totals[0]), (sum(s_by.values()), totals[1])):
        if abs(got - want) > PAIR_TOTALS_TOLERANCE * abs(want) + 1.0:
            return ()
    return tuple((n_by[p], s_by[p]) for p in sorted(n_by))


def pair_uncached_tokens(
    counts: QueryResult | None, uncached: QueryResult | None, total: QueryResult | None, window: SampleWindow
) -> tuple[float, ...]:
    """Uncached prompt tokens of each pair that has latency counts, in :func:`pair_latencies`' order (by pair
    name), or ``()`` when unusable: an answer missing, failed or stale, a negative or non-finite value, a pair twice
    or without a value, or per-pair values more than :data:`PAIR_TOTALS_TOLERANCE` from the revision's total
    (``uncached``'s answer). ``()`` leaves a TTFT gate on the proportional scaling, which the per-pair answers can
    only tighten (``core.comparison.compare_latency``). A pair with uncached tokens and no latency count (a prefill
    whose request has not finished) is left out of the fit, not refused.

    Example: ``pair="speed-p1"`` 1.2 M and ``pair="speed-p2"`` 0.6 M tokens, both with latency counts, total
    1.8 M → ``(1_200_000, 600_000)``."""
    if counts is None or uncached is None or total is None:
        return ()
    n_by, u_by = _by_pair(counts, window), _by_pair(uncached, window)
    checked = _check(total, window)
    if n_by is None or u_by is None or checked.verdict is not None or checked.value is None:
        return ()
    if not n_by.keys() <= u_by.keys() or not all(math.isfinite(u) for u in u_by.values()):
        return ()
    if abs(sum(u_by.values()) - checked.value) > PAIR_TOTALS_TOLERANCE * abs(checked.value) + 1.0:
        return ()
    return tuple(u_by[p] for p in sorted(n_by))


def look_confidence(confidence_percent: float, look: int) -> float:
    """The confidence of look ``look`` of a ``window: Step`` gate: ``α_j = α/(j(j+1))`` (Σ_j α_j = α); look 0
    means a per-interval gate, which keeps its confidence. Example: 99 % at look 1 → 99.5 %, look 4 → 99.95 %."""
    if look <= 0:
        return confidence_percent
    return 100.0 - (100.0 - confidence_percent) / (look * (look + 1))


def _pairs(
    canary: SampleResults,
    stable: SampleResults,
    canary_totals: tuple[float, float],
    stable_totals: tuple[float, float],
    window: SampleWindow,
) -> PairLatencies:
    stable_pairs = pair_latencies(stable.pair_counts, stable.pair_sums, stable_totals, window)
    uncached = pair_uncached_tokens(stable.pair_counts, stable.pair_uncached, stable.uncached, window)
    known = bool(stable_pairs) and len(uncached) == len(stable_pairs)
    fetched = pair_uncached_tokens(stable.pair_counts, stable.pair_fetched, stable.fetched, window) if known else ()
    if len(fetched) != len(uncached) or any(f > u for f, u in zip(fetched, uncached, strict=False)):
        fetched = ()  # the shared tier's share per pair, only where every pair answers it within its misses
    return PairLatencies(
        pair_latencies(canary.pair_counts, canary.pair_sums, canary_totals, window),
        stable_pairs,
        uncached if known else (),
        fetched,
    )


def _comparison(
    gate: MetricGate,
    canary: SampleResults,
    stable: SampleResults,
    counts: tuple[float, float],
    window: SampleWindow,
    max_prompt_tokens: int | None,
) -> tuple[Comparison | None, _Checked, bool]:
    """The statistical comparison, or the first sample answer that stops it (and whether it was stable's)."""
    assert gate.compare is not None
    parts: list[tuple[QueryResult | None, bool, bool]] = [
        (canary.errors, False, False),
        (stable.errors, True, False),
        (canary.sum, False, False),
        (stable.sum, True, False),
        (canary.prompt_tokens, False, False),
        (canary.hit_tokens, False, False),
        (stable.prompt_tokens, True, False),
        (stable.hit_tokens, True, False),
        (canary.buckets, False, True),
        (stable.buckets, True, True),
    ]
    values: list[float] = []
    histograms: list[tuple[tuple[float, float], ...]] = []
    for result, is_stable, is_buckets in parts:
        if result is None:
            continue
        if is_buckets:
            checked, pairs = _check_buckets(result, window)
            histograms.append(pairs)
        else:
            checked = _check(result, window)
            values.append(checked.value if checked.value is not None else math.nan)
        if checked.verdict is not None:
            return None, checked, is_stable
    n_canary, n_stable = counts
    stepped = step_window(gate)
    # A step's errors run Wald's test, valid at every look; the other step tests spend α over the looks.
    spends_alpha = stepped and canary.errors is None
    confidence = look_confidence(gate.compare.confidence_percent, window.look if spends_alpha else 0)
    if canary.errors is not None:
        comparison = compare_error_rates(
            ErrorCounts(n_canary, values[0]),
            ErrorCounts(n_stable, values[1]),
            confidence_percent=confidence,
            error_increase=gate.compare.error_increase_permille / 1000.0,
            sequential=stepped,
            power_floor=gate.compare.min_power_percent / 100.0,
        )
    elif canary.prompt_tokens is not None and len(values) == 4:
        if max_prompt_tokens is None:
            raise ValueError(f"gate {gate.name}: a hit-ratio comparison needs the longest prompt the pool admits")
        for i, is_stable in ((0, False), (2, True)):
            # No tokens looked up, or negative counts: not a window to judge a cache by (a forged or broken
            # answer must hold the step, not pass it as "not significantly worse").
            if not values[i] > 0 or values[i + 1] < 0:
                shown = f"{values[i + 1]:g} hits of {values[i]:g} tokens"
                return None, _Checked(None, shown, None, VERDICT_NO_DATA, REASON_INVALID_QUERY_RESULT), is_stable
        comparison = compare_hit_ratios(
            HitCounts(values[0], values[1]),
            HitCounts(values[2], values[3]),
            confidence_percent=confidence,
            min_ratio_percent=gate.compare.min_ratio_percent,
            max_prompt_tokens=max_prompt_tokens,
        )
    elif len(histograms) == 2 and len(values) == 2:
        comparison = compare_latency(
            LatencyHistogram(histograms[0], n_canary, values[0]),
            LatencyHistogram(histograms[1], n_stable, values[1]),
            confidence_percent=confidence,
            max_mean_ratio_percent=gate.compare.max_mean_ratio_percent,
            work=(
                uncached_work(canary, stable, counts, window)
                if gate.compare.normalize == "UncachedPromptTokens"
                else None
            ),
            pairs=_pairs(canary, stable, (n_canary, values[0]), (n_stable, values[1]), window),
        )
    else:  # the template has nothing to compare (the CRD forbids compare on it)
        return None, _Checked(None, "", None, VERDICT_ERROR, REASON_INVALID_QUERY), False
    return comparison, _Checked(None, "", None), False


def evaluate_gate(
    gate: MetricGate,
    canary: QueryResult,
    baseline: QueryResult | None,
    window: SampleWindow,
    samples: GateSamples | None = None,
    *,
    max_prompt_tokens: int | None = None,
) -> GateVerdict:
    """The verdict of one metric gate (rules in the module docstring).

    ``baseline`` is the same query on the stable revision; it is required when the gate reads it
    (:func:`uses_baseline`) and ignored otherwise. ``samples`` are the answers to the gate's sample
    queries (:func:`gate_samples`): without them ``minSamples`` is not checked; a ``compare`` gate
    requires them, stable's included. ``max_prompt_tokens`` (the longest prompt the pool admits) bounds the
    variance of a ``LocalKVHitRatio`` comparison, which requires it.
    """
    condition = condition_text(gate)
    query = canary.query
    needs_baseline = uses_baseline(gate)
    if needs_baseline and baseline is None:
        raise ValueError(f"gate {gate.name}: the gate reads baseline but no baseline result was given")
    if gate.compare is not None and (samples is None or samples.stable is None):
        raise ValueError(f"gate {gate.name}: the gate compares with stable but no sample results were given")

    def verdict(v: Verdict, reason: str, c: _Checked, b: _Checked | None, shown_query: str = "") -> GateVerdict:
        return _verdict(
            gate.name,
            v,
            reason,
            value=c.shown,
            baseline=b.shown if b else "",
            condition=condition,
            query=shown_query or query,
            evaluated_at=c.at or window.now,
        )

    conditions = [t for t in (gate.success_condition, gate.failure_condition) if t]
    if (not conditions and gate.compare is None) or any(compile_check(t) is not None for t in conditions):
        # No condition at all (the CRD forbids it; a model built in code may not) or one that does not compile.
        return verdict(VERDICT_ERROR, REASON_INVALID_QUERY, _Checked(None, "", None), None)

    c = _check(canary, window)
    b = _check(baseline, window) if needs_baseline and baseline is not None else None
    worst_c = _severity(c, is_baseline=False)
    worst_b = _severity(b, is_baseline=True) if b else 0
    if worst_c or worst_b:
        if worst_b > worst_c and b is not None and b.verdict is not None:
            reason = b.reason if b.verdict == VERDICT_ERROR else BASELINE_PREFIX + b.reason
            if b.verdict == VERDICT_ERROR and baseline is not None:
                query = baseline.query
            return verdict(b.verdict, reason, c, b)
        assert c.verdict is not None
        return verdict(c.verdict, c.reason, c, b)

    # Sample size: the canary's (and, when comparing, stable's) request count in the window.
    counts = (0.0, 0.0)
    if samples is not None:
        arms = [(samples.canary, False)] + ([(samples.stable, True)] if gate.compare and samples.stable else [])
        found = []
        for arm, is_stable in arms:
            n = _check(arm.count, window)
            if n.verdict is not None:
                reason = BASELINE_PREFIX + n.reason if is_stable and n.verdict == VERDICT_NO_DATA else n.reason
                return verdict(n.verdict, reason, c, b, arm.count.query)
            assert n.value is not None
            if n.value < gate.min_samples:
                condition = _clip(
                    f"{condition}; {'stable' if is_stable else 'canary'} requests {n.value:.0f} < minSamples "
                    f"{gate.min_samples}".lstrip("; "),
                    _CONDITION_CHARS,
                )
                reason = (BASELINE_PREFIX if is_stable else "") + REASON_TOO_FEW_SAMPLES
                return verdict(VERDICT_NO_DATA, reason, c, b, arm.count.query)
            found.append(n.value)
        counts = (found[0], found[1] if len(found) > 1 else 0.0)

    assert c.value is not None
    variables: dict[str, float] = {"result": c.value}
    if b is not None and b.value is not None:
        variables["baseline"] = b.value
    failed = succeeded = None
    if gate.failure_condition:
        failed = _condition_holds(gate.failure_condition, variables)
        if failed is None:
            return verdict(VERDICT_ERROR, REASON_INVALID_QUERY, c, b)
    if gate.success_condition:
        succeeded = _condition_holds(gate.success_condition, variables)
        if succeeded is None:
            return verdict(VERDICT_ERROR, REASON_INVALID_QUERY, c, b)
    if failed:
        by_condition: tuple[Verdict, str] = (VERDICT_FAILURE, REASON_FAILURE_CONDITION_MET)
    elif succeeded:
        by_condition = (VERDICT_SUCCESS, REASON_SUCCESS_CONDITION_MET)
    elif succeeded is None and failed is not None:  # only a failureCondition, and it did not hold
        by_condition = (VERDICT_SUCCESS, REASON_FAILURE_CONDITION_NOT_MET)
    elif failed is None and succeeded is not None:  # only a successCondition, and it did not hold
        by_condition = (VERDICT_FAILURE, REASON_SUCCESS_CONDITION_NOT_MET)
    elif conditions:
        by_condition = (VERDICT_NO_DATA, REASON_INCONCLUSIVE)
    else:
        by_condition = (VERDICT_FAILURE, "")  # no condition: the comparison alone decides
    if gate.compare is None:
        return verdict(*by_condition, c, b)

    assert samples is not None and samples.stable is not None
    comparison, stopped, is_stable = _comparison(
        gate, samples.canary, samples.stable, counts, window, max_prompt_tokens
    )
    if comparison is None:
        reason = (
            BASELINE_PREFIX + stopped.reason if is_stable and stopped.verdict == VERDICT_NO_DATA else stopped.reason
        )
        if stopped.shown:  # the counts that stopped it ("-5 hits of 320000 tokens"): value/baseline show others
            who = "stable" if is_stable else "canary"
            condition = _clip(f"{condition}; {who} {stopped.shown}".lstrip("; "), _CONDITION_CHARS)
        assert stopped.verdict is not None
        return verdict(stopped.verdict, reason, c, b)
    summary = comparison.summary + (f", step look {window.look}" if step_window(gate) else "")
    full = f"{condition}; {summary}".lstrip("; ")
    condition = _clip(full, _CONDITION_CHARS)
    if not comparison.worse:
        floor = gate.compare.min_power_percent / 100.0
        if floor > 0 and (comparison.power is None or comparison.power < floor):
            # Say what the step waits for: a held canary's status should read how far its evidence has to go. The
            # summary is clipped to make room, so a long one cannot cut this off.
            needs = f"; power below minPowerPercent {gate.compare.min_power_percent}"
            condition = _clip(full, _CONDITION_CHARS - len(needs)) + needs
            return verdict(VERDICT_NO_DATA, REASON_UNDERPOWERED, c, b)
        return verdict(VERDICT_SUCCESS, REASON_NOT_SIGNIFICANTLY_WORSE, c, b)
    if by_condition[0] == VERDICT_FAILURE:
        return verdict(VERDICT_FAILURE, REASON_SIGNIFICANTLY_WORSE, c, b)
    if by_condition[0] == VERDICT_SUCCESS:
        return verdict(VERDICT_SUCCESS, REASON_WORSE_WITHIN_CONDITION, c, b)
    return verdict(VERDICT_NO_DATA, REASON_INCONCLUSIVE, c, b)


def explain_verdict(v: GateVerdict) -> str:
    """One line for Events and logs: ``ttft-p90 Failure (SuccessConditionNotMet): value=0.71 ...``."""
    parts = [f"{v.name} {v.verdict}" + (f" ({v.reason})" if v.reason else "")]
    if v.value:
        parts.append(f"value={v.value}")
    if v.baseline:
        parts.append(f"baseline={v.baseline}")
    if v.condition:
        parts.append(f"[{v.condition}]")
    return " ".join(parts)


# --- eval gate ------------------------------------------------------------------------------------

EvalJobState = Literal["Pending", "Running", "Succeeded", "Failed"]


@dataclass(frozen=True)
class EvalJobObservation:
    """What the caller observed of the step's eval Job."""

    name: str
    state: EvalJobState
    started_at: datetime
    """When the Job was created (server time); the deadline counts from here."""
    termination_message: str | None = None
    """The eval container's termination message, ``{"score": <percent>}``."""


def parse_eval_score(message: str | None) -> float | None:
    """The score of ``{"score": <percent>}`` (a finite number in 0..100), else None."""
    if not message:
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    score = doc.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None
    score = float(score)
    if not math.isfinite(score) or not 0 <= score <= 100:
        return None
    return score


def evaluate_eval_gate(gate: EvalGate, job: EvalJobObservation, *, now: datetime) -> GateVerdict:
    """Verdict of the eval gate (testing.md §5).

    Succeeded with score ≥ ``minScorePercent`` → Success; lower → Failure; Failed, or Succeeded with no
    parsable score → Error; Pending/Running → NoData until ``started_at + deadline``, then Error.

    Example: ``minScorePercent: 98``, Job Succeeded with ``{"score": 98.4}`` → Success, value ``98.4``.
    """
    condition = f"score >= {gate.min_score_percent}"
    query = f"job/{job.name}"

    def verdict(v: Verdict, reason: str, value: str = "") -> GateVerdict:
        return _verdict(EVAL_GATE_NAME, v, reason, value=value, condition=condition, query=query, evaluated_at=now)

    if job.state == "Succeeded":
        score = parse_eval_score(job.termination_message)
        if score is None:
            return verdict(VERDICT_ERROR, REASON_EVAL_NO_RESULT)
        shown = f"{score:g}"
        if score >= gate.min_score_percent:
            return verdict(VERDICT_SUCCESS, REASON_SCORE_AT_OR_ABOVE_THRESHOLD, shown)
        return verdict(VERDICT_FAILURE, REASON_SCORE_BELOW_THRESHOLD, shown)
    if job.state == "Failed":
        return verdict(VERDICT_ERROR, REASON_EVAL_FAILED)
    if now >= job.started_at + timedelta(seconds=parse_duration(gate.deadline)):
        return verdict(VERDICT_ERROR, REASON_EVAL_DEADLINE_EXCEEDED)
    return verdict(VERDICT_NO_DATA, REASON_EVAL_RUNNING)


__all__ = [
    "BASELINE_PREFIX",
    "EVAL_GATE_NAME",
    "INVALID_QUERY_HTTP_STATUSES",
    "REASON_EMPTY",
    "REASON_EVAL_DEADLINE_EXCEEDED",
    "REASON_EVAL_FAILED",
    "REASON_EVAL_NO_RESULT",
    "REASON_EVAL_RUNNING",
    "REASON_FAILURE_CONDITION_MET",
    "REASON_FAILURE_CONDITION_NOT_MET",
    "REASON_INCONCLUSIVE",
    "REASON_INVALID_QUERY",
    "REASON_INVALID_QUERY_RESULT",
    "REASON_METRICS_UNAVAILABLE",
    "REASON_NAN",
    "REASON_NOT_SIGNIFICANTLY_WORSE",
    "REASON_PARTIAL",
    "REASON_SCORE_AT_OR_ABOVE_THRESHOLD",
    "REASON_SCORE_BELOW_THRESHOLD",
    "REASON_SIGNIFICANTLY_WORSE",
    "REASON_STALE",
    "REASON_SUCCESS_CONDITION_MET",
    "REASON_SUCCESS_CONDITION_NOT_MET",
    "REASON_TOO_EARLY",
    "REASON_TOO_FEW_SAMPLES",
    "REASON_WORSE_WITHIN_CONDITION",
    "VERDICT_ERROR",
    "VERDICT_FAILURE",
    "VERDICT_NO_DATA",
    "VERDICT_SUCCESS",
    "EvalJobObservation",
    "EvalJobState",
    "GateQueries",
    "GateSamples",
    "SampleResults",
    "SampleWindow",
    "Verdict",
    "condition_text",
    "counts_samples",
    "evaluate_eval_gate",
    "evaluate_gate",
    "explain_verdict",
    "gate_samples",
    "invalid_query_verdict",
    "parse_eval_score",
    "references_baseline",
    "resolve_gate_queries",
    "step_window",
    "uses_baseline",
]
