"""Which gates one pass must evaluate, and what their verdicts mean for the step and the scorecard.

What it owns, all pure:
- `analysis_request`: whether the current rollout step is an analysis step that is due now, and
  exactly what to query (gates, canary and stable revisions, rate window, timeout). The reconcile asks
  this *before* planning so the I/O (Prometheus, the eval Job) happens in the observe step;
- `eval_verdict`: the eval gate's verdict from the observed Job;
- `fold_analysis`: the verdicts folded into the step's progress (`tandem.core.analysis.evaluate_step`)
  as the `AnalysisResult` the rollout state machine consumes;
- `update_scorecard`: per-version numbers (TTFT p90/p95 ms, tokens/s/user, error %, local hit %, eval
  %) taken from the verdicts of built-in templates, canary and baseline, newest version first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tandem.api.pool import AnalysisStep, MetricGate
from tandem.api.pool_status import GateVerdict, RolloutStatus, VersionScore
from tandem.api.quantity import parse_duration
from tandem.api.resources import InferencePool
from tandem.core.analysis import evaluate_step, next_evaluation_at, select_gates, warm_up_verdicts
from tandem.core.gates import EVAL_GATE_NAME, EvalJobObservation, EvalJobState, evaluate_eval_gate
from tandem.core.observed import EvalJobView
from tandem.core.promql import compute_rate_window
from tandem.core.rollout import AnalysisResult

DEFAULT_SCRAPE_INTERVAL_S = 15.0
MAX_SCORECARD = 10


@dataclass(frozen=True)
class AnalysisRequest:
    """One due evaluation of the current analysis step."""

    step_index: int
    step: AnalysisStep
    gates: tuple[MetricGate, ...]
    eval: bool
    canary: str
    stable: str
    rate_window: str
    timeout_s: float
    step_started_at: datetime
    unknown: tuple[str, ...] = ()


def analysis_request(
    pool: InferencePool,
    desired: str,
    stable: str,
    now: datetime,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
) -> AnalysisRequest | None:
    """The evaluation due this pass, or None (not an analysis step, not due, paused, other revision)."""
    status = pool.status.rollout if pool.status else RolloutStatus()
    spec = pool.spec
    if status.phase != "Progressing" or spec.rollout.paused or status.revision != desired or desired == stable:
        return None
    steps = spec.rollout.steps
    if status.step_index >= len(steps) or status.step_started_at is None:
        return None
    step = steps[status.step_index]
    if step.analysis is None:
        return None
    analysis = spec.rollout.analysis
    if now < next_evaluation_at(status.analysis, analysis, status.step_started_at):
        return None
    selection = select_gates(analysis, step.analysis)
    return AnalysisRequest(
        step_index=status.step_index,
        step=step.analysis,
        gates=selection.metrics,
        eval=selection.eval,
        canary=desired,
        stable=stable,
        rate_window=compute_rate_window(parse_duration(analysis.interval), scrape_interval_s),
        timeout_s=parse_duration(analysis.timeout),
        step_started_at=status.step_started_at,
        unknown=selection.unknown,
    )


def eval_verdict(pool: InferencePool, job: EvalJobView | None, now: datetime) -> GateVerdict:
    """The eval gate's verdict: a Job not created yet is running from now (NoData until its deadline)."""
    gate = pool.spec.rollout.analysis.eval
    assert gate is not None
    if job is None:
        observation = EvalJobObservation(name="(creating)", state="Pending", started_at=now)
    else:
        state: EvalJobState = (
            "Succeeded" if job.succeeded else "Failed" if job.failed else "Running" if job.active else "Pending"
        )
        observation = EvalJobObservation(
            name=job.name,
            state=state,
            started_at=job.started or now,
            termination_message=job.termination_message,
        )
    verdict = evaluate_eval_gate(gate, observation, now=now)
    if job is not None and job.target:
        # rollout.gates[eval].query then says which path the score measured (router or decode pods).
        verdict = verdict.model_copy(update={"query": f"{verdict.query} via {job.target}"})
    return verdict


def fold_analysis(
    pool: InferencePool, request: AnalysisRequest, verdicts: Sequence[GateVerdict], now: datetime
) -> AnalysisResult:
    """The verdicts of this pass folded into the step's progress."""
    status = pool.status.rollout if pool.status else RolloutStatus()
    spec = pool.spec.rollout.analysis
    verdicts = warm_up_verdicts(verdicts, request.gates, spec, request.step_started_at, now)
    evaluation = evaluate_step(status.analysis, verdicts, spec, request.step_started_at, now)
    message = evaluation.message
    if request.unknown:
        message = f"unknown gate(s) {', '.join(request.unknown)} ignored; " + message
    return AnalysisResult(
        progress=evaluation.progress,
        outcome=evaluation.outcome.value,
        verdicts=tuple(verdicts),
        message=message[:1024],
    )


_FIELDS = {
    "TTFTP90": ("ttft_p90_ms", 1000.0),
    "TTFTP95": ("ttft_p95_ms", 1000.0),
    "TokensPerSecondPerUser": ("tokens_per_second_per_user", 1.0),
    "ErrorRate": ("error_rate_percent", 100.0),
    "LocalKVHitRatio": ("local_kv_hit_percent", 100.0),
}


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def update_scorecard(
    scorecard: Sequence[VersionScore],
    gates: Sequence[MetricGate],
    verdicts: Sequence[GateVerdict],
    canary: tuple[str, str],
    stable: tuple[str, str] | None,
    now: datetime,
) -> list[VersionScore]:
    """Scorecard rows for the canary (and, from baselines, the stable version) with this pass's numbers."""
    templates = {g.name: g.template for g in gates if g.template}
    rows = {(s.version, s.revision): s for s in scorecard}

    def apply(key: tuple[str, str], values: dict[str, float]) -> None:
        if not values:
            return
        current = rows.get(key) or VersionScore(version=key[0], revision=key[1])
        rows[key] = current.model_copy(update={**values, "updated_at": now})

    canary_values: dict[str, float] = {}
    stable_values: dict[str, float] = {}
    for verdict in verdicts:
        if verdict.name == EVAL_GATE_NAME:
            score = _number(verdict.value)
            if score is not None:
                canary_values["eval_score_percent"] = score
            continue
        template = templates.get(verdict.name)
        if template not in _FIELDS:
            continue
        field, scale = _FIELDS[template]
        value = _number(verdict.value)
        if value is not None:
            canary_values[field] = round(value * scale, 3)
        baseline = _number(verdict.baseline) if verdict.baseline else None
        if baseline is not None:
            stable_values[field] = round(baseline * scale, 3)
    apply(canary, canary_values)
    if stable is not None:
        apply(stable, stable_values)
    ordered = sorted(rows.values(), key=lambda s: s.updated_at or datetime.min.replace(tzinfo=now.tzinfo), reverse=True)
    return ordered[:MAX_SCORECARD]
