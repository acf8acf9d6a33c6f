"""Scenarios W1–W6 (benchmarks.md §6): which workload, at what scale, with which perturbation.

What it owns: :class:`ScenarioConfig` (the run-level knobs that, with the parameter file and the
seed, fully determine a run), :func:`build_workload` and :func:`install_hooks` (scenario
perturbations scheduled on a :class:`~tandem.sim.engine.Simulation`).

- **W1** Mooncake conversation trace, ticks jittered, × k by prefix-root multiplication. k defaults to
  ``round(scale × 550 / trace peak-minute rate)`` (≥ 1; ``copies`` overrides it; k = 134 at scale 1).
  The router key covers 2 blocks (block 0 is shared by every request).
- **W2** agentic week from the generator, peak ``scale × 550`` req/s, the envelope compressed
  ``compress``× (a CI run: ``--scale 0.1 --compress 10`` is a 1 % sample of the week's requests).
- **W3** W2 + Gamma session inter-arrivals (CV 2) + at Tuesday's peak as many new sessions as are
  active, all starting within 60 s (a 2× step in request rate within a minute, decaying as they end).
- **W4** W2 + for 10 min from Tuesday's peak the local prefix-cache hits are scaled by 0.4/0.9
  (a cache-miss storm: 90 % → 40 %).
- **W5** W2 + a canary revision (TPOT × 1.3 or +1 % errors) at 5 % of traffic. Not wired yet: the
  engine carries revisions (prefill/TPOT multipliers, error probability, eval score) and canary
  weights through ``tandem.routing.compute_pair_weights``, but no rollout policy drives them;
  :func:`tandem.sim.runner.run` refuses W5.
- **W6** W2 + at Tuesday's peak 5 % of decode instances (at least one) are lost; controllers replace them.

W3, W4 and W6 default to two envelope days (Monday, Tuesday) so the event falls on a weekday peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tandem.sim.config import SimParams
from tandem.sim.generator import DAY_S, GeneratorRun, generate
from tandem.sim.traces import CONVERSATION, jitter_ticks, load_trace, multiply_prefix_roots, trace_path
from tandem.sim.workload import Workload

SCENARIOS = ("W1", "W2", "W3", "W4", "W5", "W6")
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
    event_day: float = 1.0
    """Day (0 = Monday) whose peak hour hosts the W3/W4/W6 event."""
    storm_s: float = 600.0
    storm_hit_scale: float = 0.4 / 0.9
    loss_fraction: float = 0.05
    canary_tpot_mult: float = 1.3
    canary_error_prob: float = 0.0

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; choose from {', '.join(SCENARIOS)}")
        if self.scale <= 0 or self.compress <= 0:
            raise ValueError("scale and compress must be > 0")

    def resolved_days(self) -> float:
        if self.days is not None:
            return self.days
        return 7.0 if self.scenario == "W2" else 2.0

    def resolved_copies(self) -> int:
        if self.copies is not None:
            return self.copies
        return max(1, round(self.scale * FLEET_PEAK_RPS / CONVERSATION_PEAK_MINUTE_RPS))

    def event_time_s(self, params: SimParams) -> float:
        """Simulated time of the event: the peak hour of ``event_day``."""
        return (self.event_day * DAY_S + params.generator.peak_hour * 3600.0) / self.compress

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BuiltWorkload:
    workload: Workload
    key_mode: str
    key_blocks: int
    info: dict[str, Any]


def build_workload(
    cfg: ScenarioConfig, params: SimParams, rng_arrivals: np.random.Generator, rng_generator: np.random.Generator
) -> BuiltWorkload:
    """The scenario's workload (module docstring). Deterministic in the two generators' seeds."""
    if cfg.scenario == "W1":
        base = load_trace(trace_path(cfg.trace))
        k = cfg.resolved_copies()
        wl = multiply_prefix_roots(base, k, rng_arrivals) if k > 1 else jitter_ticks(base, rng_arrivals)
        info = {"source": cfg.trace, "copies": k, "base_requests": len(base)}
        return BuiltWorkload(wl, "blocks", max(2, params.router.key_blocks), info)
    days = cfg.resolved_days()
    gen = params.generator
    limit = params.model.max_context_tokens
    run = GeneratorRun(days=days, peak_rps=gen.peak_rps * cfg.scale, compress=cfg.compress, max_context_tokens=limit)
    if cfg.scenario == "W3":
        run = GeneratorRun(
            days=days,
            peak_rps=gen.peak_rps * cfg.scale,
            compress=cfg.compress,
            arrival_cv=2.0,
            burst_at_s=cfg.event_time_s(params),
            burst_ramp_s=60.0,
            burst_factor=1.0,
            max_context_tokens=limit,
        )
    wl = generate(gen, run, rng_generator, params.slo.tpot_s, name=f"agentic-{cfg.scenario}")
    info = {
        "days": days,
        "peak_rps": run.peak_rps,
        "compress": cfg.compress,
        "sessions": int(np.asarray(wl.meta["session_profile"]).size),
    }
    return BuiltWorkload(wl, "auto", params.router.key_blocks, info)


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
            from tandem.sim.engine import READY  # noqa: PLC0415 - avoid an import cycle
            from tandem.sim.metrics import DECODE  # noqa: PLC0415

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
