"""The offline profile: how much more prefill work a real fleet does than the ideal cache, measured first.

What it owns: :func:`profile_fleet`, a short engine run of a static fleet whose result sizes things
before the policy runs (the planning model of :mod:`tandem_lab.sim.oracle`: B0's static peak, the shared
max bounds, the warm start, the offline P:D). The oracle itself keeps the infinite cache (a provable
bound); sizing from it under-provisions every policy: on the CI W2 sample the infinite cache hits
94.6 % of prompt tokens while a static fleet reaches ≈ 93 % (local + shared tier), and the misses sit in
long contexts (a request that walks away from its prefix recomputes 100 k tokens), so the fleet does
≈ 2–3 × the ideal prefill work. A cache-only replay with perfect key affinity reaches the infinite
bound; the gap comes from the bounded-load walk sending requests to instances without their prefix
and from the shared tier's LRU — so the profile has to be the engine itself.

The profile: the ``pools`` topology (as B0) with a fixed fleet of ⌈``static_headroom`` × the infinite-cache
model's peak⌉ instances per role (what a static fleet sized on the bound would run), over the first
envelope day of the workload (a weekday with its peak; the whole workload if shorter). It returns
f = Σ realised prefill seconds (the engine's service, shared-tier fetches included) / Σ infinite-cache
prefill seconds over the requests it served; the planning model then costs every request's prefill at
f × its ideal service. A single global factor is a deliberate simplification (misses are not uniform
over requests); it is only used for sizing, never for a bound.

Must not: depend on a scaling policy under test. Deterministic given the seed streams it is handed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.core.capacity import CapacityProfile, DecodePoint, PrefillPoint
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.engine import STATUS_OK, SimOptions, Simulation
from tandem_lab.sim.metrics import Observation
from tandem_lab.sim.oracle import Bounds
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies.base import FleetTarget, Topology
from tandem_lab.sim.workload import Workload

DAY_S = 86_400.0


@dataclass
class FixedFleet:
    """A policy that never changes its fleet (profiling, tests)."""

    target: FleetTarget
    topology: Topology = "pools"
    name: str = "fixed"
    interval_s: float = 1e9

    def initial_target(self) -> FleetTarget:
        return self.target

    def decide(self, obs: Observation) -> FleetTarget | None:
        return None


@dataclass(frozen=True)
class Profile:
    """Result of the profile run."""

    prefill_work_factor: float
    """Σ realised prefill seconds / Σ infinite-cache prefill seconds of the served requests (≥ 1)."""
    hit_efficiency: float
    """Σ realised (local + shared) hit tokens / Σ infinite-cache hit tokens of the served requests."""
    fleet: tuple[int, int]
    requests: int
    duration_s: float

    def as_dict(self) -> dict[str, float | int | list[int]]:
        return {
            "prefill_work_factor": self.prefill_work_factor,
            "hit_efficiency": self.hit_efficiency,
            "fleet": list(self.fleet),
            "requests": self.requests,
            "duration_s": self.duration_s,
        }


def profile_fleet(
    workload: Workload,
    params: SimParams,
    cap: Roofline,
    keys: Sequence[int],
    infinite: Bounds,
    rate_scale: float,
    compress: float,
    rng_seed: int,
) -> Profile:
    """Run the profile (module docstring)."""
    horizon = min(workload.duration_s, DAY_S / max(compress, 1e-9))
    mask = workload.arrival_s < horizon
    sub = workload.select(mask)
    sub_keys = [int(k) for k, m in zip(keys, mask.tolist(), strict=True) if m]
    h = params.policies.static_headroom
    fleet = (
        max(1, math.ceil(h * infinite.peak[0] - 1e-9)),
        max(1, math.ceil(h * infinite.peak[1] - 1e-9)),
    )
    sim = Simulation(
        params,
        cap,
        sub,
        FixedFleet(FleetTarget(prefill=fleet[0], decode=fleet[1])),
        SimOptions(topology="pools", routing_keys=sub_keys, horizon_s=horizon, rate_scale=rate_scale),
        np.random.default_rng(rng_seed),
        np.ones(len(sub)),
    )
    res = sim.run()
    served = res.status == STATUS_OK
    realised = float((res.local_tokens[served] + res.shared_tokens[served]).sum())
    ideal = float(infinite.floors.hit_tokens[mask][served].sum())
    eff = min(1.0, realised / ideal) if ideal > 0 else 1.0
    work = float(res.prefill_s[served].astype(np.float64).sum())
    ideal_work = float(infinite.floors.service_s[mask][served].sum())
    factor = max(1.0, work / ideal_work) if ideal_work > 0 else 1.0
    return Profile(prefill_work_factor=factor, hit_efficiency=eff, fleet=fleet, requests=len(sub), duration_s=horizon)


PROFILE_PROMPT_TOKENS: tuple[int, ...] = (1_024, 4_096, 8_192, 16_384, 32_768, 65_536, 131_072)
"""Prompt lengths of the planning profile's prefill points (the speed pool's range)."""
PROFILE_CONTEXT_TOKENS: tuple[int, ...] = (1_024, 4_096, 8_192, 16_384, 32_768, 65_536, 131_072, 262_144)
"""Decode contexts of the planning profile's decode points."""


def planning_profile(cap: Roofline, params: SimParams, hit_ratio: float, load_time_s: float) -> CapacityProfile:
    """The capacity profile a user would declare for this stack (``spec.autoscaling.capacityProfile``),
    measured on the simulator's physics the way a benchmark would measure a real engine:

    - prefill at prompt length L with the workload's hit ratio h: u = L·(1 − h) uncached tokens after a
      cached prefix of L − u, rate = u / prefill_time(u, L − u) (the tail attends to the whole prefix, so
      a cached workload computes fewer tokens/s than a cold one at the same length);
    - decode at context c: the largest batch meeting the TPOT SLO (within KV and ``max_num_seqs``) and
      the instance's tokens/s at it;
    - load time: the expected load of the lifecycle mix (what a declared ``loadTime`` would say).
    """
    h = min(max(hit_ratio, 0.0), 0.99)
    prefill = []
    for length in PROFILE_PROMPT_TOKENS:
        u = max(1.0, length * (1.0 - h))
        prefill.append(PrefillPoint(length, u / cap.prefill_time(u, length - u)))
    decode = []
    slo, seqs = params.slo, params.instance.max_num_seqs
    for c in PROFILE_CONTEXT_TOKENS:
        b = cap.best_decode_batch(c, slo.tpot_s, seqs)
        decode.append(DecodePoint(c, float(b), cap.decode_throughput(b, c)))
    return CapacityProfile("sim", tuple(prefill), tuple(decode), load_time_s)
