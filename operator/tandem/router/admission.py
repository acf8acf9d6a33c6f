"""The router's own load view: requests in flight per pair and per engine instance.

Owns the counts :func:`tandem.routing.select` reads as :class:`~tandem.routing.PairLoad` (vLLM never
answers 429, so a pair is full by the table's admission limits against these counts), and the choice of
instance inside a pair (least in flight, ties by table order).

A request holds its pair slot from the moment it is admitted until its last decode byte is relayed (or it
fails), so the counts are what this replica has assigned and not yet finished. Each replica counts only
its own requests: the contract of the algorithm (``docs/design/005-routing.md``). Engine metrics
(running/waiting/KV usage) are not scraped yet; ``queued`` is therefore 0 and KV usage 0.

Must not: do I/O. Single-threaded (the event loop), so no locks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tandem.routing import NO_LOAD, Endpoint, PairLoad, RoutingTable


class Loads:
    """In-flight counts per pair (keyed by namespace, pool, pair id) and per instance address."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, str, str], int] = {}
        self._instances: dict[str, int] = {}

    def for_table(self, table: RoutingTable, extra: Mapping[str, PairLoad] | None = None) -> dict[str, PairLoad]:
        """``pair id → PairLoad`` for ``table``'s pairs; ``extra`` overrides some (pairs found full this walk)."""
        out: dict[str, PairLoad] = {}
        for pair in table.pairs:
            n = self._pairs.get((table.namespace, table.pool, pair.id), 0)
            out[pair.id] = PairLoad(in_flight=n) if n else NO_LOAD
        if extra:
            out.update(extra)
        return out

    def pair_in_flight(self, table: RoutingTable, pair_id: str) -> int:
        return self._pairs.get((table.namespace, table.pool, pair_id), 0)

    def instance_in_flight(self, address: str) -> int:
        return self._instances.get(address, 0)

    @contextmanager
    def hold_pair(self, table: RoutingTable, pair_id: str) -> Iterator[None]:
        key = (table.namespace, table.pool, pair_id)
        self._pairs[key] = self._pairs.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._pairs[key] - 1
            if left:
                self._pairs[key] = left
            else:
                del self._pairs[key]

    @contextmanager
    def hold_instance(self, address: str) -> Iterator[None]:
        self._instances[address] = self._instances.get(address, 0) + 1
        try:
            yield
        finally:
            left = self._instances[address] - 1
            if left:
                self._instances[address] = left
            else:
                del self._instances[address]

    def pick(self, endpoints: tuple[Endpoint, ...]) -> str | None:
        """Address of the least-loaded instance with an address (ties: table order); None if none has one."""
        best: str | None = None
        best_n = 0
        for endpoint in endpoints:
            if endpoint.address is None:
                continue
            n = self._instances.get(endpoint.address, 0)
            if best is None or n < best_n:
                best, best_n = endpoint.address, n
        return best
