"""W5, a bad canary: Tandem's rollout logic (imported from ``tandem.core``) against a Flagger-like baseline.

What it owns: the two rollout controllers the simulator drives during a run, the Prometheus query results
they read (built from the simulator's scrapes, exactly as ``tandem.core.promql`` would receive them),
the W5 timeline (detection, rollback split into observe/decide/act, requests served by the bad
revision) and the statistical floor of benchmarks.md §7.

**Tandem** (:class:`TandemRollout`) does what ``tandem.reconcile.pool`` and ``tandem.core.plan`` do
each pass, with the pure pieces imported unchanged: ``analysis_request`` (is an evaluation due, which
gates), ``tandem.core.gaterun.gate_queries`` and ``judge`` on the answers with ``SampleWindow.for_analysis``
(as ``tandem.adapters.prometheus.evaluate_metric_gates``, which sends the same queries to Prometheus),
``fold_analysis`` (``tandem.core.analysis.evaluate_step``, with the cold-cache warm-up), ``plan_rollout`` with
per-revision pair counts and the surge room (``core.rollout.surge_room``; the simulated cluster has free GPUs,
so ``maxSurge`` decides), then the pair targets are converged (``tandem.core.converge.next_moves``, the
decision ``core.plan`` runs, applied by :meth:`Simulation.converge_revisions`) and the canary's traffic
share is ``core.plan.canary_share``, the function ``build_table`` calls.
The rollout status persists between passes as the operator's ``status.rollout`` does. Passes run every
``policies.reconcile_s`` (the operator reconciles on events and on ``requeue_after``).

**Flagger-like** (:class:`FlaggerRollout`), https://docs.flagger.app/usage/how-it-works: every
``interval_s`` (60 s) one check of the same gates; a check fails unless every gate is Success (Flagger
counts "no values" as a failed check); ``threshold`` (5) failed checks → rollback; a passing check adds
``step_weight`` (5) up to ``max_weight`` (50), then promotion. The first interval after the canary is
Ready only sets the weight (no traffic to check yet). Flagger keeps the primary at full size and routes
back to it at once, so the act step is one pass; its canary capacity here follows the weight
(⌈N·w/100⌉ extra pairs, weights capped by the canary's Ready share as for Tandem) so that both arms
measure the canary at the same per-pair load. (Flagger proper scales the canary Deployment to the
primary's size; at 5 % of traffic that canary would run nearly idle and load-dependent signals such
as TPOT would not show a regression at all.)

Query results (``vllm:`` names, per revision, over the rendered ``${interval}``): the newest scrape at or
before ``now`` against the one a window earlier; TTFT/TPOT quantiles with ``histogram_quantile`` over
vLLM's buckets; ``ErrorRate`` = engine errors / finished; ``LocalKVHitRatio`` = prefix hits / queries.
0/0 → ``NaN`` and a revision without series → an empty result, so the gates' NoData rules apply as in
production. The gates' sample queries (request counts for ``minSamples``; error counts, ``le`` buckets and
``_sum`` for ``compare``, ``core.promql.template_sample_queries``) are answered from the same scrapes
(:func:`sample_results`) and judged by the same ``core.gaterun.judge``. Sample timestamps are the
evaluation time (an instant query's). The simulator records a request's TTFT when it completes (vLLM
does at the first token): a few seconds late for long outputs.

Statistical floor (§7): errors p₀ → p₁ against a much larger stable arm, one-sample, α = 0.05 one-sided,
power 0.8: n = (z_α·√(p₀q₀) + z_β·√(p₁q₁))² / (p₁ − p₀)² canary requests (0.5 % → 1.0 %: ≈ 1,600); a
p90 TPOT gate needs ≈ 10 tail events, n = 10 / (1 − 0.9) = 100. Floor = n / the canary's request rate.
Gate (§6): rollback ≤ 2 × floor and < 0.1 % of all requests on the bad revision.

Must not: re-implement any part of ``tandem.core.rollout``, ``converge``, ``analysis``, ``gaterun`` or
``gates`` (they are called; ``tests/sim/test_one_implementation.py`` checks it); read the clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from tandem.api.pool import AnalysisSpec, MetricGate
from tandem.api.pool_status import GateVerdict, InferencePoolStatus
from tandem.api.quantity import parse_duration
from tandem.api.resources import InferencePool
from tandem.core.analysisplan import analysis_request, fold_analysis
from tandem.core.gaterun import GatePlan, gate_queries, judge, step_range
from tandem.core.gates import VERDICT_FAILURE, VERDICT_SUCCESS, SampleWindow
from tandem.core.plan import canary_share
from tandem.core.promql import (
    LABEL_PAIR,
    METRIC_TTFT,
    TEMPLATE_HISTOGRAMS,
    QueryResult,
    QueryStatus,
    SampleQueries,
    Series,
    compute_rate_window,
    parse_prom_duration,
)
from tandem.core.rollout import AnalysisResult, RevisionCounts, RolloutInputs, plan_rollout, surge_room
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.engine import Revision, SimOptions, SimResult, Simulation
from tandem_lab.sim.metrics import TPOT_BUCKETS, TTFT_BUCKETS, RevisionSeries, ScrapeStore, histogram_quantile
from tandem_lab.sim.policies.base import FleetTarget, unit_shape
from tandem_lab.sim.profile import FixedFleet
from tandem_lab.sim.runner import Prepared, gpu_hours, prepare, stream, summarize
from tandem_lab.sim.scenarios import ScenarioConfig

EPOCH = datetime(2026, 1, 6, tzinfo=UTC)
"""Simulated t = 0 as a wall-clock time for the operator's datetime-based logic."""
STABLE = "r1"
CANARY = "r2"
NAMESPACE = "sim"
POOL = "speed"
Z_ALPHA = 1.645
Z_BETA = 0.842
ARMS = ("tandem", "flagger")


def at(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


# --- query results from scrapes --------------------------------------------------------------------


def _nan_or(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def template_value(store: ScrapeStore, now: float, window_s: float, template: str, revision: str) -> str | None:
    """The value string Prometheus would return for ``template`` on ``revision`` at ``now`` (None = no series)."""
    new = store.at_or_before(now)
    if new is None or revision not in new.revisions:
        return None
    old = store.at_or_before(new.t - window_s)
    cur = new.revisions[revision]
    before = old.revisions.get(revision) if old is not None else None
    if template in ("TTFTP90", "TTFTP95"):
        d = cur.ttft - (before.ttft if before is not None else 0.0)
        return _nan_or(histogram_quantile(0.90 if template == "TTFTP90" else 0.95, TTFT_BUCKETS, d))
    if template in ("TPOTP90", "TokensPerSecondPerUser"):
        d = cur.tpot - (before.tpot if before is not None else 0.0)
        q = histogram_quantile(0.90, TPOT_BUCKETS, d)
        if template == "TPOTP90" or q is None:
            return _nan_or(q)
        return _nan_or(math.inf if q <= 0 else 1.0 / q)
    if template == "ErrorRate":
        fin = cur.finished - (before.finished if before is not None else 0.0)
        err = cur.engine_errors - (before.engine_errors if before is not None else 0.0)
        return _nan_or(err / fin if fin > 0 else math.nan)
    if template == "LocalKVHitRatio":
        q = cur.local_queries - (before.local_queries if before is not None else 0.0)
        h = cur.local_hits - (before.local_hits if before is not None else 0.0)
        return _nan_or(h / q if q > 0 else math.nan)
    raise ValueError(f"the simulator has no series for template {template!r}")


def query_result(query: str, value: str | None, now: float) -> QueryResult:
    """An instant-query answer: one series at the evaluation time, or an empty vector."""
    series = () if value is None else (Series({}, at(now).timestamp(), value),)
    return QueryResult(QueryStatus.OK, query=query, http_status=200, result_type="vector", series=series)


def _le(bound: float) -> str:
    """An ``le`` label as vLLM's client library writes it (``0.01``, ``1.0``, ``+Inf``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _pair_result(
    query: str, cur: RevisionSeries, before: RevisionSeries | None, count_column: int, column: int, now: float
) -> QueryResult:
    """``sum by (pair)`` of one histogram's ``_count`` or ``_sum`` increase (``RevisionSeries.pairs`` columns):
    one series per pair that served a request of the kind in the window (a pair with no increase is left
    out; ``core.gates`` gives it no weight either way)."""
    ts = at(now).timestamp()
    series = []
    for pair, values in sorted(cur.pairs.items()):
        old = before.pairs.get(pair, [0.0] * len(values)) if before is not None else [0.0] * len(values)
        if values[count_column] - old[count_column] <= 0:
            continue
        series.append(Series({LABEL_PAIR: pair}, ts, _nan_or(values[column] - old[column])))
    return QueryResult(QueryStatus.OK, query=query, http_status=200, result_type="vector", series=tuple(series))


def _pair_uncached_result(
    query: str, cur: RevisionSeries, before: RevisionSeries | None, now: float, *, fetched: bool = False
) -> QueryResult:
    """``sum by (pair)`` over the window of the prefill instances' prefix-cache queries minus hits
    (``core.promql.PAIR_UNCACHED_TOKENS_QUERY``) or, with ``fetched``, of their shared-tier hits
    (``PAIR_FETCHED_TOKENS_QUERY``): one series per pair whose counters exist, as Prometheus returns a zero increase
    for a counter that did not move."""
    ts = at(now).timestamp()
    series = []
    for pair, values in sorted(cur.pairs.items()):
        if values[4] <= 0:
            continue
        old = before.pairs.get(pair, [0.0] * len(values)) if before is not None else [0.0] * len(values)
        tokens = values[6] - old[6] if fetched else (values[4] - old[4]) - (values[5] - old[5])
        series.append(Series({LABEL_PAIR: pair}, ts, _nan_or(tokens)))
    return QueryResult(QueryStatus.OK, query=query, http_status=200, result_type="vector", series=tuple(series))


def sample_results(
    store: ScrapeStore, now: float, window_s: float, template: str, revision: str, queries: SampleQueries
) -> dict[str, QueryResult]:
    """What Prometheus would answer to one revision's sample queries (``core.promql.template_sample_queries``).

    ``increase()`` over the window is the newest scrape minus the one a window earlier (no extrapolation);
    the bucket answer is cumulative with one series per ``le``, as ``sum by (le)`` returns it.
    """
    new = store.at_or_before(now)
    texts = queries.texts()
    if new is None or revision not in new.revisions:
        return {q: query_result(q, None, now) for q in texts}
    old = store.at_or_before(new.t - window_s)
    cur = new.revisions[revision]
    before = old.revisions.get(revision) if old is not None else None
    ts = at(now).timestamp()
    out: dict[str, QueryResult] = {}
    if template in TEMPLATE_HISTOGRAMS:
        ttft = TEMPLATE_HISTOGRAMS[template] == METRIC_TTFT
        bounds = TTFT_BUCKETS if ttft else TPOT_BUCKETS
        counts = (cur.ttft if ttft else cur.tpot) - (
            (before.ttft if ttft else before.tpot) if before is not None else 0.0
        )
        total = (cur.ttft_sum if ttft else cur.tpot_sum) - (
            (before.ttft_sum if ttft else before.tpot_sum) if before is not None else 0.0
        )
        out[queries.count] = query_result(queries.count, _nan_or(float(counts.sum())), now)
        if queries.uncached is not None:
            q = cur.local_queries - (before.local_queries if before is not None else 0.0)
            h = cur.local_hits - (before.local_hits if before is not None else 0.0)
            out[queries.uncached] = query_result(queries.uncached, _nan_or(q - h), now)
        if queries.fetched is not None:
            e = cur.external_hits - (before.external_hits if before is not None else 0.0)
            out[queries.fetched] = query_result(queries.fetched, _nan_or(e), now)
        if queries.pair_uncached is not None:
            out[queries.pair_uncached] = _pair_uncached_result(queries.pair_uncached, cur, before, now)
        if queries.pair_fetched is not None:
            out[queries.pair_fetched] = _pair_uncached_result(queries.pair_fetched, cur, before, now, fetched=True)
        if queries.sum is not None:
            out[queries.sum] = query_result(queries.sum, _nan_or(total), now)
        first = 0 if ttft else 2  # RevisionSeries.pairs: [ttft _count, ttft _sum, tpot _count, tpot _sum, …]
        for per_pair, column in ((queries.pair_counts, first), (queries.pair_sums, first + 1)):
            if per_pair is not None:
                out[per_pair] = _pair_result(per_pair, cur, before, first, column, now)
        if queries.buckets is not None:
            cumulative = np.cumsum(counts).tolist()
            series = tuple(
                Series({"le": _le(le)}, ts, _nan_or(c)) for le, c in zip((*bounds, math.inf), cumulative, strict=True)
            )
            out[queries.buckets] = QueryResult(
                QueryStatus.OK, query=queries.buckets, http_status=200, result_type="vector", series=series
            )
        return out
    finished = cur.finished - (before.finished if before is not None else 0.0)
    out[queries.count] = query_result(queries.count, _nan_or(finished), now)
    if queries.prompt_tokens is not None:
        q = cur.local_queries - (before.local_queries if before is not None else 0.0)
        out[queries.prompt_tokens] = query_result(queries.prompt_tokens, _nan_or(q), now)
    if queries.hit_tokens is not None:
        h = cur.local_hits - (before.local_hits if before is not None else 0.0)
        out[queries.hit_tokens] = query_result(queries.hit_tokens, _nan_or(h), now)
    if queries.errors is not None:
        errors = cur.engine_errors - (before.engine_errors if before is not None else 0.0)
        out[queries.errors] = query_result(queries.errors, _nan_or(errors), now)
    return out


def answer_queries(
    store: ScrapeStore, now: float, window_s: float, plan: GatePlan, canary: str, stable: str
) -> dict[str, QueryResult]:
    """What Prometheus would answer to the plan's data queries, from the scrapes: each gate's canary (and
    baseline) query from its template's series, its sample queries by :func:`sample_results`, over the
    range the gate was rendered with (``PlannedGate.interval``: a ``window: Step`` gate's is the step's;
    ``window_s`` when it has none). Freshness queries go unanswered: a scrape is current by construction
    (``core.gaterun.judge`` then leaves the answer as it is)."""
    answers: dict[str, QueryResult] = {}
    for planned in plan.gates:
        q = planned.queries
        if q is None:
            continue
        window_s = parse_prom_duration(planned.interval) if planned.interval else window_s
        template = planned.gate.template or ""
        answers[q.canary] = query_result(q.canary, template_value(store, now, window_s, template, canary), now)
        if q.baseline is not None:
            answers[q.baseline] = query_result(q.baseline, template_value(store, now, window_s, template, stable), now)
        for revision, sample_queries in ((canary, q.canary_samples), (stable, q.stable_samples)):
            if sample_queries is not None:
                answers |= sample_results(store, now, window_s, template, revision, sample_queries)
    return answers


def evaluate_gates(
    store: ScrapeStore,
    now: float,
    gates: Sequence[MetricGate],
    analysis: AnalysisSpec,
    canary: str,
    stable: str,
    step_started_at: datetime,
    scrape_interval_s: float,
    max_prompt_tokens: int,
) -> list[GateVerdict]:
    """Every gate's verdict, as ``adapters.prometheus.evaluate_metric_gates`` reaches it: the queries of
    ``core.gaterun.gate_queries``, answered from the scrapes (:func:`answer_queries`) instead of
    Prometheus, judged by ``core.gaterun.judge`` (``max_prompt_tokens``: the pool's
    ``InferencePoolSpec.longest_prompt``)."""
    interval = compute_rate_window(parse_duration(analysis.interval), scrape_interval_s)
    window_s = parse_prom_duration(interval)
    plan = gate_queries(
        gates,
        namespace=NAMESPACE,
        pool=POOL,
        canary_revision=canary,
        stable_revision=stable,
        interval=interval,
        now=at(now),
        step_interval=step_range(
            now=at(now),
            step_started_at=step_started_at,
            rate_window_s=window_s,
        ),
        max_prompt_tokens=max_prompt_tokens,
    )
    window = SampleWindow.for_analysis(
        analysis,
        now=at(now),
        step_started_at=step_started_at,
        scrape_interval_s=scrape_interval_s,
        rate_window_s=window_s,
    )
    return judge(plan, answer_queries(store, now, window_s, plan, canary, stable), window)


# --- the timeline both arms record -------------------------------------------------------------------


@dataclass
class Timeline:
    """What happened to the new revision (simulated seconds; None = did not happen)."""

    applied_s: float
    canary_ready_s: float | None = None
    first_breach_s: float | None = None
    """First evaluation (check) with a Failure verdict (or, for Flagger, a failed check)."""
    decision_s: float | None = None
    """Rollback decided (Tandem: phase → RollingBack; Flagger: threshold reached)."""
    weight_zero_s: float | None = None
    """The routing table stopped sending keys to the canary."""
    promoted_s: float | None = None
    first_copy_s: float | None = None
    """First mirror copy the canary took (a ``setMirrorPairs`` step): its evidence starts there."""
    copies: int = 0
    """Mirror copies the canary took (requests it processed and nobody received)."""
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)

    def note_phase(self, t: float, phase: str, detail: str = "") -> None:
        if not self.phases or self.phases[-1]["phase"] != phase:
            self.phases.append({"t": round(t, 3), "phase": phase, **({"detail": detail} if detail else {})})


SUMMARY_CONDITION_CHARS = 480
"""How much of each verdict's condition (the comparison's numbers) the evaluation log keeps: enough for the p-value,
the ratio and the variance behind a decision, which is what a reader of ``fleet.json`` asks first."""


def _summ(verdicts: Sequence[GateVerdict]) -> dict[str, str]:
    """Each gate's verdict, value (and baseline), reason and condition text, for the evaluation log."""
    return {
        v.name: f"{v.verdict}:{v.value}"
        + (f" vs {v.baseline}" if v.baseline else "")
        + (f" | {v.reason}" if v.reason else "")
        + (f" | {v.condition[:SUMMARY_CONDITION_CHARS]}" if v.condition else "")
        for v in verdicts
    }


def _log_entry(now: float, analysis: AnalysisResult) -> dict[str, Any]:
    """One evaluation of the Tandem arm as the step folded it: the verdicts after the warm-up, so a cold canary's
    held Failure reads ``NoData`` ``WarmingUp`` (its comparison kept in the condition) and only the Failures that
    counted toward ``failureLimit`` read ``Failure``."""
    return {"t": round(now, 3), "outcome": analysis.outcome, "gates": _summ(analysis.verdicts)}


def _gate_counts(evaluations: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per gate, the evaluations that reached a verdict (``gate_looks``: Success or Failure) and its Failures
    (``gate_failures``). On a good canary every Failure is a false alarm, so over many seeds these measure each
    gate's false-alarm rate per look, which ``failureLimit`` must tolerate over a step's looks (docs/design/009)."""
    looks: dict[str, int] = {}
    failures: dict[str, int] = {}
    for evaluation in evaluations:
        for name, text in evaluation["gates"].items():
            verdict = text.split(":", 1)[0]
            if verdict in (VERDICT_SUCCESS, VERDICT_FAILURE):
                looks[name] = looks.get(name, 0) + 1
                failures[name] = failures.get(name, 0) + (verdict == VERDICT_FAILURE)
    return {"gate_looks": looks, "gate_failures": failures}


def _canary_percent(
    sim: Simulation, canary: str | None, weight: int | None, stable: str
) -> tuple[str | None, int | None]:
    """The routing table's canary share: ``tandem.core.plan.canary_share``, the function ``build_table`` calls."""
    if canary is None or canary == stable:
        return None, None
    if weight is None:
        return canary, None
    serving = sim.serving_by_revision()
    return canary, canary_share(weight, serving.get(canary, 0), sum(serving.values()))


# --- Tandem --------------------------------------------------------------------------------------------


def build_pool(
    params: SimParams, replicas: int, shape: tuple[int, int], ttft_target_s: float, gates: str = "example"
) -> InferencePool:
    """The W5 pool: ``policies.tandem_rollout`` as ``spec.rollout`` (its gates, or only the ``regression``
    set; ``powered`` adds ``compare.minPowerPercent: 80`` to its compare gates, ``stepped`` also
    ``compare.window: Step`` to those not on TTFT), ``replicas`` pairs of ``shape``."""
    rollout = _substitute(params.policies.tandem_rollout, {"${ttft_target_s}": f"{ttft_target_s:.3f}"})
    if gates in ("regression", "powered", "stepped"):
        keep = set(params.policies.w5_regression_gates)
        analysis = dict(rollout.get("analysis", {}))
        metrics = [dict(m) for m in analysis.get("metrics", []) if m.get("name") in keep]
        for m in metrics:
            if "compare" in m and gates != "regression":
                step = gates == "stepped" and not str(m.get("template", "")).startswith("TTFT")
                m["compare"] = {**m["compare"], "minPowerPercent": 80, **({"window": "Step"} if step else {})}
        analysis["metrics"] = metrics
        rollout = {**rollout, "analysis": analysis}
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": POOL, "namespace": NAMESPACE},
        "spec": {
            "model": {"servedName": "sim", "source": "hf://sim/model", "quantization": "fp4"},
            "stack": {"version": "v1", "image": "sim@sha256:" + "0" * 64},
            "pairs": {
                "replicas": replicas,
                "prefill": {"instances": shape[0], "gpusPerInstance": params.instance.gpus},
                "decode": {"instances": shape[1], "gpusPerInstance": params.instance.gpus},
            },
            "autoscaling": {"enabled": False},
            "rollout": rollout,
        },
    }
    return InferencePool.model_validate(doc)


def _substitute(value: Any, subs: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, subs) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, subs) for v in value]
    if isinstance(value, str):
        for k, v in subs.items():
            value = value.replace(k, v)
    return value


class TandemRollout:
    """``tandem.core`` rollout logic driven each pass (module docstring)."""

    name = "tandem"

    def __init__(self, pool: InferencePool, scrape_interval_s: float, reconcile_s: float) -> None:
        self.pool = pool.model_copy(update={"status": InferencePoolStatus()})
        self.scrape_interval_s = scrape_interval_s
        self.reconcile_s = reconcile_s
        self.stable = STABLE
        self.desired = STABLE
        self.previous_ready = 0
        self.timeline = Timeline(applied_s=math.inf)
        self.rollout = pool.spec.rollout

    def apply(self, sim: Simulation, t: float) -> None:
        """The spec's stack changed: the new revision is desired from now on."""
        self.desired = CANARY
        self.timeline.applied_s = t
        self.tick(sim)

    def tick(self, sim: Simulation) -> None:
        now = sim.now
        now_dt = at(now)
        counts = {rev: RevisionCounts(live, ready) for rev, (live, ready) in sim.revision_counts().items()}
        analysis = None
        request = analysis_request(self.pool, self.desired, self.stable, now_dt, self.scrape_interval_s)
        tl = self.timeline
        if request is not None:
            verdicts = evaluate_gates(
                sim.store,
                now,
                request.gates,
                self.rollout.analysis,
                request.canary,
                request.stable,
                request.step_started_at,
                self.scrape_interval_s,
                self.pool.spec.longest_prompt,
            )
            analysis = fold_analysis(self.pool, request, verdicts, now_dt)
            tl.evaluations.append(_log_entry(now, analysis))
            if tl.first_breach_s is None and any(v.verdict == VERDICT_FAILURE for v in verdicts):
                tl.first_breach_s = now
        status = self.pool.status or InferencePoolStatus()
        spec = self.pool.spec
        room = surge_room(  # the simulated cluster has room (placement is not modelled): maxSurge decides
            max_surge=spec.rollout.max_surge,
            replicas=spec.pairs.replicas,
            live_canary=counts.get(self.desired, RevisionCounts()).live if self.desired != self.stable else 0,
            live_stable=counts.get(self.stable, RevisionCounts()).live,
            free_pairs=spec.rollout.max_surge,
            gpus_per_pair=1,
            gpu_budget=None,
        )
        decision = plan_rollout(
            RolloutInputs(
                spec=spec,
                status=status.rollout,
                stable=self.stable,
                desired=self.desired,
                counts=counts,
                now=now_dt,
                analysis=analysis,
                previous_canary_ready=self.previous_ready,
                surge_room=room,
            )
        )
        self.pool = self.pool.model_copy(update={"status": status.model_copy(update={"rollout": decision.status})})
        phase = decision.status.phase
        tl.note_phase(now, phase, decision.status.step)
        if phase == "RollingBack" and tl.decision_s is None:
            tl.decision_s = now
        if phase == "Promoted" and tl.promoted_s is None:
            tl.promoted_s = now
        self.previous_ready = counts.get(self.desired, RevisionCounts()).ready
        sim.converge_revisions(
            decision.targets,
            self.pool.spec.pairs.replicas,
            self.rollout.max_surge,
            self.rollout.max_unavailable,
        )
        self.stable = decision.stable
        canary, percent = _canary_percent(sim, decision.canary, decision.canary_weight_percent, self.stable)
        sim.set_canary(canary, percent, mirror=decision.canary_mirror)
        tl.first_copy_s = sim.first_copy_s
        tl.copies = sim.copies
        serving_c = sim.serving_by_revision().get(CANARY, 0)
        if tl.canary_ready_s is None and serving_c and canary == CANARY and (percent is None or percent > 0):
            tl.canary_ready_s = now
        if tl.decision_s is not None and tl.weight_zero_s is None and (canary != CANARY or percent == 0):
            tl.weight_zero_s = now
        sim.schedule(now + self.reconcile_s, self.tick)


# --- Flagger-like ---------------------------------------------------------------------------------------


class FlaggerRollout:
    """Flagger's analysis loop on pair groups (module docstring)."""

    name = "flagger"

    def __init__(self, params: SimParams, pool: InferencePool, scrape_interval_s: float, reconcile_s: float) -> None:
        fp = params.policies.flagger
        self.interval_s = fp.interval_s
        self.threshold = fp.threshold
        self.step = fp.step_weight
        self.max_weight = fp.max_weight
        self.replicas = pool.spec.pairs.replicas
        self.analysis = pool.spec.rollout.analysis
        self.gates = list(self.analysis.metrics)
        self.longest_prompt = pool.spec.longest_prompt
        self.scrape_interval_s = scrape_interval_s
        self.reconcile_s = reconcile_s
        self.weight = 0
        self.failed = 0
        self.phase = "Idle"
        self.next_check = math.inf
        self.weight_since = math.inf
        self.timeline = Timeline(applied_s=math.inf)

    def _pairs_for(self, weight: int) -> int:
        return max(1, math.ceil(self.replicas * weight / 100 - 1e-9))

    def apply(self, sim: Simulation, t: float) -> None:
        self.timeline.applied_s = t
        self.phase = "Initializing"
        self.tick(sim)

    def tick(self, sim: Simulation) -> None:
        now = sim.now
        tl = self.timeline
        n = self.replicas
        if self.phase == "Initializing":
            sim.converge_revisions({STABLE: n, CANARY: self._pairs_for(self.step)}, n, n, 0)
            if sim.serving_by_revision().get(CANARY, 0) >= self._pairs_for(self.step):
                self.phase = "Progressing"
                self.next_check = now + self.interval_s
        elif self.phase == "Progressing" and now >= self.next_check - 1e-9:
            self.next_check = now + self.interval_s
            ready_c = sim.serving_by_revision().get(CANARY, 0)
            if self.weight == 0:
                self.weight = self.step
                self.weight_since = now
            elif ready_c < self._pairs_for(self.weight):
                pass  # canary not ready for this weight: halt advancement (Flagger's readiness check)
            else:
                verdicts = evaluate_gates(
                    sim.store,
                    now,
                    self.gates,
                    self.analysis,
                    CANARY,
                    STABLE,
                    at(self.weight_since),
                    self.scrape_interval_s,
                    self.longest_prompt,
                )
                ok = all(v.verdict == VERDICT_SUCCESS for v in verdicts)
                tl.evaluations.append(
                    {"t": round(now, 3), "outcome": "pass" if ok else "fail", "gates": _summ(verdicts)}
                )
                if not ok:
                    self.failed += 1
                    if tl.first_breach_s is None and any(v.verdict == VERDICT_FAILURE for v in verdicts):
                        tl.first_breach_s = now
                    if self.failed >= self.threshold:
                        self.phase = "Failed"
                        tl.decision_s = now
                        self.weight = 0
                elif self.weight < self.max_weight:
                    self.weight = min(self.max_weight, self.weight + self.step)
                else:
                    self.phase = "Promoting"
                    tl.promoted_s = now
        if self.phase == "Progressing":
            sim.converge_revisions({STABLE: n, CANARY: self._pairs_for(self.weight or self.step)}, n, n, 0)
            canary, percent = _canary_percent(sim, CANARY, self.weight, STABLE)
            sim.set_canary(canary, percent)
            if tl.canary_ready_s is None and percent:
                tl.canary_ready_s = now
        elif self.phase == "Failed":
            sim.set_canary(None, None)
            sim.converge_revisions({STABLE: n, CANARY: 0}, n, n, 0)
            if tl.weight_zero_s is None:
                tl.weight_zero_s = now
        elif self.phase == "Promoting":
            sim.set_canary(None, None)
            sim.stable = sim.revisions[CANARY]
            sim.converge_revisions({CANARY: n, STABLE: 0}, n, 2, 0)
        tl.note_phase(now, self.phase, f"weight {self.weight}, failed checks {self.failed}")
        sim.schedule(now + self.reconcile_s, self.tick)


# --- the W5 run -------------------------------------------------------------------------------------------


@dataclass
class W5Arm:
    arm: str
    canary: str
    result: SimResult
    timeline: Timeline
    metrics: dict[str, Any]
    wall_s: float


@dataclass
class W5Run:
    config: ScenarioConfig
    prepared: Prepared
    pairs: int
    shape: tuple[int, int]
    arms: list[W5Arm]
    timing: dict[str, float]
    variants: list[tuple[str, str]] = field(default_factory=list)
    """(canary, gate set) pairs that ran, in order."""


def statistical_floor(kind: str, p0: float, p1: float) -> float:
    """Canary requests needed to detect the regression (module docstring)."""
    if kind == "errors":
        if p1 <= p0:
            return math.inf
        q0, q1 = 1 - p0, 1 - p1
        return (Z_ALPHA * math.sqrt(p0 * q0) + Z_BETA * math.sqrt(p1 * q1)) ** 2 / (p1 - p0) ** 2
    if kind == "tpot":
        return 10.0 / (1.0 - 0.90)
    if kind == "ttft":  # the example's TTFT gate is a p95
        return 10.0 / (1.0 - 0.95)
    return math.inf


def w5_metrics(prep: Prepared, res: SimResult, tl: Timeline, cfg: ScenarioConfig) -> dict[str, Any]:
    """Detection, rollback split, bad-revision requests and the floor comparison of one arm."""
    params = prep.params
    wl = prep.workload
    canary_index = res.revision_names.index(CANARY) if CANARY in res.revision_names else -1
    on_canary = (res.revision == canary_index) & (res.unit >= 0) if canary_index >= 0 else np.zeros(len(wl), bool)
    bad = cfg.canary != "good"
    t_arr = wl.arrival_s
    first_traffic = float(t_arr[on_canary].min()) if on_canary.any() else None
    last_traffic = float(t_arr[on_canary].max()) if on_canary.any() else None
    end = tl.weight_zero_s if tl.weight_zero_s is not None else (last_traffic or first_traffic or 0.0)
    span = max(1e-9, end - (first_traffic or end))
    n_canary = int(on_canary.sum())
    rate = n_canary / span if first_traffic is not None and span > 1 else math.nan
    p0 = params.policies.stable_error_prob
    p1 = p0 + (cfg.canary_error_prob if cfg.canary == "errors" else 0.0)
    floor_n = statistical_floor(cfg.canary, p0, p1) if bad else math.nan
    floor_s = floor_n / rate if rate and rate > 0 and math.isfinite(floor_n) else math.nan

    def since(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    # Evidence starts with the canary's first request or mirror copy, whichever came first.
    evidence = min((t for t in (first_traffic, tl.first_copy_s) if t is not None), default=None)
    detection = since(evidence, tl.decision_s)
    rollback = since(evidence, tl.weight_zero_s)
    dec = tl.decision_s

    def rps(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or b - a <= 1.0:
            return None
        m = on_canary & (t_arr >= a) & (t_arr < b)
        return float(m.sum()) / (b - a)

    out: dict[str, Any] = {
        "canary": cfg.canary,
        "gates": cfg.gates,
        "canary_rps_before_decision": rps(first_traffic, dec),
        "canary_rps_after_decision": rps(dec, tl.weight_zero_s),
        "applied_s": tl.applied_s,
        "canary_first_request_s": first_traffic,
        "canary_last_request_s": last_traffic,
        "first_breach_s": tl.first_breach_s,
        "decision_s": tl.decision_s,
        "weight_zero_s": tl.weight_zero_s,
        "promoted_s": tl.promoted_s,
        "detection_s": detection,
        "rollback_s": rollback,
        "observe_s": since(evidence, tl.first_breach_s),
        "decide_s": since(tl.first_breach_s, tl.decision_s),
        "act_s": since(tl.decision_s, tl.weight_zero_s),
        "requests_on_canary": n_canary,
        "copies_on_canary": tl.copies,
        "canary_first_copy_s": tl.first_copy_s,
        "canary_share_of_all_requests": n_canary / len(wl) if len(wl) else math.nan,
        "canary_request_rate": rate,
        "statistical_floor_requests": floor_n,
        "statistical_floor_s": floor_s,
        "rolled_back": tl.decision_s is not None,
        "promoted": tl.promoted_s is not None,
        "evaluations": len(tl.evaluations),
        **_gate_counts(tl.evaluations),
        "phases": tl.phases,
        "evaluation_log": tl.evaluations[:40],
    }
    if bad:
        out["gate_rollback_within_2x_floor"] = bool(
            rollback is not None and math.isfinite(floor_s) and rollback <= 2 * floor_s
        )
        out["gate_bad_share_below_0_1_percent"] = bool(out["canary_share_of_all_requests"] < 0.001)
    else:
        out["false_rollback"] = tl.decision_s is not None
    gh = gpu_hours(res, prep.cap.gpus)
    out["gpuh"] = gh
    s = summarize(res, wl, prep.bounds, params)
    out["both_attainment_feasible"] = s["both_attainment_feasible"]
    return out


def w5_pairs(prep: Prepared) -> tuple[int, tuple[int, int]]:
    """The fixed fleet both arms run: B0's size (1.1 × the planning model's peak per role) in pair groups
    whose P:D is the peak's, so decode runs near its TPOT-limited batch at the peak — where an SLO-driven
    autoscaler keeps it — and a TPOT regression shows in the TPOT histogram (a decode-rich fleet runs
    below 10 ms, inside vLLM's first TPOT bucket, where +30 % is invisible)."""
    params = prep.params
    peak_p, peak_d = prep.bounds.peak
    shape = unit_shape(peak_p / max(1, peak_d))
    if params.policies.w5_pairs != "auto":
        return int(params.policies.w5_pairs), shape
    h = params.policies.static_headroom
    p = math.ceil(h * prep.bounds.peak[0] - 1e-9)
    d = math.ceil(h * prep.bounds.peak[1] - 1e-9)
    return max(2, math.ceil(p / shape[0] - 1e-9), math.ceil(d / shape[1] - 1e-9)), shape


class ApplySlot:
    """The hook that applies the new revision at ``t_apply``. It is registered before the shared warm-up
    (so the hook's place among the events at ``t_apply`` is the one a straight run gives it), and each
    variant's copy of the warm simulation gets its own controller's ``apply`` as the target."""

    def __init__(self) -> None:
        self.target: Callable[[Simulation, float], None] | None = None

    def __call__(self, sim: Simulation) -> None:
        if self.target is None:
            raise RuntimeError("W5: the revision was applied before a rollout arm was attached")
        self.target(sim, sim.now)


@dataclass
class Warm:
    """A W5 simulation run up to (not including) ``t_apply``: the part every arm and variant shares.

    The canary revision is neither applied nor routed to before ``t_apply``, and the controllers do
    nothing until it is, so every (variant, arm) run is the same up to that instant: one warm-up per seed,
    then a ``Simulation.fork`` per run (continuing a copy is the same run as never stopping:
    ``Simulation.advance``; ``tests/sim/test_rollout.py`` checks it)."""

    sim: Simulation
    slot: ApplySlot
    t_apply: float
    wall_s: float


def warm_up(
    prep: Prepared, pairs: int, shape: tuple[int, int], t_apply: float, scale: float, until: float | None = None
) -> Warm:
    """Build the fixed W5 fleet and simulate it up to ``t_apply`` (see :class:`Warm`); ``until`` (≤
    ``t_apply``) stops it earlier (``0``: nothing simulated yet, each run is a straight run)."""
    params, wl = prep.params, prep.workload
    fleet = FixedFleet(FleetTarget(pairs=pairs, shape=shape), topology="pairs", name="w5")
    options = SimOptions(
        topology="pairs",
        router=params.router.policy,
        routing_keys=prep.keys,
        horizon_s=wl.duration_s,
        rate_scale=scale,
        max_instances=10 * pairs * (shape[0] + shape[1]),
        default_shape=shape,
    )
    sim = Simulation(params, prep.cap, wl, fleet, options, stream(prep.seed, "lifecycle"), prep.errors)
    sim.revisions[STABLE].error_prob = params.policies.stable_error_prob
    sim.add_revision(Revision(CANARY))  # its performance is the variant's, set on each copy
    slot = ApplySlot()
    sim.at(t_apply, slot, f"apply revision {CANARY}")
    start = time.perf_counter()
    sim.start()
    sim.advance(before=t_apply if until is None else min(until, t_apply))
    return Warm(sim, slot, t_apply, time.perf_counter() - start)


SETTLED_GRACE_S = 60.0
"""``settle``: how long a run goes on after the canary's weight reached 0 (nothing it measures changes)."""


def _settled(tl: Timeline, now: float) -> bool:
    """The rollout's outcome is fixed and nothing measured can change: rolled back and the canary's weight
    at 0 for ``SETTLED_GRACE_S`` (no new request can reach the bad revision), or promoted."""
    if tl.promoted_s is not None:
        return True
    return tl.weight_zero_s is not None and now >= tl.weight_zero_s + SETTLED_GRACE_S


def run_arm(
    prep: Prepared,
    cfg: ScenarioConfig,
    arm: str,
    pairs: int,
    shape: tuple[int, int],
    say: Callable[[str], None],
    warm: Warm,
    settle: bool = False,
) -> W5Arm:
    """One rollout arm on a copy of the warm W5 simulation (``cfg`` chooses the canary and the gate set).

    ``settle``: end the run once the outcome is settled (:func:`_settled`) instead of at the horizon. The
    W5 measures (detection, act, requests on the bad revision over *all* the window's requests) are the
    same; GPU-hours and attainment are not (``metrics["ended_s"]`` says where it stopped), so the
    single-seed W5 of ``fleet.md`` runs to the horizon and ``--seeds`` settles."""
    params = prep.params
    pool = build_pool(params, pairs, shape, prep.ttft_target_ms / 1000.0, cfg.gates)
    ctrl: TandemRollout | FlaggerRollout
    scrape = params.observation.scrape_interval_s
    if arm == "tandem":
        ctrl = TandemRollout(pool, scrape, params.policies.reconcile_s)
    elif arm == "flagger":
        ctrl = FlaggerRollout(params, pool, scrape, params.policies.reconcile_s)
    else:
        raise ValueError(f"unknown rollout arm {arm!r}; choose from {', '.join(ARMS)}")
    sim, (slot,) = warm.sim.fork(warm.slot)
    tpot = cfg.canary_tpot_mult if cfg.canary == "tpot" else 1.0
    prefill = cfg.canary_ttft_mult if cfg.canary == "ttft" else 1.0
    err = params.policies.stable_error_prob + (cfg.canary_error_prob if cfg.canary == "errors" else 0.0)
    sim.add_revision(Revision(CANARY, prefill_mult=prefill, tpot_mult=tpot, error_prob=err))
    slot.target = ctrl.apply
    if settle:

        def watch(s: Simulation) -> None:
            if _settled(ctrl.timeline, s.now):
                s.halt()
            else:
                s.schedule(s.now + params.policies.reconcile_s, watch)

        sim.schedule(warm.t_apply, watch)
    start = time.perf_counter()
    sim.advance()
    ended = sim.now if sim.halted else None
    res = sim.result()
    wall = time.perf_counter() - start
    metrics = w5_metrics(prep, res, ctrl.timeline, cfg)
    metrics["ended_s"] = ended
    say(
        f"W5/{cfg.canary}/{cfg.gates} {arm}: {wall:.1f} s wall; "
        + (
            f"rollback {metrics['rollback_s']:.0f} s (observe {metrics['observe_s'] or 0:.0f} / decide "
            f"{metrics['decide_s'] or 0:.0f} / act {metrics['act_s'] or 0:.0f}), "
            if metrics["rollback_s"] is not None
            else ("promoted, " if metrics["promoted"] else "no decision, ")
        )
        + f"{metrics['requests_on_canary']:,} requests on the canary"
    )
    return W5Arm(arm, cfg.canary, res, ctrl.timeline, metrics, wall)


def run_w5(
    config: ScenarioConfig,
    seed: int,
    params: SimParams,
    arms: Sequence[str] = ARMS,
    progress: Callable[[str], None] | None = None,
    variants: Sequence[tuple[str, str]] | None = None,
    settle: bool = False,
) -> W5Run:
    """Prepare the W5 workload and its warm-up once and run every rollout arm for each (canary, gate set)
    variant (default: the config's own) on a copy of it; ``settle`` as in :func:`run_arm`."""
    say = progress or (lambda _msg: None)
    prep = prepare(config, seed, params, progress)
    pairs, shape = w5_pairs(prep)
    t_apply = config.event_time_s(params)
    say(f"W5 fleet: {pairs} pairs of {shape[0]}P:{shape[1]}D for both arms; revision applied at {t_apply:.0f} s")
    chosen = list(variants) if variants else [(config.canary, config.gates)]
    out: list[W5Arm] = []
    timing: dict[str, float] = dict(prep.timing)
    warm = warm_up(prep, pairs, shape, t_apply, config.scale)
    timing["warm_up_s"] = warm.wall_s
    say(f"W5 warm-up to {t_apply:.0f} s: {warm.wall_s:.1f} s wall (shared by every arm and variant)")
    for canary, gates in chosen:
        cfg = replace(config, canary=canary, gates=gates)
        for arm in arms:
            r = run_arm(prep, cfg, arm, pairs, shape, say, warm, settle)
            out.append(r)
            timing[f"{canary}_{gates}_{arm}_s"] = r.wall_s
    return W5Run(config, prep, pairs, shape, out, timing, chosen)
