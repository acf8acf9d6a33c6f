"""How big the shared KV tier (Mooncake) must be for a workload: hits and the TTFT ceiling by tier size.

Why: the fleet benchmark's misses that no fleet size removes are *cache* misses (``oracle.ttft_miss_causes``):
requests that are SLO-feasible with the infinite cache's hits, but whose own prefill, with the hits the fleet
really got, is over budget. On W1 at the shipped tier (16 × 1 TiB stores at fleet scale, one at a 5 % run) they
were two thirds of what a static fleet at twice the peak still missed, and their earlier copies were 95–1,030 s
back (p10–p90) while the tier held about three minutes of the trace's unique prefixes. The tier's size, not
the autoscaler, sets that ceiling; this module measures it for any workload, so an operator can size the
``MooncakeCache`` from their own trace before buying capacity to chase it.

What it owns (pure, no clock, no randomness): :func:`tier_hits`, one LRU shared tier fed with every request in
arrival order (lookup the prompt's leading run, then insert its blocks tail first: the simulator's shared tier,
:class:`~tandem_lab.sim.cache.PrefixCache`, without the local tiers in front of it), and :func:`tier_curve`,
that for several multiples of the configured tier. Each point gives the token-weighted hit share, the tier's
horizon (how many seconds of the workload's unique blocks it holds), and the **TTFT ceiling**: the share of the
infinite-cache SLO-feasible requests whose prefill floor (``oracle.request_floors`` with these hits) still fits
their budget. A fleet whose requests all read this one tier cannot beat that share on TTFT; local caches in
front of the tier can add hits the tier evicted, so a real fleet may land a little above it, and its queues
below.

Must not: know about instances, policies or time beyond arrival order.

Worked example: three requests of one 4-block prompt at t = 0, 10 and 400 s and 2,000 other blocks between
the second and the third; a tier of 1,000 blocks gives the second request all its blocks and the third none
(evicted), a tier of 4,096 gives both: hit shares 1/3 and 2/3 of the prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tandem_lab.sim.cache import PrefixCache, hit_tokens
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.oracle import request_floors
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.workload import Workload

DEFAULT_MULTIPLES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True, slots=True)
class TierPoint:
    """One tier size and what it gives this workload."""

    multiple: float
    """Of the configured tier (``shared_tier.segment_bytes`` × its stores at this run's scale)."""
    run_bytes: float
    """Tier bytes at the run's scale (what the simulator's runs hold)."""
    fleet_bytes: float
    """The same tier at the fleet's scale (``shared_tier.stores`` stores): what to declare in a MooncakeCache."""
    hit_share: float
    """Token-weighted share of prompt tokens found in the tier."""
    horizon_s: float
    """Seconds of the workload's unique blocks the tier holds (capacity ÷ unique blocks per second)."""
    ttft_ceiling: float
    """Share of the infinite-cache SLO-feasible requests still feasible with these hits."""


@dataclass(frozen=True, slots=True)
class TierCurve:
    points: tuple[TierPoint, ...]
    infinite_hit_share: float
    feasible_requests: int
    """SLO-feasible requests under the infinite cache (the ceiling's denominator)."""
    unique_blocks: int
    duration_s: float

    def smallest(self, ceiling: float) -> TierPoint | None:
        """The smallest tier whose TTFT ceiling reaches ``ceiling`` (0–1), if any measured does."""
        return next((p for p in self.points if p.ttft_ceiling >= ceiling), None)


def tier_hits(workload: Workload, capacity_blocks: int, block_tokens: int) -> npt.NDArray[np.int64]:
    """Each request's hit tokens in one LRU tier of ``capacity_blocks`` fed with every request in arrival order."""
    cache = PrefixCache(capacity_blocks)
    out = np.zeros(len(workload), dtype=np.int64)
    for i in range(len(workload)):
        blocks = workload.hash_ids(i)
        run = cache.lookup(blocks)
        out[i] = hit_tokens(run, len(blocks), int(workload.input_tokens[i]), block_tokens)
        cache.insert(blocks, 0, run)
    return out


def tier_curve(
    workload: Workload,
    params: SimParams,
    cap: Roofline,
    rate_scale: float,
    multiples: Sequence[float] = DEFAULT_MULTIPLES,
) -> TierCurve:
    """:class:`TierPoint` for each multiple of the configured tier (module docstring), smallest first."""
    if not multiples or any(m <= 0 for m in multiples):
        raise ValueError("tier multiples must be > 0")
    st = params.shared_tier
    bt = params.generator.block_tokens
    block_bytes = bt * params.model.kv_bytes_per_token
    run_bytes = st.stores_at(rate_scale) * st.segment_bytes
    fleet_bytes = st.stores * st.segment_bytes
    prompt_tokens = float(workload.input_tokens.sum())
    unique = len({b for i in range(len(workload)) for b in workload.hash_ids(i)})
    duration = max(float(workload.duration_s), 1e-9)
    base = request_floors(workload, params, cap)
    feasible = base.feasible
    n_feasible = int(feasible.sum())
    points = []
    for m in sorted(multiples):
        blocks = int(m * run_bytes / block_bytes)
        hits = tier_hits(workload, blocks, bt)
        floors = request_floors(workload, params, cap, hit_tokens=hits)
        kept = int((feasible & floors.feasible).sum())
        points.append(
            TierPoint(
                multiple=m,
                run_bytes=m * run_bytes,
                fleet_bytes=m * fleet_bytes,
                hit_share=float(hits.sum()) / prompt_tokens if prompt_tokens else 0.0,
                horizon_s=blocks / (unique / duration) if unique else float("inf"),
                ttft_ceiling=kept / n_feasible if n_feasible else 1.0,
            )
        )
    return TierCurve(
        points=tuple(points),
        infinite_hit_share=float(base.hit_tokens.sum()) / prompt_tokens if prompt_tokens else 0.0,
        feasible_requests=n_feasible,
        unique_blocks=unique,
        duration_s=float(workload.duration_s),
    )
