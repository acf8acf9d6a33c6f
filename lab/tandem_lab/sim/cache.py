"""Prefix caches over 512-token blocks: the local (per prefill instance) cache and the shared Mooncake tier.

What it owns: cache *contents* and hit arithmetic, and the NIC cost of shared-tier transfers.

Semantics (benchmarks.md §3.3, vLLM's chained-hash prefix caching):

- A request's prompt is a list of block ids (``hash_ids``). Its **hit** is the longest run of
  *leading* blocks present in the cache: a missing block 3 makes blocks 4, 5, … useless even if
  present, because a block's KV depends on everything before it.
- **LRU with tail-first eviction.** After a prefill every block of the prompt is inserted (refreshed
  if present) in *reverse* order, so the first block of a prompt is the most recently used and a
  prompt's tail is evicted before its head — as vLLM's free-block queue does. Evicting heads first
  would destroy the whole chain. Hits refresh recency then too (at prefill completion rather than at
  lookup: one pass over the prompt instead of two; they differ only if a hit block is evicted while
  its request waits).
- Token-weighted hits: full blocks count ``block_tokens``; a hit on every block of a prompt counts
  the whole prompt (the last block may be partial).
- ``capacity_blocks=None`` is an infinite cache (a set; used for the §2.1 bounds and goldens).

Shared tier: one LRU of ``stores × segment`` bytes, filled by prefill writes of computed blocks.
Blocks after the local hit are looked up there (again a leading run, starting after the local run).
A hit costs ``bytes / rate`` where the rate is fair-shared at transfer start between the reading
instance's NIC (``nic / (active transfers of that instance + 1)``) and the stores' NICs, across
which Mooncake stripes objects (``stores × store_nic / (all active transfers + 1)``); the smaller
applies. The rate is fixed at the transfer's start (no re-sharing when others finish): a documented
approximation of max-min fairness that costs O(log n) per transfer.

Must not: know about requests, instances or time beyond the transfer bookkeeping.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat, starmap


class PrefixCache:
    """LRU (or infinite) set of block ids with longest-leading-run lookups."""

    __slots__ = ("_lru", "_set", "capacity_blocks", "evictions")

    def __init__(self, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._set: set[int] = set()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._set) if self.capacity_blocks is None else len(self._lru)

    def __contains__(self, block: int) -> bool:
        return block in self._set if self.capacity_blocks is None else block in self._lru

    def leading_run(self, blocks: Sequence[int], start: int = 0) -> int:
        """Number of consecutive blocks present from index ``start`` (no recency change).

        Block ids are chained (a block's id stands for its whole prefix), so presence along a prompt is
        prefix-closed in an infinite cache, and in an LRU one too as long as no block was evicted from
        the middle of a run (tail-first eviction makes that rare): the run is found by exponential +
        binary search, O(log n) lookups instead of n. :meth:`leading_run_exact` scans linearly.
        """
        store = self._set if self.capacity_blocks is None else self._lru
        n = len(blocks)
        if start >= n or blocks[start] not in store:
            return 0
        # invariant: blocks[start + lo - 1] present; blocks[start + hi] absent or hi = n - start
        lo, step = 1, 1
        hi = n - start
        while lo < hi:
            probe = min(lo + step, hi)
            if blocks[start + probe - 1] in store:
                lo = probe
                step *= 2
            else:
                hi = probe - 1
                break
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[start + mid - 1] in store:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def leading_run_exact(self, blocks: Sequence[int], start: int = 0) -> int:
        """Linear scan version of :meth:`leading_run` (tests compare the two)."""
        store = self._set if self.capacity_blocks is None else self._lru
        n = len(blocks)
        i = start
        while i < n and blocks[i] in store:
            i += 1
        return i - start

    def lookup(self, blocks: Sequence[int], start: int = 0) -> int:
        """:meth:`leading_run`. Recency of the hit blocks is refreshed when the prompt's blocks are
        (re)inserted after its prefill (:meth:`insert`), which every hit is followed by."""
        return self.leading_run(blocks, start)

    def insert(self, blocks: Sequence[int], start: int = 0, present: int = 0) -> None:
        """Insert (or refresh) ``blocks[start:]`` tail first, then evict least recently used blocks.

        ``present`` is a hint: ``blocks[start:start + present]`` were found by a lookup, so they are
        refreshed in one C-level pass (falling back to the checked loop if one was evicted since).
        """
        if self.capacity_blocks is None:
            self._set.update(blocks[start:] if start else blocks)
            return
        lru = self._lru
        move = lru.move_to_end
        head_end = min(len(blocks), start + present)
        # the tail, last block first: each present block moves to the end, each new one is appended. Popping
        # them all and re-adding in that order ends in the same order (a prompt's chained ids are distinct),
        # in two C-level passes instead of a Python loop over every block of a long prompt
        tail = blocks[head_end:][::-1]
        deque(map(lru.pop, tail, repeat(None)), maxlen=0)
        lru.update(zip(tail, repeat(None)))
        if head_end > start:
            head = blocks[start:head_end]
            try:
                deque(map(move, reversed(head)), maxlen=0)
            except KeyError:
                for b in reversed(head):
                    if b in lru:
                        move(b)
                    else:
                        lru[b] = None
        excess = len(lru) - self.capacity_blocks
        if excess > 0:
            deque(starmap(lru.popitem, repeat((False,), excess)), maxlen=0)
            self.evictions += excess

    def clear(self) -> None:
        self._lru.clear()
        self._set.clear()


def hit_tokens(run: int, n_blocks: int, input_tokens: int, block_tokens: int) -> int:
    """Token-weighted hit of a ``run``-block leading hit on a prompt of ``n_blocks`` blocks."""
    if run >= n_blocks:
        return input_tokens
    return run * block_tokens


class NicModel:
    """Fair-share transfer times on instance NICs and the shared tier's store NICs (see module docstring)."""

    __slots__ = ("_active", "_all", "bytes_moved", "nic_bandwidth", "store_bandwidth")

    def __init__(self, nic_bandwidth: float, store_bandwidth: float) -> None:
        self.nic_bandwidth = nic_bandwidth
        self.store_bandwidth = store_bandwidth
        self._active: dict[int, list[float]] = {}
        self._all: list[float] = []
        self.bytes_moved = 0.0

    def transfer(self, reader: int, nbytes: float, now: float) -> float:
        """Start a transfer of ``nbytes`` from the stores to instance ``reader`` at ``now``; its duration."""
        if nbytes <= 0:
            return 0.0
        mine = self._active.setdefault(reader, [])
        while mine and mine[0] <= now:
            heapq.heappop(mine)
        everyone = self._all
        while everyone and everyone[0] <= now:
            heapq.heappop(everyone)
        rate = min(self.nic_bandwidth / (len(mine) + 1), self.store_bandwidth / (len(everyone) + 1))
        duration = nbytes / rate
        heapq.heappush(mine, now + duration)
        heapq.heappush(everyone, now + duration)
        self.bytes_moved += nbytes
        return duration

    def forget(self, reader: int) -> None:
        """Drop the bookkeeping of a deleted instance."""
        self._active.pop(reader, None)
