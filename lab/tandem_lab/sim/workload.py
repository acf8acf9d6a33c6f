"""The workload container: requests as columns (numpy arrays), prompts as slices of a shared block array.

What it owns: the in-memory form every arrival source produces (Mooncake traces, the agentic-session
generator, scenario transforms) and the engine, the oracle and the reports consume.

Layout: request ``i`` arrives at ``arrival_s[i]`` (sorted ascending), asks ``input_tokens[i]`` prompt and
``output_tokens[i]`` output tokens; its ``hash_ids`` are ``blocks[block_start[i] : block_start[i] +
block_count[i]] + id_offset[i]``, followed by ``tail_id[i] + id_offset[i]`` when ``tail_id[i] >= 0``
(a partial last block unique to the request, used by the generator). Sharing the block array is what
keeps a week of agentic sessions in memory: every step of a session is a prefix slice of that
session's block run. ``id_offset`` gives prefix-root copies disjoint id spaces without copying blocks.

Must not: hold Python objects per request (memory), or mutate arrays after construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tandem.routing import routing_key_from_blocks

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U64 = npt.NDArray[np.uint64]

BLOCK_TOKENS = 512
COPY_ID_STRIDE = 1 << 40
"""Id-space stride between prefix-root copies (trace ids are < 2**40)."""


@dataclass
class Workload:
    """Requests as columns; see the module docstring for the block layout."""

    name: str
    arrival_s: F64
    input_tokens: I64
    output_tokens: I64
    block_start: I64
    block_count: I64
    tail_id: I64
    id_offset: I64
    blocks: I64
    prefix_key: U64 | None = None
    """Routing key per request when the source models one (the generator's family + first message)."""
    session: I64 | None = None
    bound_hit_blocks: I64 | None = None
    """Leading blocks each request finds in one infinite cache fed in arrival order, when the source
    knows it by construction (the generator); else computed by :func:`infinite_cache_hits`."""
    duration_s: float = 0.0
    """Horizon of the run (≥ last arrival)."""
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("input_tokens", "output_tokens", "block_start", "block_count", "tail_id", "id_offset"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected {n}")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrival_s must be sorted")
        if self.duration_s <= 0 and n:
            self.duration_s = float(self.arrival_s[-1]) + 1.0

    def __len__(self) -> int:
        return len(self.arrival_s)

    def hash_ids(self, i: int) -> list[int]:
        """The prompt's block ids (Python ints)."""
        s = int(self.block_start[i])
        ids = self.blocks[s : s + int(self.block_count[i])]
        off = int(self.id_offset[i])
        out: list[int] = (ids + off).tolist() if off else ids.tolist()
        tail = int(self.tail_id[i])
        if tail >= 0:
            out.append(tail + off)
        return out

    def n_blocks(self, i: int) -> int:
        return int(self.block_count[i]) + (1 if self.tail_id[i] >= 0 else 0)

    def routing_keys(self, mode: str, key_blocks: int) -> list[int]:
        """Routing key per request: ``prefix-key`` (the generator's), ``blocks`` (first ``key_blocks`` ids)
        or ``auto`` (prefix key when present)."""
        if mode == "prefix-key" or (mode == "auto" and self.prefix_key is not None):
            if self.prefix_key is None:
                raise ValueError(f"workload {self.name} has no prefix_key")
            return [int(k) for k in self.prefix_key.tolist()]
        cache: dict[tuple[int, ...], int] = {}
        keys: list[int] = []
        for i in range(len(self)):
            s = int(self.block_start[i])
            n = min(key_blocks, int(self.block_count[i]))
            head = tuple((self.blocks[s : s + n] + int(self.id_offset[i])).tolist())
            if n < key_blocks and self.tail_id[i] >= 0:
                head = (*head, int(self.tail_id[i]) + int(self.id_offset[i]))
            key = cache.get(head)
            if key is None:
                key = routing_key_from_blocks(head, key_blocks)
                cache[head] = key
            keys.append(key)
        return keys

    def totals(self) -> dict[str, int]:
        return {
            "requests": len(self),
            "input_tokens": int(self.input_tokens.sum()),
            "output_tokens": int(self.output_tokens.sum()),
        }

    def select(self, mask: npt.NDArray[np.bool_], name: str | None = None) -> Workload:
        """Rows where ``mask`` holds (blocks are shared, not copied)."""
        return Workload(
            name=name or self.name,
            arrival_s=self.arrival_s[mask],
            input_tokens=self.input_tokens[mask],
            output_tokens=self.output_tokens[mask],
            block_start=self.block_start[mask],
            block_count=self.block_count[mask],
            tail_id=self.tail_id[mask],
            id_offset=self.id_offset[mask],
            blocks=self.blocks,
            prefix_key=None if self.prefix_key is None else self.prefix_key[mask],
            session=None if self.session is None else self.session[mask],
            bound_hit_blocks=None,
            duration_s=self.duration_s,
            meta=dict(self.meta),
        )

    def with_arrivals(self, arrival_s: F64, name: str | None = None) -> Workload:
        """Same requests with new arrival times (re-sorted stably)."""
        order = np.argsort(arrival_s, kind="stable")
        return Workload(
            name=name or self.name,
            arrival_s=arrival_s[order],
            input_tokens=self.input_tokens[order],
            output_tokens=self.output_tokens[order],
            block_start=self.block_start[order],
            block_count=self.block_count[order],
            tail_id=self.tail_id[order],
            id_offset=self.id_offset[order],
            blocks=self.blocks,
            prefix_key=None if self.prefix_key is None else self.prefix_key[order],
            session=None if self.session is None else self.session[order],
            bound_hit_blocks=None,
            duration_s=max(self.duration_s, float(arrival_s.max()) + 1.0 if len(arrival_s) else 0.0),
            meta=dict(self.meta),
        )


def infinite_cache_hits(workload: Workload, block_tokens: int = BLOCK_TOKENS) -> tuple[I64, I64]:
    """Per request (hit blocks, hit tokens) against one infinite cache fed in arrival order.

    This is the §2.1 bound (and the oracle's hit model): the best any router can do. Uses
    ``workload.bound_hit_blocks`` when the source provides it.
    """
    if workload.bound_hit_blocks is not None:
        hb0 = workload.bound_hit_blocks.astype(np.int64)
        nb = workload.block_count + (workload.tail_id >= 0)
        ht0 = np.where(hb0 >= nb, workload.input_tokens, hb0 * block_tokens).astype(np.int64)
        return hb0, ht0
    seen: set[int] = set()
    n = len(workload)
    hb = np.zeros(n, dtype=np.int64)
    ht = np.zeros(n, dtype=np.int64)
    for i in range(n):
        ids = workload.hash_ids(i)
        run = 0
        for b in ids:
            if b not in seen:
                break
            run += 1
        hb[i] = run
        ht[i] = int(workload.input_tokens[i]) if run >= len(ids) else run * block_tokens
        seen.update(ids)
    return hb, ht
