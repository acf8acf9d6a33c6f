"""The router's load view: its own requests in flight per pair and per engine instance, joined with
what the engines report.

Owns the loads :func:`tandem.routing.select` reads as :class:`~tandem.routing.PairLoad` (vLLM never
answers 429, so a pair is full by the table's admission limits against these loads), and the choice of
instance inside a pair: a prefill instance by the request's key (``tandem.routing.pick_instance``, the
simulator's rule: a conversation keeps to the instance holding its prefix), a decode instance by least in
flight (ties by table order).

A request holds its pair slot from the moment it is admitted until its last decode byte is relayed (or it
fails), so the own counts are what this replica has assigned and not yet finished. The engine view
(:mod:`.scrape`: running, waiting, KV usage, summed over the pair's instances) also sees other replicas'
requests but lags by up to a scrape interval. The join takes the larger of the two views, so a pair is
full when its own counts *or* its engines say so, and a request this replica just admitted counts before
the engines report it, without being counted twice once they do:

- ``queued`` is the engines' (this replica cannot tell which of its requests wait inside an engine);
- ``in_flight`` is the larger of the engines' running count and this replica's holds *minus* that queue,
  because every queued request is one of the holds. Taking both maxima field by field would count a
  queued request twice in the load the bounded-load walk compares (``in_flight + queued``), and a pair
  with a queue would look heavier than the simulator (which counts each request once) sees it.

So ``in_flight + queued`` is ``max(own holds, engine running + engine waiting)``: every request once. A
stale or missing engine view leaves the own counts alone.

Must not: do I/O. Single-threaded (the event loop), so no locks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tandem.routing import Endpoint, Pair, PairLoad, PairState, RoutingTable, WalkBound, pick_instance


def _join(own: PairLoad, engine: PairLoad) -> PairLoad:
    """The larger view, each request counted once (see the module docstring): ``own`` is this replica's holds
    (queued ones included), ``engine`` the scraped running/waiting/KV."""
    queued = max(own.queued, engine.queued)
    return PairLoad(
        in_flight=max(own.in_flight - queued, engine.in_flight, 0),
        queued=queued,
        kv_utilization_percent=max(own.kv_utilization_percent, engine.kv_utilization_percent),
    )


class Loads:
    """In-flight counts per pair (keyed by namespace, pool, pair id) and per instance address."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, str, str], int] = {}
        self._by_table: dict[tuple[str, str], dict[str, int]] = {}
        """The same counts grouped per table, so a decision reads only the loaded pairs."""
        self._instances: dict[str, int] = {}
        self._tables: dict[tuple[str, str, int], int] = {}
        """Holds per (namespace, pool, ``id`` of the table object the request walks): a request whose table
        is no longer live may still pick any pair of that older table (see ``tandem.router.drainreport``)."""

    def for_table(self, table: RoutingTable, engine: Mapping[str, PairLoad] | None = None) -> dict[str, PairLoad]:
        """``pair id → PairLoad`` for ``table``'s loaded pairs (a pair absent is idle, as the algorithm reads
        it): own in-flight counts joined field-wise by maximum with ``engine`` (the scraped view)."""
        own = self._by_table.get((table.namespace, table.pool))
        out: dict[str, PairLoad] = {pid: PairLoad(in_flight=n) for pid, n in own.items()} if own else {}
        if engine:
            for pid, seen in engine.items():
                mine = out.get(pid)
                out[pid] = seen if mine is None else _join(mine, seen)
        return out

    def pair_in_flight(self, table: RoutingTable, pair_id: str) -> int:
        return self._pairs.get((table.namespace, table.pool, pair_id), 0)

    def instance_in_flight(self, address: str) -> int:
        return self._instances.get(address, 0)

    @contextmanager
    def hold_pair(self, table: RoutingTable, pair_id: str) -> Iterator[None]:
        key = (table.namespace, table.pool, pair_id)
        group = self._by_table.setdefault((table.namespace, table.pool), {})
        # id() is safe as a key: the held table object stays referenced (by the request) while held.
        by_table = (table.namespace, table.pool, id(table))
        self._pairs[key] = group[pair_id] = self._pairs.get(key, 0) + 1
        self._tables[by_table] = self._tables.get(by_table, 0) + 1
        try:
            yield
        finally:
            _decrement(self._tables, by_table)
            left = self._pairs[key] - 1
            if left:
                self._pairs[key] = group[pair_id] = left
            else:
                del self._pairs[key]
                del group[pair_id]
                if not group:
                    self._by_table.pop((table.namespace, table.pool), None)

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

    def pick_for_key(self, key: int, endpoints: tuple[Endpoint, ...], load_bound_percent: int) -> str | None:
        """Address of the instance a request with ``key`` enters among ``endpoints`` (a pair's prefill instances):
        ``tandem.routing.pick_instance`` over the ones with an address, hashed by pod name (an address changes
        when a pod restarts, the name does not) and loaded with this replica's holds, so a conversation keeps to
        the instance that holds its prefix; the table's load bound moves a key off an instance carrying more than
        its share. One instance: it. None if none has an address."""
        address = {e.pod: e.address for e in endpoints if e.address is not None}
        if len(address) <= 1:  # the common 1P:1D pair: no walk to build
            return next(iter(address.values()), None)
        units = [Pair(id=pod, index=i, revision="-", state=PairState.SERVING) for i, pod in enumerate(address)]
        loads = {pod: PairLoad(in_flight=self._instances.get(addr, 0)) for pod, addr in address.items()}
        bound = WalkBound(load_bound_percent=load_bound_percent, max_walk=len(units))
        chosen = pick_instance(key, units, loads, bound)
        return None if chosen is None else address[chosen]

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
