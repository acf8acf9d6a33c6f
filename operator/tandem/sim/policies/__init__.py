"""Scaling policies for the simulator: the interface (:mod:`.base`), baselines B0–B4 (:mod:`.baselines`)
and Tandem's own (:mod:`.tandem`, imported from ``tandem.core`` and loaded only when asked for, so a
broken ``tandem.core`` fails the runs that need it — never silently)."""

from __future__ import annotations

from tandem.sim.policies.base import FleetTarget, PolicyContext, ScalingPolicy, Topology, unit_shape
from tandem.sim.policies.baselines import HpaUtilization, KedaQueue, PlannerLike, RatioLocked, StaticPeak

POLICIES: dict[str, str] = {
    "B0": "static peak (1.1 × oracle peak)",
    "B1": "HPA on KV-cache usage / prefill busy",
    "B2": "KEDA on waiting + running per replica",
    "B3": "Dynamo-planner-like throughput planner",
    "B4": "ratio-locked on decode tokens/s",
    "tandem": "tandem.core.autoscale on pair groups",
}
ALIASES = {"static": "B0", "hpa": "B1", "keda": "B2", "planner": "B3", "ratio": "B4", "ours": "tandem"}


def canonical(name: str) -> str:
    key = ALIASES.get(name, name)
    if key not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return key


def make_policy(name: str, ctx: PolicyContext, ttft_p95_ms: int = 1000) -> ScalingPolicy:
    """Instantiate a policy by id (``B0``–``B4``, ``tandem``) or alias."""
    key = canonical(name)
    if key == "B0":
        return StaticPeak(ctx)
    if key == "B1":
        return HpaUtilization(ctx)
    if key == "B2":
        return KedaQueue(ctx)
    if key == "B3":
        return PlannerLike(ctx)
    if key == "B4":
        return RatioLocked(ctx)
    from tandem.sim.policies.tandem import TandemAutoscaler  # noqa: PLC0415 - fail here, loudly, if core is broken

    return TandemAutoscaler(ctx, ttft_p95_ms)


__all__ = [
    "POLICIES",
    "FleetTarget",
    "PolicyContext",
    "ScalingPolicy",
    "Topology",
    "canonical",
    "make_policy",
    "unit_shape",
]
