"""Baseline scaling policies B0–B4 (benchmarks.md §5), with the real defaults of the systems they imitate.

What it owns: re-implementations of *other* systems' autoscalers, so Tandem's can be compared with
them. (Tandem's own policy is imported from ``tandem.core``; see :mod:`tandem_lab.sim.policies.tandem`.)
All run the ``pools`` topology (independent prefill and decode pools) and see only observations.

- **B0 static peak**: N_role = ⌈1.1 × max_t N*_role(t)⌉ for the whole run (the P:D split comes from
  the offline profile, i.e. the oracle's per-role peaks).
- **B1 HPA-utilization** (Kubernetes ``pkg/apis/autoscaling/v2/defaults.go``): per role,
  desired = ⌈current × metric/target⌉ unless |metric/target − 1| ≤ 0.1; decode metric
  ``vllm:kv_cache_usage_perc`` (target 0.8), prefill busy fraction (0.8); sync 15 s; scale up at most
  max(+4 pods, +100 %) per 15 s with no stabilisation; scale down to the highest recommendation of
  the last 300 s, then up to 100 % per 15 s. Like the HPA, pods not yet ready count as 0 % when
  scaling up and as 100 % of target when scaling down.
- **B2 KEDA-queue**: Prometheus trigger ``num_requests_waiting + num_requests_running`` per replica,
  AverageValue 5 → desired = ⌈Σ metric / 5⌉; KEDA only feeds the HPA it creates (pollingInterval 30 s
  matters for 0↔1 activation only; min ≥ 1 here), so the HPA behaviour of B1 applies.
- **B3 planner-like** (Dynamo SLA planner): every 180 s, constant predictor on the last window's
  request rate λ̂, ISL, OSL; prefill = ⌈λ̂·ISL·min(1, corr_p) / thpt_per_GPU(ISL) / GPUs⌉ with the
  profile's prefill throughput without prefix caching and corr_p = observed TTFT / profile TTFT(ISL);
  decode = ⌈λ̂·OSL / thpt_per_GPU / GPUs⌉ at the best throughput/GPU whose ITL meets
  target/corr_d at context ISL + OSL/2, corr_d = profile ITL / observed ITL. The "profile" is the
  simulator's own capacity model (a perfect offline profile).
- **B4 ratio-locked** (HeteroScale-like): one signal, decode tokens/s; proportional control on whole
  units of the offline profile's P:D (tolerance 10 %, 300 s down-stabilisation); target per decode
  instance = 0.8 × its tokens/s at the TPOT SLO and the profile's mean context.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tandem_lab.sim.config import HpaParams
from tandem_lab.sim.metrics import DECODE, PREFILL, Observation, RoleState
from tandem_lab.sim.policies.base import FleetTarget, PolicyContext, Topology, unit_shape


class StaticPeak:
    """B0: a fixed fleet sized at 1.1 × the oracle's per-role peak."""

    name = "B0-static"
    topology: Topology = "pools"

    def __init__(self, ctx: PolicyContext) -> None:
        h = ctx.params.policies.static_headroom
        self.target = FleetTarget(
            prefill=max(ctx.min_prefill, math.ceil(h * ctx.oracle_peak[0])),
            decode=max(ctx.min_decode, math.ceil(h * ctx.oracle_peak[1])),
        )
        self.interval_s = 3600.0

    def initial_target(self) -> FleetTarget:
        return self.target

    def decide(self, obs: Observation) -> FleetTarget | None:
        return None


@dataclass
class HpaRole:
    """The HPA algorithm for one scale target (one role)."""

    params: HpaParams
    min_replicas: int
    max_replicas: int
    history: deque[tuple[float, int]] = field(default_factory=deque)

    def recommend(self, now: float, state: RoleState, ratio: float | None, average_value: bool) -> int:
        """Desired replicas for a metric/target ``ratio`` (None: no data → keep current).

        ``average_value``: the ratio is total/target already expressed in replicas (AverageValue of an
        external metric: desired = ⌈total/target⌉), else a per-pod utilisation ratio.
        """
        current = max(state.current, 1)
        ready = state.ready
        tol = self.params.tolerance
        if ratio is None:
            rec = current
        elif average_value:
            usage = ratio / current  # ratio = total/target in replicas
            rec = current if abs(usage - 1.0) <= tol else math.ceil(ratio - 1e-9)
        elif abs(ratio - 1.0) <= tol:
            rec = current
        elif ratio > 1.0 and ready < current:
            # unready pods count as 0 % when scaling up
            adj = ratio * ready / current
            rec = current if adj <= 1.0 + tol else math.ceil(adj * current - 1e-9)
        elif ratio < 1.0 and ready < current:
            # unready pods count as 100 % of target when scaling down
            adj = (ratio * ready + (current - ready)) / current
            rec = current if adj >= 1.0 - tol else math.ceil(adj * current - 1e-9)
        else:
            rec = math.ceil(ratio * current - 1e-9)
        rec = min(self.max_replicas, max(self.min_replicas, rec))
        # Stabilisation: scale down only to the highest recommendation of the window.
        self.history.append((now, rec))
        window = self.params.scale_down_stabilization_s
        while self.history and self.history[0][0] < now - window:
            self.history.popleft()
        stabilized = max(r for _, r in self.history) if rec < current else rec
        # Rate limits per period (the sync period equals the policy period here).
        if stabilized > current:
            limit = max(
                current + self.params.scale_up_pods, math.floor(current * (1 + self.params.scale_up_percent / 100))
            )
            stabilized = min(stabilized, limit)
        elif stabilized < current:
            limit = math.ceil(current * (1 - self.params.scale_down_percent / 100))
            stabilized = max(stabilized, limit)
        return max(self.min_replicas, min(self.max_replicas, stabilized))


class HpaUtilization:
    """B1: per-role HPA on KV-cache usage (decode) and busy fraction (prefill)."""

    name = "B1-hpa"
    topology: Topology = "pools"

    def __init__(self, ctx: PolicyContext) -> None:
        pp = ctx.params.policies
        self.ctx = ctx
        self.interval_s = pp.hpa.sync_period_s
        self.kv_target = pp.hpa_decode_kv_target
        self.busy_target = pp.hpa_prefill_busy_target
        self.roles = (
            HpaRole(pp.hpa, ctx.min_prefill, ctx.max_instances),
            HpaRole(pp.hpa, ctx.min_decode, ctx.max_instances),
        )

    def initial_target(self) -> FleetTarget:
        return FleetTarget(prefill=self.ctx.initial[0], decode=self.ctx.initial[1])

    def decide(self, obs: Observation) -> FleetTarget | None:
        busy = None if obs.prefill_busy is None else obs.prefill_busy / self.busy_target
        kv = None if obs.kv_usage is None else obs.kv_usage / self.kv_target
        p = self.roles[PREFILL].recommend(obs.now, obs.prefill, busy, average_value=False)
        d = self.roles[DECODE].recommend(obs.now, obs.decode, kv, average_value=False)
        return FleetTarget(prefill=p, decode=d)


class KedaQueue:
    """B2: KEDA Prometheus trigger on waiting (+ running) per replica, AverageValue 5, through the HPA."""

    name = "B2-keda"
    topology: Topology = "pools"

    def __init__(self, ctx: PolicyContext) -> None:
        pp = ctx.params.policies
        self.ctx = ctx
        self.interval_s = pp.hpa.sync_period_s
        self.target = pp.keda_target
        self.include_running = pp.keda_include_running
        self.roles = (
            HpaRole(pp.hpa, ctx.min_prefill, ctx.max_instances),
            HpaRole(pp.hpa, ctx.min_decode, ctx.max_instances),
        )

    def initial_target(self) -> FleetTarget:
        return FleetTarget(prefill=self.ctx.initial[0], decode=self.ctx.initial[1])

    def decide(self, obs: Observation) -> FleetTarget | None:
        out = []
        for role in (PREFILL, DECODE):
            total: float | None = None
            if obs.waiting is not None and obs.running is not None:
                total = obs.waiting[role] + (obs.running[role] if self.include_running else 0.0)
            ratio = None if total is None else total / self.target
            out.append(self.roles[role].recommend(obs.now, obs.role(role), ratio, average_value=True))
        return FleetTarget(prefill=out[0], decode=out[1])


class PlannerLike:
    """B3: Dynamo SLA-planner-like throughput planner with correction factors."""

    name = "B3-planner"
    topology: Topology = "pools"

    def __init__(self, ctx: PolicyContext) -> None:
        pp = ctx.params.policies
        self.ctx = ctx
        self.interval_s = pp.planner_interval_s
        self.cap = ctx.capacity
        self.gpus = ctx.capacity.gpus
        self.ttft_target = ctx.params.slo.ttft_short_s
        self.itl_target = ctx.params.slo.tpot_s
        self.max_seqs = ctx.params.instance.max_num_seqs
        self.use_p = pp.planner_prefill_correction
        self.use_d = pp.planner_decode_correction

    def initial_target(self) -> FleetTarget:
        return FleetTarget(prefill=self.ctx.initial[0], decode=self.ctx.initial[1])

    def decide(self, obs: Observation) -> FleetTarget | None:
        lam, isl, osl = obs.request_rate, obs.isl_mean, obs.osl_mean
        if lam is None or isl is None or osl is None or lam <= 0:
            return None
        # prefill: profile throughput per GPU at ISL without prefix caching
        ttft_profile = self.cap.prefill_time(isl, 0.0)
        thpt_p = isl / ttft_profile / self.gpus
        corr_p = 1.0
        if self.use_p and obs.ttft_mean is not None and ttft_profile > 0:
            corr_p = obs.ttft_mean / ttft_profile
        prefill = math.ceil(lam * isl * min(1.0, corr_p) / thpt_p / self.gpus - 1e-9)
        # decode: best throughput/GPU whose ITL meets the corrected target at context ISL + OSL/2
        context = isl + osl / 2.0
        corr_d = 1.0
        ready_d = max(1, obs.decode.ready)
        if self.use_d and obs.tpot_mean is not None and obs.running is not None and obs.tpot_mean > 0:
            batch = max(1, round(obs.running[DECODE] / ready_d))
            expected = self.cap.decode_step_time(batch, batch * context) / self.cap.tokens_per_step
            corr_d = expected / obs.tpot_mean
        itl = self.itl_target / corr_d if corr_d > 0 else self.itl_target
        b = self.cap.best_decode_batch(context, itl, self.max_seqs)
        thpt_d = self.cap.decode_throughput(b, context) / self.gpus
        decode = math.ceil(lam * osl / thpt_d / self.gpus - 1e-9)
        return FleetTarget(prefill=max(1, prefill), decode=max(1, decode))


class RatioLocked:
    """B4: decode tokens/s → whole units of a fixed P:D (proportional control)."""

    name = "B4-ratio"
    topology: Topology = "pools"

    def __init__(self, ctx: PolicyContext) -> None:
        pp = ctx.params.policies
        self.ctx = ctx
        self.interval_s = pp.ratio_interval_s
        self.tolerance = pp.ratio_tolerance
        self.unit = unit_shape(ctx.profile_ratio)
        cap = ctx.capacity
        b = cap.best_decode_batch(ctx.mean_context, ctx.params.slo.tpot_s, ctx.params.instance.max_num_seqs)
        self.per_decode = pp.ratio_target_utilization * cap.decode_throughput(b, ctx.mean_context)
        self.window = pp.ratio_down_stabilization_s
        self.history: deque[tuple[float, int]] = deque()
        p0, d0 = ctx.initial
        self.units = max(1, math.ceil(max(p0 / self.unit[0], d0 / self.unit[1])))

    def initial_target(self) -> FleetTarget:
        return FleetTarget(prefill=self.units * self.unit[0], decode=self.units * self.unit[1])

    def decide(self, obs: Observation) -> FleetTarget | None:
        tps = obs.generation_token_rate
        if tps is None:
            return None
        want = max(1, math.ceil(tps / (self.per_decode * self.unit[1]) - 1e-9))
        current = self.units
        if abs(tps / (self.per_decode * self.unit[1] * current) - 1.0) <= self.tolerance:
            want = current
        self.history.append((obs.now, want))
        while self.history and self.history[0][0] < obs.now - self.window:
            self.history.popleft()
        if want < current:
            want = max(r for _, r in self.history)
        self.units = want
        return FleetTarget(prefill=want * self.unit[0], decode=want * self.unit[1])
