"""Scenarios W1–W6 (benchmarks.md §6): which workload, at what scale, with which perturbation.

What it owns: :class:`ScenarioConfig` (the run-level knobs that, with the parameter file and the
seed, fully determine a run), :func:`build_workload` and :func:`install_hooks` (scenario
perturbations scheduled on a :class:`~tandem_lab.sim.engine.Simulation`).

- **W1** Mooncake conversation trace, ticks jittered, × k by prefix-root multiplication. k defaults to
  ``round(scale × 550 / trace peak-minute rate)`` (≥ 1; ``copies`` overrides it; k = 134 at scale 1).
  The router key covers 2 blocks (block 0 is shared by every request).
- **W2** agentic week from the generator, peak ``scale × 550`` req/s, the envelope compressed
  ``compress``× (a CI run: ``--scale 0.1 --compress 10`` is a 1 % sample of the week's requests).
- **W3** W2 + Gamma session inter-arrivals (CV 2) + at Tuesday's peak as many new sessions as are
  active, all starting within 60 s (a 2× step in request rate within a minute, decaying as they end).
- **W4** W2 + for 10 min from Tuesday's peak the local prefix-cache hits are scaled by 0.4/0.9
  (a cache-miss storm: 90 % → 40 %).
- **W5** W2's traffic around Tuesday's peak (default: envelope Tuesday 12:00–18:00) + at the peak a new
  revision is applied whose pairs run TPOT × 1.3 (``canary="tpot"``), + 1 point of engine errors
  (``"errors"``) or nothing different (``"good"``, the control); the stable revision has
  ``policies.stable_error_prob`` engine errors. The rollout policies are :mod:`tandem_lab.sim.rollout`'s.
- **W6** W2 + at Tuesday's peak 5 % of decode instances (at least one) are lost; controllers replace them.

W3, W4 and W6 default to two envelope days (Monday, Tuesday) so the event falls on a weekday peak.

**Pools.** The fleet benchmark sizes one pool, ``params.pool`` (``examples/speed-pool.yaml``): every
workload is classified by prompt size as the routing tables do — prompts of at most
``pool.max_prompt_tokens`` (131,072) go to the speed pool and are simulated; longer ones belong to the
long-context pool and are only counted (``routed_long_context`` in the workload info), never scored as
the speed pool's SLO misses. Images would go to the images pool (no workload carries them). The
agentic generator keeps the fleet's 1 M-token model limit for session compaction (sessions grow past
the speed pool's limit and continue on the long-context pool); W1's trace (max 126 k) is all speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tandem_lab.sim.config import SimParams
from tandem_lab.sim.generator import DAY_S, GeneratorRun, chained_bound, generate
from tandem_lab.sim.traces import CONVERSATION, jitter_ticks, load_trace, multiply_prefix_roots, trace_path
from tandem_lab.sim.workload import Workload

SCENARIOS = ("W1", "W2", "W3", "W4", "W5", "W6")
GATE_SETS = ("example", "regression", "powered", "stepped")
"""W5's gate sets (:attr:`ScenarioConfig.gates`)."""
FLEET_PEAK_RPS = 550.0
CONVERSATION_PEAK_MINUTE_RPS = 4.11
"""Peak 60 s arrival rate of the conversation trace (3.40 req/s × 1.21, benchmarks.md §2.1)."""


@dataclass(frozen=True)
class ScenarioConfig:
    """Run-level knobs (with the parameter file and the seed they determine a run)."""

    scenario: str
    scale: float = 0.01
    """Fraction of the reference fleet's rate (550 req/s peak)."""
    compress: float = 1.0
    """Envelope time compression for generated weeks (gaps are not compressed)."""
    days: float | None = None
    """Envelope days (default: 7 for W2, 2 for W3–W6)."""
    copies: int | None = None
    """W1: prefix-root copies (default from ``scale``)."""
    trace: str = CONVERSATION
    trace_file: str | None = None
    """W1 on a user's trace: a file in the documented trace format (``../shared/traces/README.md``)."""
    scale_to_rps: float | None = None
    """W1: copies = round(this / the trace's mean request rate) (``copies`` wins when both are set)."""
    decorrelate: bool = False
    """W1: shift each copy independently around the trace's span (copies of one burst do not stack)."""
    event_day: float = 1.0
    """Day (0 = Monday) whose peak hour hosts the W3/W4/W6 event."""
    storm_s: float = 600.0
    storm_hit_scale: float = 0.4 / 0.9
    loss_fraction: float = 0.05
    canary_tpot_mult: float = 1.3
    canary_ttft_mult: float = 1.5
    """Prefill time multiplier of the W5 ``ttft`` canary (its TTFT × about this much at W5's load)."""
    canary_error_prob: float = 0.01
    """Engine errors the canary adds to the stable revision's (W5 ``errors``)."""
    canary: str = "tpot"
    """W5 regression: ``tpot`` (TPOT × ``canary_tpot_mult``), ``ttft`` (prefill × ``canary_ttft_mult``),
    ``errors`` (+ ``canary_error_prob``) or ``good``."""
    gates: str = "example"
    """W5 gate set: ``example`` (speed-pool.yaml's), ``regression`` (``policies.w5_regression_gates`` only) or
    ``powered`` (the regression set with ``compare.minPowerPercent: 80``: no step passes on a window too small
    to see the gate's effect, docs/design/009) or ``stepped`` (``powered`` with ``compare.window: Step`` on
    every compare gate but TTFT, whose cold start a step window would keep)."""
    start_day: float | None = None
    """Envelope day at t = 0 (default 0 = Monday 00:00; W5: Tuesday 12:00)."""

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; choose from {', '.join(SCENARIOS)}")
        if self.scale <= 0 or self.compress <= 0:
            raise ValueError("scale and compress must be > 0")
        if self.canary not in ("tpot", "ttft", "errors", "good"):
            raise ValueError(f"unknown canary {self.canary!r}; choose from tpot, ttft, errors, good")
        if self.gates not in GATE_SETS:
            raise ValueError(f"unknown gate set {self.gates!r}; choose from {', '.join(GATE_SETS)}")

    def resolved_days(self) -> float:
        if self.days is not None:
            return self.days
        if self.scenario == "W5":
            return 0.25
        return 7.0 if self.scenario == "W2" else 2.0

    def resolved_start_day(self) -> float:
        if self.start_day is not None:
            return self.start_day
        return 1.5 if self.scenario == "W5" else 0.0

    def resolved_copies(self, base_rps: float | None = None) -> int:
        """W1 copies: ``copies``, else ``scale_to_rps`` / the trace's mean rate (``base_rps``), else from
        ``scale`` and the conversation trace's peak minute."""
        if self.copies is not None:
            return self.copies
        if self.scale_to_rps is not None and base_rps:
            return max(1, round(self.scale_to_rps / base_rps))
        return max(1, round(self.scale * FLEET_PEAK_RPS / CONVERSATION_PEAK_MINUTE_RPS))

    def event_time_s(self, params: SimParams) -> float:
        """Simulated time of the event: the peak hour of ``event_day`` (relative to the run's start day)."""
        day = self.event_day * DAY_S + params.generator.peak_hour * 3600.0 - self.resolved_start_day() * DAY_S
        return max(0.0, day) / self.compress

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BuiltWorkload:
    workload: Workload
    key_mode: str
    key_blocks: int
    info: dict[str, Any]


def split_pool(wl: Workload, params: SimParams, generated: bool) -> tuple[Workload, dict[str, Any]]:
    """The pool's share of ``wl`` (prompts ≤ ``pool.max_prompt_tokens``) and what was routed elsewhere.

    ``generated``: ``wl`` comes from :func:`~tandem_lab.sim.generator.generate`, so the subset's infinite-cache
    bound is recomputed from the block layout (:func:`~tandem_lab.sim.generator.chained_bound`) instead of by
    replay; traces keep ``None`` (replayed when needed).
    """
    limit = params.pool.max_prompt_tokens
    mask = wl.input_tokens <= limit
    routed = ~mask
    info: dict[str, Any] = {
        "pool": params.pool.name,
        "max_prompt_tokens": limit,
        "offered_requests": len(wl),
        "routed_long_context": {
            "requests": int(routed.sum()),
            "share": float(routed.mean()) if len(wl) else 0.0,
            "input_tokens": int(wl.input_tokens[routed].sum()),
            "output_tokens": int(wl.output_tokens[routed].sum()),
            "input_token_share": float(wl.input_tokens[routed].sum() / max(1, int(wl.input_tokens.sum()))),
        },
        "routed_images": 0,
    }
    if mask.all():
        return wl, info
    sub = wl.select(mask, name=f"{wl.name}-{params.pool.name}")
    if generated:
        sub = replace(sub, bound_hit_blocks=chained_bound(sub))
    return sub, info


def build_workload(
    cfg: ScenarioConfig, params: SimParams, rng_arrivals: np.random.Generator, rng_generator: np.random.Generator
) -> BuiltWorkload:
    """The scenario's workload for the benchmark's pool (module docstring). Deterministic in the seeds."""
    if cfg.scenario == "W1":
        path = Path(cfg.trace_file) if cfg.trace_file else trace_path(cfg.trace)
        base = load_trace(path)
        base_rps = len(base) / base.duration_s if base.duration_s > 0 else None
        k = cfg.resolved_copies(base_rps)
        if k > 1:
            wl = multiply_prefix_roots(base, k, rng_arrivals, decorrelate=cfg.decorrelate)
        else:
            wl = jitter_ticks(base, rng_arrivals)
        speed, pool_info = split_pool(wl, params, generated=False)
        info = {
            "source": path.name,
            "copies": k,
            "decorrelated": cfg.decorrelate,
            "base_requests": len(base),
            "base_rps": base_rps,
            **pool_info,
        }
        return BuiltWorkload(speed, "blocks", max(2, params.router.key_blocks), info)
    days = cfg.resolved_days()
    gen = params.generator
    limit = params.model.max_context_tokens
    run = GeneratorRun(
        days=days,
        peak_rps=gen.peak_rps * cfg.scale,
        compress=cfg.compress,
        start_day=cfg.resolved_start_day(),
        max_context_tokens=limit,
    )
    if cfg.scenario == "W3":
        run = replace(run, arrival_cv=2.0, burst_at_s=cfg.event_time_s(params), burst_ramp_s=60.0, burst_factor=1.0)
    wl = generate(gen, run, rng_generator, params.slo.tpot_s, name=f"agentic-{cfg.scenario}")
    speed, pool_info = split_pool(wl, params, generated=True)
    info = {
        "days": days,
        "start_day": run.start_day,
        "peak_rps": run.peak_rps,
        "compress": cfg.compress,
        "sessions": int(np.asarray(wl.meta["session_profile"]).size),
        **pool_info,
    }
    return BuiltWorkload(speed, "auto", params.router.key_blocks, info)


def install_hooks(cfg: ScenarioConfig, params: SimParams, sim: Any, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Schedule the scenario's perturbations on ``sim``; returns their description for the report."""
    events: list[dict[str, Any]] = []
    t0 = cfg.event_time_s(params)
    if cfg.scenario == "W4":
        scale = cfg.storm_hit_scale

        def storm_on(s: Any) -> None:
            s.local_hit_scale = scale

        def storm_off(s: Any) -> None:
            s.local_hit_scale = 1.0

        sim.at(t0, storm_on, "cache-miss storm begins")
        sim.at(t0 + cfg.storm_s, storm_off, "cache-miss storm ends")
        events.append({"kind": "cache-miss-storm", "start_s": t0, "end_s": t0 + cfg.storm_s, "hit_scale": scale})
    elif cfg.scenario == "W6":
        fraction = cfg.loss_fraction
        draw = float(rng.uniform())

        def lose(s: Any) -> None:
            from tandem_lab.sim.engine import READY  # noqa: PLC0415 - avoid an import cycle
            from tandem_lab.sim.metrics import DECODE  # noqa: PLC0415

            ready = sorted((i for i in s.alive if i.role == DECODE and i.state == READY), key=lambda i: i.iid)
            n = max(1, math.ceil(fraction * len(ready))) if ready else 0
            start = int(draw * len(ready)) if ready else 0
            for k in range(n):
                s.kill_instance(ready[(start + k) % len(ready)])

        sim.at(t0, lose, f"lose {fraction:.0%} of decode instances")
        events.append({"kind": "decode-loss", "at_s": t0, "fraction": fraction})
    elif cfg.scenario == "W3":
        events.append({"kind": "burst", "at_s": t0, "ramp_s": 60.0})
    return events


def event_window(cfg: ScenarioConfig, params: SimParams) -> tuple[float, float] | None:
    """The window a scenario's gate is evaluated over (W3 burst, W4 storm, W6 loss), in simulated seconds."""
    t0 = cfg.event_time_s(params)
    if cfg.scenario == "W3":
        return (t0, t0 + 600.0)
    if cfg.scenario == "W4":
        return (t0, t0 + cfg.storm_s)
    if cfg.scenario == "W6":
        return (t0, t0 + 600.0)
    return None


Hook = Callable[[Any], None]
