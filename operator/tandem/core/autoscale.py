"""SLO-driven pair autoscaling: the pure policy (docs/design/004-autoscaling.md).

What it owns: from one metrics snapshot, the pool's `spec.autoscaling` and the state returned by the
previous call, the desired number of pair groups (`pairs.replicas`) with a PascalCase reason, a
bounded message and the metric values behind it; optionally a new P:D shape when one role is the
bottleneck. It decides the **total** pair count only: the rollout planner splits it between stable
and canary (setWeight w → ⌈total × w / 100⌉ canary pairs, `core/rollout.py`), and the reconciler
acts on it (drain first, capacity first).

What it must not do: I/O, clock reads (``now`` is a parameter, in seconds on any fixed base), kopf,
Kubernetes or Prometheus imports (import-linter), hidden state (everything it remembers is returned
in :class:`AutoscaleState`). The fleet simulator imports it unchanged and calls it thousands of
times, so a call is a few hundred arithmetic operations; pass a precompiled :class:`AutoscalePolicy`
to skip parsing the spec's durations on every call.

Invariants (property-tested in tests/unit/core/test_autoscale.py):

- **No data → hold** (no change either way). **Partial data** (an expected instance missing, NaN,
  or a configured pool metric missing) → scale-up allowed, **scale-down never**; it also restarts
  the scale-down stabilization window, as does an empty state (operator restart) and the
  ``hold_scale_down`` flag (rollback in progress, new capacity not yet Ready).
- Inside ``[minPairs, maxPairs]`` the result stays inside; outside, it moves to the nearest bound.
- Never above ``max(current, max_placeable_pairs + surge_pairs)``: capacity never adds more than
  the surge of Pending pairs, and never removes a pair either.
- Step limits per period (HPA `behavior`): the change since the start of the period is at most
  ``max(maxPairs, maxPercent % of the count at the start of the period)``.
- Same input + same state → same output; a constant snapshot moves the count in one direction at
  most and then stays.

The rule, per metric m with value v and effective target t (worked example below):

    r = v / t;  band [lo, hi] = [1 − tol, 1 + tol] for load metrics, [1 − 2·tol, 1] for latencies
    r > hi  →  rec_m = max(current, ⌈ready × r⌉)             (too hot: scale up; r ≤ 2 for latency)
    r < lo  →  rec_m = min(current, ⌈ready × r⌉)             load metrics only (see below)
    else    →  rec_m = current                                (dead band: holds both ways)
    rec = max over metrics;  stabilized = HPA windows;  then step limits, bounds, capacity.

Load metrics (decode KV-cache utilization, in-flight requests per prefill and per decode instance)
are proportional to demand per pair and act in both directions, around their target as in HPA.
Latency targets are SLOs, so their band lies below the target: the pool settles under its SLO,
never up to ``tol`` above it. Latency is not proportional to load (an idle pool still has its
service time; a saturated one measures its queue), so below the band a latency has no opinion,
inside it it vetoes scale-down, and above the target it scales up proportionally with the ratio
capped at ×2 (``max_latency_ratio``):
the base is the *ready* pairs, so no second doubling happens before the first is Ready and
measured. With no load metric at all, latencies fall back to HPA's proportional rule both ways.

A latency breach (r > 1, complete data) also teaches a *learned ceiling* for the configured decode-side
load metrics (KV, decode in-flight): ``(1 − tol) × the value at the breach``, which tightens the
target so the pool does not scale back down to the count that breached. A ceiling is held
``learn_hold_s`` (default 30 min), then relaxed by ``max(tol, 5 %)`` per down-stabilization window
while every latency is below its band, and dropped once it reaches the configured target.

Worked example (reference fleet, `speed` pool: 8..95 pairs, TTFT p95 ≤ 1 s, TPOT p90 ≤ 16 ms,
KV 80 %; tolerance 10 %; up max(4, 100 %)/15 s; down max(1, 10 %)/60 s after 300 s): 60 ready
pairs, TTFT p95 1.35 s → r = 1.35 → ⌈60 × 1.35⌉ = 81. TPOT 14 ms → r = 0.875, inside the latency
band [0.8, 1]: rec = 60 (it would veto a scale-down). The TTFT breach teaches a KV ceiling of
0.9 × 0.42 = 0.378, so KV 0.42 → r = 1.11 → ⌈66.7⌉ = 67. rec = max(81, 60, 67) = 81 = ScaleUpTTFT,
within the step limit (max(60 + 4, 60 × 2) = 120), maxPairs 95 and capacity (94 placeable + 1
surge) → 81.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Literal

from tandem.api.pool import AutoscalingSpec, CapacityProfileSpec, RatioAdjustment, ScalingRule
from tandem.api.pool_status import ScalingDecision
from tandem.api.quantity import parse_duration
from tandem.core.capacity import (
    CapacityProfile,
    DecodePoint,
    EngineObservation,
    ForecastState,
    LearnedProfile,
    PrefillPoint,
    WorkDemand,
    decode_need,
    groups_for,
    learn_profile,
    prefill_need,
    update_correction,
    update_forecast,
)

Role = Literal["prefill", "decode"]
Completeness = Literal["complete", "partial", "none"]
Limit = Literal["maxPairs", "minPairs", "capacity", "step"]

# --- reasons (status.lastScaling.reason and the Event reason) ---------------------------------

REASON_SCALE_UP_TTFT: Final = "ScaleUpTTFT"
REASON_SCALE_UP_TPOT: Final = "ScaleUpTPOT"
REASON_SCALE_UP_KV_CACHE: Final = "ScaleUpKVCache"
REASON_SCALE_UP_IN_FLIGHT: Final = "ScaleUpInFlight"
REASON_SCALE_UP_MIN_PAIRS: Final = "ScaleUpToMinPairs"
REASON_SCALE_DOWN_IDLE: Final = "ScaleDownIdle"
REASON_SCALE_DOWN_MAX_PAIRS: Final = "ScaleDownToMaxPairs"
REASON_HOLD_NO_DATA: Final = "HoldNoData"
REASON_HOLD_PARTIAL_DATA: Final = "HoldPartialData"
REASON_HOLD_STABILIZING: Final = "HoldStabilizing"
REASON_HOLD_WITHIN_TOLERANCE: Final = "HoldWithinTolerance"
REASON_HOLD_STEP_LIMIT: Final = "HoldStepLimit"
REASON_HOLD_CAPACITY_FIRST: Final = "HoldCapacityFirst"
REASON_HOLD_CAPACITY_PENDING: Final = "HoldCapacityPending"
REASON_HOLD_NO_TARGETS: Final = "HoldNoTargets"
REASON_HOLD_SERVICE_BOUND: Final = "HoldTTFTServiceBound"
REASON_SCALE_UP_WORK: Final = "ScaleUpWork"
REASON_SCALE_UP_AHEAD: Final = "ScaleUpAhead"
REASON_SCALE_DOWN_WORK: Final = "ScaleDownWork"
REASON_HOLD_LEAD_TIME: Final = "HoldLeadTime"
REASON_HOLD_WORK_COVERED: Final = "HoldWorkCovered"
REASON_AT_MAX_PAIRS: Final = "AtMaxPairs"

# Which signal corrected work planning's model (decision metric ``signal``, and the message's last words).
SIGNAL_ROUTER: Final = "attainment from the router"
"""The router's per-request SLO counter answered: the corrections follow measured attainment."""
SIGNAL_MODEL: Final = "model only: no router attainment"
"""No router SLO series (no router scraped, or no request judged in the window): corrections unchanged."""
REASON_AT_MIN_PAIRS: Final = "AtMinPairs"
REASON_LIMITED_BY_CAPACITY: Final = "LimitedByCapacity"
REASON_DISABLED: Final = "AutoscalingDisabled"

REASON_RATIO_PREFILL_BOUND: Final = "PrefillBound"
REASON_RATIO_DECODE_BOUND: Final = "DecodeBound"
REASON_RATIO_BALANCED: Final = "RatioBalanced"
REASON_RATIO_DWELL: Final = "RatioHoldDwell"
REASON_RATIO_NO_DATA: Final = "RatioHoldNoData"
REASON_RATIO_AT_BOUNDS: Final = "RatioAtBounds"
REASON_RATIO_ROLLOUT: Final = "RatioHoldRollout"
REASON_RATIO_DISABLED: Final = "RatioDisabled"

# --- metric names (keys of AutoscaleDecision.metrics) -----------------------------------------

METRIC_TTFT: Final = "ttftP95"
METRIC_TPOT: Final = "tpotP90"
METRIC_KV_CACHE: Final = "kvCacheUtilization"
METRIC_IN_FLIGHT_PREFILL: Final = "inFlightPrefill"
METRIC_IN_FLIGHT_DECODE: Final = "inFlightDecode"
METRIC_WORK: Final = "work"
METRIC_WORK_AHEAD: Final = "workAhead"
LATENCY_METRICS: Final = (METRIC_TTFT, METRIC_TPOT)
LOAD_METRICS: Final = (METRIC_KV_CACHE, METRIC_IN_FLIGHT_PREFILL, METRIC_IN_FLIGHT_DECODE)
# Demand proxies a latency breach may tighten: smooth decode-side gauges. Prefill in-flight is left out:
# small counts (noise well above the tolerance) that a TTFT breach inflates with its own queue.
LEARNABLE_METRICS: Final = (METRIC_KV_CACHE, METRIC_IN_FLIGHT_DECODE)
_SCALE_UP_REASON: Final = {
    METRIC_TTFT: REASON_SCALE_UP_TTFT,
    METRIC_TPOT: REASON_SCALE_UP_TPOT,
    METRIC_KV_CACHE: REASON_SCALE_UP_KV_CACHE,
    METRIC_IN_FLIGHT_PREFILL: REASON_SCALE_UP_IN_FLIGHT,
    METRIC_IN_FLIGHT_DECODE: REASON_SCALE_UP_IN_FLIGHT,
    METRIC_WORK: REASON_SCALE_UP_WORK,
    METRIC_WORK_AHEAD: REASON_SCALE_UP_AHEAD,
}
_WARNING_REASONS: Final = frozenset(
    {REASON_HOLD_NO_DATA, REASON_HOLD_PARTIAL_DATA, REASON_AT_MAX_PAIRS, REASON_LIMITED_BY_CAPACITY}
)

MESSAGE_MAX: Final = 256  # status.lastScaling.message and Event messages stay short
_EPS: Final = 1e-9  # ⌈10 × 1.1⌉ must be 11, not 12
DEFAULT_LEARN_HOLD_S: Final = 1800.0
DEFAULT_MAX_LATENCY_RATIO: Final = 2.0
DEFAULT_SERVICE_BOUND_IN_FLIGHT: Final = 0.5
_NO_RATIO: Final = RatioAdjustment()
_NO_FORECAST: Final = ForecastState()
_MIN_CEILING: Final = 0.05  # learned ceilings never go below 5 % of the configured target


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceSample:
    """One instance's scraped gauges (None when missing or stale; NaN and ±Inf count as missing)."""

    pair: str
    role: Role
    running: float | None = None
    """`vllm:num_requests_running`."""
    waiting: float | None = None
    """`vllm:num_requests_waiting`."""
    kv_cache_utilization: float | None = None
    """`vllm:kv_cache_usage_perc`, 0-1 (decode instances are the ones that count)."""


@dataclass(frozen=True, slots=True)
class PoolSample:
    """Pool-level latencies and hit ratio over the rate window (None when missing, NaN, stale)."""

    ttft_p95_s: float | None = None
    tpot_p90_s: float | None = None
    local_hit_ratio: float | None = None
    """Informational: recorded with the decision, not scaled on (its effect shows up in TTFT)."""
    request_rate: float | None = None
    """Requests/s reaching the pool (router: every outcome, rejects included). Work planning only."""
    prompt_tokens_rate: float | None = None
    """Prompt tokens/s (`vllm:prompt_tokens_total`, prefill instances). Work planning only."""
    cache_hit_ratio: float | None = None
    """Share of prompt tokens served from a cache, local and shared tier (0-1). Work planning only."""
    generation_tokens_rate: float | None = None
    """Generated tokens/s (`vllm:generation_tokens_total`, decode instances). Work planning only."""
    ttft_attainment: float | None = None
    """Share of requests within their TTFT budget by prompt size (rejects and timeouts are misses)."""
    tpot_attainment: float | None = None
    """Share of requests within the TPOT target (rejects and timeouts are misses)."""
    unserved_share: float | None = None
    """Share of requests the router rejected or timed out (no pair had room): queueing the engines never see."""
    prefill_busy: float | None = None
    """Seconds of prefill phase per second over the prefill instances (profile learning; work planning only)."""
    prefills_rate: float | None = None
    """Prefills finished per second on the prefill instances (profile learning's evidence)."""
    itl_mean_s: float | None = None
    """Mean inter-token latency on the decode instances, from ``_sum``/``_count`` (profile learning)."""


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What one evaluation sees: per-instance samples of serving pairs plus pool samples.

    ``expected_prefill``/``expected_decode`` are the Ready instances of serving pairs (normally
    ready_pairs × instances per role): fewer valid samples than expected is partial data.
    """

    instances: tuple[InstanceSample, ...] = ()
    pool: PoolSample = PoolSample()
    expected_prefill: int = 0
    expected_decode: int = 0


@dataclass(frozen=True, slots=True)
class ScaleContext:
    """The pool's observed facts the policy needs besides metrics."""

    current_pairs: int
    """spec.pairs.replicas now (what the policy changes)."""
    ready_pairs: int
    """Serving pair groups (all instances Ready): the capacity that produced the metrics."""
    max_placeable_pairs: int | None = None
    """Pairs of this pool the GPUs can hold (already bound + what free GPUs fit); None = unknown."""
    surge_pairs: int = 1
    """Pending pairs allowed above what capacity can place (spec.rollout.maxSurge)."""
    hold_scale_down: bool = False
    """Set by the caller during a rollback or while new capacity is not yet Ready: no scale-down."""
    shape: tuple[int, int] = (1, 1)
    """Instances per pair group (prefill, decode): work planning turns per-role needs into groups."""
    group_shapes: tuple[tuple[int, int], ...] = ()
    """The live groups' own (prefill, decode), in the order a scale-down keeps them; () = all in ``shape``.
    While groups take a new P:D as they cycle (``tandem.core.reshape``) work planning counts them as they are
    (``tandem.core.capacity.groups_for``)."""
    measured_load_s: float | None = None
    """The serving revision's measured model load time (`tandem.core.loadtime`); None: not measured yet.
    Work planning's lead time is the smaller of this and the declared ``loadTime`` (:func:`lead_time`)."""


@dataclass(frozen=True, slots=True)
class StepRule:
    """One direction's behaviour in seconds (parsed from :class:`ScalingRule`)."""

    window_s: float
    period_s: float
    max_pairs: int
    max_percent: int

    @classmethod
    def from_spec(cls, rule: ScalingRule) -> StepRule:
        return cls(
            window_s=parse_duration(rule.stabilization_window),
            period_s=parse_duration(rule.period),
            max_pairs=rule.max_pairs,
            max_percent=rule.max_percent,
        )


@dataclass(frozen=True, slots=True)
class WorkPlanning:
    """`spec.autoscaling.capacityProfile` compiled: the profile and the planning knobs (fractions, seconds)."""

    profile: CapacityProfile
    attainment: float = 0.99
    burst_headroom: float = 0.2
    ttft_overhead_s: float = 0.05
    learn: bool = False
    """Plan with the profile learned from the engines (``learnFromEngines``), bounded by the declared one."""

    @property
    def lead_s(self) -> float:
        return self.profile.load_time_s

    @classmethod
    def from_spec(cls, spec: CapacityProfileSpec, version: str = "") -> WorkPlanning:
        profile = CapacityProfile(
            version=version,
            prefill=tuple(PrefillPoint(p.prompt_tokens, p.uncached_tokens_per_second) for p in spec.prefill),
            decode=tuple(DecodePoint(d.context_tokens, d.streams, d.tokens_per_second) for d in spec.decode),
            load_time_s=parse_duration(spec.load_time),
        )
        return cls(
            profile=profile,
            attainment=spec.attainment_percent / 100,
            burst_headroom=spec.burst_headroom_percent / 100,
            ttft_overhead_s=spec.ttft_overhead_ms / 1000,
            learn=spec.learn_from_engines,
        )


@dataclass(frozen=True, slots=True)
class AutoscalePolicy:
    """`spec.autoscaling` compiled to plain numbers (seconds, fractions). Build once per spec."""

    enabled: bool = True
    min_pairs: int = 1
    max_pairs: int = 8
    interval_s: float = 30.0
    tolerance: float = 0.1
    ttft_p95_s: float | None = None
    tpot_p90_s: float | None = None
    kv_cache_utilization: float | None = 0.8
    in_flight_per_instance: float | None = None
    scale_up: StepRule = StepRule(window_s=0.0, period_s=15.0, max_pairs=4, max_percent=100)
    scale_down: StepRule = StepRule(window_s=300.0, period_s=60.0, max_pairs=1, max_percent=10)
    ratio: RatioAdjustment = _NO_RATIO
    learn_hold_s: float = DEFAULT_LEARN_HOLD_S
    """How long a learned ceiling is held before it may relax (not in the API yet; see the design doc)."""
    service_bound_in_flight: float = DEFAULT_SERVICE_BOUND_IN_FLIGHT
    """Prefill in-flight (running + waiting) per instance below which a TTFT breach is service-time bound:
    with no queue to cut, the breach has no opinion on the pair count
    (spec.autoscaling.ttftServiceBoundInFlightPercent). 0.5 was chosen on the fleet benchmark
    (docs/design/004-autoscaling.md)."""
    max_latency_ratio: float = DEFAULT_MAX_LATENCY_RATIO
    """Cap on a latency's ratio in the scale-up rule: past saturation a latency measures the queue, not the
    shortfall, so one breach may at most multiply the *ready* pairs by this (not in the API yet)."""
    work: WorkPlanning | None = None
    """Work planning (spec.autoscaling.capacityProfile); None keeps the latency/utilization rule."""

    @classmethod
    def from_spec(
        cls,
        spec: AutoscalingSpec,
        *,
        learn_hold_s: float | None = None,
        max_latency_ratio: float = DEFAULT_MAX_LATENCY_RATIO,
    ) -> AutoscalePolicy:
        t = spec.targets
        down = StepRule.from_spec(spec.scale_down)
        return cls(
            enabled=spec.enabled,
            min_pairs=spec.min_pairs,
            max_pairs=spec.max_pairs,
            interval_s=parse_duration(spec.interval),
            tolerance=spec.tolerance_percent / 100,
            ttft_p95_s=None if t.ttft_p95_ms is None else t.ttft_p95_ms / 1000,
            tpot_p90_s=None if t.tpot_p90_ms is None else t.tpot_p90_ms / 1000,
            kv_cache_utilization=None
            if t.kv_cache_utilization_percent is None
            else t.kv_cache_utilization_percent / 100,
            in_flight_per_instance=None if t.in_flight_per_instance is None else float(t.in_flight_per_instance),
            scale_up=StepRule.from_spec(spec.scale_up),
            scale_down=down,
            ratio=spec.ratio,
            learn_hold_s=max(DEFAULT_LEARN_HOLD_S, 6 * down.window_s) if learn_hold_s is None else learn_hold_s,
            max_latency_ratio=max_latency_ratio,
            service_bound_in_flight=spec.ttft_service_bound_in_flight_percent / 100,
            work=None if spec.capacity_profile is None else WorkPlanning.from_spec(spec.capacity_profile),
        )

    def target(self, metric: str) -> float | None:
        """The configured target of a metric (seconds, 0-1 fraction, or requests per instance)."""
        if metric == METRIC_TTFT:
            return self.ttft_p95_s
        if metric == METRIC_TPOT:
            return self.tpot_p90_s
        if metric == METRIC_KV_CACHE:
            return self.kv_cache_utilization
        return self.in_flight_per_instance

    @property
    def configured(self) -> tuple[str, ...]:
        """Metrics with a configured target, in a fixed order."""
        return tuple(m for m in (*LATENCY_METRICS, *LOAD_METRICS) if self.target(m) is not None)


def _policy(spec: AutoscalingSpec | AutoscalePolicy) -> AutoscalePolicy:
    return spec if isinstance(spec, AutoscalePolicy) else AutoscalePolicy.from_spec(spec)


# --- state ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recommendation:
    at: float
    pairs: int


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    at: float
    delta: int
    """Pairs added (> 0) or removed (< 0) by one decision of this policy."""


@dataclass(frozen=True, slots=True)
class LearnedCeiling:
    """A load metric's per-instance value the SLO tolerates, learned from a latency breach."""

    metric: str
    value: float
    learned_at: float
    relaxed_at: float


@dataclass(frozen=True, slots=True)
class WorkState:
    """Per role: the forecast of the need (instances) and the attainment correction on the model."""

    prefill: ForecastState = _NO_FORECAST
    decode: ForecastState = _NO_FORECAST
    prefill_correction: float = 1.0
    decode_correction: float = 1.0


def last_work_need(state: AutoscaleState | None, now: float, max_age_s: float) -> tuple[float, float] | None:
    """The per-role instances (prefill, decode) work planning's last evaluation needed, with its correction and
    headroom: what a pool of any shape must hold for the autoscaler not to scale up. None without work planning
    or when that evaluation is older than ``max_age_s`` (the autoscaler has stopped answering: its last need is
    no reason to hold anything). Example: an evaluation 20 s ago needed 7.4 prefill and 3.1 decode instances
    → (7.4, 3.1); the same one 10 minutes ago with a 60 s limit → None."""
    work = None if state is None else state.work
    if work is None or not work.prefill.samples or not work.decode.samples:
        return None
    (at_p, need_p), (at_d, need_d) = work.prefill.samples[-1], work.decode.samples[-1]
    if now - min(at_p, at_d) > max_age_s:
        return None
    return need_p, need_d


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """Everything the policy remembers between calls. Empty after an operator restart (by design).

    ``since`` is the first evaluation with this state; ``down_blocked_until`` is when scale-down may
    next happen (pushed to ``now + down window`` by a fresh state, no data, partial data and the
    caller's hold flag). Recommendations and scale events are trimmed to the longest window/period.
    """

    since: float | None = None
    down_blocked_until: float = -math.inf
    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()
    learned: tuple[LearnedCeiling, ...] = ()
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    work: WorkState | None = None
    """Work planning's forecasts and corrections (None until its first evaluation)."""

    def without_learned(self) -> AutoscaleState:
        """Forget learned ceilings (e.g. when the stable revision changes: capacity per pair is per revision)."""
        return replace(self, learned=())


# --- output -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AutoscaleDecision:
    """One evaluation's verdict. ``metrics`` has ≤ 16 entries, keys ≤ 63 and values ≤ 64 chars."""

    from_pairs: int
    desired_pairs: int
    reason: str
    message: str
    metrics: dict[str, str] = field(default_factory=dict)
    recommendation: int | None = None
    """Raw metric recommendation before stabilization, step limits, bounds and capacity."""
    data: Completeness = "none"
    limited_by: Limit | None = None
    """What kept the result from the stabilized recommendation, if anything."""
    requeue_after_s: float = 30.0

    @property
    def changed(self) -> bool:
        return self.desired_pairs != self.from_pairs

    @property
    def warning(self) -> bool:
        """Whether the Event should be a Warning (no or partial data, SLO at risk from bounds or capacity)."""
        return self.reason in _WARNING_REASONS or self.limited_by in ("maxPairs", "capacity")

    @property
    def key(self) -> tuple[int, int, str]:
        """What makes a decision new: write status/Event only when this differs from the last one (INV-8)."""
        return (self.from_pairs, self.desired_pairs, self.reason)

    def to_status(self, time: datetime) -> ScalingDecision:
        return ScalingDecision(
            time=time,
            from_pairs=self.from_pairs,
            to_pairs=self.desired_pairs,
            reason=self.reason,
            message=self.message,
            metrics=self.metrics,
        )


# --- reading the snapshot -----------------------------------------------------------------------


def _valid(value: float | None, upper: float = math.inf) -> bool:
    return value is not None and math.isfinite(value) and 0.0 <= value <= upper


@dataclass(frozen=True, slots=True)
class _Reading:
    values: dict[str, float]
    coverage: dict[str, tuple[int, int]]
    incomplete: tuple[str, ...]
    completeness: Completeness
    hit_ratio: float | None


def _read(policy: AutoscalePolicy, snap: MetricsSnapshot, ready_pairs: int) -> _Reading:
    """Aggregate the snapshot: pool values, per-role means, and how complete the configured metrics are."""
    kv_sum = ifp_sum = ifd_sum = 0.0
    kv_n = ifp_n = ifd_n = 0
    for s in snap.instances:
        running, waiting, kv = s.running, s.waiting, s.kv_cache_utilization
        in_flight = running + waiting if running is not None and waiting is not None else None
        if in_flight is not None and not (_valid(running) and _valid(waiting)):
            in_flight = None
        if s.role == "decode":
            if kv is not None and _valid(kv, 1.0):
                kv_sum += kv
                kv_n += 1
            if in_flight is not None:
                ifd_sum += in_flight
                ifd_n += 1
        elif in_flight is not None:
            ifp_sum += in_flight
            ifp_n += 1
    values: dict[str, float] = {}
    coverage: dict[str, tuple[int, int]] = {}
    pool = snap.pool
    for metric, value in ((METRIC_TTFT, pool.ttft_p95_s), (METRIC_TPOT, pool.tpot_p90_s)):
        if value is not None and _valid(value):
            values[metric] = value
    for metric, total, n, expected in (
        (METRIC_KV_CACHE, kv_sum, kv_n, snap.expected_decode),
        (METRIC_IN_FLIGHT_PREFILL, ifp_sum, ifp_n, snap.expected_prefill),
        (METRIC_IN_FLIGHT_DECODE, ifd_sum, ifd_n, snap.expected_decode),
    ):
        coverage[metric] = (min(n, expected), expected)
        if n and expected:
            values[metric] = total / n
    incomplete: list[str] = []
    present = 0
    for metric in policy.configured:
        if metric not in values or ready_pairs <= 0:
            incomplete.append(metric)
            continue
        present += 1
        if metric in coverage and coverage[metric][0] < coverage[metric][1]:
            incomplete.append(metric)
    completeness: Completeness = "none" if present == 0 else ("partial" if incomplete else "complete")
    hit = pool.local_hit_ratio if _valid(pool.local_hit_ratio, 1.0) else None
    return _Reading(values, coverage, tuple(incomplete), completeness, hit)


def _service_bound(policy: AutoscalePolicy, reading: _Reading) -> _Reading:
    """Drop a TTFT breach that more pairs cannot fix: the prefill instances hold fewer than
    ``service_bound_in_flight`` requests each (complete data), so there is no queue to shorten and the
    p95 is the prefill time of long, uncached prompts. Left in, it would order pairs up to maxPairs and
    veto every scale-down; dropped, the load metrics size the pool."""
    ttft, target = reading.values.get(METRIC_TTFT), policy.ttft_p95_s
    in_flight = reading.values.get(METRIC_IN_FLIGHT_PREFILL)
    seen, expected = reading.coverage.get(METRIC_IN_FLIGHT_PREFILL, (0, 0))
    if ttft is None or not target or ttft <= target or in_flight is None or seen < expected:
        return reading
    if in_flight >= policy.service_bound_in_flight:
        return reading
    values = {k: v for k, v in reading.values.items() if k != METRIC_TTFT}
    return replace(reading, values=values)


# --- learned ceilings -------------------------------------------------------------------------


def _update_learned(
    policy: AutoscalePolicy, learned: tuple[LearnedCeiling, ...], reading: _Reading, now: float
) -> tuple[LearnedCeiling, ...]:
    """Learn on a latency breach (complete data only); relax slowly while latency has headroom."""
    if reading.completeness != "complete":
        return learned
    tol = policy.tolerance
    ratios = [reading.values[m] / t for m in LATENCY_METRICS if (t := policy.target(m)) and m in reading.values]
    if not ratios:
        return learned
    by_metric = {c.metric: c for c in learned}
    low, high = _band(tol, latency=True)
    if max(ratios) > high:
        for metric in LEARNABLE_METRICS:
            value, target = reading.values.get(metric), policy.target(metric)
            if not value or target is None:
                continue
            # Floored at a fraction of the target: a breach at near-zero load says nothing about capacity.
            ceiling = max(value * (1 - tol) if tol < 1 else value, target * _MIN_CEILING)
            old = by_metric.get(metric)
            if old is not None:
                ceiling = min(ceiling, old.value)
            by_metric[metric] = LearnedCeiling(metric, ceiling, now, now)
    elif max(ratios) < low:
        step = 1 + max(tol, 0.05)
        for metric, c in list(by_metric.items()):
            if now - c.learned_at < policy.learn_hold_s or now - c.relaxed_at < policy.scale_down.window_s:
                continue
            relaxed = c.value * step
            configured = policy.target(metric)
            if configured is None or relaxed >= configured:
                del by_metric[metric]
            else:
                by_metric[metric] = LearnedCeiling(metric, relaxed, c.learned_at, now)
    return tuple(by_metric[m] for m in LOAD_METRICS if m in by_metric)


def _effective_target(policy: AutoscalePolicy, learned: tuple[LearnedCeiling, ...], metric: str) -> float | None:
    """The configured target, tightened by a learned ceiling (ceilings exist only for configured targets)."""
    target = policy.target(metric)
    if target is None:
        return None
    for c in learned:
        if c.metric == metric:
            return min(target, c.value)
    return target


# --- recommendations ---------------------------------------------------------------------------


def _band(tol: float, *, latency: bool) -> tuple[float, float]:
    """Dead band of the ratio. Load targets are set points (1 ± tol, as HPA); latency targets are SLOs,
    ceilings not set points, so their band sits below them: [1 − 2·tol, 1]."""
    return (1 - 2 * tol, 1.0) if latency else (1 - tol, 1 + tol)


def _ceil(x: float) -> int:
    """⌈x⌉ robust to float noise and to absurd ratios (a count never needs more than 10⁹)."""
    return math.ceil(min(x, 1e9) - _EPS)


def _recommend(
    policy: AutoscalePolicy, reading: _Reading, learned: tuple[LearnedCeiling, ...], current: int, ready: int
) -> tuple[int, str | None, dict[str, float]]:
    """Per-metric recommendations → (max, the metric that drove it, each metric's ratio)."""
    tol = policy.tolerance
    ratios: dict[str, float] = {}
    recs: dict[str, int] = {}
    below_latency: list[str] = []
    for metric in (*LATENCY_METRICS, *LOAD_METRICS):
        value = reading.values.get(metric)
        target = _effective_target(policy, learned, metric)
        if value is None or not target:
            continue
        r = value / target
        ratios[metric] = r
        latency = metric in LATENCY_METRICS
        low, high = _band(tol, latency=latency)
        if r > high:
            grow = min(r, policy.max_latency_ratio) if latency else r
            recs[metric] = max(current, _ceil(ready * grow))
        elif r < low:
            if latency:
                below_latency.append(metric)
            else:
                recs[metric] = min(current, _ceil(ready * r))
        else:
            recs[metric] = current
    if not any(m in recs for m in LOAD_METRICS):
        # No load metric spoke: latency falls back to HPA's proportional rule in both directions.
        for metric in below_latency:
            recs[metric] = min(current, _ceil(ready * ratios[metric]))
    if not recs:
        return current, None, ratios
    driver = max(recs, key=lambda m: (recs[m], ratios[m]))
    return recs[driver], driver, ratios


def _period_start(events: tuple[ScaleEvent, ...], now: float, period: float, current: int) -> int:
    """Pairs at the start of the period (HPA): current − added + removed within it."""
    start = current
    for e in events:
        if e.at > now - period:
            start -= e.delta
    return start


def _up_limit(rule: StepRule, start: int) -> int:
    return max(start + rule.max_pairs, -(-start * (100 + rule.max_percent) // 100))


def _down_limit(rule: StepRule, start: int) -> int:
    return max(0, min(start - rule.max_pairs, start * (100 - rule.max_percent) // 100))


# --- formatting ---------------------------------------------------------------------------------


def _num(v: float) -> str:
    return f"{v:.3g}"


def _describe(metric: str, value: float) -> str:
    return f"{_num(value)}s" if metric in LATENCY_METRICS else _num(value)


def _bounded(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"


def _metrics_out(
    policy: AutoscalePolicy,
    reading: _Reading,
    learned: tuple[LearnedCeiling, ...],
    ready: int,
    rec: int | None,
) -> dict[str, str]:
    out: dict[str, str] = {"readyPairs": str(ready)}
    learned_for = {c.metric for c in learned}
    for metric in (*LATENCY_METRICS, *LOAD_METRICS):
        target = _effective_target(policy, learned, metric)
        value = reading.values.get(metric)
        if target is None and value is None:
            continue
        text = "missing" if value is None else _describe(metric, value)
        if target is not None:
            text += f" (target {_describe(metric, target)}{' learned' if metric in learned_for else ''})"
        out[metric] = text[:64]
    gaps = [f"{m} {n}/{e}" for m, (n, e) in reading.coverage.items() if m in policy.configured and n < e]
    out["data"] = (reading.completeness + (": " + ", ".join(gaps) if gaps else ""))[:64]
    if reading.hit_ratio is not None:
        out["localHitRatio"] = _num(reading.hit_ratio)
    out["recommendation"] = "-" if rec is None else str(rec)
    return out


# --- the policy ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Evaluation:
    """One call's working set: the inputs, what was read, and helpers that build the result."""

    policy: AutoscalePolicy
    context: ScaleContext
    state: AutoscaleState
    now: float
    reading: _Reading
    out: dict[str, str]
    rec: int | None = None

    @property
    def cur(self) -> int:
        return self.context.current_pairs

    @property
    def cap(self) -> int | None:
        """Most pairs GPU capacity allows: placeable + surge (None = unknown)."""
        placeable = self.context.max_placeable_pairs
        return None if placeable is None else max(0, placeable) + max(0, self.context.surge_pairs)

    def block_down(self) -> None:
        self.state = replace(
            self.state,
            down_blocked_until=max(self.state.down_blocked_until, self.now + self.policy.scale_down.window_s),
        )

    def decide(
        self, new: int, reason: str, message: str, limited_by: Limit | None = None
    ) -> tuple[AutoscaleDecision, AutoscaleState]:
        cur, now, st = self.cur, self.now, self.state
        if new != cur:
            st = replace(
                st,
                scale_events=(*st.scale_events, ScaleEvent(now, new - cur)),
                last_scale_up_at=now if new > cur else st.last_scale_up_at,
                last_scale_down_at=now if new < cur else st.last_scale_down_at,
            )
        metrics = self.out | {"limitedBy": limited_by} if limited_by else self.out
        decision = AutoscaleDecision(
            from_pairs=cur,
            desired_pairs=new,
            reason=reason,
            message=_bounded(message),
            metrics=metrics,
            recommendation=self.rec,
            data=self.reading.completeness,
            limited_by=limited_by,
            requeue_after_s=self.policy.interval_s,
        )
        return decision, st

    def hold(
        self, reason: str, message: str, limited_by: Limit | None = None
    ) -> tuple[AutoscaleDecision, AutoscaleState]:
        """No change. Under partial data every hold says so, except the actionable bound/capacity ones."""
        if self.reading.completeness == "partial" and reason not in (REASON_AT_MAX_PAIRS, REASON_LIMITED_BY_CAPACITY):
            reason, message = (
                REASON_HOLD_PARTIAL_DATA,
                f"partial data ({', '.join(self.reading.incomplete)}): {message}",
            )
        return self.decide(self.cur, reason, message, limited_by)

    def capacity_text(self) -> str:
        return f"GPU capacity places {self.context.max_placeable_pairs} pairs (+{self.context.surge_pairs} surge)"

    # (4) Outside [minPairs, maxPairs]: move to the nearest bound (no metrics, no step limits, as HPA).
    def correct_bounds(self) -> tuple[AutoscaleDecision, AutoscaleState] | None:
        cur, lo, hi, cap = self.cur, self.policy.min_pairs, self.policy.max_pairs, self.cap
        if cur < lo:
            new = lo if cap is None else min(lo, max(cur, cap))
            if new == cur:
                return self.decide(
                    cur, REASON_LIMITED_BY_CAPACITY, f"below minPairs {lo}; {self.capacity_text()}", "capacity"
                )
            limited: Limit | None = "capacity" if new < lo else None
            note = f"; {self.capacity_text()}" if limited else ""
            return self.decide(
                new, REASON_SCALE_UP_MIN_PAIRS, f"{cur} pairs is below minPairs {lo}: {cur} → {new}{note}", limited
            )
        if cur > hi:
            if self.context.hold_scale_down:
                return self.decide(
                    cur,
                    REASON_HOLD_CAPACITY_FIRST,
                    f"{cur} pairs is above maxPairs {hi}; scale-down held (rollback or capacity)",
                )
            return self.decide(hi, REASON_SCALE_DOWN_MAX_PAIRS, f"{cur} pairs is above maxPairs {hi}: {cur} → {hi}")
        return None

    # (8) Scale up: step limit, maxPairs, capacity (never below the current count).
    def scale_up(self, stabilized: int, driver: str, why: str) -> tuple[AutoscaleDecision, AutoscaleState]:
        cur, hi, cap, up = self.cur, self.policy.max_pairs, self.cap, self.policy.scale_up
        limit = _up_limit(up, _period_start(self.state.scale_events, self.now, up.period_s, cur))
        ceiling = hi if cap is None else min(hi, max(cur, cap))
        new = max(cur, min(stabilized, limit, ceiling))
        limited: Limit | None = None
        if new < stabilized:
            limited = "maxPairs" if new == hi else ("capacity" if new == ceiling else "step")
        if new == cur:
            if limited == "maxPairs":
                return self.hold(REASON_AT_MAX_PAIRS, f"{why} asks for {stabilized} pairs; at maxPairs {hi}", limited)
            if limited == "capacity":
                return self.hold(
                    REASON_LIMITED_BY_CAPACITY, f"{why} asks for {stabilized}; {self.capacity_text()}", limited
                )
            return self.hold(REASON_HOLD_STEP_LIMIT, f"{why} asks for {stabilized} pairs; step limit reached", limited)
        note = {
            None: "",
            "maxPairs": f", capped at maxPairs {hi}",
            "capacity": f", capped: {self.capacity_text()}",
            "step": f", step limit max({up.max_pairs} pairs, {up.max_percent}%) per {_num(up.period_s)}s",
            "minPairs": "",
        }[limited]
        ready = self.context.ready_pairs
        message = f"{why} on {ready} ready pairs: {cur} → {new} pairs (recommended {stabilized}{note})"
        return self.decide(new, _SCALE_UP_REASON[driver], message, limited)

    # (9) Scale down: complete data only, outside the caller's hold, after the down window.
    def scale_down(self, stabilized: int, why: str) -> tuple[AutoscaleDecision, AutoscaleState]:
        cur, lo, down = self.cur, self.policy.min_pairs, self.policy.scale_down
        if self.reading.completeness == "partial":
            return self.hold(REASON_HOLD_PARTIAL_DATA, f"would scale down to {stabilized}; never on partial data")
        if self.context.hold_scale_down:
            return self.hold(
                REASON_HOLD_CAPACITY_FIRST, f"would scale down to {stabilized}; held (rollback or capacity)"
            )
        if self.now < self.state.down_blocked_until:
            wait = _num(self.state.down_blocked_until - self.now)
            return self.hold(
                REASON_HOLD_STABILIZING,
                f"would scale down to {stabilized}; {wait}s left of a down window restarted by a restart, "
                "missing or partial data, or a hold",
            )
        limit = _down_limit(down, _period_start(self.state.scale_events, self.now, down.period_s, cur))
        new = min(cur, max(stabilized, limit, lo))
        if new == cur:
            if cur <= lo:
                return self.hold(
                    REASON_AT_MIN_PAIRS, f"recommendation {stabilized} pairs; at minPairs {lo}", "minPairs"
                )
            return self.hold(REASON_HOLD_STEP_LIMIT, f"would scale down to {stabilized}; step limit reached", "step")
        limited: Limit | None = None
        if new > stabilized:
            limited = "minPairs" if new == lo else "step"
        note = "" if limited is None else f" (recommended {stabilized}, limited by {limited})"
        ready = self.context.ready_pairs
        return self.decide(
            new,
            REASON_SCALE_DOWN_IDLE,
            f"below target on {ready} ready pairs ({why}): {cur} → {new} pairs{note}",
            limited,
        )


def compute_desired_pairs(
    spec: AutoscalingSpec | AutoscalePolicy,
    context: ScaleContext,
    metrics: MetricsSnapshot,
    state: AutoscaleState,
    now: float,
) -> tuple[AutoscaleDecision, AutoscaleState]:
    """Desired pair groups for one evaluation, and the state to pass to the next one.

    The caller applies ``desired_pairs`` (drain first) and keeps the returned state; if the write
    fails it may keep the old state, since the next call starts from the observed count either way.
    Numbered steps below follow the module docstring's rule.
    """
    policy = _policy(spec)
    cur = context.current_pairs
    ready = max(0, context.ready_pairs)
    up, down = policy.scale_up, policy.scale_down

    # (1) Autoscaling off: pairs.replicas belongs to the user, HPA or KEDA; Tandem never writes it.
    if not policy.enabled:
        reading = _Reading({}, {}, (), "none", None)
        ev = _Evaluation(policy, context, state, now, reading, {})
        return ev.decide(cur, REASON_DISABLED, "autoscaling is disabled: pairs.replicas is not Tandem's to set")

    # (2) A fresh state (first call, operator restart) waits a full down window before any scale-down;
    #     history is trimmed to the longest window/period.
    if state.since is None:
        state = replace(state, since=now, down_blocked_until=max(state.down_blocked_until, now + down.window_s))
    horizon_rec, horizon_ev = max(up.window_s, down.window_s), max(up.period_s, down.period_s)
    state = replace(
        state,
        recommendations=tuple(r for r in state.recommendations if r.at > now - horizon_rec),
        scale_events=tuple(e for e in state.scale_events if e.at > now - horizon_ev),
    )

    # (3) Read the snapshot; learn ceilings on a latency breach, relax them with headroom.
    raw_reading = _read(policy, metrics, ready)
    reading = _service_bound(policy, raw_reading)
    bound_note = ""
    if reading is not raw_reading:
        bound_note = (
            f"TTFT p95 {_num(raw_reading.values[METRIC_TTFT])}s is over its target but the prefill instances hold "
            f"{_num(raw_reading.values[METRIC_IN_FLIGHT_PREFILL])} requests each (< "
            f"{_num(policy.service_bound_in_flight)}): no queue for more pairs to cut"
        )
    learned = _update_learned(policy, state.learned, reading, now)
    state = replace(state, learned=learned)
    ev = _Evaluation(policy, context, state, now, reading, _metrics_out(policy, reading, learned, ready, None))

    # (4) Out of bounds.
    corrected = ev.correct_bounds()
    if corrected is not None:
        return corrected

    # (4b) Work planning (a declared capacity profile) replaces the per-metric rule below.
    if policy.work is not None:
        return _plan_work(ev, policy.work, metrics)

    # (5) Nothing to scale on: hold, and restart the down window on missing/partial data or a hold.
    if not policy.configured:
        return ev.hold(REASON_HOLD_NO_TARGETS, "no SLO target is set")
    if reading.completeness == "none":
        ev.block_down()
        why = "no serving pairs" if ready == 0 else "no configured metric has data (missing, NaN or stale)"
        return ev.hold(REASON_HOLD_NO_DATA, f"{why}: holding {cur} pairs")
    if reading.completeness == "partial" or context.hold_scale_down:
        ev.block_down()

    # (6) One recommendation per metric, the max wins; recorded for the windows.
    rec, driver, ratios = _recommend(policy, reading, learned, cur, ready)
    history = ev.state.recommendations
    ev.state = replace(ev.state, recommendations=(*history, Recommendation(now, rec)))
    ev.rec = rec
    ev.out = ev.out | {"recommendation": str(rec)}
    why = "" if driver is None else f"{driver} {_describe(driver, reading.values[driver])} ×{_num(ratios[driver])}"

    # (7) Stabilization (HPA): scale up to the lowest, down to the highest recommendation in its window.
    up_rec = down_rec = rec
    for r in history:
        if r.at > now - up.window_s:
            up_rec = min(up_rec, r.pairs)
        if r.at > now - down.window_s:
            down_rec = max(down_rec, r.pairs)
    if cur < up_rec and driver is not None:
        return ev.scale_up(up_rec, driver, why)
    if cur > down_rec:
        return ev.scale_down(down_rec, why)

    # (10) No change.
    if rec > cur:
        if cur >= policy.max_pairs:
            return ev.hold(
                REASON_AT_MAX_PAIRS, f"{why} asks for {rec} pairs; at maxPairs {policy.max_pairs}", "maxPairs"
            )
        return ev.hold(REASON_HOLD_STABILIZING, f"{why} asks for {rec}; the up window's lowest is {up_rec}")
    if rec < cur:
        if cur <= policy.min_pairs:
            return ev.hold(REASON_AT_MIN_PAIRS, f"recommendation {rec}; at minPairs {policy.min_pairs}", "minPairs")
        return ev.hold(REASON_HOLD_STABILIZING, f"recommendation {rec}; the down window's highest is {down_rec}")
    if driver is not None and ratios[driver] > _band(policy.tolerance, latency=driver in LATENCY_METRICS)[1]:
        # Over target, but ⌈ready × r⌉ ≤ current: the pairs already asked for (not Ready yet) cover it.
        return ev.hold(REASON_HOLD_CAPACITY_PENDING, f"{why} on {ready} ready pairs; the {cur} requested cover it")
    if bound_note:
        return ev.hold(REASON_HOLD_SERVICE_BOUND, bound_note)
    return ev.hold(REASON_HOLD_WITHIN_TOLERANCE, f"every metric within {_num(policy.tolerance * 100)}% or below target")


# --- work planning -------------------------------------------------------------------------------


def work_demand(metrics: MetricsSnapshot) -> WorkDemand | None:
    """The pool's work from one snapshot, or None when an input is missing (module docstring of
    :mod:`tandem.core.capacity`). Decode streams are the decode instances' running + waiting."""
    pool = metrics.pool
    values = (pool.request_rate, pool.prompt_tokens_rate, pool.generation_tokens_rate)
    if any(not _valid(v) for v in values):
        return None
    streams = 0.0
    for inst in metrics.instances:
        if inst.role == "decode":
            streams += (inst.running or 0.0) + (inst.waiting or 0.0)
    hit = pool.cache_hit_ratio if _valid(pool.cache_hit_ratio, 1.0) else 0.0
    return WorkDemand(
        request_rate=pool.request_rate or 0.0,
        prompt_tokens_per_s=pool.prompt_tokens_rate or 0.0,
        hit_ratio=hit or 0.0,
        generation_tokens_per_s=pool.generation_tokens_rate or 0.0,
        decode_streams=streams,
    )


def engine_observation(metrics: MetricsSnapshot) -> EngineObservation:
    """What the engines measured, for :func:`tandem.core.capacity.learn_profile`: the pool-wide prefill phase
    and inter-token latency, and the mean running sequences per decode instance that reported one."""
    pool = metrics.pool
    running = [i.running for i in metrics.instances if i.role == "decode" and _valid(i.running)]
    return EngineObservation(
        prefill_busy=pool.prefill_busy if _valid(pool.prefill_busy) else None,
        prefills_per_s=pool.prefills_rate if _valid(pool.prefills_rate) else None,
        mean_itl_s=pool.itl_mean_s if _valid(pool.itl_mean_s) else None,
        decode_running_per_instance=sum(r or 0.0 for r in running) / len(running) if running else None,
        prefill_instances=metrics.expected_prefill,
    )


def lead_time(work: WorkPlanning, measured_s: float | None) -> tuple[float, str]:
    """Work planning's capacity lead time and where it came from: the measured load time of the pool's own
    pods when there is one, bounded above by the declared ``capacityProfile.loadTime``.

    Why the declared value bounds it from above: the measurement is a few pods' first loads, and the ways it
    goes wrong make it long, not short (a readiness probe that flapped moves the Ready transition later; a
    one-off cold image pull on a new node). A lead time longer than the one the user declared would keep
    capacity, and forecast, further out than they chose to pay for; a shorter measured one (images cached,
    a fast model load) lets the pool follow the load as closely as it can really come back.
    Example: declared 300 s, measured 110 s → 110 s; measured 695 s → 300 s."""
    declared = work.lead_s
    if measured_s is None or not math.isfinite(measured_s) or measured_s < 0:
        return declared, f"{declared:.0f}s declared"
    if measured_s >= declared:
        return declared, f"{declared:.0f}s declared (measured {measured_s:.0f}s)"
    return measured_s, f"{measured_s:.0f}s measured (declared {declared:.0f}s)"


def _plan_work(
    ev: _Evaluation, work: WorkPlanning, metrics: MetricsSnapshot
) -> tuple[AutoscaleDecision, AutoscaleState]:
    """Pairs from the work (docs/design/012-autoscaler.md), with the same bounds, step limits and capacity
    rules as the metric rule:

    1. need_r = queue-model instances for role r at the attainment target × the role's attainment correction
       × (1 + burst headroom);
    2. forecast each need ``lead`` ahead (:func:`lead_time`: the measured load time, at most the declared
       one); scale up to the pairs the forecast needs (ScaleUpAhead when the forecast, not the need now, asks
       for more);
    3. scale down only to the pairs of the largest need seen within the lead time (capacity released now
       cannot be back sooner), never below the need now; the metric rule's down window and step limits apply.

    The corrections of step 1 follow the router's measured attainment (rejects and timeouts are misses) when
    it answers; without it they stay as they were and the decision's ``signal`` says the model ran alone.
    """
    now, cur, shape = ev.now, ev.cur, ev.context.shape
    st = ev.state.work or WorkState()
    demand = work_demand(metrics)
    if demand is None or (ev.context.ready_pairs == 0 and demand.request_rate <= 0):
        ev.block_down()
        return ev.hold(REASON_HOLD_NO_DATA, f"no work data (request, prompt or generation rate missing): holding {cur}")
    pool = metrics.pool
    ttft_att = pool.ttft_attainment if _valid(pool.ttft_attainment, 1.0) else None
    tpot_att = pool.tpot_attainment if _valid(pool.tpot_attainment, 1.0) else None
    unserved = pool.unserved_share if _valid(pool.unserved_share, 1.0) else None
    signal = SIGNAL_ROUTER if ttft_att is not None or tpot_att is not None else SIGNAL_MODEL
    # A queue is what more capacity cuts: the prefill engines' waiting requests, or the requests the router
    # rejected or timed out because no pair had room (the admission cap keeps those out of the engines' queues).
    prefill_waiting = sum((i.waiting or 0.0) for i in metrics.instances if i.role == "prefill")
    queued = prefill_waiting > 0 or (unserved or 0.0) > 0
    p_corr = update_correction(st.prefill_correction, ttft_att, work.attainment, queued)
    d_corr = update_correction(st.decode_correction, tpot_att, work.attainment, True)
    learned = (
        learn_profile(work.profile, demand, engine_observation(metrics), ev.policy.interval_s)
        if work.learn
        else LearnedProfile(work.profile)
    )
    p = prefill_need(demand, learned.profile, work.attainment, work.ttft_overhead_s)
    d = decode_need(demand, learned.profile, work.attainment)
    head = 1.0 + work.burst_headroom
    lead, lead_source = lead_time(work, ev.context.measured_load_s)
    p_fc, p_state = update_forecast(st.prefill, now, p.instances * p_corr * head, lead)
    d_fc, d_state = update_forecast(st.decode, now, d.instances * d_corr * head, lead)
    ev.state = replace(ev.state, work=WorkState(p_state, d_state, p_corr, d_corr))
    kept = ev.context.group_shapes
    need_now = groups_for(p_fc.now, d_fc.now, shape, kept)
    ahead = groups_for(p_fc.ahead, d_fc.ahead, shape, kept)
    keep = max(need_now, groups_for(p_fc.recent_peak, d_fc.recent_peak, shape, kept))
    ev.rec = ahead
    ev.out = {
        "readyPairs": str(ev.context.ready_pairs),
        "recommendation": str(ahead),
        "prefillNeed": f"{p_fc.now:.2f} now, {p_fc.ahead:.2f} ahead (load {p.load:.2f}, x{p_corr:.2f})",
        "decodeNeed": f"{d_fc.now:.2f} now, {d_fc.ahead:.2f} ahead (load {d.load:.2f}, x{d_corr:.2f})",
        "pairsNeeded": f"{need_now} now, {ahead} ahead, {keep} kept",
        "attainment": f"ttft {_opt(ttft_att)} tpot {_opt(tpot_att)} unserved {_opt(unserved)}",
        "signal": signal,
        "leadTime": lead_source,
        "prefillProfile": learned.prefill_note,
        "decodeProfile": learned.decode_note,
    }
    why = (
        f"work {demand.uncached_tokens_per_s:.0f} uncached tok/s, {demand.decode_streams:.0f} streams; "
        f"{p_fc.ahead:.1f}P+{d_fc.ahead:.1f}D within {lead:.0f}s; "
        f"{signal}"
    )
    if cur < ahead:
        return ev.scale_up(ahead, METRIC_WORK if ahead <= need_now else METRIC_WORK_AHEAD, why)
    if cur > keep:
        decision, state = ev.scale_down(keep, why)
        if decision.reason == REASON_SCALE_DOWN_IDLE:
            decision = replace(decision, reason=REASON_SCALE_DOWN_WORK)
        return decision, state
    if cur > need_now:
        return ev.hold(REASON_HOLD_LEAD_TIME, f"{why}: {need_now} pairs would do now, {keep} kept for the lead time")
    return ev.hold(REASON_HOLD_WORK_COVERED, f"{why}: {cur} pairs cover it")


def _opt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# --- P:D ratio adjustment ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RatioState:
    """Hysteresis memory of the P:D adjustment: which role looked like the bottleneck, since when."""

    bottleneck: Role | None = None
    since: float | None = None
    last_change_at: float | None = None


@dataclass(frozen=True, slots=True)
class RatioDecision:
    """Proposed instances per role per pair group. A change is rolled out as a new pair shape."""

    shape: tuple[int, int]
    """(prefill, decode) instances per pair group."""
    from_shape: tuple[int, int]
    reason: str
    message: str
    metrics: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.shape != self.from_shape


def _pressures(policy: AutoscalePolicy, reading: _Reading) -> tuple[float | None, float | None]:
    """(prefill pressure, decode pressure) as ratios to target; None when not measurable."""
    ttft = reading.values.get(METRIC_TTFT)
    prefill = ttft / policy.ttft_p95_s if ttft is not None and policy.ttft_p95_s else None
    decode_parts = [
        reading.values[m] / t
        for m, t in ((METRIC_TPOT, policy.tpot_p90_s), (METRIC_KV_CACHE, policy.kv_cache_utilization))
        if t and m in reading.values
    ]
    return prefill, (max(decode_parts) if decode_parts else None)


def _shape_candidates(bounds: RatioAdjustment, shape: tuple[int, int], verdict: Role) -> list[tuple[int, int]]:
    """One instance toward the bottleneck role, inside the bounds, in lowest terms when that fits."""
    p, d = shape
    raw = [(p + 1, d), (p, d - 1)] if verdict == "prefill" else [(p, d + 1), (p - 1, d)]

    def fits(c: tuple[int, int]) -> bool:
        return bounds.min_prefill <= c[0] <= bounds.max_prefill and bounds.min_decode <= c[1] <= bounds.max_decode

    out: list[tuple[int, int]] = []
    for c in raw:
        if fits(c):
            g = math.gcd(*c)
            out.append((c[0] // g, c[1] // g) if fits((c[0] // g, c[1] // g)) else c)
    return out


def compute_role_ratio(
    spec: AutoscalingSpec | AutoscalePolicy,
    shape: tuple[int, int],
    metrics: MetricsSnapshot,
    state: RatioState,
    now: float,
    *,
    hold: bool = False,
    dwell_s: float | None = None,
    need: tuple[float, float] | None = None,
) -> tuple[RatioDecision, RatioState]:
    """Propose a new (prefill, decode) per pair group when one role stays the bottleneck.

    With work planning (``spec.autoscaling.capacityProfile``; ``need``: the per-role instances this
    evaluation needed, :func:`last_work_need`; without it, no change), the target ratio is the work's:
    ρ* = prefill need / decode need. The verdict is prefill-bound when ρ* > (P/D)·(1 + tol), decode-bound
    when ρ* < (P/D)/(1 + tol). Why not the pressures below: a pool-wide TTFT p95 is the prefill time of long
    prompts, above its target even on an idle fleet (issue 18), so the latency rule calls such a pool
    prefill-bound and moves one instance toward prefill at each dwell, without end (the simulator's
    W1 --decorrelate went 4P:1D → 10P:1D in 28 minutes while its work needed 3–4 prefill per decode).

    Without a need, pressures: p = TTFT p95 / target, d = max(TPOT p90 / target, decode KV / target).
    Whole-pair scaling holds the binding role in its latency band, so the signature of a wrong ratio is one
    role at or above the band's floor while the other is below it: prefill-bound when p ≥ 1 − 2·tol > d,
    decode-bound in mirror, and ρ* = (P × p) / (D × d) (the ratio at which both roles would sit at the same
    pressure).

    Either way the verdict must hold on complete data for ``dwell_s`` (default: the down-stabilization
    window, at least two intervals); anything else restarts the streak. Then one instance moves toward ρ*:
    prefill-bound tries (P+1, D) and (P, D−1), decode-bound (P, D+1) and (P−1, D), inside the bounds, in
    lowest terms when that fits. The best candidate must beat today's shape by ln(1 + tol) in
    |ln(shape) − ln ρ*| (hysteresis: no flapping between neighbours). ``hold`` (groups still being replaced
    for the last change) freezes it.

    Example (pressures): 1P:1D, p = 1.0, d = 0.6 → ρ* = 1.67; 2P:1D is 0.18 from ρ* in log terms against 0.51
    today → 2P:1D. Once pairs are trimmed (d → 1.0, p → 0.83) both roles sit in the band: balanced.
    Example (work): 4P:1D, need 13.0P + 3.5D → ρ* = 3.71, within 10 % of 4: balanced.
    """
    policy = _policy(spec)
    bounds, tol = policy.ratio, policy.tolerance
    dwell = max(policy.scale_down.window_s, 2 * policy.interval_s) if dwell_s is None else dwell_s
    reset = RatioState(None, None, state.last_change_at)

    def keep(reason: str, message: str, st: RatioState, shown: dict[str, str]) -> tuple[RatioDecision, RatioState]:
        return RatioDecision(shape, shape, reason, _bounded(message), shown), st

    if not bounds.enabled:
        return keep(REASON_RATIO_DISABLED, "P:D adjustment is disabled", state, {})
    if hold:
        return keep(REASON_RATIO_ROLLOUT, "a pair-shape rollout is in progress", reset, {})
    verdict: Role | None = None
    shown: dict[str, str] = {"shape": f"{shape[0]}P:{shape[1]}D"}
    if policy.work is not None:
        if need is None:
            return keep(REASON_RATIO_NO_DATA, "needs this evaluation's work need (work planning)", reset, shown)
        p_need, d_need = need
        shown["workNeed"] = f"{p_need:.2f}P+{d_need:.2f}D"
        if not (p_need > 0 and d_need > 0 and math.isfinite(p_need) and math.isfinite(d_need)):
            return keep(REASON_RATIO_NO_DATA, "needs a positive work need of both roles", reset, shown)
        ideal = math.log(p_need / d_need)
        today = math.log(shape[0] / shape[1])
        if ideal > today + math.log(1 + tol):
            verdict = "prefill"
        elif ideal < today - math.log(1 + tol):
            verdict = "decode"
        pressures = f"work {p_need:.1f}P+{d_need:.1f}D, ratio {p_need / d_need:.2f}"
        balanced = f"the work's P:D {p_need / d_need:.2f} is within {tol:.0%} of {shape[0]}P:{shape[1]}D"
    else:
        reading = _read(policy, metrics, 1 if metrics.expected_decode or metrics.expected_prefill else 0)
        p_press, d_press = _pressures(policy, reading)
        shown["prefillPressure"] = "-" if p_press is None else _num(p_press)
        shown["decodePressure"] = "-" if d_press is None else _num(d_press)
        if reading.completeness != "complete" or p_press is None or d_press is None:
            return keep(REASON_RATIO_NO_DATA, "needs complete TTFT and TPOT or KV data", reset, shown)
        floor = _band(tol, latency=True)[0]
        if p_press >= floor > d_press:
            verdict = "prefill"
        elif d_press >= floor > p_press:
            verdict = "decode"
        ideal = math.log(shape[0] * max(p_press, 0.05)) - math.log(shape[1] * max(d_press, 0.05))
        pressures = f"prefill ×{_num(p_press)}, decode ×{_num(d_press)}"
        balanced = "no role is the sole bottleneck"
    if verdict is None:
        return keep(REASON_RATIO_BALANCED, balanced, reset, shown)
    since = state.since if state.bottleneck == verdict and state.since is not None else now
    streak = RatioState(verdict, since, state.last_change_at)
    if now - since < dwell:
        return keep(REASON_RATIO_DWELL, f"{verdict}-bound for {_num(now - since)}s of {_num(dwell)}s", streak, shown)

    def distance(c: tuple[int, int]) -> float:
        return abs(math.log(c[0] / c[1]) - ideal)

    candidates = _shape_candidates(bounds, shape, verdict)
    best = min(candidates, key=lambda c: (distance(c), c[0] + c[1]), default=None)
    if best is None or distance(best) > distance(shape) - math.log(1 + tol):
        return keep(REASON_RATIO_AT_BOUNDS, f"{verdict}-bound, but no shape inside the bounds is better", streak, shown)
    reason = REASON_RATIO_PREFILL_BOUND if verdict == "prefill" else REASON_RATIO_DECODE_BOUND
    message = f"{verdict}-bound for {_num(now - since)}s ({pressures}): {shape[0]}P:{shape[1]}D → {best[0]}P:{best[1]}D"
    return RatioDecision(best, shape, reason, message, shown), RatioState(None, None, now)


def equivalent_pairs(pairs: int, old: tuple[int, int], new: tuple[int, int]) -> int:
    """Pair groups of the new shape keeping at least the instances of each role (capacity first).

    N' = max(⌈N·P/P'⌉, ⌈N·D/D'⌉); the pair autoscaler trims any excess after its down window.
    10 pairs of 1P:1D → 2P:1D: max(⌈5⌉, ⌈10⌉) = 10 (prefill doubles, decode kept).
    """
    (p, d), (p2, d2) = old, new
    return max(-(-pairs * p // p2), -(-pairs * d // d2))


def ratio_pairs(pairs: int, old: tuple[int, int], new: tuple[int, int], need: tuple[float, float] | None) -> int:
    """The pair count written with a P:D change.

    With work planning (``need``) it stays: groups keep the shape they were built with and take the new one
    as they cycle (``tandem.core.reshape``), the autoscaler already counted them as they are, and a replacement
    that would leave a role short of the need is kept until a group is added. Converting the count as if
    every group changed shape (:func:`equivalent_pairs`) would add groups the fleet does not need: in the
    simulator, 4 groups of 4P:1D → 3P:1D became 6 groups, 4 of them still 4P:1D (28 instances for 20).
    Without work planning nothing knows the per-role need, so the count is :func:`equivalent_pairs` (no role
    loses instances)."""
    return pairs if need is not None else equivalent_pairs(pairs, old, new)


__all__ = [
    "AutoscaleDecision",
    "AutoscalePolicy",
    "AutoscaleState",
    "InstanceSample",
    "LearnedCeiling",
    "MetricsSnapshot",
    "PoolSample",
    "RatioDecision",
    "RatioState",
    "Recommendation",
    "ScaleContext",
    "ScaleEvent",
    "StepRule",
    "compute_desired_pairs",
    "compute_role_ratio",
    "equivalent_pairs",
    "last_work_need",
    "ratio_pairs",
]
