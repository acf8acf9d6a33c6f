"""The scaling-policy interface: one small protocol every policy (baselines and Tandem's) implements.

What it owns: :class:`ScalingPolicy` (``initial_target`` and ``decide(observation)``),
:class:`FleetTarget` (what a policy asks for: instances per role, or pair groups of a shape) and
:class:`PolicyContext` (what a policy may know before the run: the capacity model for offline
profiles, fleet bounds shared by all policies, the offline profile's P:D ratio and peak).

Fairness rules (benchmarks.md §5), enforced by the engine and not by policies: every policy gets the
same :class:`~tandem_lab.sim.metrics.Observation` (same scrape interval, window and lag), the same load
times, the same router and the same min/max bounds; the engine clamps every target to the bounds.

Must not: policies never see the engine, instances or requests — only observations. One exception, by
design: C1, the clairvoyant reference, also reads the planning model's future need (``model_need``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from tandem.core.capacity import CapacityProfile
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.metrics import Observation
from tandem_lab.sim.physics import Roofline

Topology = Literal["pairs", "pools"]
"""``pairs``: routing units are pair groups of p prefill + d decode instances (P→D inside the group;
one 8-GPU node holds a 1P:1D pair). ``pools``: independent prefill and decode pools; the router picks
a prefill instance, the least-loaded decode instance takes the KV over the network (Dynamo-style)."""


@dataclass(frozen=True)
class FleetTarget:
    """Desired fleet: ``prefill``/``decode`` instance counts (pools), or ``pairs`` groups of ``shape``."""

    prefill: int = 0
    decode: int = 0
    pairs: int | None = None
    shape: tuple[int, int] | None = None
    """(prefill, decode) instances per pair group; None keeps the current shape."""
    need: tuple[float, float] | None = None
    """Work planning's last per-role need (``tandem.core.autoscale.last_work_need``): while groups take a new
    shape, a replacement is kept until the groups left would hold it (``tandem.core.reshape``)."""

    def instances(self, default_shape: tuple[int, int]) -> tuple[int, int]:
        if self.pairs is None:
            return self.prefill, self.decode
        p, d = self.shape or default_shape
        return self.pairs * p, self.pairs * d


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know before the run (identical for every policy)."""

    params: SimParams
    capacity: Roofline
    min_prefill: int
    min_decode: int
    max_instances: int
    """Most instances (both roles) any policy may run."""
    oracle_peak: tuple[int, int]
    """max_t N_p*(t), max_t N_d*(t) of the O0 oracle: B0's sizing input."""
    profile_ratio: float
    """Offline-profile P:D = Σ N_p* / Σ N_d* over the workload (B0, B4, auto pair shape)."""
    initial: tuple[int, int]
    """Warm fleet at t = 0 (prefill, decode): the oracle's need over the first minutes, same for all."""
    mean_context: float
    """Offline-profile mean decode context (tokens) for capacity-at-SLO estimates."""
    capacity_profile: CapacityProfile | None = None
    """The stack's capacity profile measured on the simulator's physics
    (:func:`tandem_lab.sim.profile.planning_profile`):
    what a user declares in ``spec.autoscaling.capacityProfile``; any policy may use it."""
    model_need: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], float] | None = None
    """The planning model's per-window need over the whole run (prefill, decode, window seconds): the future.
    Only C1, the clairvoyant reference (:mod:`.clairvoyant`), reads it; the policies it is compared with may not."""


class ScalingPolicy(Protocol):
    """A scaling policy: called every ``interval_s`` with the current observation."""

    name: str
    topology: Topology
    interval_s: float

    def initial_target(self) -> FleetTarget:
        """The fleet at t = 0 (created Ready, no load charged)."""
        ...

    def decide(self, obs: Observation) -> FleetTarget | None:
        """The desired fleet now, or None to keep it."""
        ...


def unit_shape(ratio: float, max_per_role: int = 16) -> tuple[int, int]:
    """Small-integer (prefill, decode) approximating ``ratio`` = P/D: (round(r), 1) for r ≥ 1, else
    (1, round(1/r)); each within 1..``max_per_role`` (the pool API's per-pair bound). Example: 6.3 → (6, 1)."""
    if ratio >= 1.0:
        return max(1, min(max_per_role, round(ratio))), 1
    return 1, max(1, min(max_per_role, round(1.0 / max(ratio, 1e-9))))
