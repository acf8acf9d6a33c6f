"""A pair's admission limits follow its instances (``tandem.routing.Admission.for_groups``).

The pool API's ``maxInFlight`` / ``maxQueued`` are per instance; the router compares the table's limits with
the pair's sums over its instances. Before the rule, the operator published the per-instance numbers as they
were, so the long-context example's 2P:1D pairs were full at one prefill instance's queue limit."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from tandem.routing import Admission
from tandem.routing.table import PairState
from tests.support.factories import World, make_nodes, make_pool

PER_INSTANCE = Admission(max_in_flight=48, max_queued=4, max_kv_utilization_percent=92, reject_status=503)


def test_a_group_is_full_at_its_instances_limits() -> None:
    got = PER_INSTANCE.for_groups([(4, 1)])
    assert (got.max_in_flight, got.max_queued) == (48, 16)
    got = PER_INSTANCE.for_groups([(1, 3)])
    assert (got.max_in_flight, got.max_queued) == (144, 4)
    # the KV limit is a percentage of the fullest decode instance, and the reject status is not a count
    assert (got.max_kv_utilization_percent, got.reject_status) == (92, 503)


def test_one_instance_per_role_or_no_group_keeps_the_per_instance_limits() -> None:
    assert PER_INSTANCE.for_groups([(1, 1), (1, 1)]) == PER_INSTANCE
    assert PER_INSTANCE.for_groups([]) == PER_INSTANCE


def test_mixed_shapes_take_the_smallest_group_per_role() -> None:
    got = PER_INSTANCE.for_groups([(4, 1), (2, 1), (3, 2)])
    assert (got.max_in_flight, got.max_queued) == (48, 8)


@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 16)), min_size=1, max_size=12))
def test_no_group_may_take_more_than_its_own_instances_and_none_less_than_one(
    shapes: list[tuple[int, int]],
) -> None:
    got = PER_INSTANCE.for_groups(shapes)
    for p, d in shapes:
        assert PER_INSTANCE.max_queued <= got.max_queued <= p * PER_INSTANCE.max_queued
        assert PER_INSTANCE.max_in_flight <= got.max_in_flight <= d * PER_INSTANCE.max_in_flight
    # and some group is exactly at its own limit per role (the bound is tight, not merely safe)
    assert any(got.max_queued == p * PER_INSTANCE.max_queued for p, _ in shapes)
    assert any(got.max_in_flight == d * PER_INSTANCE.max_in_flight for _, d in shapes)


def test_the_operator_publishes_pair_limits_for_its_groups_shape() -> None:
    """A 2P:1D pool's table: each pair may queue two prefill instances' worth and run one decode's."""
    pool = make_pool().pairs(2, ratio=(2, 1), gpus=2).obj()
    world = World(pool, make_nodes(4))
    world.run_until(lambda w: w.ready_pairs() == 2)
    table = world.routing
    admission = pool.spec.admission
    assert [(len(p.prefill), len(p.decode)) for p in table.pairs] == [(2, 1), (2, 1)]
    assert table.admission.max_queued == 2 * admission.max_queued
    assert table.admission.max_in_flight == admission.max_in_flight


def test_while_groups_of_two_shapes_serve_the_table_holds_the_smaller_ones_limits() -> None:
    """A P:D change 2P:1D → 1P:1D as groups cycle: until the last 2P:1D group is gone the table's queue limit is
    a 1P:1D pair's (no 1P:1D pair is let queue two instances' worth); afterwards it stays there."""
    world = World(make_pool().pairs(2, ratio=(2, 1), gpus=2).obj(), make_nodes(6))
    world.run_until(lambda w: w.ready_pairs() == 2 and not w.plans[-1].creates)
    per_instance = world.pool.spec.admission.max_queued
    assert world.routing.admission.max_queued == 2 * per_instance
    world.set_spec(make_pool().pairs(2, ratio=(1, 1), gpus=2))
    seen: Counter[tuple[int, int]] = Counter()
    for _ in range(300):
        world.tick()
        table = world.routing
        listed = {(len(p.prefill), len(p.decode)) for p in table.pairs}
        seen.update(listed)
        want = per_instance * min(p for p, _ in listed)
        assert table.admission.max_queued == want, (listed, table.admission)
        if listed == {(1, 1)} and all(p.state is PairState.SERVING for p in table.pairs):
            break
    else:
        raise AssertionError(f"did not converge: {seen}")
    assert seen[(2, 1)] > 0 and seen[(1, 1)] > 0
    assert world.routing.admission.max_queued == per_instance
