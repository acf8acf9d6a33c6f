"""Running an analysis step's metric gates, minus the I/O: what to ask, then a judgement over the answers.

What it owns, all pure:
- :func:`step_range`: the ``${interval}`` of a ``compare.window: Step`` gate — the time since the step
  started, in whole seconds, once that is longer than the rate window;
- :func:`gate_queries`: for each gate, the rendered queries (canary, baseline, and the sample counts it
  needs, ``core.gates.resolve_gate_queries``) or, when a query cannot be rendered, its Error
  ``InvalidQuery`` verdict; and, for the whole pass, every query text to send once, each with the
  freshness query that says how old its inputs are (``core.promql.freshness_query``);
- :func:`judge`: the gates' verdicts (``core.gates.evaluate_gate``) from the answers by query text, the
  freshness answers attached, in the order of the gates.

Between the two the caller asks: ``tandem.adapters.prometheus.evaluate_metric_gates`` sends the queries
to Prometheus concurrently under the analysis timeout; the simulator answers the same query objects from
its scrapes. Both call these functions, so a benchmark judges canaries with the operator's code.

An answer may be missing: a data query without an answer counts as a timeout (Error
``MetricsUnavailable``, never a silent pass); a freshness query without an answer leaves its data
answer as it is (a source whose answers are current by construction, like the simulator, need not
answer them).

Must not: send a query, read the clock, or log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from tandem.api.pool import MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.core.gates import (
    GateQueries,
    SampleWindow,
    evaluate_gate,
    gate_samples,
    invalid_query_verdict,
    resolve_gate_queries,
    step_window,
)
from tandem.core.promql import (
    QueryRenderError,
    QueryResult,
    QueryStatus,
    attach_freshness,
    format_duration,
    freshness_query,
)

UNANSWERED_ERROR = "no answer to this query"
"""The error of a data query the caller did not answer (judged as a timeout)."""


@dataclass(frozen=True)
class PlannedGate:
    """One gate of the pass: its queries, or why it has none (then :attr:`invalid` is its verdict)."""

    gate: MetricGate
    queries: GateQueries | None = None
    interval: str = ""
    """The ``${interval}`` its queries were rendered with (the step's range for a ``window: Step`` gate)."""
    invalid: GateVerdict | None = None
    error: str = ""
    """Why the query could not be rendered (for the caller's log)."""


@dataclass(frozen=True)
class GatePlan:
    """What one analysis pass asks: the gates in order, and the query texts to send."""

    gates: tuple[PlannedGate, ...]
    max_prompt_tokens: int | None = None
    """The longest prompt the pool admits: bounds a ``LocalKVHitRatio`` comparison's variance."""

    def texts(self) -> tuple[str, ...]:
        """Every data query of the renderable gates, each once, sorted."""
        return tuple(sorted({t for p in self.gates if p.queries is not None for t in p.queries.texts()}))

    def freshness(self) -> dict[str, str]:
        """Data query text → its freshness query (a query without a selector has none)."""
        return {t: f for t in self.texts() if (f := freshness_query(t)) is not None}

    def asked(self) -> tuple[str, ...]:
        """Everything to send: the data queries, then their freshness queries."""
        return (*self.texts(), *self.freshness().values())


def step_range(*, now: datetime, step_started_at: datetime, rate_window_s: float) -> str | None:
    """The range a ``window: Step`` gate queries: from the step's start to ``now``, in whole seconds — None
    while that is not longer than the rate window (the gate then reads ``${interval}`` like any other).
    Example: step started 12:00:00, now 12:05:30.4, rate window 60 s → ``5m30s``.

    From the start, not from the end of ``initialDelay``: the delay says when to look first, and a cumulative
    window that dropped it would drop requests the canary served to users — at W5's first step about 110
    requests (1.85 canary requests/s for 60 s) of the 834 that are 0.1 % of its window, spent before the
    errors test saw one. (An analysis step
    starts in the pass that publishes its weight, ``core.rollout.published_index``, so the step's requests
    are the canary's requests at that weight.)
    """
    since = (now - step_started_at).total_seconds()
    whole = int(since)
    return format_duration(whole) if whole > rate_window_s else None


def gate_queries(
    gates: Sequence[MetricGate],
    *,
    namespace: str,
    pool: str,
    canary_revision: str,
    stable_revision: str | None,
    interval: str,
    now: datetime,
    step_interval: str | None = None,
    max_prompt_tokens: int | None = None,
) -> GatePlan:
    """The queries of every gate for this pass (``interval`` is the rendered ``${interval}``; ``step_interval``,
    from :func:`step_range`, replaces it for ``compare.window: Step`` gates); a gate whose query cannot be
    rendered gets its Error ``InvalidQuery`` verdict stamped ``now`` instead. ``max_prompt_tokens``
    (``InferencePoolSpec.longest_prompt``) goes with the plan to :func:`judge`."""
    planned: list[PlannedGate] = []
    for gate in gates:
        own = step_interval if step_interval and step_window(gate) else interval
        try:
            q = resolve_gate_queries(
                gate,
                namespace=namespace,
                pool=pool,
                canary_revision=canary_revision,
                stable_revision=stable_revision,
                interval=own,
            )
        except QueryRenderError as exc:
            planned.append(PlannedGate(gate, invalid=invalid_query_verdict(gate, now=now), error=str(exc)))
            continue
        planned.append(PlannedGate(gate, queries=q, interval=own))
    return GatePlan(tuple(planned), max_prompt_tokens)


def judge(plan: GatePlan, answers: Mapping[str, QueryResult], window: SampleWindow) -> list[GateVerdict]:
    """Every gate's verdict, in the plan's order, from ``answers`` by query text (module docstring: a
    missing data answer is a timeout, a missing freshness answer changes nothing)."""
    fresh = plan.freshness()

    def answer(text: str) -> QueryResult:
        data = answers.get(text) or QueryResult(QueryStatus.TIMEOUT, query=text, error=UNANSWERED_ERROR)
        return attach_freshness(data, answers.get(fresh[text]) if text in fresh else None)

    results = {t: answer(t) for t in plan.texts()}
    verdicts: list[GateVerdict] = []
    for p in plan.gates:
        if p.queries is None:
            assert p.invalid is not None
            verdicts.append(p.invalid)
            continue
        q = p.queries
        baseline = results[q.baseline] if q.baseline else None
        verdicts.append(
            evaluate_gate(
                p.gate,
                results[q.canary],
                baseline,
                window,
                gate_samples(q, results),
                max_prompt_tokens=plan.max_prompt_tokens,
            )
        )
    return verdicts


__all__ = ["UNANSWERED_ERROR", "GatePlan", "PlannedGate", "gate_queries", "judge", "step_range"]
