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
from typing import Any

from tandem.routing import NO_LOAD, Endpoint, PairLoad, RoutingTable


class Loads:
    """In-flight counts per pair (keyed by namespace, pool, pair id) and per instance address."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, str, str], int] = {}
        self._instances: dict[str, int] = {}
        self._tables: dict[tuple[str, str, int], int] = {}
        """Holds per (namespace, pool, ``id`` of the table object the request walks): a request whose table
        is no longer live may still pick any pair of that older table (see ``tandem.router.drainreport``)."""

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
        # id() is safe as a key: the held table object stays referenced (by the request) while held.
        by_table = (table.namespace, table.pool, id(table))
        self._pairs[key] = self._pairs.get(key, 0) + 1
        self._tables[by_table] = self._tables.get(by_table, 0) + 1
        try:
            yield
        finally:
            _decrement(self._pairs, key)
            _decrement(self._tables, by_table)

    def open_streams(self) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str, int], int]]:
        """Copies of (holds per pair, holds per table object), for the drain report.

        ``dict(d)`` of a plain dict is one C call under the GIL, so the health thread may take the copies
        while the event loop changes the counts.
        """
        return dict(self._pairs), dict(self._tables)

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


def _decrement(counts: dict[Any, int], key: Any) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
