"""The instance inside a pair a request enters (``tandem.routing.pick_instance``): the router and the simulator
run this one rule, so a conversation keeps to the prefill instance that holds its prefix."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from tandem.routing import Admission, Pair, PairLoad, PairState, WalkBound, candidates, pick_instance

UNITS = tuple(Pair(id=f"pool-p0-prefill-{i}", index=i, revision="r1", state=PairState.SERVING) for i in range(3))
BOUND = WalkBound(load_bound_percent=125, max_walk=3)


@given(st.integers(0, 2**64 - 1))
def test_idle_instances_give_a_key_its_first_rendezvous_choice(key: int) -> None:
    assert pick_instance(key, UNITS, {}, BOUND) == candidates(key, UNITS)[0].id


def test_keys_spread_over_the_instances() -> None:
    got = Counter(pick_instance(key * 7919, UNITS, {}, BOUND) for key in range(3000))
    assert set(got) == {u.id for u in UNITS}
    assert all(800 < n < 1200 for n in got.values()), got


def test_an_instance_over_its_share_passes_its_keys_on() -> None:
    """Worked example of the docstring: ``a`` holds 3 in flight, ``b`` none; cap ⌈1.25 · 4 / 2⌉ = 3."""
    a, b = UNITS[:2]
    keys = [k for k in range(200) if candidates(k, (a, b))[0].id == a.id]
    assert keys
    loads = {a.id: PairLoad(in_flight=3)}
    assert {pick_instance(k, (a, b), loads, BOUND) for k in keys} == {b.id}
    # one in flight: cap ⌈1.25 · 2 / 2⌉ = 2, so a keeps its keys
    assert {pick_instance(k, (a, b), {a.id: PairLoad(in_flight=1)}, BOUND) for k in keys} == {a.id}


def test_every_instance_full_gives_the_least_loaded() -> None:
    full = WalkBound(load_bound_percent=125, max_walk=3, admission=Admission(max_in_flight=1, max_queued=1))
    loads = {UNITS[0].id: PairLoad(in_flight=4), UNITS[1].id: PairLoad(in_flight=2), UNITS[2].id: PairLoad(queued=3)}
    assert {pick_instance(k, UNITS, loads, full) for k in range(50)} == {UNITS[1].id}


def test_one_instance_or_none() -> None:
    assert pick_instance(5, UNITS[:1], {UNITS[0].id: PairLoad(in_flight=99)}, BOUND) == UNITS[0].id
    assert pick_instance(5, (), {}, BOUND) is None
