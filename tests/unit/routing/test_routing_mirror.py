"""Mirroring the canary (``tandem.routing.mirror_pair``): a mirrored canary pair gets a copy of exactly the keys it
would own by pair count, serves none of them, and a table that does not mirror copies nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tandem.routing import PairLoad, PairState, Revisions, candidates, mirror_pair, select_for_table
from tandem.routing.algorithm import NO_MIRROR
from tandem.routing.table import DEFAULT_PAIR_WEIGHT
from tests.unit.routing.routing_factories import make_table, scaled_examples

MIRRORED = make_table("speed").pairs(75).mirror("r2", pairs=1).obj()
BY_COUNT = make_table("speed").pairs(76).obj()  # the same pair ids, all serving at equal weights


@given(st.integers(min_value=0, max_value=2**64 - 1))
@scaled_examples(1.0, floor=200)
def test_the_copy_goes_where_the_key_would_go_by_pair_count(key: int) -> None:
    """The canary pair speed-p75 gets a copy exactly when it is the key's first pair by pair count, and the user's
    request still goes to a stable pair."""
    first = candidates(key, BY_COUNT.pairs)[0]
    copy = mirror_pair(MIRRORED, key).pair
    assert (copy.id if copy is not None else None) == (first.id if first.id == "speed-p75" else None)
    served = select_for_table(MIRRORED, key, {}).pair
    assert served is not None and served.revision == "r1"
    if copy is not None:
        assert copy.revision == "r2" and copy.weight == DEFAULT_PAIR_WEIGHT
        assert copy.decode == MIRRORED.pairs[75].decode  # the table's endpoints


def test_one_mirrored_pair_of_76_gets_about_one_key_in_76() -> None:
    n = 20_000
    copied = sum(mirror_pair(MIRRORED, key * 0x9E3779B97F4A7C15).pair is not None for key in range(n))
    expected = n / 76  # 263; binomial sd ≈ 16
    assert abs(copied - expected) < 5 * (expected**0.5)


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(make_table("speed").pairs(8).obj(), id="no canary"),
        pytest.param(make_table("speed").pairs(8).canary("r2", percent=0, pairs=1).obj(), id="canary at 0, no mirror"),
        pytest.param(make_table("speed").pairs(8).canary("r2", percent=10, pairs=1).obj(), id="serving canary"),
        pytest.param(
            make_table("speed").pairs(8).mirror("r2", pairs=1, state=PairState.WARMING).obj(),
            id="mirrored pair not serving yet",
        ),
    ],
)
def test_no_copy_without_a_serving_mirrored_pair(table: object) -> None:
    assert all(mirror_pair(table, key) == NO_MIRROR for key in range(2_000))  # type: ignore[arg-type]


def test_a_mirror_needs_a_canary_at_zero_weight() -> None:
    with pytest.raises(ValidationError, match="canaryMirror"):
        Revisions(stable="r1", canary="r2", canary_weight_percent=5, canary_mirror=True)
    with pytest.raises(ValidationError, match="canaryMirror"):
        Revisions(stable="r1", canary_mirror=True)


def test_the_flag_is_left_out_of_the_json_while_off() -> None:
    """Tables published before the field keep their bytes and their fingerprint."""
    assert "canaryMirror" not in BY_COUNT.canonical_json()
    assert '"canaryMirror":true' in MIRRORED.canonical_json()


def _canary_key() -> int:
    return next(k for k in range(10_000) if mirror_pair(MIRRORED, k).pair is not None)


def test_a_canary_pair_over_its_load_bound_sheds_copies_as_a_serving_pair_sheds_keys() -> None:
    """The copy follows the by-count walk with the pairs' loads: a canary pair far above the average load (its keys
    run hot) is passed by, as a serving pair would be, and the router counts the copy as skipped."""
    key = _canary_key()
    hot = {"speed-p75": PairLoad(in_flight=20)}  # 75 idle stable pairs: the bound is ceil(1.25 * 21 / 76) = 1
    choice = mirror_pair(MIRRORED, key, hot)
    assert choice.pair is None
    assert choice.skipped is not None and choice.skipped.id == "speed-p75"
    assert mirror_pair(MIRRORED, key, {"speed-p75": PairLoad(in_flight=0)}).pair is not None


def test_a_full_canary_pair_gets_no_copy() -> None:
    key = _canary_key()
    full = {"speed-p75": PairLoad(in_flight=0, queued=0, kv_utilization_percent=99)}  # the table's KV limit: 95
    choice = mirror_pair(MIRRORED, key, full)
    assert choice.pair is None and choice.skipped is not None
