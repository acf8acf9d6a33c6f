"""W1 goldens (benchmarks.md §2.1, §6): the simulator's own caches and router reproduce the trace bounds.

- One infinite cache fed in arrival order reproduces 36.6 % / 64.0 % of blocks (37.4 % / 65.1 % of
  tokens) for the conversation / synthetic traces — through :class:`PrefixCache`, and through the engine
  with a single prefill instance.
- At the instance level, 8 prefill instances with infinite caches behind ``tandem.routing`` (no load
  effect: the first candidate) give the §2.1 router goldens: key = first block → one hot instance with
  every hit; key = first 2 blocks ≈ 37 % hits spread with max/mean ≤ 1.15; round-robin 13.9 %.
"""

from __future__ import annotations

import numpy as np
import pytest

from tandem_lab.sim.cache import PrefixCache
from tandem_lab.sim.config import SimParams, load_params
from tandem_lab.sim.policies.base import FleetTarget
from tandem_lab.sim.traces import CONVERSATION, SYNTHETIC, load_trace
from tandem_lab.sim.workload import Workload, infinite_cache_hits
from tests.sim.simhelpers import simulate, trace_file


def _replay(wl: Workload) -> tuple[float, float]:
    cache = PrefixCache(None)
    hit_blocks = blocks = hit = total = 0
    for i in range(len(wl)):
        ids = wl.hash_ids(i)
        run = cache.lookup(ids)
        hit_blocks += run
        blocks += len(ids)
        hit += int(wl.input_tokens[i]) if run == len(ids) else 512 * run
        total += int(wl.input_tokens[i])
        cache.insert(ids)
    return hit_blocks / blocks, hit / total


@pytest.mark.parametrize(
    ("name", "want_blocks", "want_tokens"),
    [
        pytest.param(CONVERSATION, 0.366, 0.374, id="conversation 36.6 %"),
        pytest.param(SYNTHETIC, 0.640, 0.651, id="synthetic 64.0 %"),
    ],
)
def test_one_infinite_cache_reproduces_published_bounds(name: str, want_blocks: float, want_tokens: float) -> None:
    wl = load_trace(trace_file(name))
    blocks, tokens = _replay(wl)
    assert round(blocks, 3) == want_blocks
    assert round(tokens, 3) == want_tokens


def _fast_params() -> SimParams:
    """Prefill as good as instant and no load effect: the goldens take the first candidate in arrival order."""
    return load_params(
        overrides={
            "hardware": {"fp8_flops": 1e30, "bf16_flops": 1e30},
            "instance": {"prefill_overhead_s": 0.0},
            "network": {"router_rtt_s": 0.0},
            "router": {"load_bound_percent": 100_000, "max_walk": 1},
            "admission": {"max_in_flight": 4096, "max_queued": 4096},
            "shared_tier": {"enabled": False},
        }
    )


@pytest.fixture(scope="module")
def conversation() -> Workload:
    # File order, as the published goldens: with prefill this fast a request's blocks are cached at its own
    # arrival time, so requests of one 3 s tick see each other in file order, as in a sequential replay.
    return load_trace(trace_file(CONVERSATION))


def test_engine_with_one_infinite_cache_reproduces_the_bound(conversation: Workload) -> None:
    wl = conversation
    _, res = simulate(
        wl,
        FleetTarget(prefill=1, decode=4),
        params=_fast_params(),
        infinite_cache=True,
        keys=wl.routing_keys("blocks", 2),
    )
    _, want = infinite_cache_hits(wl)
    assert res.local_tokens.sum() == pytest.approx(want.sum(), rel=1e-3)
    assert res.local_tokens.sum() / wl.input_tokens.sum() == pytest.approx(0.374, abs=0.001)


@pytest.mark.parametrize(
    ("router", "key_blocks", "want_hits", "want_max_over_mean"),
    [
        pytest.param("prefix-hash", 1, (0.373, 0.375), (8.0, 8.0), id="key = first block: one hot instance"),
        pytest.param("prefix-hash", 2, (0.365, 0.375), (1.0, 1.15), id="key = first 2 blocks"),
        pytest.param("round-robin", 1, (0.138, 0.140), (1.0, 1.001), id="round-robin"),
    ],
)
def test_router_goldens_at_instance_level(
    conversation: Workload,
    router: str,
    key_blocks: int,
    want_hits: tuple[float, float],
    want_max_over_mean: tuple[float, float],
) -> None:
    wl = conversation
    keys = wl.routing_keys("blocks", key_blocks)
    _, res = simulate(
        wl, FleetTarget(prefill=8, decode=8), params=_fast_params(), router=router, keys=keys, infinite_cache=True
    )
    hits = res.local_tokens.sum() / wl.input_tokens.sum()
    assert want_hits[0] <= hits <= want_hits[1]
    counts = np.bincount(res.unit, minlength=8)
    assert len(counts) == 8 and (res.unit >= 0).all()
    assert want_max_over_mean[0] <= counts.max() / counts.mean() <= want_max_over_mean[1]
