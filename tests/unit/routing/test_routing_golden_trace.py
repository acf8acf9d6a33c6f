"""Golden router numbers on the real Mooncake conversation trace (benchmarks.md §2.1).

Setup: 8 (or 32) pairs, each with an **infinite** prefix cache. A request's hit is the longest run of
its leading ``hash_ids`` already in the chosen pair's cache (vLLM's chained-hash semantics); all its
blocks are inserted afterwards. Hits are token-weighted: every block is 512 tokens except the last,
which holds ``input_length - 512·(len(hash_ids) - 1)``. The prefix-hash router here is the
unloaded choice of :func:`tandem.routing.select` (the first candidate); load-dependent walks belong to
the simulator.

Published numbers and the tolerances asserted (the computation is deterministic, so the tolerances
only absorb the rounding of the published values and, for key depth 2, the hash choice that the doc
says the exact load depends on):

| Policy, 8 pairs | published | asserted |
|---|---|---|
| one infinite cache (upper bound) | 37.4 % | 37.4 ± 0.05 % |
| key = first block | 37.4 %, all on one pair | 37.4 ± 0.05 %, max/mean = 8 exactly |
| key = first 2 blocks | ≈ 37 %, max/mean ≈ 1.1 | 36.5 % … bound; max/mean ≤ 1.15 (≤ 1.25 at 32); 7,373 keys |
| round-robin | 13.9 % (7.4 % at 32 pairs) | 13.9 ± 0.1 % (7.4 ± 0.1 %) |
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from tandem.routing import Outcome, PairLoad, WalkBound, candidates, routing_key_from_blocks, select
from tandem_lab.sim.traces import traces_dir
from tests.unit.routing.routing_factories import make_pairs

TRACE = traces_dir() / "mooncake_conversation_trace.jsonl"
BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Request:
    input_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Replay:
    hit_ratio: float
    """Token-weighted local prefix-cache hit ratio."""
    max_over_mean: float
    """Requests on the busiest pair / mean requests per pair."""


@pytest.fixture(scope="module")
def trace() -> list[Request]:
    # The shared traces are part of the workplace, not the repo: missing them is an error, never a skip.
    assert TRACE.exists(), f"trace not found: {TRACE} (set TANDEM_TRACES_DIR)"
    with TRACE.open() as f:
        return [Request(r["input_length"], tuple(r["hash_ids"])) for r in map(json.loads, f)]


def replay(requests: Sequence[Request], n_pairs: int, assign: Callable[[int, Request], int]) -> Replay:
    """Infinite per-pair prefix caches; ``assign(i, request)`` returns a pair index."""
    caches: list[set[int]] = [set() for _ in range(n_pairs)]
    per_pair = [0] * n_pairs
    hit_tokens = total_tokens = 0
    for i, req in enumerate(requests):
        pair = assign(i, req)
        per_pair[pair] += 1
        cache = caches[pair]
        run = 0
        for block in req.hash_ids:
            if block not in cache:
                break
            run += 1
        # Full blocks are 512 tokens; a hit on every block includes the partial last one.
        hit_tokens += BLOCK_TOKENS * run if run < len(req.hash_ids) else req.input_length
        total_tokens += req.input_length
        cache.update(req.hash_ids)
    mean = len(requests) / n_pairs
    return Replay(hit_tokens / total_tokens, max(per_pair) / mean)


def prefix_hash(n_pairs: int, key_blocks: int) -> Callable[[int, Request], int]:
    pairs = make_pairs("speed", n_pairs)
    index = {p.id: p.index for p in pairs}
    bound = WalkBound()

    def assign(_: int, req: Request) -> int:
        key = routing_key_from_blocks(req.hash_ids, key_blocks)
        decision = select(key, pairs, {}, bound)  # idle fleet: the walk stops at the first candidate
        assert decision.outcome is Outcome.ROUTED and decision.walk_length == 1
        assert decision.pair == candidates(key, pairs)[0]
        return index[decision.pair.id]

    return assign


def round_robin(n_pairs: int) -> Callable[[int, Request], int]:
    return lambda i, _: i % n_pairs


def test_golden_trace_shape(trace: list[Request]) -> None:
    assert len(trace) == 12_031
    assert all(r.hash_ids[0] == 0 for r in trace)  # block 0 is shared by every request
    assert len({r.hash_ids[:2] for r in trace}) == 7_373


def test_golden_single_infinite_cache_bound(trace: list[Request]) -> None:
    got = replay(trace, 1, lambda i, r: 0)
    assert got.hit_ratio == pytest.approx(0.374, abs=0.0005)


def test_golden_key_first_block_sends_everything_to_one_pair(trace: list[Request]) -> None:
    got = replay(trace, 8, prefix_hash(8, key_blocks=1))
    assert got.hit_ratio == pytest.approx(0.374, abs=0.0005)
    assert got.max_over_mean == 8.0


@pytest.mark.parametrize(
    ("n_pairs", "want_max_over_mean"),
    [
        pytest.param(8, 1.15, id="8 pairs, published max/mean 1.1"),
        # Not published; 32 pairs get ~376 requests each, so sampling noise alone is ~±5 %.
        pytest.param(32, 1.25, id="32 pairs"),
    ],
)
def test_golden_key_first_two_blocks_keeps_hits_and_balances(
    trace: list[Request], n_pairs: int, want_max_over_mean: float
) -> None:
    bound = replay(trace, 1, lambda i, r: 0).hit_ratio
    got = replay(trace, n_pairs, prefix_hash(n_pairs, key_blocks=2))
    assert 0.365 <= got.hit_ratio <= bound
    assert got.max_over_mean <= want_max_over_mean


@pytest.mark.parametrize(
    ("n_pairs", "want"),
    [pytest.param(8, 0.139, id="8 pairs 13.9 %"), pytest.param(32, 0.074, id="32 pairs 7.4 %")],
)
def test_golden_round_robin_loses_most_hits(trace: list[Request], n_pairs: int, want: float) -> None:
    got = replay(trace, n_pairs, round_robin(n_pairs))
    assert got.hit_ratio == pytest.approx(want, abs=0.001)


def test_golden_idle_loads_equal_missing_loads(trace: list[Request]) -> None:
    pairs = make_pairs("speed", 8)
    idle = {p.id: PairLoad() for p in pairs}
    for req in trace[:500]:
        key = routing_key_from_blocks(req.hash_ids, 2)
        assert select(key, pairs, idle, WalkBound()) == select(key, pairs, {}, WalkBound())
