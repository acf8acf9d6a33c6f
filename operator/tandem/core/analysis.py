"""One evaluation pass of a canary analysis step: gate verdicts in, step progress and an outcome out.

What it owns: the step-level rules of testing.md §5 over ``AnalysisProgress`` (persisted in
``status.rollout.analysis``) and the pacing of evaluations. The caller (the rollout state machine)
queries the gates, calls :func:`evaluate_step`, persists the returned progress and acts on the outcome.

What it must not do: read the clock (``now`` is a parameter; all datetimes are timezone-aware), query
anything, or decide what a failure or a NoData deadline *does* (rollback, pause: the caller applies
``failureAction`` / ``onNoData``).

Rules, for one evaluation with the verdicts of every gate of the step:

1. **Pacing.** The first evaluation is due at ``step_started_at + initialDelay``, each next one at
   ``last_evaluated_at + interval``. A call before that changes nothing (``evaluated=False``) and
   returns the standing outcome and the due time, so the caller requeues instead of querying more
   than once per interval. An InvalidQuery is thus retried at most once per interval.
2. **Consecutive means consecutive.** A gap of more than 2 × interval since the last evaluation (the
   operator was down or stalled) restarts the streak and the NoData clock: a fresh window after a
   restart (OP-04); ``failures`` are kept for the whole step.
   Progress last evaluated before ``step_started_at`` belongs to an earlier step and is discarded.
3. **InvalidQuery** (an Error verdict with reason ``InvalidQuery``) → ``Paused`` at once; the streak
   resets. (A step without any gate is paused too, reason ``NoGates``: nothing could ever pass it.)
4. **Failures.** An evaluation with at least one Failure counts once toward ``failures`` (per step);
   ``failures > failureLimit`` → ``Failed`` (``failureLimit: -1`` never fails). A Failure resets the
   streak. A Failure of a ``compare.window: Step`` gate fails the step at once (``failures`` is raised to
   ``failureLimit + 1``): its test is already valid at every look, so a confirming look adds only delay.
   A gate with its own ``failureLimit`` is counted apart, in ``gateFailures[name]``, and its Failures neither
   count toward ``failures`` nor add to another gate's: ``gateFailures[name] > its failureLimit`` → ``Failed``.
   Why: a shared count adds up rare false alarms of different gates, and of looks far apart in a long step; a
   gate whose false alarms come in a heavier tail than its test's ``α`` (W5's TTFT, 2.7 % of looks at 99 %) can
   ask for one more confirming Failure of its own without slowing the other gates (docs/design/009).
5. **Streak.** All gates Success → ``successStreak + 1``; anything else → 0. Streak ≥ ``successStreak``
   → ``Passed``. NoData and Error never count as Success.
6. **NoData / Error** in any gate → hold; ``noDataSince`` is set at the first such evaluation and kept
   until an evaluation with none; ``now − noDataSince ≥ noDataDeadline`` → ``NoDataDeadline``.
   An evaluation with a Failure (below ``failureLimit``) clears ``noDataSince`` even when other gates are
   NoData: the failure is evidence, and the step should wait for the confirming one rather than apply
   ``onNoData`` at the moment its evidence arrives. With a power floor (``minPowerPercent``) most gates are
   NoData for most of a small first step, and a bad canary's first Failure tends to come late in it: without
   this rule the deadline fired in the very evaluation of that Failure and ``onNoData: Pause`` parked the bad
   canary in front of its keys (W5 at the full rate, ``bench/results/w5-full-rate-seed1.md``). Each restart
   costs a Failure, so with ``failureLimit ≥ 0`` a step holds at most ``(failureLimit + 1) × noDataDeadline``
   plus its evaluations; with ``failureLimit: -1`` (never fail) a step whose gates keep failing stays
   ``Continue`` instead of reaching the deadline.

Precedence when several apply: Paused, Failed, NoDataDeadline, Passed, Continue.

Worked example (``interval: 30s``, ``initialDelay: 60s``, ``successStreak: 3``, ``failureLimit: 1``,
``noDataDeadline: 2m``; step started at t=0):

====  ======================  ======  ========  ===========  ==============
t     verdicts                streak  failures  noDataSince  outcome
====  ======================  ======  ========  ===========  ==============
 30   (not due: first at 60)  0       0         -            Continue, due 60
 60   Success, Success        1       0         -            Continue
 90   Success, NoData         0       0         90           Continue
120   Success, Failure        0       1         -            Continue
150   Success, Success        1       1         -            Continue
180   Success, Success        2       1         -            Continue
210   Success, Success        3       1         -            **Passed**
====  ======================  ======  ========  ===========  ==============

Had t=150 been a second Failure, ``failures`` = 2 > 1 → **Failed**; had NoData lasted from t=90 to
t=210, ``210 − 90 ≥ 120`` → **NoDataDeadline**.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from tandem.api.pool import AnalysisSpec, AnalysisStep, MetricGate
from tandem.api.pool_status import AnalysisProgress, GateVerdict
from tandem.api.quantity import parse_duration
from tandem.core.gates import (
    REASON_INVALID_QUERY,
    VERDICT_ERROR,
    VERDICT_FAILURE,
    VERDICT_NO_DATA,
    VERDICT_SUCCESS,
    explain_verdict,
    step_window,
)
from tandem.core.promql import HIT_RATIO_TEMPLATE


class Outcome(StrEnum):
    """What one evaluation pass means for the step."""

    CONTINUE = "Continue"
    """Keep the step and its traffic; evaluate again at ``next_due``."""
    PASSED = "Passed"
    """``successStreak`` consecutive all-Success evaluations: advance to the next step."""
    FAILED = "Failed"
    """More Failures than ``failureLimit``: apply ``failureAction`` (capacity-safe rollback by default)."""
    NO_DATA_DEADLINE = "NoDataDeadline"
    """NoData/Error lasted ``noDataDeadline``: apply ``onNoData``."""
    PAUSED = "Paused"
    """A query or condition is invalid (or the step has no gates): pause and surface it; retried per interval."""


REASON_NO_GATES: Final = "NoGates"
REASON_FAILURE_LIMIT: Final = "FailureLimitExceeded"
REASON_NO_DATA_DEADLINE: Final = "NoDataDeadlineExceeded"
REASON_SUCCESS_STREAK: Final = "SuccessStreakReached"
REASON_NOT_DUE: Final = "NotDue"
REASON_HOLDING_NO_DATA: Final = "HoldingNoData"
REASON_WAITING_STREAK: Final = "WaitingForStreak"
_MESSAGE_CHARS: Final = 1024


@dataclass(frozen=True)
class StepEvaluation:
    """The result of :func:`evaluate_step`."""

    progress: AnalysisProgress
    """The new progress to persist (unchanged when ``evaluated`` is False)."""
    outcome: Outcome
    next_due: datetime
    """When the next evaluation is due: requeue the pool then."""
    evaluated: bool
    """False when the call came before the evaluation was due and the verdicts were ignored."""
    reason: str
    """PascalCase: ``InvalidQuery``, ``FailureLimitExceeded``, ``NoDataDeadlineExceeded``..."""
    message: str
    """Human explanation naming the gates and their values."""


@dataclass(frozen=True)
class GateSelection:
    """The gates an analysis step runs."""

    metrics: tuple[MetricGate, ...]
    eval: bool
    unknown: tuple[str, ...]
    """Metric names the step lists that the analysis spec does not define."""


def select_gates(spec: AnalysisSpec, step: AnalysisStep) -> GateSelection:
    """The step's gates: the named metrics (all metrics when the list is empty), plus eval if asked and defined."""
    by_name = {m.name: m for m in spec.metrics}
    if step.metrics:
        chosen = tuple(by_name[n] for n in step.metrics if n in by_name)
        unknown = tuple(n for n in step.metrics if n not in by_name)
    else:
        chosen, unknown = tuple(spec.metrics), ()
    return GateSelection(chosen, step.eval and spec.eval is not None, unknown)


def next_evaluation_at(progress: AnalysisProgress, spec: AnalysisSpec, step_started_at: datetime) -> datetime:
    """When the next evaluation is due (rule 1)."""
    first = step_started_at + timedelta(seconds=parse_duration(spec.initial_delay))
    if progress.last_evaluated_at is None or progress.last_evaluated_at < step_started_at:
        return first
    return max(first, progress.last_evaluated_at + timedelta(seconds=parse_duration(spec.interval)))


def _own_limits(spec: AnalysisSpec) -> dict[str, int]:
    """The gates counted apart (rule 4): name → their own ``failureLimit``."""
    return {g.name: g.failure_limit for g in spec.metrics if g.failure_limit is not None}


def _over_own_limit(gate_failures: Mapping[str, int], spec: AnalysisSpec) -> list[str]:
    """The gates whose own Failures in this step exceed their own ``failureLimit`` (-1: never)."""
    return [n for n, limit in _own_limits(spec).items() if 0 <= limit < gate_failures.get(n, 0)]


def _over_shared_limit(failures: int, spec: AnalysisSpec) -> bool:
    """Whether the step's shared count of failed evaluations exceeds ``analysis.failureLimit`` (-1: never)."""
    return spec.failure_limit >= 0 and failures > spec.failure_limit


def _standing(progress: AnalysisProgress, spec: AnalysisSpec, now: datetime) -> Outcome:
    """The outcome the persisted progress already implies (for calls that are not due)."""
    if _over_shared_limit(progress.failures, spec) or _over_own_limit(progress.gate_failures, spec):
        return Outcome.FAILED
    if progress.no_data_since is not None and now - progress.no_data_since >= _deadline(spec):
        return Outcome.NO_DATA_DEADLINE
    if progress.success_streak >= spec.success_streak:
        return Outcome.PASSED
    return Outcome.CONTINUE


def _step_window_failures(verdicts: Sequence[GateVerdict], spec: AnalysisSpec) -> bool:
    """Whether a ``compare.window: Step`` gate failed (rule 4): such a failure spends the rest of the step's
    ``failureLimit`` at once. ``failureLimit`` absorbs a noisy window, but a Step gate has no separate windows:
    its test already holds its confidence over every look of the step (Wald's ratio for errors, α spent over
    the looks otherwise), and the next look re-reads the same requests plus an interval's more. Waiting for it
    cost W5's errors canary one more interval on its 2 % step — about 55 requests of a 834-request budget."""
    stepped = {g.name for g in spec.metrics if step_window(g)}
    return any(v.verdict == VERDICT_FAILURE and v.name in stepped for v in verdicts)


def _deadline(spec: AnalysisSpec) -> timedelta:
    return timedelta(seconds=parse_duration(spec.no_data_deadline))


def _summary(verdicts: Sequence[GateVerdict], wanted: set[str]) -> str:
    text = "; ".join(explain_verdict(v) for v in verdicts if v.verdict in wanted)
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def evaluate_step(
    progress: AnalysisProgress,
    verdicts: Sequence[GateVerdict],
    spec: AnalysisSpec,
    step_started_at: datetime,
    now: datetime,
) -> StepEvaluation:
    """Fold one evaluation's verdicts into the step's progress (rules in the module docstring)."""
    interval = timedelta(seconds=parse_duration(spec.interval))
    due = next_evaluation_at(progress, spec, step_started_at)
    if now < due:
        standing = _standing(progress, spec, now)
        return StepEvaluation(progress, standing, due, False, REASON_NOT_DUE, f"next evaluation at {due.isoformat()}")

    last = progress.last_evaluated_at
    if last is not None and last < step_started_at:
        # Progress left over from an earlier step (the caller did not reset it): start this step clean.
        progress = progress.model_copy(
            update={"success_streak": 0, "failures": 0, "gate_failures": {}, "no_data_since": None}
        )
        last = None
    fresh_window = last is None or now - last > 2 * interval
    streak = 0 if fresh_window else progress.success_streak
    failures = progress.failures
    gate_failures = dict(progress.gate_failures)
    no_data_since = None if fresh_window else progress.no_data_since
    next_due = now + interval

    def done(outcome: Outcome, reason: str, message: str) -> StepEvaluation:
        new = progress.model_copy(
            update={
                "success_streak": streak,
                "failures": failures,
                "gate_failures": gate_failures,
                "no_data_since": no_data_since,
                "last_evaluated_at": now,
            }
        )
        return StepEvaluation(new, outcome, next_due, True, reason, message)

    if not verdicts:
        streak = 0
        return done(Outcome.PAUSED, REASON_NO_GATES, "the analysis step has no gates: nothing can pass it")

    kinds = {v.verdict for v in verdicts}
    holding = VERDICT_NO_DATA in kinds or VERDICT_ERROR in kinds
    # A Failure is evidence, even beside other gates' NoData: it restarts the NoData clock (rule 6), so a step
    # whose evidence has just turned against the canary waits for the confirming Failure, not for onNoData.
    no_data_since = (no_data_since or now) if holding and VERDICT_FAILURE not in kinds else None

    invalid = [v for v in verdicts if v.verdict == VERDICT_ERROR and v.reason == REASON_INVALID_QUERY]
    if invalid:
        streak = 0
        return done(Outcome.PAUSED, REASON_INVALID_QUERY, "; ".join(explain_verdict(v) for v in invalid))

    if VERDICT_FAILURE in kinds:
        streak = 0
        own = _own_limits(spec)
        failed = {v.name for v in verdicts if v.verdict == VERDICT_FAILURE}
        for name in failed & own.keys():
            gate_failures[name] = min(gate_failures.get(name, 0) + 1, 100_000)
        stepped = False
        if failed - own.keys():
            failures = min(failures + 1, 100_000)
            stepped = (
                spec.failure_limit >= 0
                and not _over_shared_limit(failures, spec)
                and _step_window_failures(verdicts, spec)
            )
            if stepped:
                failures = spec.failure_limit + 1
        over = _over_own_limit(gate_failures, spec)
        if _over_shared_limit(failures, spec) or over:
            whys = [f"{n}: {gate_failures[n]} failed evaluation(s) > its failureLimit {own[n]}" for n in over]
            if stepped:
                whys.insert(0, "a window: Step gate failed (valid at every look; failureLimit not waited out)")
            elif _over_shared_limit(failures, spec):
                whys.insert(0, f"{failures} failed evaluation(s) > failureLimit {spec.failure_limit}")
            why = "; ".join(whys)
            return done(Outcome.FAILED, REASON_FAILURE_LIMIT, f"{why}: " + _summary(verdicts, {VERDICT_FAILURE}))
    elif kinds == {VERDICT_SUCCESS}:
        streak += 1
    else:
        streak = 0

    if holding and no_data_since is not None and now - no_data_since >= _deadline(spec):
        return done(
            Outcome.NO_DATA_DEADLINE,
            REASON_NO_DATA_DEADLINE,
            f"no data since {no_data_since.isoformat()} (noDataDeadline {spec.no_data_deadline}): "
            + _summary(verdicts, {VERDICT_NO_DATA, VERDICT_ERROR}),
        )
    if streak >= spec.success_streak:
        message = f"{streak} consecutive evaluations with every gate Success"
        if failures:
            message += f" (after {failures} failed evaluation(s), within failureLimit {spec.failure_limit})"
        if any(gate_failures.values()):
            message += " (within their own failureLimit: " + _counts(gate_failures) + ")"
        return done(Outcome.PASSED, REASON_SUCCESS_STREAK, message)
    if holding:
        return done(Outcome.CONTINUE, REASON_HOLDING_NO_DATA, _summary(verdicts, {VERDICT_NO_DATA, VERDICT_ERROR}))
    return done(
        Outcome.CONTINUE,
        REASON_WAITING_STREAK,
        f"success streak {streak}/{spec.success_streak}"
        + (f"; {failures} failure(s)" if failures else "")
        + (f"; {_counts(gate_failures)}" if any(gate_failures.values()) else ""),
    )


def _counts(gate_failures: Mapping[str, int]) -> str:
    """``ttft-p95 2 failure(s)``: the gates counted apart, for messages."""
    return ", ".join(f"{n} {k} failure(s)" for n, k in sorted(gate_failures.items()) if k)


__all__ = [
    "REASON_FAILURE_LIMIT",
    "REASON_HOLDING_NO_DATA",
    "REASON_NOT_DUE",
    "REASON_NO_DATA_DEADLINE",
    "REASON_NO_GATES",
    "REASON_SUCCESS_STREAK",
    "REASON_WAITING_STREAK",
    "GateSelection",
    "Outcome",
    "StepEvaluation",
    "evaluate_step",
    "next_evaluation_at",
    "select_gates",
]


REASON_WARMING_UP: Final = "WarmingUp"
"""A TTFT or hit-ratio Failure held while the canary's prefix cache is colder than stable's (``warmUp``)."""
WARM_UP_TEMPLATES: Final = frozenset({"TTFTP90", "TTFTP95", "LocalKVHitRatio"})
"""Gates a cold prefix cache fails on its own: prefill work grows with the uncached prompt, hits fall."""


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


COLD_CACHE_FULL_MISS: Final = 1e-6
"""Below this miss ratio stable serves (almost) everything from its cache: any cold slowdown is explicable."""
DEFAULT_COLD_SLACK_PERCENT: Final = 110
"""The slack over the cold-cache bound for a TTFT gate without ``compare`` (compare's own default effect size)."""


def cold_ttft_bound(canary_hits: float, stable_hits: float, slack_percent: float) -> float:
    """The largest canary/stable TTFT ratio a cold prefix cache explains: ``(1 − h_c)/(1 − h_s)`` × slack.

    Prefill work is proportional to the prompt tokens *not* found in the cache, so at the same traffic mix
    the canary prefills ``(1 − h_c)/(1 − h_s)`` times as many tokens per request as stable. TTFT is a
    fixed part (queueing, the first decode step, the P→D transfer) plus that prefill, so its ratio stays
    at or below the miss ratio's: a canary slower than the bound is slower per *uncached* token, which
    a cold cache cannot cause. Never below 1 × slack (a canary warmer than stable explains nothing away
    but is still allowed the gate's own effect size); unbounded when stable misses (almost) nothing.

    Example: stable hits 0.83, canary 0.46, slack 110 % → bound (0.54/0.17) × 1.1 = 3.49: W5's cold but good
    canary (TTFT p95 9.6 s vs 4.7 s, ×2.04) is held; the demo's bad version (prefill × 3, hits 0.05 vs
    0.10 → bound 1.16) at ×4.5 fails at once.
    """
    stable_miss = 1.0 - stable_hits
    if stable_miss <= COLD_CACHE_FULL_MISS:
        return math.inf
    return max(1.0, (1.0 - canary_hits) / stable_miss) * slack_percent / 100


def warm_up_verdicts(
    verdicts: Sequence[GateVerdict],
    gates: Sequence[MetricGate],
    analysis: AnalysisSpec,
    step_started_at: datetime,
    now: datetime,
) -> list[GateVerdict]:
    """Hold the cache-sensitive Failures of a cold canary, unless the cold cache cannot explain them
    (``analysis.warmUp``; docs/design/009, "Cold caches").

    The canary is *cold* while its local prefix-hit ratio (the ``LocalKVHitRatio`` gate's value) is below
    ``hitRatioPercent`` % of stable's (that gate's baseline) — or unknown — and the step started less than
    ``maxDuration`` ago. A cold canary's hit-ratio Failure becomes NoData ``WarmingUp``: it holds the step
    (no streak, the NoData clock runs) but never counts toward ``failureLimit``. Its TTFT Failure is held
    the same way **only when the cold cache explains it**: with both hit ratios known, a TTFT ratio
    (canary/stable, the gate's value over its baseline) above :func:`cold_ttft_bound` — the ratio of
    uncached prompt tokens, times the gate's ``compare.maxMeanRatioPercent`` — is a slower prefill per
    uncached token, i.e. the new version's doing, and the Failure stands at once (a warm-up must not hide
    a regression for ``maxDuration``). With the hit ratio unknown nothing can be normalised, and the TTFT
    Failure is held until ``maxDuration``, which bounds every hold. Errors and decode speed are judged
    throughout.

    A TTFT gate with ``compare.normalize: UncachedPromptTokens`` has already scaled stable by the canary's extra
    uncached work, so its Failure is the new version's doing: with the hit ratio known (the cache counters
    answer) it stands at once — holding it too would excuse the cold cache twice. With the hit ratio unknown
    the counters are unusable, the comparison ran unscaled, and the Failure is held as above.

    Why the hit ratio "at its key share" is the right yardstick: the router gives the canary's pairs a slice
    of the key ring, and each pair caches the prefixes of its own keys; once a canary pair has seen its keys
    long enough its hit ratio is a stable pair's (at a lower load, if anything higher). Below that, its
    TTFT pays for prefill that stable skips, which is not the new version's doing.

    Example: hitRatioPercent 90, stable hits 0.83, canary 0.46 one minute into the step → cold (0.46 <
    0.75): ``ttft-p95`` 9.6 s vs 4.7 s (×2.04 ≤ bound 3.49) → NoData WarmingUp; 19 s vs 4.7 s (×4.04 > 3.49)
    → the Failure stands. At hits 0.78 → warm: every Failure stands.
    """
    spec = analysis.warm_up
    if spec is None or now - step_started_at >= timedelta(seconds=parse_duration(spec.max_duration)):
        return list(verdicts)
    by_name = {g.name: g for g in gates}
    templates = {g.name: g.template or "" for g in gates}
    cold = True
    hits: tuple[float, float] | None = None
    detail = "canary hit ratio unknown"
    for v in verdicts:
        if templates.get(v.name) != HIT_RATIO_TEMPLATE:
            continue
        canary, stable = _finite(v.value), _finite(v.baseline)
        if canary is not None and stable is not None:
            need = stable * spec.hit_ratio_percent / 100
            cold = canary < need
            hits = (canary, stable)
            detail = f"canary hit ratio {canary:.3f} vs stable {stable:.3f} (warm at ≥ {need:.3f})"
        break
    if not cold:
        return list(verdicts)
    out: list[GateVerdict] = []
    for v in verdicts:
        template = templates.get(v.name)
        if v.verdict != VERDICT_FAILURE or template not in WARM_UP_TEMPLATES:
            out.append(v)
            continue
        note = detail
        if template != HIT_RATIO_TEMPLATE and hits is not None:
            gate = by_name[v.name]
            if gate.compare is not None and gate.compare.normalize == "UncachedPromptTokens":
                why = f"not a cold cache: already compared per uncached prompt token ({detail})"
                text = f"{v.condition}; {why}" if v.condition else why
                out.append(v.model_copy(update={"condition": text[:1024]}))
                continue
            slack = gate.compare.max_mean_ratio_percent if gate.compare is not None else DEFAULT_COLD_SLACK_PERCENT
            bound = cold_ttft_bound(hits[0], hits[1], slack)
            canary_ttft, stable_ttft = _finite(v.value), _finite(v.baseline)
            if canary_ttft is not None and stable_ttft is not None and stable_ttft > 0:
                ratio = canary_ttft / stable_ttft
                if ratio > bound:
                    why = f"not a cold cache: TTFT ×{ratio:.3g} > ×{bound:.3g} explained by the misses ({detail})"
                    text = f"{v.condition}; {why}" if v.condition else why
                    out.append(v.model_copy(update={"condition": text[:1024]}))
                    continue
                note = f"TTFT ×{ratio:.3g} ≤ ×{bound:.3g} explained by the misses, {detail}"
        text = f"{v.condition}; warming up: {note}" if v.condition else f"warming up: {note}"
        held = {"verdict": VERDICT_NO_DATA, "reason": REASON_WARMING_UP, "condition": text[:1024]}
        out.append(v.model_copy(update=held))
    return out
