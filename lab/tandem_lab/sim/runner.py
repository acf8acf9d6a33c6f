"""Run a scenario for one or more policies: workload → bounds → simulation per policy → metrics.

What it owns: the library entry point (:func:`run`) that the CLI, tests and, later, ``make bench``
call; seeding; the per-run metrics of benchmarks.md §6 (:func:`summarize`). It writes nothing: files
are :mod:`tandem_lab.sim.report`'s job.

Seeding (benchmarks.md §8): one master seed; each component draws from its own stream,
``SeedSequence(seed).spawn(len(STREAMS))[i]`` with ``i`` its index in :data:`STREAMS`. New components
are appended, so adding one shifts no other stream. The workload depends only on (scenario, params,
seed): every policy of a run sees exactly the same requests.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tandem_lab.sim.config import SimParams, config_hash
from tandem_lab.sim.decisionlog import decision_log_summary
from tandem_lab.sim.engine import (
    STATUS_OK,
    STATUS_REJECTED,
    SimOptions,
    SimResult,
    Simulation,
)
from tandem_lab.sim.metrics import DECODE, PREFILL
from tandem_lab.sim.oracle import Bounds, compute_bounds, request_floors, served_bounds, ttft_miss_causes
from tandem_lab.sim.physics import Roofline, ttft_budgets
from tandem_lab.sim.policies import PolicyContext, canonical, make_policy
from tandem_lab.sim.profile import Profile, planning_profile, profile_fleet
from tandem_lab.sim.scenarios import ScenarioConfig, build_workload, event_window, install_hooks
from tandem_lab.sim.workload import Workload

STREAMS = ("arrivals", "generator", "lifecycle", "errors", "scenario", "profile")
CODE_ROOT = Path(__file__).resolve().parents[3]


def stream(seed: int, name: str) -> np.random.Generator:
    """The named component's generator (see module docstring)."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return np.random.default_rng(children[STREAMS.index(name)])


def code_revision() -> str:
    """``git describe`` of the checkout (``+dirty`` when modified), or ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty"],
            cwd=CODE_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class PolicyRun:
    policy: str
    result: SimResult
    metrics: dict[str, Any]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScenarioRun:
    """One scenario, several policies, shared workload and bounds."""

    config: ScenarioConfig
    params: SimParams
    seed: int
    workload: Workload
    workload_info: dict[str, Any]
    bounds: Bounds
    context: PolicyContext
    runs: list[PolicyRun]
    config_hash: str
    timing: dict[str, float]
    events: list[dict[str, Any]]
    ttft_target_ms: int = 0
    profile: Profile | None = None


def make_context(params: SimParams, cap: Roofline, bounds: Bounds, profile: Profile | None = None) -> PolicyContext:
    """The pre-run knowledge every policy shares (bounds, offline profile, warm start, the capacity profile)."""
    b = params.bounds
    peak_p, peak_d = bounds.peak
    max_instances = int(b.get("max_factor", 2.0) * (peak_p + peak_d) + b.get("max_extra", 2.0))
    first = max(1, int(600.0 / bounds.demand.window_s))
    init_p = max(int(b.get("min_prefill", 1)), int(bounds.demand.n_prefill[:first].max(initial=0)))
    init_d = max(int(b.get("min_decode", 1)), int(bounds.demand.n_decode[:first].max(initial=0)))
    return PolicyContext(
        params=params,
        capacity=cap,
        min_prefill=int(b.get("min_prefill", 1)),
        min_decode=int(b.get("min_decode", 1)),
        max_instances=max(max_instances, init_p + init_d + 2),
        oracle_peak=bounds.peak,
        profile_ratio=bounds.profile_ratio,
        initial=(init_p, init_d),
        mean_context=bounds.mean_context or 1.0,
        capacity_profile=planning_profile(
            cap, params, bounds.bound_hit_ratio * (profile.hit_efficiency if profile else 1.0), bounds.load_s
        ),
        model_need=(bounds.demand.n_prefill, bounds.demand.n_decode, bounds.demand.window_s),
    )


def ttft_target_ms(workload: Workload, params: SimParams) -> int:
    """Tandem's ``ttftP95Ms: auto``: the §6 TTFT budget (1 s up to ``l_short``, 3 s at the pool's max context,
    linear between) at the pool traffic's p95 input length, in whole milliseconds (rounded down, so the
    target is never looser than the budget). It is never raised to what idle instances achieve: if the
    traffic's unloaded p95 is above it, the policy sees a breach, and the report says so."""
    if not len(workload):
        return int(params.slo.ttft_short_s * 1000)
    p95 = np.percentile(workload.input_tokens, 95)
    slo = params.slo
    budget = ttft_budgets(
        np.asarray([p95], dtype=np.int64), slo.ttft_short_s, slo.ttft_long_s, slo.l_short_tokens, slo.l_long_tokens
    )
    return max(1, math.floor(float(budget[0]) * 1000.0 + 1e-9))


@dataclass
class Prepared:
    """What every policy of a scenario shares: workload, keys, bounds, context, error draws, targets."""

    config: ScenarioConfig
    params: SimParams
    seed: int
    workload: Workload
    info: dict[str, Any]
    keys: list[int]
    cap: Roofline
    bounds: Bounds
    context: PolicyContext
    errors: npt.NDArray[np.float64]
    ttft_target_ms: int
    profile: Profile
    timing: dict[str, float]


def prepare(
    config: ScenarioConfig, seed: int, params: SimParams, progress: Callable[[str], None] | None = None
) -> Prepared:
    """Workload (the pool's share), routing keys, the offline profile, bounds and the shared policy context."""
    timing: dict[str, float] = {}
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    built = build_workload(config, params, stream(seed, "arrivals"), stream(seed, "generator"))
    wl = built.workload
    timing["workload_s"] = time.perf_counter() - t0
    routed = built.info.get("routed_long_context", {})
    say(
        f"{config.scenario}: {len(wl):,} {params.pool.name}-pool requests over {wl.duration_s / 3600:.1f} h simulated "
        f"({routed.get('requests', 0):,} routed to long-context; {timing['workload_s']:.1f} s to build)"
    )
    cap = Roofline.from_params(params)
    t1 = time.perf_counter()
    keys = wl.routing_keys(built.key_mode, built.key_blocks)
    timing["keys_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    floors = request_floors(wl, params, cap)
    ideal = compute_bounds(wl, params, cap, wl.duration_s, floors=floors)
    seed_profile = int(stream(seed, "profile").integers(0, 2**31 - 1))
    profile = profile_fleet(wl, params, cap, keys, ideal, config.scale, config.compress, seed_profile)
    bounds = compute_bounds(wl, params, cap, wl.duration_s, prefill_factor=profile.prefill_work_factor, floors=floors)
    timing["bounds_s"] = time.perf_counter() - t2
    say(
        f"bounds: oracle O1 (all feasible) {bounds.full.o1_gpuh:.1f} GPUh, model O1 {bounds.model_o1_gpuh:.1f} GPUh, "
        f"model peak {bounds.peak[0]}P+{bounds.peak[1]}D; profile: prefill work x{profile.prefill_work_factor:.2f}, "
        f"hits {profile.hit_efficiency:.1%} of ideal; "
        f"SLO-feasible {bounds.demand.feasible_share:.1%} ({timing['bounds_s']:.1f} s)"
    )
    ctx = make_context(params, cap, bounds, profile)
    errors = stream(seed, "errors").uniform(size=len(wl))
    return Prepared(
        config,
        params,
        seed,
        wl,
        built.info,
        keys,
        cap,
        bounds,
        ctx,
        errors,
        ttft_target_ms(wl, params),
        profile,
        timing,
    )


def run_policy(prep: Prepared, name: str, progress: Callable[[str], None] | None = None) -> PolicyRun:
    """Simulate one scaling policy on a prepared scenario."""
    key = canonical(name)
    say = progress or (lambda _msg: None)
    wl, params, config, ctx = prep.workload, prep.params, prep.config, prep.context
    policy = make_policy(key, ctx, prep.ttft_target_ms)
    options = SimOptions(
        topology=policy.topology,
        router=params.router.policy,
        routing_keys=prep.keys,
        horizon_s=wl.duration_s,
        rate_scale=config.scale,
        min_prefill=ctx.min_prefill,
        min_decode=ctx.min_decode,
        max_instances=ctx.max_instances,
        default_shape=policy.initial_target().shape or (1, 1),
        progress=_progress_printer(say, key, wl.duration_s) if progress else None,
        progress_every_s=max(600.0, wl.duration_s / 10),
    )
    sim = Simulation(params, prep.cap, wl, policy, options, stream(prep.seed, "lifecycle"), prep.errors)
    install_hooks(config, params, sim, stream(prep.seed, "scenario"))
    start = time.perf_counter()
    result = sim.run()
    wall = time.perf_counter() - start
    metrics = summarize(result, wl, prep.bounds, params, event_window(config, params))
    if key == "tandem":
        metrics["tandem_ttft_p95_target_ms"] = prep.ttft_target_ms
    extra: dict[str, Any] = {}
    reasons = getattr(policy, "reasons", None)
    if isinstance(reasons, dict):
        extra["decision_reasons"] = dict(sorted(reasons.items()))
    log = getattr(policy, "log", None)
    if isinstance(log, list):
        spec = getattr(policy, "spec", None)
        max_pairs = getattr(spec, "max_pairs", None)
        extra["decision_log"] = log
        extra["decision_log_summary"] = decision_log_summary(log, max_pairs, prep.bounds.load_s)
    say(
        f"{key}: {wall:.1f} s wall, {len(wl) / max(wall, 1e-9):,.0f} req/s simulated; "
        f"GPUh {metrics['gpuh']['total']:.1f} = {metrics['gpuh_over_o1']:.2f} x its O1; attainment on feasible "
        f"TTFT {metrics['ttft_attainment_feasible']:.2%}, TPOT {metrics['tpot_attainment_feasible']:.2%}"
    )
    return PolicyRun(key, result, metrics, wall, extra)


def run(
    config: ScenarioConfig,
    policies: Sequence[str],
    seed: int,
    params: SimParams,
    progress: Callable[[str], None] | None = None,
) -> ScenarioRun:
    """Build the scenario's workload and bounds once, then simulate each scaling policy on it (W1–W4, W6;
    W5 is :func:`tandem_lab.sim.rollout.run_w5`)."""
    if config.scenario == "W5":
        raise ValueError(  # W5 is not a scaling-policy scenario: a usage error, not a missing feature
            "W5 runs rollout policies: use `tandem bench fleet --scenarios W5` (tandem_lab.sim.rollout.run_w5)"
        )
    prep = prepare(config, seed, params, progress)
    runs: list[PolicyRun] = []
    for name in policies:
        r = run_policy(prep, name, progress)
        runs.append(r)
        prep.timing[f"{r.policy}_s"] = r.wall_s
    chash = config_hash(params, config.as_dict(), list(policies))
    events = install_hooks(config, params, _HookSink(), stream(seed, "scenario"))
    return ScenarioRun(
        config,
        params,
        seed,
        prep.workload,
        prep.info,
        prep.bounds,
        prep.context,
        runs,
        chash,
        prep.timing,
        events,
        prep.ttft_target_ms,
        prep.profile,
    )


class _HookSink:
    """Collects a scenario's event descriptions without a simulation (for the report)."""

    def at(self, t: float, hook: Callable[[Any], None], label: str) -> None:
        return None


def _progress_printer(say: Callable[[str], None], name: str, horizon: float) -> Callable[[float, int, int], None]:
    start = time.perf_counter()

    def report(now: float, done: int, total: int) -> None:
        elapsed = time.perf_counter() - start
        say(
            f"  {name}: t = {now / 3600:6.2f} h of {horizon / 3600:.2f} h, {done:,}/{total:,} requests, "
            f"{elapsed:.0f} s wall"
        )

    return report


# --- metrics -------------------------------------------------------------------------------------


def gpu_hours(result: SimResult, gpus: int) -> dict[str, float]:
    """GPU-hours split into prefill busy, decode busy, loading and idle (clipped to the horizon)."""
    h = result.horizon_s
    split = {"prefill": 0.0, "decode": 0.0, "loading": 0.0, "idle": 0.0}
    for r in result.instances:
        if not math.isfinite(r.t_bound) or r.t_bound >= h:
            continue
        end = min(r.t_end, h)
        ready_at = min(r.t_ready, end) if math.isfinite(r.t_ready) else end
        loading = max(0.0, ready_at - r.t_bound)
        ready = max(0.0, end - ready_at)
        busy = min(r.busy_s, ready)
        split["loading"] += loading
        split["prefill" if r.role == PREFILL else "decode"] += busy
        split["idle"] += ready - busy
    out = {k: v * gpus / 3600.0 for k, v in split.items()}
    out["total"] = sum(out.values())
    return out


def _window_attainment(
    ok: npt.NDArray[np.bool_], t: npt.NDArray[np.float64], window: float, horizon: float
) -> tuple[float, npt.NDArray[np.float64]]:
    n = max(1, math.ceil(horizon / window))
    idx = np.clip((t // window).astype(np.int64), 0, n - 1)
    total = np.bincount(idx, minlength=n)
    good = np.bincount(idx, weights=ok.astype(np.float64), minlength=n)
    att = np.divide(good, total, out=np.full(n, np.nan), where=total > 0)
    valid = total >= 20
    worst = float(np.nanmin(att[valid])) if valid.any() else float(np.nanmin(att)) if (total > 0).any() else math.nan
    return worst, att


def summarize(
    result: SimResult, wl: Workload, bounds: Bounds, params: SimParams, event: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The §6 metrics of one run (deterministic: no wall-clock values).

    Attainment is reported over all of the pool's requests and over the SLO-feasible ones (those that can
    meet their TTFT budget on an idle instance, :func:`tandem_lab.sim.oracle.request_floors`); gates read the
    latter, and the oracle is computed on the feasible requests this policy served within both SLOs.
    """
    slo = params.slo
    g = bounds.gpus
    n = len(wl)
    gh = gpu_hours(result, g)
    fl = bounds.floors
    budget = fl.budget_s
    ok = result.status == STATUS_OK
    ttft_ok = ok & (result.ttft <= budget)
    tpot_ok = ok & ((wl.output_tokens <= 1) | (result.tpot <= slo.tpot_s))
    both = ttft_ok & tpot_ok
    feasible = fl.feasible
    t = wl.arrival_s
    worst_ttft, _ = _window_attainment(ttft_ok[feasible], t[feasible], slo.window_s, bounds.horizon_s)
    worst_tpot, _ = _window_attainment(tpot_ok[feasible], t[feasible], slo.window_s, bounds.horizon_s)
    worst_both, _ = _window_attainment(both[feasible], t[feasible], slo.window_s, bounds.horizon_s)
    good_tokens = float((wl.input_tokens[both] + wl.output_tokens[both]).sum())
    inp_total = float(wl.input_tokens.sum())
    served = result.status != STATUS_REJECTED
    local = float(result.local_tokens.sum())
    shared = float(result.shared_tokens.sum())
    inp_served = float(wl.input_tokens[served].sum()) or 1.0
    walks = result.walk[served]
    walk_hist = (
        {str(int(k)): int(v) for k, v in zip(*np.unique(walks, return_counts=True), strict=True)} if len(walks) else {}
    )
    hours = bounds.horizon_s / 3600.0
    # in flight and time in system at the peak window
    done = np.where(np.isfinite(result.t_done), result.t_done, bounds.horizon_s)
    sojourn = done - t
    peak_w = int(np.argmax(bounds.demand.n_prefill + bounds.demand.n_decode))
    w = bounds.demand.window_s
    in_peak = (t >= peak_w * w - 300) & (t < peak_w * w + 300)
    statuses = {
        name: int((result.status == code).sum())
        for code, name in ((0, "ok"), (1, "rejected"), (2, "failed"), (3, "error"), (4, "timeout"))
    }
    completed = ((result.status == STATUS_OK) | (result.status == 3)) & (result.t_done <= bounds.horizon_s)
    served_floor = float(fl.service_s[completed].sum() + fl.decode_work_s[completed].sum()) * g / 3600.0
    oracle = served_bounds(fl, both & feasible, bounds.horizon_s, params, g, bounds.min_load_s)
    total = gh["total"]

    def ratio(den: float) -> float:
        return total / den if den > 0 else math.nan

    def share(mask: npt.NDArray[np.bool_], sub: npt.NDArray[np.bool_] | None = None) -> float:
        m = mask if sub is None else mask[sub]
        return float(m.mean()) if len(m) else math.nan

    out: dict[str, Any] = {
        "requests": n,
        "feasible_requests": int(feasible.sum()),
        "status": statuses,
        "gpuh": gh,
        "oracle": oracle.as_dict(),
        "gpuh_over_o1": ratio(oracle.o1_gpuh),
        "gpuh_over_o0": ratio(oracle.o0_gpuh),
        "gpuh_over_o1_full": ratio(bounds.full.o1_gpuh),
        "gpuh_over_model_o1": ratio(bounds.model_o1_gpuh),
        "gpuh_over_floor": ratio(bounds.floor_gpuh),
        "floor_served_gpuh": served_floor,
        "ttft_attainment": share(ttft_ok),
        "tpot_attainment": share(tpot_ok),
        "both_attainment": share(both),
        "ttft_attainment_feasible": share(ttft_ok, feasible),
        "tpot_attainment_feasible": share(tpot_ok, feasible),
        "both_attainment_feasible": share(both, feasible),
        "ttft_miss_causes_feasible": ttft_miss_causes(fl, ok, result.ttft, result.prefill_s),
        "worst_window_ttft": worst_ttft,
        "worst_window_tpot": worst_tpot,
        "worst_window_both": worst_both,
        "goodput_rps": float(both.sum()) / bounds.horizon_s if bounds.horizon_s > 0 else 0.0,
        "gpuh_per_million_good_tokens": total / (good_tokens / 1e6) if good_tokens > 0 else math.inf,
        "hit_local": local / inp_served,
        "hit_shared": shared / inp_served,
        "computed_share": 1.0 - (local + shared) / inp_served,
        "input_tokens": inp_total,
        "bytes_shared_tier": result.bytes_shared,
        "bytes_pd_network": result.bytes_pd_network,
        "nic_capacity_bytes": result.nic_capacity_bytes,
        "nic_utilization": (result.bytes_shared + result.bytes_pd_network) / result.nic_capacity_bytes
        if result.nic_capacity_bytes > 0
        else 0.0,
        "scale_actions_per_hour": result.scale_actions / hours if hours > 0 else 0.0,
        "ratio_changes_per_hour": result.ratio_changes / hours if hours > 0 else 0.0,
        "fast_rejects": result.fast_rejects,
        "rejected_429": statuses["rejected"],
        "walk_lengths": walk_hist,
        "ttft_p50": _pct(result.ttft[ok], 50),
        "ttft_p95": _pct(result.ttft[ok], 95),
        "ttft_p99": _pct(result.ttft[ok], 99),
        "tpot_p50": _pct(result.tpot[ok], 50),
        "tpot_p90": _pct(result.tpot[ok], 90),
        "tpot_p99": _pct(result.tpot[ok], 99),
        "peak_time_in_system_s": float(np.mean(sojourn[in_peak])) if in_peak.any() else math.nan,
        "peak_in_flight": float(in_peak.sum() / 600.0 * np.mean(sojourn[in_peak])) if in_peak.any() else math.nan,
        "cache_evictions": result.evictions,
        "events": result.events,
        "instances_created": len(result.instances),
        "max_instances": [
            int(result.samples[:, r, 2:4].sum(axis=1).max()) if len(result.samples) else 0 for r in (PREFILL, DECODE)
        ],
    }
    if event is not None:
        a, b = event
        mask = (t >= a) & (t < b) & feasible
        out["event_window"] = [a, b]
        out["event_both_attainment"] = float(both[mask].mean()) if mask.any() else math.nan
        after = (t >= b) & (t < b + 3600.0) & feasible
        _, per = _window_attainment(both[after], t[after] - b, 60.0, 3600.0)
        recovered = next((i for i, v in enumerate(per.tolist()) if v >= 0.99), None)
        out["event_recovery_s"] = None if recovered is None else recovered * 60.0
    return out


def _pct(values: npt.NDArray[np.float64], q: float) -> float:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if len(v) else math.nan
