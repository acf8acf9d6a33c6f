"""Convergence at the level of counts: the next moves toward per-revision pair targets.

What it owns, all pure: given each revision's target (from ``tandem.core.rollout.plan_rollout``), its
live and Ready pair counts and the pool's bounds (``replicas``, ``maxSurge``, ``maxUnavailable``),
:func:`next_moves` says how many pairs of which revision to delete, create and drain this pass, in which
order and with which preference. ``tandem.core.plan`` turns the moves into pods (placement picks nodes and
indexes, builders write the pods); the simulator turns them into pair groups. Both run this one decision,
in the style of LeaderWorkerSet's DisaggregatedSet planner, so a benchmark measures the rules the
operator runs.

The rules, in the order they apply:

1. **Not-Ready excess goes first**: a revision above its target loses its not-Ready pairs before any
   other (they carry no traffic), highest index first. A revision that is not targeted at all has
   target 0.
2. **Creates within the surge bound**: short revisions get new pairs while live pairs stay below
   ``replicas + maxSurge``; the revision with the largest target first (on a rollback, stable's pairs
   are created before the canary's), then by name.
3. **Ready excess drains within the unavailable bound**: a revision still above its target drains Ready
   pairs, highest index first, while the Ready pairs of all revisions stay at least
   ``replicas − maxUnavailable``. Pairs created this pass do not count: they are not Ready yet.

Placement may refuse a create (no GPUs, or GPUs come back when drains finish). The caller then stops
creating that revision; the room it left (:attr:`Moves.create_room` less the pairs placed) stays
available to the next revision in :attr:`Moves.wanted` order, as ``core.plan`` always did.

Must not: see pods, nodes, indexes or time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tandem.core.rollout import RevisionCounts

T = TypeVar("T")


@dataclass(frozen=True)
class Bounds:
    """The pool's convergence bounds (``spec.pairs.replicas``, ``spec.rollout.maxSurge/maxUnavailable``)."""

    replicas: int
    max_surge: int
    max_unavailable: int

    @property
    def ceiling(self) -> int:
        """Live pairs never exceed this: creates stop here."""
        return self.replicas + self.max_surge

    @property
    def floor(self) -> int:
        """Ready pairs never drain below this."""
        return max(0, self.replicas - self.max_unavailable)


@dataclass(frozen=True)
class Moves:
    """One pass's moves, per revision. Each tuple lists ``(revision, pairs)`` with pairs > 0."""

    delete_unready: tuple[tuple[str, int], ...] = ()
    """Not-Ready pairs to delete, highest index first (rule 1); by revision name."""
    wanted: tuple[tuple[str, int], ...] = ()
    """Each short revision's shortfall, in creation order (rule 2); see :attr:`creates` for the bounded counts."""
    create_room: int = 0
    """Pairs that may be created this pass in all: ``replicas + maxSurge`` − live pairs after rule 1."""
    drain_ready: tuple[tuple[str, int], ...] = ()
    """Ready pairs to drain, highest index first (rule 3); by revision name."""

    @property
    def creates(self) -> tuple[tuple[str, int], ...]:
        """Pairs to create per revision, in order, when every create is placed: :attr:`create_room` handed
        out along :attr:`wanted`. Example: room 1, wanted (stable 2, canary 1) → (stable 1)."""
        out: list[tuple[str, int]] = []
        room = self.create_room
        for rev, n in self.wanted:
            take = min(n, room)
            if take > 0:
                out.append((rev, take))
                room -= take
        return tuple(out)

    @property
    def empty(self) -> bool:
        """Nothing to do: the counts already meet the targets, or the bounds allow no move."""
        return not (self.delete_unready or self.creates or self.drain_ready)


def creation_order(targets: Mapping[str, int]) -> list[str]:
    """Revisions in the order their pairs are created: the largest target first, then by name."""
    if not targets:
        return []
    first = min(targets, key=lambda r: (-targets[r], r))
    return sorted(targets, key=lambda r: (r != first, r))


def next_moves(targets: Mapping[str, int], counts: Mapping[str, RevisionCounts], bounds: Bounds) -> Moves:
    """The moves that bring ``counts`` (live and Ready pairs per revision, draining pairs excluded) toward
    ``targets`` within ``bounds`` (module docstring: rules 1-3).

    Example: targets stable 3, canary 1; counts stable 3 live/3 Ready; replicas 3, maxSurge 1,
    maxUnavailable 0 → create 1 canary, drain nothing (3 Ready is the floor). The next pass, canary 1
    Ready: nothing to do. With maxSurge 0 and maxUnavailable 1 (targets stable 2, canary 1) the first pass
    instead drains 1 stable and creates nothing (3 live is the ceiling); the pass after creates the canary.
    """
    full = dict(targets)
    for rev in counts:
        full.setdefault(rev, 0)
    live = {rev: counts.get(rev, RevisionCounts()).live for rev in full}
    ready = {rev: min(counts.get(rev, RevisionCounts()).ready, live[rev]) for rev in full}

    delete_unready: list[tuple[str, int]] = []
    for rev in sorted(full):
        n = min(max(0, live[rev] - full[rev]), live[rev] - ready[rev])
        if n > 0:
            delete_unready.append((rev, n))
            live[rev] -= n

    wanted = [(rev, full[rev] - live[rev]) for rev in creation_order(full) if full[rev] > live[rev]]
    room = max(0, bounds.ceiling - sum(live.values()))

    ready_total = sum(ready.values())
    drain_ready: list[tuple[str, int]] = []
    for rev in sorted(full):
        # After rule 1 a revision still above its target has only Ready pairs left.
        n = min(max(0, live[rev] - full[rev]), max(0, ready_total - bounds.floor))
        if n > 0:
            drain_ready.append((rev, n))
            ready_total -= n
    return Moves(tuple(delete_unready), tuple(wanted), room, tuple(drain_ready))


def highest_first(items: Iterable[T], n: int, index: Callable[[T], int | tuple[bool, int]]) -> list[T]:
    """The ``n`` items with the highest ``index`` (the pairs a move takes: the newest indexes go first; the planner's
    key puts groups off the pool's P:D first, ``tandem.core.reshape.drain_order``)."""
    return sorted(items, key=index, reverse=True)[: max(0, n)]


__all__ = ["Bounds", "Moves", "creation_order", "highest_first", "next_moves"]
