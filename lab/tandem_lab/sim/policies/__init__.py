"""Scaling policies for the simulator: the interface (:mod:`.base`), baselines B0–B4 (:mod:`.baselines`), the
clairvoyant reference C1 (:mod:`.clairvoyant`)
and Tandem's own (:mod:`.tandem`, imported from ``tandem.core`` and loaded only when asked for, so a
broken ``tandem.core`` fails the runs that need it — never silently)."""

from __future__ import annotations

from tandem_lab.sim.policies.base import FleetTarget, PolicyContext, ScalingPolicy, Topology, unit_shape
from tandem_lab.sim.policies.baselines import HpaUtilization, KedaQueue, PlannerLike, RatioLocked, StaticPeak
from tandem_lab.sim.policies.clairvoyant import Clairvoyant

POLICIES: dict[str, str] = {
    "B0": "static peak (1.1 × oracle peak)",
    "B1": "HPA on KV-cache usage / prefill busy",
    "B2": "KEDA on waiting + running per replica",
    "B3": "Dynamo-planner-like throughput planner",
    "B4": "ratio-locked on decode tokens/s",
    "tandem": "tandem.core.autoscale on pair groups",
    "C1": "clairvoyant reference: the model's future need, a slowest load ahead",
}
POLICY_WORDS: dict[str, str] = {
    "B0": "**B0 static peak**: a fixed fleet for the whole run, 1.1 × the planning model's per-role peak "
    "(it knows the whole workload in advance; no scaling, no load cost).",
    "B1": "**B1 HPA-utilization**: Kubernetes HPA defaults per role — decode on KV-cache usage (target 80 %), "
    "prefill on busy fraction (80 %); up at once by max(4 pods, +100 %) per 15 s, down after 300 s.",
    "B2": "**B2 KEDA-queue**: KEDA's Prometheus trigger, waiting + running requests per replica (target 5), "
    "through the HPA KEDA creates (B1's behaviour).",
    "B3": "**B3 Dynamo-planner-like**: every 180 s, next-interval request rate, input and output length → "
    "prefill and decode instances from a perfect offline throughput profile, with TTFT/ITL correction factors.",
    "B4": "**B4 ratio-locked** (HeteroScale-like): one signal, decode tokens/s, proportional control of whole "
    "units of the offline P:D (tolerance 10 %, 300 s down-stabilisation).",
    "tandem": "**tandem**: `tandem.core.autoscale` unchanged on pair groups; with a capacity profile it plans "
    "from the work (M/D/c prefill, square-root-staffed decode, forecast over the load time, attainment "
    "correction; docs/design/012-autoscaler.md).",
    "C1": "**C1 clairvoyant** (a reference, not a baseline): it reads the planning model's need for the whole run "
    "and holds H × the largest need over the next slowest load time (H = 1 unless `policies.clairvoyant_headroom`), on "
    "independent pools: an exact forecast, never late. What it misses, no better forecast catches at its GPU-hours.",
}
"""What each policy is, in words, for the reports (benchmarks.md §5 has the full definitions)."""

ALIASES = {
    "static": "B0",
    "hpa": "B1",
    "keda": "B2",
    "planner": "B3",
    "ratio": "B4",
    "ours": "tandem",
    "clairvoyant": "C1",
}


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
    if key == "C1":
        return Clairvoyant(ctx)
    from tandem_lab.sim.policies.tandem import TandemAutoscaler  # noqa: PLC0415 - fail here, loudly, if core is broken

    return TandemAutoscaler(ctx, ttft_p95_ms)


__all__ = [
    "POLICIES",
    "POLICY_WORDS",
    "FleetTarget",
    "PolicyContext",
    "ScalingPolicy",
    "Topology",
    "canonical",
    "make_policy",
    "unit_shape",
]
