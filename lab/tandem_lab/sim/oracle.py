"""GPU-hour bounds (benchmarks.md §4): the oracle (provable lower bounds) and the planning model.

What it owns: everything computed from a workload and the physics without running the engine. Two
families of numbers, kept apart on purpose:

**The oracle — O0 and O1, provable lower bounds** (:func:`request_floors`, :func:`served_bounds`). The
issue's must-show is "the oracle is never above any policy's GPU-hours", so O0/O1 are built only from
facts no schedule can beat, on **the work a policy delivered**: its set G of SLO-feasible requests
served within both SLOs (TTFT within the §6 budget, TPOT ≤ 16.7 ms). Per request r of G (arrival a_r):

- prefill service S_r under the best hit model (one infinite cache fed with every arrival: no policy's
  local + shared hits are larger, and a prefill never gets cheaper with fewer hits), on one instance at
  rate ≤ 1, inside D_r = [a_r, a_r + budget_r − pd_r − step1_r] (pd_r = P→D over the fastest link,
  step1_r = one decode step at batch 1 holding only r: a request that met its TTFT finished its prefill
  by then);
- decode work = n_out/m × (W_touched(B)/B + c_r·b_kv)/BW (+ t_comm/B) with B = ``max_num_seqs`` (the
  smallest share of an instance a sequence can take per step), inside [a_r + S_r + pd_r,
  a_r + budget_r + (n_out − 1)·TPOT_SLO].
- SLO-feasible = S_r + pd_r + step1_r ≤ budget_r: a request outside it misses its TTFT on any fleet, so
  it is excluded from G and from the attainment the gates read ("attainment on feasible requests"),
  for the oracle and every policy alike.

Energy: a job of work w inside window [s, e] puts at least max(0, w − (e − s) + |[s, e] ∩ b|) of
instance-time into any interval b (the rest of its window cannot hold more). Then, per role:

- **O0** = the energy of [0, H] (H = horizon; later work is not charged to any policy): instance-time
  is at least the work that had to happen inside the run.
- **O1** = O0 raised by integer instances and start-up: for blocks b of Δ_b (10 s … 10 min), ∫_b n ≥ E_b,
  so at some instant of b at least k_b = ⌈E_b/Δ_b⌉ instances were serving. For each level j, between two
  such instants t₁ < t₂ the j-th instance was charged for at least min(t₂ − t₁, L_min) (either it stayed,
  or one that was not charged when the count last fell below j had to load, ≥ L_min; L_min = the fastest
  load kind with a positive weight, 88 s); before the first instant, min(t₁, L_min) (the warm fleet
  exists at t = 0). Instants are only known to lie in their blocks, so each gap is bounded from below
  (a run of blocks closer than L_min counts its span minus one block). O1 = max over Δ_b and ≥ O0.
  Worked example: a single level-1 block [600 s, 610 s) after nothing → min(88, 600) = 88 s charged.

Both are lower bounds for *that* policy's run by construction (tests assert O0 ≤ O1 ≤ GPUh for every
policy, seed and scenario); O1_full (G = every feasible request) bounds any policy that serves them all.
They leave out what is not provable: queueing headroom, the TPOT-limited decode batch, KV residency
(all model-dependent) — which is what the planning model adds.

**The planning model** (:func:`compute_demand`, :func:`compute_bounds`): the §4 construction, used to
*size* things before a run (B0's static peak, the shared max bounds, the warm start, the offline P:D)
and reported as "model O1" for information. Per Δ-window t:

- Prefill work W_p(t) = instance-seconds of prefill in window t (each request occupies one instance for
  its service from its arrival, split over the windows it spans): f × prefill_time(u, c₀) with u =
  uncached tokens under the infinite cache and f the **profile's** measured prefill work per ideal
  second (:mod:`tandem_lab.sim.profile`, ≈ 2–3 on agentic traffic; 1 when no profile is given).
  ρ_max(t) = 2(T − S)/(2T − S)
  (M/D/1 mean sojourn ≤ T) with S = the window's mean service time and T = its mean TTFT budget minus
  P→D and one decode step, over the feasible requests; infeasible ones need their service at ρ = 1.
  N_p*(t) = ⌈(W_feasible/ρ_max + W_infeasible) / Δ⌉.
- Both roles' needs are smoothed by a centred moving average of ``oracle.smooth_s`` (*start* 60 s) before
  rounding up (at CI scales a 10 s window holds a few dozen requests and its Poisson noise would set
  the peak).
- Decode: each request produces its output over [arrival + S + P→D, … + n_out · TPOT_SLO]; R_d(t) =
  output tokens in t / Δ, K(t) = mean resident KV tokens, c̄(t) = mean context of active sequences.
  C_d(t) = instance tokens/s at the largest batch meeting TPOT at c̄ (within ``max_num_seqs`` and
  KV); N_d*(t) = ⌈max(R_d/C_d, K/KV_cap)⌉.
- model O0 = g·Δ/3600·Σ_t (N_p* + N_d*); model O1: per level j, intervals with N*(t) ≥ j merged over gaps
  shorter than the expected load, each charged (b − a) + min(S_load, a).
- Ratio-rigidity tax of a unit of p prefill + d decode instances: U(t) = max(⌈N_p*/p⌉, ⌈N_d*/d⌉),
  tax = GPUh_unit/GPUh_O0 − 1 (worked example: N_p* = 40, N_d* = 60, 1:1 → 60 units = 120 instances
  vs 100: +20 %). Reported for 1:1 and for the best p:d with p, d ≤ 16.
- Static peak: (max_t N_p* + max_t N_d*) for the whole horizon; autoscaling saves at most 1 − mean/peak.
- Work floor: busy time alone, the oracle's prefill and decode work of every request, no window.

Must not: depend on a policy, a router or randomness (the profile replay is deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tandem.core.capacity import mdl_rho_max
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.physics import Roofline, ttft_budgets
from tandem_lab.sim.workload import Workload, infinite_cache_hits

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
class ServedBounds:
    """The oracle of one request set: provable lower bounds on GPU-hours (module docstring)."""

    requests: int
    o0_prefill_gpuh: float
    o0_decode_gpuh: float
    o1_prefill_gpuh: float
    o1_decode_gpuh: float
    o1_block_s: tuple[float, float]
    """Block length that gave each role's O1 (prefill, decode)."""

    @property
    def o0_gpuh(self) -> float:
        return self.o0_prefill_gpuh + self.o0_decode_gpuh

    @property
    def o1_gpuh(self) -> float:
        return self.o1_prefill_gpuh + self.o1_decode_gpuh

    def as_dict(self) -> dict[str, float | int | list[float]]:
        return {
            "requests": self.requests,
            "o0_gpuh": self.o0_gpuh,
            "o0_prefill_gpuh": self.o0_prefill_gpuh,
            "o0_decode_gpuh": self.o0_decode_gpuh,
            "o1_gpuh": self.o1_gpuh,
            "o1_prefill_gpuh": self.o1_prefill_gpuh,
            "o1_decode_gpuh": self.o1_decode_gpuh,
            "o1_block_s": list(self.o1_block_s),
        }


@dataclass(frozen=True)
class Bounds:
    """A workload's bounds: the oracle for serving every feasible request, and the planning model."""

    demand: Demand
    floors: RequestFloors
    gpus: int
    horizon_s: float
    load_s: float
    """Expected load time (planning model)."""
    min_load_s: float
    """Fastest load kind with a positive weight (the oracle's L_min)."""
    full: ServedBounds
    """The oracle with G = every SLO-feasible request (a floor for any policy that serves them all)."""
    model_o0_gpuh: float
    model_o0_prefill_gpuh: float
    model_o0_decode_gpuh: float
    model_o1_gpuh: float
    model_o1_prefill_gpuh: float
    model_o1_decode_gpuh: float
    static_gpuh: float
    peak: tuple[int, int]
    mean_over_peak: float
    floor_gpuh: float
    """Work floor: prefill and decode work of every request (infinite cache, full batch), no window."""
    tax_1to1: float
    best_unit: tuple[int, int]
    tax_best: float
    profile_ratio: float
    mean_context: float
    bound_hit_ratio: float
    """Token-weighted hit ratio of the infinite-cache model."""
    prefill_factor: float
    """The planning model's prefill work per ideal (infinite-cache) prefill second (the profile's measurement)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "oracle_full": self.full.as_dict(),
            "model_o0_gpuh": self.model_o0_gpuh,
            "model_o0_prefill_gpuh": self.model_o0_prefill_gpuh,
            "model_o0_decode_gpuh": self.model_o0_decode_gpuh,
            "model_o1_gpuh": self.model_o1_gpuh,
            "model_o1_prefill_gpuh": self.model_o1_prefill_gpuh,
            "model_o1_decode_gpuh": self.model_o1_decode_gpuh,
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
            "model_prefill_factor": self.prefill_factor,
            "slo_feasible_share": self.demand.feasible_share,
            "unloaded_ttft_p95_s": self.demand.unloaded_ttft_p95,
            "load_s": self.load_s,
            "min_load_s": self.min_load_s,
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


@dataclass(frozen=True)
class RequestFloors:
    """Per-request facts no schedule can beat (the oracle's inputs; module docstring)."""

    arrival_s: F64
    budget_s: F64
    """TTFT budget on total input tokens (§6)."""
    service_s: F64
    """Prefill seconds under the infinite-cache hit model (the least any policy can need)."""
    pd_s: F64
    """P→D transfer over the fastest link (intra-node)."""
    step1_s: F64
    """One decode step at batch 1 holding only this request (the fastest first token)."""
    decode_work_s: F64
    """Decode instance-seconds at the full batch (``max_num_seqs``): the least share of an instance."""
    output_tokens: npt.NDArray[np.int64]
    feasible: npt.NDArray[np.bool_]
    """service + pd + step1 ≤ budget: the request can meet its TTFT on an idle instance."""
    hit_tokens: npt.NDArray[np.int64]
    """Infinite-cache hit tokens."""

    def prefill_window(self) -> tuple[F64, F64]:
        """[a, a + budget − pd − step1]: where a request that met its TTFT was prefilled."""
        return self.arrival_s, self.arrival_s + self.budget_s - self.pd_s - self.step1_s

    def decode_window(self, tpot_s: float) -> tuple[F64, F64]:
        """[a + S + pd, a + budget + (n_out − 1)·TPOT]: where a request that met both SLOs was decoded."""
        extra = np.maximum(self.output_tokens - 1, 0).astype(np.float64) * tpot_s
        return self.arrival_s + self.service_s + self.pd_s, self.arrival_s + self.budget_s + extra


def request_floors(
    workload: Workload, params: SimParams, cap: Roofline, hit_tokens: npt.NDArray[np.int64] | None = None
) -> RequestFloors:
    """The per-request floors of ``workload`` (module docstring). ``hit_tokens``: each request's cached prompt
    tokens under another hit model than the infinite cache (e.g. a shared tier of a given size,
    :mod:`tandem_lab.sim.kvsizing`); the floors then hold for that cache, not for any cache."""
    slo = params.slo
    hit = infinite_cache_hits(workload, params.generator.block_tokens)[1] if hit_tokens is None else hit_tokens
    inp = workload.input_tokens.astype(np.float64)
    out = workload.output_tokens.astype(np.float64)
    uncached = np.maximum(1.0, inp - hit)
    service = cap.prefill_times(uncached, inp - uncached)
    pd = inp * params.model.kv_bytes_per_token / params.network.intra_node_bandwidth
    budget = ttft_budgets(
        workload.input_tokens, slo.ttft_short_s, slo.ttft_long_s, slo.l_short_tokens, slo.l_long_tokens
    )
    ctx = inp + out / 2.0
    kv_b = cap.kv_bytes_per_token
    step1 = (cap.weight_bytes_touched(1) + ctx * kv_b) / cap.bandwidth + cap.comm_s
    b = max(1, params.instance.max_num_seqs)
    per_step = (cap.weight_bytes_touched(b) / b + ctx * kv_b) / cap.bandwidth + cap.comm_s / b
    decode = out / cap.tokens_per_step * per_step
    feasible = service + pd + step1 <= budget
    return RequestFloors(
        arrival_s=workload.arrival_s,
        budget_s=budget,
        service_s=service,
        pd_s=pd,
        step1_s=step1,
        decode_work_s=decode,
        output_tokens=workload.output_tokens,
        feasible=feasible,
        hit_tokens=hit,
    )


def ttft_miss_causes(
    floors: RequestFloors, ok: npt.NDArray[np.bool_], ttft: F64, prefill_s: npt.NDArray[np.floating]
) -> dict[str, float]:
    """Why SLO-feasible requests missed their TTFT, as shares of the feasible requests (they add up to the
    TTFT miss share). Feasibility assumes the infinite-cache hits; a run gets the hits its caches held, so a
    miss is one of:

    - ``cache``: served late, and its own prefill with the hits it really got, plus P→D and the first decode
      step, is already over the budget: no amount of capacity saves it, only a warmer cache would;
    - ``wait``: served late although that floor fits the budget: it queued or shared an instance's compute
      with other prefills (capacity, or a better spread of the load, would have saved it);
    - ``unserved``: rejected, failed, errored or timed out.

    This is what tells an autoscaler's misses from a router's: only ``wait`` and ``unserved`` move with the
    fleet's size. Worked example: budget 1 s, P→D + first step 0.1 s; a request served in 1.4 s whose own
    prefill took 1.0 s is ``cache`` (1.1 s > 1 s); one whose prefill took 0.3 s is ``wait``."""
    feasible = floors.feasible
    n = int(feasible.sum())
    if n == 0:
        return {"cache": math.nan, "wait": math.nan, "unserved": math.nan}
    late = feasible & ok & (ttft > floors.budget_s)
    own = np.asarray(prefill_s, dtype=np.float64) + floors.pd_s + floors.step1_s
    cache = late & (own > floors.budget_s)
    return {
        "cache": float(cache.sum()) / n,
        "wait": float((late & ~cache).sum()) / n,
        "unserved": float((feasible & ~ok).sum()) / n,
    }


def compute_demand(
    workload: Workload,
    params: SimParams,
    cap: Roofline,
    horizon_s: float,
    prefill_factor: float = 1.0,
    floors: RequestFloors | None = None,
) -> tuple[Demand, float]:
    """The planning model's per-window demand (module docstring) and the token-weighted infinite-cache hit
    ratio. ``prefill_factor``: the profile's measured prefill work per ideal prefill second (default 1:
    the infinite cache)."""
    window = params.oracle.window_s
    n_windows = max(1, math.ceil(horizon_s / window))
    slo = params.slo
    fl = floors or request_floors(workload, params, cap)
    hit = fl.hit_tokens
    inp = workload.input_tokens.astype(np.float64)
    out = workload.output_tokens.astype(np.float64)
    service = fl.service_s * max(1.0, prefill_factor)
    pd = fl.pd_s
    budget = fl.budget_s
    t_eff = budget - pd - fl.step1_s
    # Under the model's hit model a request is served with headroom if it can meet its budget on an idle
    # instance *with those hits*; the rest need their service at ρ = 1. (Demand.feasible, which the
    # oracle and attainment use, is the hit-model-free definition of request_floors.)
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
        feasible_share=float(fl.feasible.mean()) if len(fl.feasible) else 1.0,
        feasible=fl.feasible,
        service_s=fl.service_s,
        decode_floor_s=fl.decode_work_s,
        unloaded_ttft_p95=float(np.percentile(fl.service_s + pd + fl.step1_s, 95)) if len(pd) else 0.0,
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


ORACLE_BLOCKS_S: tuple[float, ...] = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Block lengths the oracle's O1 tries (each gives a valid bound; the largest is kept)."""


def _energy(start: F64, end: F64, work: F64, block_s: float, n_blocks: int) -> F64:
    """Per block [kΔ, (k+1)Δ): Σ_jobs max(0, w − (e − s) + |[s, e] ∩ block|) — the instance-time a job of
    work w confined to [s, e] must spend inside the block (energetic reasoning)."""
    out = np.zeros(n_blocks, dtype=np.float64)
    if not len(start):
        return out
    slack = np.maximum(0.0, (end - start) - work)
    b0 = np.clip(np.floor(start / block_s).astype(np.int64), 0, n_blocks - 1)
    b1 = np.clip(np.floor(np.maximum(end - 1e-12, start) / block_s).astype(np.int64), 0, n_blocks - 1)
    span = int((b1 - b0).max()) + 1
    for k in range(span):
        idx = b0 + k
        live = idx <= b1
        if not live.any():
            break
        lo = np.maximum(start[live], idx[live] * block_s)
        hi = np.minimum(end[live], (idx[live] + 1) * block_s)
        overlap = np.maximum(0.0, hi - lo)
        np.add.at(out, idx[live], np.maximum(0.0, overlap - slack[live]))
    return out


def _level_coverage_s(levels: I64, block_s: float, load_s: float) -> float:
    """Σ_j the seconds level j must have been charged, given that some instant of every block b held at
    least ``levels[b]`` serving instances (module docstring: gaps ≥ min(gap, L), first ≥ min(t₁, L))."""
    total = 0.0
    top = int(levels.max()) if len(levels) else 0
    for j in range(1, top + 1):
        on = np.flatnonzero(levels >= j)
        if not len(on):
            break
        total += min(load_s, float(on[0]) * block_s)
        if len(on) == 1:
            continue
        d = np.diff(on)
        linear = (d + 1) * block_s <= load_s
        # separators between runs: the gap between instants is at least (d − 1)·Δ
        sep = ~linear
        total += float(np.minimum(load_s, (d[sep] - 1) * block_s).sum())
        # runs: consecutive on-blocks whose instants are closer than L; span minus one block
        run_id = np.concatenate(([0], np.cumsum(sep)))
        first = np.full(int(run_id[-1]) + 1, np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(int(run_id[-1]) + 1, -1, dtype=np.int64)
        np.minimum.at(first, run_id, on)
        np.maximum.at(last, run_id, on)
        total += float(np.maximum(0, last - first - 1).sum()) * block_s
    return total


def served_bounds(
    floors: RequestFloors,
    include: npt.NDArray[np.bool_],
    horizon_s: float,
    params: SimParams,
    gpus: int,
    min_load_s: float,
    blocks_s: tuple[float, ...] = ORACLE_BLOCKS_S,
) -> ServedBounds:
    """O0 and O1 (module docstring) of the requests in ``include`` (feasible ones only count)."""
    sel = include & floors.feasible
    to_gpuh = gpus / 3600.0
    out: list[tuple[float, float, float]] = []
    p_s, p_e = floors.prefill_window()
    d_s, d_e = floors.decode_window(params.slo.tpot_s)
    for start, end, work in (
        (p_s[sel], p_e[sel], floors.service_s[sel]),
        (d_s[sel], d_e[sel], floors.decode_work_s[sel]),
    ):
        o0 = float(_energy(start, end, work, max(horizon_s, 1e-9), 1)[0])
        best, best_block = o0, 0.0
        for block in blocks_s:
            n = max(1, math.ceil(horizon_s / block))
            energy = _energy(start, end, work, block, n)
            # the last block may be shorter than Δ: its instant still holds ⌈E / |b|⌉ instances
            length = np.full(n, block)
            length[-1] = max(1e-9, horizon_s - (n - 1) * block)
            levels = np.ceil(energy / length - 1e-9).astype(np.int64)
            cover = _level_coverage_s(levels, block, min_load_s)
            if cover > best:
                best, best_block = cover, block
        out.append((o0 * to_gpuh, best * to_gpuh, best_block))
    return ServedBounds(
        requests=int(sel.sum()),
        o0_prefill_gpuh=out[0][0],
        o0_decode_gpuh=out[1][0],
        o1_prefill_gpuh=out[0][1],
        o1_decode_gpuh=out[1][1],
        o1_block_s=(out[0][2], out[1][2]),
    )


def _possible_load_times(params: SimParams) -> list[float]:
    """Load times of the kinds that can occur (positive weight in the load mix)."""
    mix = params.lifecycle.load_mix
    return [params.lifecycle.load_times_s[k] for k, w in mix.items() if w > 0]


def min_load_s(params: SimParams) -> float:
    """The oracle's L_min: the fastest load kind that can occur (positive weight in the load mix)."""
    return min(_possible_load_times(params), default=0.0)


def max_load_s(params: SimParams) -> float:
    """The slowest load kind that can occur: a capacity request this far ahead is never late (C1's lead)."""
    return max(_possible_load_times(params), default=0.0)


def expected_load_s(params: SimParams) -> float:
    mix = params.lifecycle.load_mix
    weight = sum(mix.values())
    mean = sum(mix[k] * params.lifecycle.load_times_s[k] for k in mix) / weight if weight else 0.0
    return params.lifecycle.schedule_delay_s + mean


def compute_bounds(
    workload: Workload,
    params: SimParams,
    cap: Roofline,
    horizon_s: float | None = None,
    prefill_factor: float = 1.0,
    floors: RequestFloors | None = None,
) -> Bounds:
    """The oracle for every feasible request and the planning model (prefill at ``prefill_factor`` × the
    infinite-cache service, the profile's measurement; default 1). ``floors``: :func:`request_floors` of
    the workload, when already computed."""
    horizon = horizon_s or workload.duration_s
    floors = floors or request_floors(workload, params, cap)
    demand, hit_ratio = compute_demand(workload, params, cap, horizon, prefill_factor, floors)
    g = cap.gpus
    win = demand.window_s
    n_p, n_d = demand.n_prefill, demand.n_decode
    to_gpuh = g * win / 3600.0
    o0_p = float(n_p.sum()) * to_gpuh
    o0_d = float(n_d.sum()) * to_gpuh
    load_s = expected_load_s(params)
    l_min = min_load_s(params)
    o1_p = startup_aware_seconds(n_p, win, load_s) * g / 3600.0
    o1_d = startup_aware_seconds(n_d, win, load_s) * g / 3600.0
    peak = (int(n_p.max()) if len(n_p) else 0, int(n_d.max()) if len(n_d) else 0)
    static = (peak[0] + peak[1]) * g * horizon / 3600.0
    total = n_p + n_d
    mean_over_peak = float(total.mean() / total.max()) if len(total) and total.max() > 0 else 1.0
    floor = (float(floors.service_s.sum()) + float(floors.decode_work_s.sum())) * g / 3600.0
    o0 = o0_p + o0_d
    full = served_bounds(floors, np.ones(len(workload), dtype=bool), horizon, params, g, l_min)

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
        floors=floors,
        gpus=g,
        horizon_s=horizon,
        load_s=load_s,
        min_load_s=l_min,
        full=full,
        model_o0_gpuh=o0,
        model_o0_prefill_gpuh=o0_p,
        model_o0_decode_gpuh=o0_d,
        model_o1_gpuh=o1_p + o1_d,
        model_o1_prefill_gpuh=o1_p,
        model_o1_decode_gpuh=o1_d,
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
        prefill_factor=max(1.0, prefill_factor),
    )
