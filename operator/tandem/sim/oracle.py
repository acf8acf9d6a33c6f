"""Lower bounds on GPU-hours (benchmarks.md §4): O0 instant oracle, O1 startup-aware, ratio tax, static peak.

What it owns: per Δ-window demand of a workload under the same physics as the engine, and the bounds
derived from it. It never runs the engine: the bounds depend only on the workload, the capacity model
and the SLOs, so every policy is compared with the same numbers.

Per window t (Δ = ``oracle.window_s``):

- Prefill work W_p(t) = instance-seconds of prefill in window t (each request occupies one instance for
  prefill_time(u, c₀) from its arrival, split over the windows it spans), with
  u = uncached tokens under the best router's hit model (one infinite cache fed in arrival order,
  the §2.1 bound). ρ_max(t) = 2(T − S)/(2T − S) (M/D/1 mean sojourn ≤ T) with S = the window's mean
  service time and T = its mean TTFT budget minus the P→D transfer and one decode step, over the
  *feasible* requests (S ≤ T on an idle instance); infeasible ones need their service time at ρ = 1
  (they miss the SLO whatever the fleet). N_p*(t) = ⌈(W_feasible/ρ_max + W_infeasible) / Δ⌉.
- Both roles' needs are smoothed by a centred moving average of ``oracle.smooth_s`` (*start* 60 s)
  before rounding up: at CI scales a 10 s window holds a few dozen requests and its Poisson noise
  would otherwise dominate the peak (and B0, which is sized from it) and O1's load charges. No policy
  can react within a minute (scrape 15 s + lag 30 s), so the smoothing removes nothing it could use.
- Decode: each request produces its output over [arrival + S + P→D, … + n_out · TPOT_SLO]; R_d(t) =
  output tokens in t / Δ, K(t) = mean resident KV tokens, c̄(t) = mean context of active sequences.
  C_d(t) = instance tokens/s at the largest batch meeting TPOT at c̄ (within ``max_num_seqs`` and
  KV); N_d*(t) = ⌈max(R_d/C_d, K/KV_cap)⌉.
- O0 = g·Δ/3600·Σ_t (N_p* + N_d*).
- O1: for each role and level j, the windows where N*(t) ≥ j form intervals; intervals separated by
  gaps shorter than S_load are merged (keeping an instance beats reloading it); each merged interval
  [a, b) costs (b − a) + min(S_load, a): an instance needed from t = 0 is part of the warm fleet the
  run starts with, one needed at a < S_load must have started loading at 0.
- Ratio-rigidity tax of a unit of p prefill + d decode instances: U(t) = max(⌈N_p*/p⌉, ⌈N_d*/d⌉),
  tax = GPUh_unit/GPUh_O0 − 1 (worked example: N_p* = 40, N_d* = 60, 1:1 → 60 units = 120 instances
  vs 100: +20 %). Reported for 1:1 and for the best p:d with p, d ≤ 16.
- Static peak: (max_t N_p* + max_t N_d*) for the whole horizon; autoscaling saves at most 1 − mean/peak.
- Work floor: busy time alone — Σ prefill service + decode tokens at the *largest* batch KV and
  ``max_num_seqs`` allow, no SLO, no rounding. Every policy that serves the requests uses at least
  this many GPU-hours; O0/O1 are floors only for policies that also meet the SLOs. Per request
  (``service_s``, ``decode_floor_s``) it gives the strict floor of the requests a policy actually
  completed (``floor_served`` in the run metrics): prefill service can only grow with fewer hits, and
  a token costs at least W_touched(B_max)/B_max + its own KV read.

Must not: depend on a policy, a router or randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tandem.sim.config import SimParams
from tandem.sim.physics import Roofline, mdl_rho_max, ttft_budgets
from tandem.sim.workload import Workload, infinite_cache_hits

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Demand:
    """Per-window demand and oracle instance counts."""

    window_s: float
    t: F64
    prefill_work_s: F64
    rho_max: F64
    output_rate: F64
    kv_tokens: F64
    mean_context: F64
    decode_capacity: F64
    n_prefill: I64
    n_decode: I64
    floor_decode_s: F64
    """Instance-seconds of decode at the largest batch (no SLO), per window."""
    feasible_share: float = 1.0
    """Share of requests whose TTFT budget is met on an idle instance under the oracle's hit model."""
    feasible: npt.NDArray[np.bool_] | None = None
    """Per request: the TTFT budget is met on an idle instance (same hit model)."""
    unloaded_ttft_p95: float = 0.0
    """p95 of prefill + P→D + one decode step on idle instances under the oracle's hit model."""
    service_s: F64 | None = None
    """Per request: prefill seconds under the best hit model (no request can need less)."""
    decode_floor_s: F64 | None = None
    """Per request: decode instance-seconds at the full batch (``max_num_seqs``), its own KV reads included:
    out·(W_touched(B)/B + c·b_kv)/BW. No batch of at most ``max_num_seqs`` serves its tokens in less."""


@dataclass(frozen=True)
class Bounds:
    """GPU-hour bounds of one workload (see module docstring)."""

    demand: Demand
    gpus: int
    horizon_s: float
    load_s: float
    o0_gpuh: float
    o0_prefill_gpuh: float
    o0_decode_gpuh: float
    o1_gpuh: float
    o1_prefill_gpuh: float
    o1_decode_gpuh: float
    static_gpuh: float
    peak: tuple[int, int]
    mean_over_peak: float
    floor_gpuh: float
    tax_1to1: float
    best_unit: tuple[int, int]
    tax_best: float
    profile_ratio: float
    mean_context: float
    bound_hit_ratio: float
    """Token-weighted hit ratio of the infinite-cache model."""

    def as_dict(self) -> dict[str, float | list[int] | int]:
        return {
            "o0_gpuh": self.o0_gpuh,
            "o0_prefill_gpuh": self.o0_prefill_gpuh,
            "o0_decode_gpuh": self.o0_decode_gpuh,
            "o1_gpuh": self.o1_gpuh,
            "o1_prefill_gpuh": self.o1_prefill_gpuh,
            "o1_decode_gpuh": self.o1_decode_gpuh,
            "static_peak_gpuh": self.static_gpuh,
            "peak_prefill": self.peak[0],
            "peak_decode": self.peak[1],
            "mean_over_peak": self.mean_over_peak,
            "max_autoscaling_saving": 1.0 - self.mean_over_peak,
            "work_floor_gpuh": self.floor_gpuh,
            "ratio_tax_1to1": self.tax_1to1,
            "best_unit": list(self.best_unit),
            "ratio_tax_best_unit": self.tax_best,
            "profile_ratio_p_over_d": self.profile_ratio,
            "mean_decode_context": self.mean_context,
            "infinite_cache_hit_ratio": self.bound_hit_ratio,
            "slo_feasible_share": self.demand.feasible_share,
            "unloaded_ttft_p95_s": self.demand.unloaded_ttft_p95,
            "load_s": self.load_s,
        }


def _spread(start: F64, end: F64, weight_per_s: F64, n_windows: int, window: float) -> F64:
    """Σ over items of ``weight_per_s`` × (overlap of [start, end) with each window)."""
    out = np.zeros(n_windows, dtype=np.float64)
    w0 = np.clip(np.floor(start / window).astype(np.int64), 0, n_windows - 1)
    w1 = np.clip(np.floor(np.maximum(end - 1e-12, start) / window).astype(np.int64), 0, n_windows - 1)
    span = int((w1 - w0).max()) + 1 if len(start) else 0
    for k in range(span):
        idx = w0 + k
        live = idx <= w1
        if not live.any():
            break
        lo = np.maximum(start[live], idx[live] * window)
        hi = np.minimum(end[live], (idx[live] + 1) * window)
        np.add.at(out, idx[live], np.maximum(0.0, hi - lo) * weight_per_s[live])
    return out


def compute_demand(workload: Workload, params: SimParams, cap: Roofline, horizon_s: float) -> tuple[Demand, float]:
    """Per-window demand (module docstring) and the token-weighted infinite-cache hit ratio."""
    window = params.oracle.window_s
    n_windows = max(1, math.ceil(horizon_s / window))
    slo = params.slo
    _, hit = infinite_cache_hits(workload, params.generator.block_tokens)
    inp = workload.input_tokens.astype(np.float64)
    out = workload.output_tokens.astype(np.float64)
    uncached = np.maximum(1.0, inp - hit)
    cached = inp - uncached
    service = cap.prefill_times(uncached, cached)
    pd = inp * params.model.kv_bytes_per_token / params.network.intra_node_bandwidth
    budget = ttft_budgets(
        workload.input_tokens, slo.ttft_short_s, slo.ttft_long_s, slo.l_short_tokens, slo.l_long_tokens
    )
    t_eff = budget - pd - slo.tpot_s
    feasible = service <= t_eff
    arrival = workload.arrival_s
    w = np.clip(np.floor(arrival / window).astype(np.int64), 0, n_windows - 1)
    count = np.bincount(w, weights=feasible.astype(np.float64), minlength=n_windows)
    mean_s = np.divide(
        np.bincount(w, weights=np.where(feasible, service, 0.0), minlength=n_windows),
        count,
        out=np.zeros(n_windows),
        where=count > 0,
    )
    mean_t = np.divide(
        np.bincount(w, weights=np.where(feasible, t_eff, 0.0), minlength=n_windows),
        count,
        out=np.ones(n_windows),
        where=count > 0,
    )
    # A prefill is indivisible: it occupies one instance from arrival for its service time, so work is
    # spread over the windows it spans (a 10-minute prefill needs one instance for 10 minutes).
    end = arrival + service
    ones = np.ones_like(service)
    work_ok = _spread(arrival, end, np.where(feasible, ones, 0.0), n_windows, window)
    work_late = _spread(arrival, end, np.where(feasible, 0.0, ones), n_windows, window)
    work = work_ok + work_late
    rho = np.array(
        [
            mdl_rho_max(float(t), float(s), params.oracle.rho_floor) if c > 0 else 1.0
            for t, s, c in zip(mean_t, mean_s, count, strict=True)
        ]
    )
    # Requests that miss their budget even on an idle instance need capacity, not headroom (ρ = 1).
    need_p = _smooth((work_ok / rho + work_late) / window, params.oracle.smooth_s / window)
    n_p = np.ceil(need_p - 1e-9).astype(np.int64)

    d_start = arrival + service + pd
    d_end = d_start + out * slo.tpot_s
    ctx = inp + out / 2.0
    dur = np.maximum(d_end - d_start, 1e-9)
    tokens = _spread(d_start, d_end, out / dur, n_windows, window)
    seq_s = _spread(d_start, d_end, np.ones_like(out), n_windows, window)
    kv_s = _spread(d_start, d_end, inp + out, n_windows, window)
    ctx_s = _spread(d_start, d_end, ctx, n_windows, window)
    rate = tokens / window
    kv = kv_s / window
    cbar = np.divide(ctx_s, seq_s, out=np.zeros(n_windows), where=seq_s > 0)
    max_seqs = params.instance.max_num_seqs
    cd = np.zeros(n_windows)
    cd_max = np.zeros(n_windows)
    memo: dict[int, tuple[float, float]] = {}
    for i in range(n_windows):
        if seq_s[i] <= 0:
            continue
        key = int(cbar[i] // 256)
        if key not in memo:
            c = (key + 0.5) * 256
            b = cap.best_decode_batch(c, slo.tpot_s, max_seqs)
            b_max = max(1, min(max_seqs, cap.max_batch_for_context(c)))
            memo[key] = (cap.decode_throughput(b, c), cap.decode_throughput(b_max, c))
        cd[i], cd_max[i] = memo[key]
    need = np.maximum(np.divide(rate, cd, out=np.zeros(n_windows), where=cd > 0), kv / cap.kv_capacity_tokens)
    n_d = np.ceil(_smooth(need, params.oracle.smooth_s / window) - 1e-9).astype(np.int64)
    floor_decode = np.divide(tokens, cd_max, out=np.zeros(n_windows), where=cd_max > 0)
    demand = Demand(
        window_s=window,
        t=np.arange(n_windows, dtype=np.float64) * window,
        prefill_work_s=work,
        rho_max=rho,
        output_rate=rate,
        kv_tokens=kv,
        mean_context=cbar,
        decode_capacity=cd,
        n_prefill=n_p,
        n_decode=n_d,
        floor_decode_s=floor_decode,
        feasible_share=float(feasible.mean()) if len(feasible) else 1.0,
        feasible=feasible,
        service_s=service,
        decode_floor_s=out
        * (cap.weight_bytes_touched(max_seqs) / max_seqs + ctx * cap.kv_bytes_per_token)
        / cap.bandwidth
        / cap.tokens_per_step,
        unloaded_ttft_p95=float(np.percentile(service + pd + slo.tpot_s, 95)) if len(service) else 0.0,
    )
    hit_ratio = float(hit.sum() / inp.sum()) if len(inp) else 0.0
    return demand, hit_ratio


def _smooth(x: F64, width: float) -> F64:
    """Centred moving average over ``width`` windows (≤ 1: unchanged)."""
    k = round(width)
    if k <= 1 or len(x) < 2:
        return x
    kernel = np.ones(k) / k
    out: F64 = np.convolve(x, kernel, mode="same")
    return out


def startup_aware_seconds(levels: I64, window: float, load_s: float) -> float:
    """O1 instance-seconds of one role (module docstring)."""
    total = 0.0
    peak = int(levels.max()) if len(levels) else 0
    gap_windows = load_s / window
    for j in range(1, peak + 1):
        on = levels >= j
        if not on.any():
            break
        padded = np.concatenate(([False], on, [False]))
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        starts, ends = edges[0::2], edges[1::2]
        # merge intervals separated by gaps shorter than the load time
        keep = np.ones(len(starts), dtype=bool)
        if len(starts) > 1:
            gaps = starts[1:] - ends[:-1]
            merge = gaps < gap_windows
            keep[1:] = ~merge
        group = np.cumsum(keep) - 1
        m_start = starts[keep]
        m_end = np.zeros(len(m_start), dtype=np.int64)
        np.maximum.at(m_end, group, ends)
        a = m_start * window
        total += float(((m_end - m_start) * window).sum() + np.minimum(load_s, a).sum())
    return total


def expected_load_s(params: SimParams) -> float:
    mix = params.lifecycle.load_mix
    weight = sum(mix.values())
    mean = sum(mix[k] * params.lifecycle.load_times_s[k] for k in mix) / weight if weight else 0.0
    return params.lifecycle.schedule_delay_s + mean


def compute_bounds(workload: Workload, params: SimParams, cap: Roofline, horizon_s: float | None = None) -> Bounds:
    horizon = horizon_s or workload.duration_s
    demand, hit_ratio = compute_demand(workload, params, cap, horizon)
    g = cap.gpus
    win = demand.window_s
    n_p, n_d = demand.n_prefill, demand.n_decode
    to_gpuh = g * win / 3600.0
    o0_p = float(n_p.sum()) * to_gpuh
    o0_d = float(n_d.sum()) * to_gpuh
    load_s = expected_load_s(params)
    o1_p = startup_aware_seconds(n_p, win, load_s) * g / 3600.0
    o1_d = startup_aware_seconds(n_d, win, load_s) * g / 3600.0
    peak = (int(n_p.max()) if len(n_p) else 0, int(n_d.max()) if len(n_d) else 0)
    static = (peak[0] + peak[1]) * g * horizon / 3600.0
    total = n_p + n_d
    mean_over_peak = float(total.mean() / total.max()) if len(total) and total.max() > 0 else 1.0
    floor = (float(demand.prefill_work_s.sum()) + float(demand.floor_decode_s.sum())) * g / 3600.0
    o0 = o0_p + o0_d

    def unit_gpuh(p: int, d: int) -> float:
        units = np.maximum(np.ceil(n_p / p), np.ceil(n_d / d))
        return float((units * (p + d)).sum()) * to_gpuh

    tax_1 = unit_gpuh(1, 1) / o0 - 1.0 if o0 > 0 else 0.0
    best = (1, 1)
    best_gpuh = math.inf
    for p in range(1, 17):
        for d in range(1, 17):
            if math.gcd(p, d) != 1:
                continue
            v = unit_gpuh(p, d)
            if v < best_gpuh - 1e-9:
                best, best_gpuh = (p, d), v
    ratio = float(n_p.sum() / n_d.sum()) if n_d.sum() > 0 else 1.0
    seq_weight = demand.output_rate
    mean_ctx = float(np.average(demand.mean_context, weights=seq_weight)) if seq_weight.sum() > 0 else 0.0
    return Bounds(
        demand=demand,
        gpus=g,
        horizon_s=horizon,
        load_s=load_s,
        o0_gpuh=o0,
        o0_prefill_gpuh=o0_p,
        o0_decode_gpuh=o0_d,
        o1_gpuh=o1_p + o1_d,
        o1_prefill_gpuh=o1_p,
        o1_decode_gpuh=o1_d,
        static_gpuh=static,
        peak=peak,
        mean_over_peak=mean_over_peak,
        floor_gpuh=floor,
        tax_1to1=tax_1,
        best_unit=best,
        tax_best=best_gpuh / o0 - 1.0 if o0 > 0 else 0.0,
        profile_ratio=ratio,
        mean_context=mean_ctx,
        bound_hit_ratio=hit_ratio,
    )
