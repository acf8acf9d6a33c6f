"""Fluent factories and a closed-loop driver for autoscaling tests (tests only).

``make_autoscaling().targets(ttft_p95_ms=1000).bounds(1, 95).obj()``
``make_snapshot(10).latency(ttft=1.2, tpot=0.012).kv(0.5).missing("decode", 1).obj()``
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

from hypothesis import settings

from tandem.api.pool import AutoscalingSpec, RatioAdjustment, ScaleDownRule, ScaleUpRule, SloTargets
from tandem.core.autoscale import (
    AutoscaleDecision,
    AutoscalePolicy,
    AutoscaleState,
    InstanceSample,
    MetricsSnapshot,
    PoolSample,
    Role,
    ScaleContext,
    compute_desired_pairs,
)

WARM = AutoscaleState(since=-1e9)
"""A state whose restart window is long over and whose history is empty."""


def scaled_examples(fraction: float, floor: int = 10) -> settings:
    """Hypothesis settings following the loaded profile's ``max_examples`` (scaled for cost), no deadline."""
    return settings(max_examples=max(floor, int(settings().max_examples * fraction)), deadline=None)


class AutoscalingFactory:
    """Builds an enabled ``AutoscalingSpec`` with no targets unless asked (so each test states its SLOs).

    Every method returns a new factory, so module-level factories can be shared and refined safely.
    """

    def __init__(self) -> None:
        self._fields: dict[str, Any] = {"enabled": True, "min_pairs": 1, "max_pairs": 95}
        self._targets: dict[str, Any] = {"kv_cache_utilization_percent": None}

    def _with(self, targets: dict[str, Any] | None = None, **fields: Any) -> Self:
        new = copy.copy(self)
        new._fields = self._fields | fields
        new._targets = dict(self._targets) if targets is None else targets
        return new

    def targets(
        self,
        *,
        ttft_p95_ms: int | None = None,
        tpot_p90_ms: int | None = None,
        kv_percent: int | None = None,
        in_flight: int | None = None,
    ) -> Self:
        return self._with(
            {
                "ttft_p95_ms": ttft_p95_ms,
                "tpot_p90_ms": tpot_p90_ms,
                "kv_cache_utilization_percent": kv_percent,
                "in_flight_per_instance": in_flight,
            }
        )

    def bounds(self, min_pairs: int, max_pairs: int) -> Self:
        return self._with(min_pairs=min_pairs, max_pairs=max_pairs)

    def tolerance(self, percent: int) -> Self:
        return self._with(tolerance_percent=percent)

    def interval(self, duration: str) -> Self:
        return self._with(interval=duration)

    def scale_up(self, window: str = "0s", period: str = "15s", pairs: int = 4, percent: int = 100) -> Self:
        return self._with(
            scale_up=ScaleUpRule(stabilization_window=window, period=period, max_pairs=pairs, max_percent=percent)
        )

    def scale_down(self, window: str = "300s", period: str = "60s", pairs: int = 1, percent: int = 10) -> Self:
        return self._with(
            scale_down=ScaleDownRule(stabilization_window=window, period=period, max_pairs=pairs, max_percent=percent)
        )

    def ratio(self, prefill: tuple[int, int] = (1, 1), decode: tuple[int, int] = (1, 1)) -> Self:
        return self._with(
            ratio=RatioAdjustment(
                enabled=True, min_prefill=prefill[0], max_prefill=prefill[1], min_decode=decode[0], max_decode=decode[1]
            )
        )

    def disabled(self) -> Self:
        return self._with(enabled=False)

    def obj(self) -> AutoscalingSpec:
        return AutoscalingSpec(**self._fields, targets=SloTargets(**self._targets))

    def policy(self, **overrides: Any) -> AutoscalePolicy:
        return AutoscalePolicy.from_spec(self.obj(), **overrides)


def make_autoscaling() -> AutoscalingFactory:
    return AutoscalingFactory()


def reference_autoscaling() -> AutoscalingFactory:
    """The reference fleet's `speed` pool: 8..95 pairs, TTFT p95 1 s, TPOT p90 16 ms, KV 80 %."""
    return make_autoscaling().targets(ttft_p95_ms=1000, tpot_p90_ms=16, kv_percent=80).bounds(8, 95)


class SnapshotFactory:
    """Instances of ``pairs`` serving pairs (``prefill``/``decode`` per pair), all reporting the same values.

    Every method returns a new factory (copy-on-write), like :class:`AutoscalingFactory`.
    """

    def __init__(self, pairs: int, prefill: int = 1, decode: int = 1) -> None:
        self._pairs = pairs
        self._per: dict[Role, int] = {"prefill": prefill, "decode": decode}
        self._pool: dict[str, float | None] = {}
        self._values: dict[Role, dict[str, float | None]] = {
            "prefill": {"running": 1.0, "waiting": 0.0, "kv_cache_utilization": None},
            "decode": {"running": 10.0, "waiting": 0.0, "kv_cache_utilization": 0.3},
        }
        self._missing: dict[Role, tuple[int, str | None]] = {}
        self._expected: dict[Role, int] | None = None

    def _copy(self) -> Self:
        new = copy.copy(self)
        new._pool = dict(self._pool)
        new._values = {"prefill": dict(self._values["prefill"]), "decode": dict(self._values["decode"])}
        new._missing = dict(self._missing)
        return new

    def latency(self, *, ttft: float | None = None, tpot: float | None = None) -> Self:
        new = self._copy()
        new._pool.update(ttft_p95_s=ttft, tpot_p90_s=tpot)
        return new

    def hit(self, ratio: float | None) -> Self:
        new = self._copy()
        new._pool["local_hit_ratio"] = ratio
        return new

    def kv(self, utilization: float | None) -> Self:
        return self.gauges("decode", kv_cache_utilization=utilization)

    def in_flight(self, *, prefill: float | None = None, decode: float | None = None) -> Self:
        new = self
        if prefill is not None:
            new = new.gauges("prefill", running=prefill, waiting=0.0)
        if decode is not None:
            new = new.gauges("decode", running=decode, waiting=0.0)
        return new

    def gauges(self, role: Role, **values: float | None) -> Self:
        new = self._copy()
        new._values[role].update(values)
        return new

    def missing(self, role: Role, count: int, gauge: str | None = None) -> Self:
        """Drop ``count`` instances of ``role`` (or only their ``gauge``, set to NaN)."""
        new = self._copy()
        new._missing[role] = (count, gauge)
        return new

    def expected(self, prefill: int, decode: int) -> Self:
        new = self._copy()
        new._expected = {"prefill": prefill, "decode": decode}
        return new

    def _instances(self) -> Iterator[InstanceSample]:
        roles: tuple[Role, ...] = ("prefill", "decode")
        for role in roles:
            count, gauge = self._missing.get(role, (0, None))
            n = self._pairs * self._per[role]
            for i in range(n):
                values = dict(self._values[role])
                if i < count:
                    if gauge is None:
                        continue
                    values[gauge] = math.nan
                yield InstanceSample(pair=f"p{i // self._per[role]}", role=role, **values)

    def obj(self) -> MetricsSnapshot:
        expected = self._expected or {r: self._pairs * n for r, n in self._per.items()}
        return MetricsSnapshot(
            instances=tuple(self._instances()),
            pool=PoolSample(**self._pool),
            expected_prefill=expected["prefill"],
            expected_decode=expected["decode"],
        )


def make_snapshot(pairs: int, prefill: int = 1, decode: int = 1) -> SnapshotFactory:
    return SnapshotFactory(pairs, prefill, decode)


def no_data(pairs: int) -> MetricsSnapshot:
    """Every gauge and latency NaN (the 0/0 of an idle or unscraped pool)."""
    return (
        make_snapshot(pairs)
        .latency(ttft=math.nan, tpot=math.nan)
        .gauges("prefill", running=math.nan, waiting=math.nan)
        .gauges("decode", running=math.nan, waiting=math.nan, kv_cache_utilization=math.nan)
        .obj()
    )


# --- a closed loop with an injected clock ---------------------------------------------------------


@dataclass(frozen=True)
class Plant:
    """A pool whose metrics follow its demand per serving pair x = demand / ready (monotone in x).

    KV = kv_per_x·x; TPOT = tpot_base + tpot_slope·x^steep; TTFT = service / (1 − min(0.97, rho_per_x·x)).
    The defaults put the SLO edge (TTFT 1 s, TPOT 16 ms) at x = 1 with KV 0.35: a TPOT-bound decode like
    the reference fleet's, whose KV target of 80 % is far too loose.
    """

    kv_per_x: float = 0.35
    tpot_base: float = 0.010
    tpot_slope: float = 0.006
    steep: float = 3.0
    service: float = 0.3
    rho_per_x: float = 0.7

    def snapshot(self, demand: float, ready: int) -> MetricsSnapshot:
        if ready <= 0:
            return no_data(0)
        x = demand / ready
        return (
            make_snapshot(ready)
            .latency(
                ttft=self.service / (1 - min(0.97, self.rho_per_x * x)),
                tpot=self.tpot_base + self.tpot_slope * x**self.steep,
            )
            .kv(min(1.0, self.kv_per_x * x))
            .in_flight(prefill=max(0.0, 2 * x), decode=30 * x)
            .obj()
        )


@dataclass(frozen=True)
class Evaluated:
    at: float
    from_pairs: int
    recommendation: int | None
    reason: str


@dataclass
class Loop:
    """Runs the policy every ``interval`` seconds against a plant; readiness lags by ``load_s``."""

    policy: AutoscalePolicy
    plant: Plant
    current: int
    interval: float = 30.0
    load_s: float = 0.0
    state: AutoscaleState = field(default_factory=AutoscaleState)
    now: float = 0.0
    log: list[tuple[float, int, int, str]] = field(default_factory=list)
    """(time, from, to, reason) of every change."""
    decisions: list[Evaluated] = field(default_factory=list)
    _ready_at: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ready_at = [-math.inf] * self.current

    @property
    def ready(self) -> int:
        return sum(1 for t in self._ready_at[: self.current] if t <= self.now)

    def step(self, demand: float, **context: Any) -> AutoscaleDecision:
        ready = self.ready
        ctx = ScaleContext(current_pairs=self.current, ready_pairs=ready, **context)
        decision, self.state = compute_desired_pairs(
            self.policy, ctx, self.plant.snapshot(demand, ready), self.state, self.now
        )
        self.decisions.append(Evaluated(self.now, decision.from_pairs, decision.recommendation, decision.reason))
        if decision.changed:
            self.log.append((self.now, decision.from_pairs, decision.desired_pairs, decision.reason))
            if decision.desired_pairs > self.current:
                self._ready_at += [self.now + self.load_s] * (decision.desired_pairs - self.current)
            else:
                # Scale-down removes the newest (least warm) pairs first.
                self._ready_at = sorted(self._ready_at)[: decision.desired_pairs]
            self.current = decision.desired_pairs
        self.now += self.interval
        return decision

    def run(self, demand: Callable[[float], float], until: float) -> Self:
        while self.now <= until:
            self.step(demand(self.now))
        return self


def reversals(log: list[tuple[float, int, int, str]]) -> list[tuple[float, str]]:
    """(time, new direction) of each change whose direction flipped ("up" after down, "down" after up)."""
    out: list[tuple[float, str]] = []
    last = ""
    for t, before, after, _ in log:
        direction = "up" if after > before else "down"
        if last and direction != last:
            out.append((t, direction))
        last = direction
    return out
