"""The memoised candidate order (:class:`CandidateSet`) and walk exclusion against the algorithm as it was.

``_reference_*`` below is the walk of ``tandem.routing`` before the decision-cost change (kept here
verbatim as the oracle): a sorted list of every candidate's rendezvous score, loads summed over all
candidates, the walk over the first ``maxWalk``. The property tests draw random tables, loads and keys and
require identical decisions, first on a cold memo and again on a warm one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.routing import (
    NO_LOAD,
    Admission,
    CandidateSet,
    HashSpec,
    Outcome,
    Pair,
    PairLoad,
    PairState,
    Revisions,
    RouteDecision,
    RoutingTable,
    Skip,
    SkipReason,
    WalkBound,
    algorithm,
    candidate_set_for_table,
    candidates,
    compute_capacity,
    full_reason,
    is_candidate,
    rendezvous_score,
    select,
    select_for_table,
)
from tests.unit.routing.routing_factories import make_pairs, scaled_examples

# --- the oracle: the algorithm before the change ----------------------------------------------------


def _reference_score(key: int, pair_id: str, weight: int) -> float:
    data = b"tandem/hrw/v1\x00" + (key & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + pair_id.encode("utf-8")
    h = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    u = ((h >> 11) + 0.5) / float(1 << 53)
    return -weight / math.log(u)


def _reference_candidates(key: int, pairs: Iterable[Pair]) -> tuple[Pair, ...]:
    scored = [(_reference_score(key, p.id, p.weight), p) for p in pairs if is_candidate(p)]
    scored.sort(key=lambda sp: (-sp[0], sp[1].id))
    return tuple(p for _, p in scored)


def _reference_select(
    key: int, pairs: Iterable[Pair], loads: Mapping[str, PairLoad], bound: WalkBound
) -> RouteDecision:
    order = _reference_candidates(key, pairs)
    if not order:
        return RouteDecision(Outcome.REJECTED, None, 0, (), 503)
    total_load = sum(loads.get(p.id, NO_LOAD).load for p in order)
    total_weight = sum(p.weight for p in order)
    skips: list[Skip] = []
    fallback: Pair | None = None
    fallback_load = 0
    for tried, pair in enumerate(order[: bound.max_walk], start=1):
        load = loads.get(pair.id, NO_LOAD)
        reason = full_reason(load, bound.admission)
        if reason is None:
            cap = compute_capacity(pair.weight, total_weight, total_load, bound.load_bound_percent)
            if load.load < cap:
                return RouteDecision(Outcome.ROUTED, pair, tried, tuple(skips))
            reason = SkipReason.LOAD_BOUND
            if fallback is None or load.load < fallback_load:
                fallback, fallback_load = pair, load.load
        skips.append(Skip(pair.id, reason))
    walked = min(bound.max_walk, len(order))
    if fallback is not None:
        return RouteDecision(Outcome.QUEUED, fallback, walked, tuple(skips))
    status = bound.admission.reject_status if bound.admission is not None else 503
    return RouteDecision(Outcome.REJECTED, None, walked, tuple(skips), status)


# --- strategies ------------------------------------------------------------------------------------

_STATES = st.sampled_from(
    [PairState.SERVING, PairState.SERVING, PairState.SERVING, PairState.WARMING, PairState.DRAINING]
)


@st.composite
def tables(draw: st.DrawFn) -> RoutingTable:
    n = draw(st.integers(0, 40))
    pairs = tuple(
        Pair(
            id=f"pool-p{draw(st.integers(0, 9))}-{i}",  # ids share prefixes and lengths vary
            index=i,
            revision="r1",
            state=draw(_STATES),
            weight=draw(st.sampled_from([0, 1, 9, 19, 100, 100, 100])),
        )
        for i in range(n)
    )
    return RoutingTable(
        pool="pool",
        namespace="ns",
        traffic_class="pool",
        hash=HashSpec(load_bound_percent=draw(st.integers(100, 300)), max_walk=draw(st.integers(1, 8))),
        admission=Admission(
            max_in_flight=draw(st.integers(1, 12)),
            max_queued=draw(st.integers(1, 6)),
            max_kv_utilization_percent=draw(st.integers(1, 100)),
            reject_status=draw(st.sampled_from([429, 503])),
        ),
        revisions=Revisions(stable="r1"),
        pairs=pairs,
    )


@st.composite
def loads_for(draw: st.DrawFn, table: RoutingTable) -> dict[str, PairLoad]:
    out = {}
    for pair in table.pairs:
        if draw(st.booleans()):
            out[pair.id] = PairLoad(
                in_flight=draw(st.integers(0, 14)),
                queued=draw(st.integers(0, 7)),
                kv_utilization_percent=draw(st.floats(0, 100, allow_nan=False)),
            )
    if draw(st.booleans()):
        out["not-a-pair"] = PairLoad(in_flight=50)  # loads of other pools' pairs are ignored
    return out


_KEYS = st.integers(0, 2**64 - 1)


# --- properties ------------------------------------------------------------------------------------


@given(data=st.data(), table=tables(), keys=st.lists(_KEYS, min_size=1, max_size=8))
@scaled_examples(1.0, floor=200)
def test_select_for_table_decides_exactly_as_before(data: st.DataObject, table: RoutingTable, keys: list[int]) -> None:
    loads = data.draw(loads_for(table))
    bound = WalkBound.from_table(table)
    for key in [*keys, *keys]:  # the second round hits the memo
        want = _reference_select(key, table.pairs, loads, bound)
        assert select_for_table(table, key, loads) == want
        assert select(key, table.pairs, loads, bound) == want  # tuple of pairs: memoised by identity
        assert select(key, list(table.pairs), loads, bound) == want  # a list: compiled per call


@given(table=tables(), key=_KEYS)
@scaled_examples(1.0, floor=200)
def test_candidates_order_is_the_reference_order(table: RoutingTable, key: int) -> None:
    want = _reference_candidates(key, table.pairs)
    assert candidates(key, table.pairs) == want
    cset = candidate_set_for_table(table)
    for limit in (1, 2, 4, len(want) + 1):
        assert cset.order(key, limit) == want[:limit]
    assert cset.order(key) == want


@given(key=_KEYS, pid=st.text(min_size=1, max_size=30), weight=st.integers(1, 10_000))
def test_rendezvous_score_matches_the_byte_layout(key: int, pid: str, weight: int) -> None:
    # rendezvous_score is the documented form; CandidateSet inlines it (a copied hasher): same floats.
    try:
        pid.encode("utf-8")
    except UnicodeEncodeError:
        return
    pair = Pair(id=pid, index=0, revision="r1", state=PairState.SERVING, weight=weight)
    other = Pair(id=pid + "x", index=1, revision="r1", state=PairState.SERVING, weight=weight)
    assert rendezvous_score(key, pid, weight) == _reference_score(key, pid, weight)
    want = _reference_candidates(key, [pair, other])
    assert CandidateSet([pair, other]).order(key) == want


@given(data=st.data(), table=tables(), key=_KEYS)
@scaled_examples(1.0, floor=200)
def test_excluded_pairs_are_walked_past_never_chosen(data: st.DataObject, table: RoutingTable, key: int) -> None:
    loads = data.draw(loads_for(table))
    order = candidates(key, table.pairs)[: table.hash.max_walk]
    excluded = {p.id for p in order if data.draw(st.booleans())}
    decision = select_for_table(table, key, loads, exclude=excluded)
    assert decision.pair_id not in excluded
    # Each excluded pair keeps its place in the walk and is recorded as Excluded, nothing else is.
    walked = [p.id for p in order[: decision.walk_length]]
    assert [s.pair_id for s in decision.skips if s.reason is SkipReason.EXCLUDED] == [
        pid for pid in walked if pid in excluded
    ]
    # Excluding nothing, or only pairs beyond the walk, changes nothing.
    beyond = {p.id for p in candidates(key, table.pairs)[table.hash.max_walk :]}
    assert select_for_table(table, key, loads, exclude=beyond) == select_for_table(table, key, loads)


# --- examples --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("excluded", "want_pair", "want_walk", "want_skips"),
    [
        pytest.param(set(), "speed-p1", 1, [], id="nothing excluded: the first candidate"),
        pytest.param({"speed-p1"}, "speed-p0", 2, [("speed-p1", "Excluded")], id="first excluded: the next one"),
        pytest.param(
            {"speed-p1", "speed-p0", "speed-p3"},
            "speed-p2",
            4,
            [("speed-p1", "Excluded"), ("speed-p0", "Excluded"), ("speed-p3", "Excluded")],
            id="three excluded: the last within maxWalk",
        ),
    ],
)
def test_select_exclusion_walks_the_documented_order(
    excluded: set[str], want_pair: str, want_walk: int, want_skips: list[tuple[str, str]]
) -> None:
    # Key and order from the module docstring's worked example: speed-p1, speed-p0, speed-p3, speed-p2.
    pairs = tuple(make_pairs("speed", 4))
    bound = WalkBound(load_bound_percent=125, max_walk=4, admission=Admission(max_in_flight=8, max_queued=8))
    decision = select(0xB2921D9AF23E3CED, pairs, {}, bound, exclude=excluded)
    assert decision.outcome is Outcome.ROUTED
    assert (decision.pair_id, decision.walk_length) == (want_pair, want_walk)
    assert [(s.pair_id, str(s.reason)) for s in decision.skips] == want_skips


def test_select_all_excluded_rejects_with_the_table_status() -> None:
    pairs = tuple(make_pairs("speed", 2))
    bound = WalkBound(max_walk=4, admission=Admission(max_in_flight=8, max_queued=8, reject_status=503))
    decision = select(7, pairs, {}, bound, exclude={"speed-p0", "speed-p1"})
    assert (decision.outcome, decision.pair, decision.walk_length, decision.status) == (Outcome.REJECTED, None, 2, 503)


def test_candidate_set_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(algorithm, "ORDER_MEMO_KEYS", 8)
    cset = CandidateSet(make_pairs("speed", 5))
    for key in range(20):
        assert cset.order(key, 3) == _reference_candidates(key, cset.pairs)[:3]
    assert len(cset._orders) == 8
    assert cset.order(19, 3) == _reference_candidates(19, cset.pairs)[:3]  # a hit gives the same answer


def test_table_memo_is_bounded_and_never_confuses_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(algorithm, "CANDIDATE_SET_MEMO", 4)
    monkeypatch.setattr(algorithm, "_SETS", type(algorithm._SETS)())
    base = make_pairs("speed", 6)
    made = []
    for i in range(10):
        table = RoutingTable(
            pool="speed",
            namespace="ns",
            traffic_class="speed",
            admission=Admission(max_in_flight=8, max_queued=8),
            revisions=Revisions(stable="r1"),
            pairs=tuple(base[: 1 + i % 6]),
        )
        made.append(table)
        assert candidate_set_for_table(table).pairs == table.pairs
    assert len(algorithm._SETS) == 4
    for table in made:  # evicted ones are rebuilt, kept ones are reused: always this table's pairs
        assert candidate_set_for_table(table).pairs == table.pairs
