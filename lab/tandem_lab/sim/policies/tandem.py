"""Tandem's own autoscaling policy in the simulator: an adapter around ``tandem.core.autoscale``, unchanged.

What it owns: translating a simulator :class:`~tandem_lab.sim.metrics.Observation` (the same scraped,
lagged metrics every baseline sees) into the operator's inputs — :class:`MetricsSnapshot` (one
:class:`InstanceSample` per instance of a serving pair in the visible scrape, and the pool's TTFT p95 /
TPOT p90 computed with ``histogram_quantile`` over vLLM's buckets, as the operator's PromQL does) and
:class:`ScaleContext` — then calling :func:`compute_desired_pairs` and, when the pool spec enables it,
:func:`compute_role_ratio`, and carrying their returned state between calls.

Must not: re-implement or patch any part of the policy. The import below is unconditional: if
``tandem.core.autoscale`` is missing or broken, requesting this policy raises and the bench fails
(there is no fallback copy).

Wiring choices (reviewable; docs/design/007-simulator.md):

- ``ready_pairs`` and the expected instance counts are those of the *visible scrape* (pairs serving
  when it was taken), so a pair that became Ready after ``now − lag`` is not "missing data";
  ``current_pairs`` is the pair count the policy last asked for (``spec.pairs.replicas``).
- The router's attainment and unserved share (rejects over requests with an outcome) are passed as the operator
  reads them from ``tandem_router_slo_requests_total``; the engine-phase series of ``learnFromEngines`` are not.
- ``max_placeable_pairs`` is None (the simulated cluster has room for the shared maximum fleet) and
  ``hold_scale_down`` is False (no rollback in W1–W4, W6).
- A ratio change keeps the pair count with work planning, else :func:`equivalent_pairs` (``ratio_pairs``, as
  the planner does). The new P:D is the target shape, as in the operator: the engine builds new groups in it,
  drains off-target groups first and replaces them one at a time, surge first, with ``tandem.core.reshape``
  (this policy hands it work planning's last need); ``group_shapes`` lets work planning count the groups as
  they are, and no new ratio is chosen while off-target groups are still being replaced.
"""

from __future__ import annotations

import math
from typing import Any

from tandem.api.pool import AutoscalingSpec
from tandem.core.autoscale import (
    AutoscalePolicy,
    AutoscaleState,
    InstanceSample,
    MetricsSnapshot,
    PoolSample,
    RatioState,
    ScaleContext,
    compute_desired_pairs,
    compute_role_ratio,
    last_work_need,
    ratio_pairs,
)
from tandem.core.capacity import CapacityProfile
from tandem.core.plan import NEED_MAX_AGE_EVALUATIONS
from tandem_lab.sim.config import deep_merge
from tandem_lab.sim.metrics import PREFILL, Observation
from tandem_lab.sim.policies.base import FleetTarget, PolicyContext, Topology, unit_shape

LOG_METRICS = ("pairsNeeded", "prefillNeed", "decodeNeed", "attainment", "leadTime")


def build_spec(ctx: PolicyContext, ttft_p95_ms: int) -> AutoscalingSpec:
    """The pool's ``spec.autoscaling`` from ``policies.tandem_pool`` with the run's shared bounds."""
    raw: dict[str, Any] = dict(ctx.params.policies.tandem_pool)
    targets = dict(raw.get("targets", {}))
    if targets.get("ttftP95Ms") == "auto":
        targets["ttftP95Ms"] = ttft_p95_ms
    raw["targets"] = targets
    planning = raw.get("capacityProfile")
    if isinstance(planning, dict) and ctx.capacity_profile is not None:
        raw["capacityProfile"] = declared_profile(ctx.capacity_profile, planning)
    elif planning is not None and ctx.capacity_profile is None:
        raw.pop("capacityProfile")
    shape = resolve_shape(ctx)
    max_pairs = max(1, ctx.max_instances // (shape[0] + shape[1]))
    raw = deep_merge(raw, {"minPairs": 1, "maxPairs": min(512, max_pairs)})
    return AutoscalingSpec.model_validate(raw)


def declared_profile(profile: CapacityProfile, knobs: dict[str, Any]) -> dict[str, Any]:
    """``spec.autoscaling.capacityProfile`` from the simulator's measured profile (``auto`` entries) and the
    parameter file's knobs (attainment, burst headroom, overhead). Integers as the API wants them, rounded
    down (a declared profile never claims more than was measured)."""
    out = dict(knobs)
    if out.get("prefill", "auto") == "auto":
        out["prefill"] = [
            {"promptTokens": int(p.prompt_tokens), "uncachedTokensPerSecond": max(1, int(p.uncached_tokens_per_s))}
            for p in profile.prefill
        ]
    if out.get("decode", "auto") == "auto":
        out["decode"] = [
            {
                "contextTokens": int(d.context_tokens),
                "streams": max(1, int(d.streams)),
                "tokensPerSecond": max(1, int(d.tokens_per_s)),
            }
            for d in profile.decode
        ]
    if out.get("loadTime", "auto") == "auto":
        out["loadTime"] = f"{max(1, math.ceil(profile.load_time_s))}s"
    return out


def resolve_shape(ctx: PolicyContext) -> tuple[int, int]:
    shape = ctx.params.policies.tandem_shape
    if shape == "auto":
        return unit_shape(ctx.profile_ratio)
    return (int(shape[0]), int(shape[1]))


class TandemAutoscaler:
    """Ours: ``tandem.core.autoscale`` on pair groups (``pairs`` topology, hash-bias routing)."""

    name = "tandem"
    topology: Topology = "pairs"

    def __init__(self, ctx: PolicyContext, ttft_p95_ms: int) -> None:
        self.ctx = ctx
        self.spec = build_spec(ctx, ttft_p95_ms)
        self.policy = AutoscalePolicy.from_spec(self.spec)
        self.interval_s = self.policy.interval_s
        self.state = AutoscaleState()
        self.ratio_state = RatioState()
        self.shape = resolve_shape(ctx)
        p0, d0 = ctx.initial
        self.pairs = max(1, math.ceil(max(p0 / self.shape[0], d0 / self.shape[1])))
        self.last_reason = ""
        self.reasons: dict[str, int] = {}
        self.log: list[dict[str, Any]] = []
        """Decision log: every evaluation's time, pairs asked, Ready pairs, reason and the metrics behind it."""

    def initial_target(self) -> FleetTarget:
        return FleetTarget(pairs=self.pairs, shape=self.shape)

    def snapshot(self, obs: Observation) -> MetricsSnapshot:
        samples = tuple(
            InstanceSample(
                pair=g.pair,
                role="prefill" if g.role == PREFILL else "decode",
                running=g.running,
                waiting=g.waiting,
                kv_cache_utilization=g.kv_usage if g.role != PREFILL else None,
            )
            for g in obs.instances
        )
        return MetricsSnapshot(
            instances=samples,
            pool=PoolSample(
                ttft_p95_s=obs.ttft_p95,
                tpot_p90_s=obs.tpot_p90,
                local_hit_ratio=obs.local_hit_ratio,
                request_rate=obs.request_rate,
                prompt_tokens_rate=obs.prompt_token_rate,
                cache_hit_ratio=obs.cache_hit_ratio,
                generation_tokens_rate=obs.generation_token_rate,
                ttft_attainment=obs.ttft_attainment,
                tpot_attainment=obs.tpot_attainment,
                unserved_share=obs.unserved_share,
            ),
            expected_prefill=obs.serving_instances_scraped[0],
            expected_decode=obs.serving_instances_scraped[1],
        )

    def decide(self, obs: Observation) -> FleetTarget | None:
        snap = self.snapshot(obs)
        context = ScaleContext(
            current_pairs=self.pairs,
            ready_pairs=obs.serving_pairs_scraped,
            max_placeable_pairs=None,
            surge_pairs=1,
            hold_scale_down=False,
            shape=self.shape,
            group_shapes=obs.group_shapes,
        )
        decision, self.state = compute_desired_pairs(self.policy, context, snap, self.state, obs.now)
        self.last_reason = decision.reason
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        self.log.append(
            {
                "t": round(obs.now, 1),
                "pairs": decision.desired_pairs,
                "ready": obs.serving_pairs_scraped,
                "reason": decision.reason,
                "metrics": {k: decision.metrics[k] for k in LOG_METRICS if k in decision.metrics},
            }
        )
        pairs = decision.desired_pairs
        work_need = last_work_need(self.state, obs.now, self.interval_s)
        ratio, self.ratio_state = compute_role_ratio(
            self.policy, self.shape, snap, self.ratio_state, obs.now, hold=obs.shape_rollout, need=work_need
        )
        if ratio.changed:
            pairs = ratio_pairs(pairs, self.shape, ratio.shape, work_need)
            self.shape = ratio.shape
            self.reasons[ratio.reason] = self.reasons.get(ratio.reason, 0) + 1
        self.pairs = pairs
        need = last_work_need(self.state, obs.now, NEED_MAX_AGE_EVALUATIONS * self.interval_s)
        return FleetTarget(pairs=pairs, shape=self.shape, need=need)
