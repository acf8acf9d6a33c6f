"""``core.converge.next_moves``: the count-level moves toward per-revision pair targets (rules 1-3 of the
module docstring), with the surge and unavailable bounds at their edges; ``highest_first``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tandem.core.converge import Bounds, Moves, creation_order, highest_first, next_moves
from tandem.core.rollout import RevisionCounts

Counts = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Case:
    id: str
    targets: dict[str, int]
    counts: Counts
    bounds: Bounds
    delete_unready: tuple[tuple[str, int], ...] = ()
    creates: tuple[tuple[str, int], ...] = ()
    drain_ready: tuple[tuple[str, int], ...] = ()
    wanted: tuple[tuple[str, int], ...] | None = field(default=None)
    """Only checked when given (differs from ``creates`` when the surge room cuts it)."""


CASES = [
    Case("steady: counts meet the targets", {"s": 3}, {"s": (3, 3)}, Bounds(3, 1, 0)),
    Case("fresh pool: create every pair", {"s": 3}, {}, Bounds(3, 1, 0), creates=(("s", 3),)),
    Case(
        "surge: canary created, no Ready stable drains below the floor",
        {"s": 2, "c": 1},
        {"s": (3, 3)},
        Bounds(3, 1, 0),
        creates=(("c", 1),),
    ),
    Case(
        "surge: canary Ready, the excess stable drains",
        {"s": 2, "c": 1},
        {"s": (3, 3), "c": (1, 1)},
        Bounds(3, 1, 0),
        drain_ready=(("s", 1),),
    ),
    Case(
        "surge edge: maxSurge 0 at replicas live creates nothing; maxUnavailable 1 lets one drain",
        {"s": 2, "c": 1},
        {"s": (3, 3)},
        Bounds(3, 0, 1),
        drain_ready=(("s", 1),),
        wanted=(("c", 1),),
    ),
    Case(
        "surge edge: maxSurge 0, maxUnavailable 0: stuck (no create, no drain)",
        {"s": 2, "c": 1},
        {"s": (3, 3)},
        Bounds(3, 0, 0),
        wanted=(("c", 1),),
    ),
    Case(
        "surge edge: room for 1 of 2 short pairs",
        {"s": 4, "c": 2},
        {"s": (4, 4)},
        Bounds(4, 1, 0),
        creates=(("c", 1),),
        wanted=(("c", 2),),
    ),
    Case(
        "unavailable edge: floor reached exactly",
        {"s": 1},
        {"s": (3, 3)},
        Bounds(3, 1, 2),
        drain_ready=(("s", 2),),
    ),
    Case(
        "unavailable edge: maxUnavailable above replicas floors at 0",
        {"s": 0},
        {"s": (2, 2)},
        Bounds(2, 0, 5),
        drain_ready=(("s", 2),),
    ),
    Case(
        "unavailable: the floor counts Ready pairs of every revision",
        {"s": 1, "c": 2},
        {"s": (3, 3), "c": (2, 1)},
        Bounds(3, 2, 0),
        drain_ready=(("s", 1),),
    ),
    Case(
        "not-Ready excess goes first and needs no bound",
        {"s": 2},
        {"s": (4, 2)},
        Bounds(2, 0, 0),
        delete_unready=(("s", 2),),
    ),
    Case(
        "not-Ready excess first, then Ready excess within the floor",
        {"s": 1},
        {"s": (4, 3)},
        Bounds(2, 0, 1),
        delete_unready=(("s", 1),),
        drain_ready=(("s", 2),),
    ),
    Case(
        "an untargeted revision goes to zero: not-Ready at once, Ready above the floor",
        {"s": 3},
        {"s": (3, 3), "old": (2, 1)},
        Bounds(3, 1, 0),
        delete_unready=(("old", 1),),
        drain_ready=(("old", 1),),
    ),
    Case(
        "deleting not-Ready pairs frees surge room in the same pass",
        {"s": 3, "c": 1},
        {"s": (3, 3), "old": (1, 0)},
        Bounds(3, 1, 0),
        delete_unready=(("old", 1),),
        creates=(("c", 1),),
    ),
    Case(
        "rollback: stable (largest target) is created before the canary",
        {"s": 3, "c": 1},
        {"s": (1, 1), "c": (1, 1)},
        Bounds(3, 1, 0),
        creates=(("s", 2),),
    ),
    Case(
        "rollback with room for both, largest target first",
        {"s": 3, "c": 1},
        {},
        Bounds(3, 1, 0),
        creates=(("s", 3), ("c", 1)),
    ),
    Case(
        "more Ready than live is clipped to live",
        {"s": 1},
        {"s": (2, 5)},
        Bounds(1, 0, 0),
        drain_ready=(("s", 1),),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_next_moves(case: Case) -> None:
    counts = {rev: RevisionCounts(live, ready) for rev, (live, ready) in case.counts.items()}
    moves = next_moves(case.targets, counts, case.bounds)
    assert moves.delete_unready == case.delete_unready
    assert moves.creates == case.creates
    assert moves.drain_ready == case.drain_ready
    assert moves.empty == (not (case.delete_unready or case.creates or case.drain_ready))
    if case.wanted is not None:
        assert moves.wanted == case.wanted


@pytest.mark.parametrize(
    ("wanted", "room", "creates"),
    [
        ((("s", 2), ("c", 1)), 0, ()),
        ((("s", 2), ("c", 1)), 1, (("s", 1),)),
        ((("s", 2), ("c", 1)), 2, (("s", 2),)),
        ((("s", 2), ("c", 1)), 5, (("s", 2), ("c", 1))),
    ],
    ids=["no room", "room cuts the first", "room fills the first", "room for all"],
)
def test_creates_hand_out_the_room_in_order(
    wanted: tuple[tuple[str, int], ...], room: int, creates: tuple[tuple[str, int], ...]
) -> None:
    assert Moves(wanted=wanted, create_room=room).creates == creates


@pytest.mark.parametrize(
    ("targets", "order"),
    [({}, []), ({"a": 1, "b": 3, "c": 3}, ["b", "a", "c"]), ({"r2": 0, "r1": 0}, ["r1", "r2"])],
    ids=["none", "largest target first then by name", "ties by name"],
)
def test_creation_order(targets: dict[str, int], order: list[str]) -> None:
    assert creation_order(targets) == order


def test_moves_never_break_the_bounds_over_a_rollout() -> None:
    """Applied pass after pass (creates become Ready the pass after), every surge step keeps live ≤
    replicas + maxSurge and Ready ≥ replicas − maxUnavailable, and ends at the targets."""
    bounds = Bounds(replicas=4, max_surge=1, max_unavailable=1)
    live = {"s": 4, "c": 0}
    ready = {"s": 4, "c": 0}
    targets = {"s": 0, "c": 4}
    for _ in range(20):
        counts = {r: RevisionCounts(live[r], ready[r]) for r in live}
        moves = next_moves(targets, counts, bounds)
        ready = dict(live)  # last pass's creates are Ready now
        for rev, n in (*moves.delete_unready, *moves.drain_ready):
            live[rev] -= n
            ready[rev] = min(ready[rev], live[rev])
        for rev, n in moves.creates:
            live[rev] += n
        assert sum(live.values()) <= bounds.ceiling
        assert sum(ready.values()) >= bounds.floor
        if moves.empty:
            break
    assert live == {"s": 0, "c": 4}


@pytest.mark.parametrize(
    ("n", "expected"), [(0, []), (2, [7, 5]), (9, [7, 5, 2])], ids=["none", "two newest", "more than there are"]
)
def test_highest_first_takes_the_newest_indexes(n: int, expected: list[int]) -> None:
    assert highest_first([2, 7, 5], n, lambda i: i) == expected
