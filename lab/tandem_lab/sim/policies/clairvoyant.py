"""C1, the clairvoyant reference: what an autoscaler that knew the future could do in this simulator.

What it owns: one reference policy, not a baseline of another system and not a candidate for the
product. It reads the planning model's per-window need over the *whole* run (``PolicyContext.model_need``,
which no other policy reads) and holds, per role,

    N_role(t) = ⌈H × max{ N*_role(t') : t ≤ t' ≤ t + lead }⌉

on independent pools (B0's topology), re-evaluated every ``interval_s``. ``lead`` defaults to the slowest
load (scheduling delay + the slowest load kind with a positive weight), so every instance it asks for is
Ready before the window that needs it, whatever load it draws. ``H`` is ``policies.clairvoyant_headroom``
(decode may take its own, ``policies.clairvoyant_decode_headroom``, to try other splits of the same GPU-hours).

Why it exists: issue 18 asks for ≥ 99 % attainment at ≤ 1.3 × the model O1. B0 answers what a fleet that
never moves can do; C1 answers what a fleet that moves perfectly on time can do: the forecast is exact and
the lead covers every load, so what it misses is what the planning model's need (× H) cannot hold, not
lateness. Where C1 misses a target at every headroom up to a price, a policy that sizes from the planning
model does not reach it at that price by forecasting better (it could by sizing differently: routing, another
split of the roles). It pays for its lead (instances are created up to ``lead`` early and drained when the need
falls), as a real fleet would.
"""

from __future__ import annotations

import math

import numpy as np

from tandem_lab.sim.metrics import Observation
from tandem_lab.sim.oracle import max_load_s
from tandem_lab.sim.policies.base import FleetTarget, PolicyContext, Topology

INTERVAL_S = 30.0
"""Tandem's evaluation interval: C1 differs from it in what it knows, not in how often it acts."""


class Clairvoyant:
    """C1: the planning model's future need × H, ``lead`` ahead, on independent pools."""

    name = "C1-clairvoyant"
    topology: Topology = "pools"
    interval_s = INTERVAL_S

    def __init__(self, ctx: PolicyContext) -> None:
        if ctx.model_need is None:
            raise ValueError("C1 needs the planning model's per-window need (PolicyContext.model_need)")
        n_p, n_d, window_s = ctx.model_need
        pol = ctx.params.policies
        slowest = ctx.params.lifecycle.schedule_delay_s + max_load_s(ctx.params)
        self.lead_s = pol.clairvoyant_lead_s if pol.clairvoyant_lead_s is not None else slowest
        h_d = pol.clairvoyant_decode_headroom
        self.headroom = (pol.clairvoyant_headroom, pol.clairvoyant_headroom if h_d is None else h_d)
        self.window_s = window_s
        self._floors = (ctx.min_prefill, ctx.min_decode)
        self._need = (np.asarray(n_p, dtype=np.float64), np.asarray(n_d, dtype=np.float64))

    def _target(self, now: float) -> FleetTarget:
        """The largest need from ``now`` to ``now + lead + interval`` (the next decision comes one interval on).
        Past the run's last window (requests still finishing) it keeps that window's need."""
        first = min(max(0, int(now // self.window_s)), len(self._need[0]) - 1)
        last = math.ceil((now + self.lead_s + self.interval_s) / self.window_s)
        counts = []
        for need, floor, h in zip(self._need, self._floors, self.headroom, strict=True):
            peak = float(need[first : max(first + 1, last)].max())  # never empty: first is a valid window
            counts.append(max(floor, math.ceil(h * peak - 1e-9)))
        return FleetTarget(prefill=counts[0], decode=counts[1])

    def initial_target(self) -> FleetTarget:
        return self._target(0.0)

    def decide(self, obs: Observation) -> FleetTarget | None:
        return self._target(obs.now)
