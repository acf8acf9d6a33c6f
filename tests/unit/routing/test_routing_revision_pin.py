"""A walk pinned to one revision (``select_for_table(..., revision=R)``): the same walk over that revision's
serving pairs at equal weights (``tandem.routing.algorithm``, *Pinning a revision*)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.routing import (
    Outcome,
    PairLoad,
    PairState,
    RoutingTable,
    SkipReason,
    candidate_set_for_revision,
    candidates,
    revision_pairs,
    select_for_table,
)
from tandem.routing.table import DEFAULT_PAIR_WEIGHT
from tests.unit.routing.routing_factories import make_table, scaled_examples


def _rollout(percent: int) -> RoutingTable:
    """6 stable pairs (r1), 2 canary pairs (r2) at ``percent``, one warming r2 pair, one draining r1 pair."""
    factory = make_table("speed").pairs(6).canary("r2", percent=percent, pairs=2)
    factory.pairs(1, revision="r2", state=PairState.WARMING).pairs(1, revision="r1", state=PairState.DRAINING)
    return factory.obj()


@pytest.mark.parametrize(
    ("percent", "revision", "want_ids"),
    [
        pytest.param(10, "r2", {"speed-p6", "speed-p7"}, id="canary at 10 percent: its two serving pairs"),
        pytest.param(0, "r2", {"speed-p6", "speed-p7"}, id="canary at 0 percent (weight 0) is still reachable"),
        pytest.param(100, "r1", {f"speed-p{i}" for i in range(6)}, id="stable at weight 0 is still reachable"),
        pytest.param(10, "r1", {f"speed-p{i}" for i in range(6)}, id="stable: the draining r1 pair stays out"),
        pytest.param(10, "r9", set(), id="unknown revision: no pair"),
    ],
)
def test_revision_pairs_are_the_serving_pairs_of_the_revision_at_equal_weight(
    percent: int, revision: str, want_ids: set[str]
) -> None:
    pairs = revision_pairs(_rollout(percent), revision)
    assert {p.id for p in pairs} == want_ids
    assert all(p.revision == revision and p.state is PairState.SERVING for p in pairs)
    assert {p.weight for p in pairs} <= {DEFAULT_PAIR_WEIGHT}


@given(key=st.integers(min_value=0, max_value=2**64 - 1))
@scaled_examples(0.5)
def test_select_pinned_to_the_canary_routes_to_a_canary_pair_in_the_unpinned_order(key: int) -> None:
    table = _rollout(10)
    decision = select_for_table(table, key, {}, revision="r2")
    assert decision.outcome is Outcome.ROUTED
    assert decision.pair is not None and decision.pair.revision == "r2"
    # Equal weights within a revision: the pinned order is the table's order restricted to that revision.
    unpinned = [p.id for p in candidates(key, table.pairs) if p.revision == "r2"]
    assert decision.pair.id == unpinned[0]


def test_select_pinned_walks_on_inside_the_revision_only() -> None:
    table = _rollout(10)
    key = 12345
    first = select_for_table(table, key, {}, revision="r2")
    assert first.pair is not None
    second = select_for_table(table, key, {}, revision="r2", exclude={first.pair.id})
    assert second.outcome is Outcome.ROUTED and second.pair is not None
    assert second.pair.revision == "r2" and second.pair.id != first.pair.id
    assert second.skips[0].reason is SkipReason.EXCLUDED and second.walk_length == 2
    both = {first.pair.id, second.pair.id}
    third = select_for_table(table, key, {}, revision="r2", exclude=both)
    # Both canary pairs tried: the walk ends inside the revision instead of spilling to a stable pair.
    assert third.outcome is Outcome.REJECTED and third.pair is None and third.walk_length == 2


def test_select_pinned_honours_admission_limits() -> None:
    table = _rollout(10)
    full = PairLoad(in_flight=32)
    decision = select_for_table(table, 7, {"speed-p6": full, "speed-p7": full}, revision="r2")
    assert decision.outcome is Outcome.REJECTED
    assert decision.status == table.admission.reject_status
    assert {s.reason for s in decision.skips} == {SkipReason.IN_FLIGHT_LIMIT}


@pytest.mark.parametrize(
    "revision",
    [pytest.param("r9", id="unknown revision"), pytest.param("r3", id="revision with only a warming pair")],
)
def test_select_pinned_without_a_serving_pair_rejects_with_walk_length_zero(revision: str) -> None:
    table = make_table("speed").pairs(2).pairs(1, revision="r3", state=PairState.WARMING).obj()
    decision = select_for_table(table, 1, {}, revision=revision)
    assert (decision.outcome, decision.pair, decision.walk_length, decision.status) == (
        Outcome.REJECTED,
        None,
        0,
        503,
    )


def test_unpinned_select_is_unchanged_by_pinned_calls() -> None:
    table = _rollout(0)
    before = select_for_table(table, 99, {})
    select_for_table(table, 99, {}, revision="r2")
    assert select_for_table(table, 99, {}) == before
    assert before.pair is not None and before.pair.revision == "r1"  # canary at 0 %: no unpinned key


def test_candidate_set_for_revision_is_memoised_per_table_and_revision() -> None:
    table = _rollout(10)
    assert candidate_set_for_revision(table, "r2") is candidate_set_for_revision(table, "r2")
    assert candidate_set_for_revision(table, "r1") is not candidate_set_for_revision(table, "r2")
    other = _rollout(10)  # equal content, another object: its own set (tables are swapped by identity)
    assert candidate_set_for_revision(other, "r2") is not candidate_set_for_revision(table, "r2")
