"""The router's load view: own pair counts joined with the engine view, instance choice inside a pair."""

from __future__ import annotations

import pytest

from tandem.router.admission import Loads
from tandem.routing import Endpoint, PairLoad
from tests.unit.routing.routing_factories import make_table


def test_loads_count_holds_per_pair_and_release_them() -> None:
    table = make_table("speed").pairs(2).obj()
    loads = Loads()
    with loads.hold_pair(table, "speed-p0"), loads.hold_pair(table, "speed-p0"):
        assert loads.for_table(table) == {"speed-p0": PairLoad(in_flight=2)}  # speed-p1 absent: idle
    assert loads.for_table(table) == {}
    assert loads.pair_in_flight(table, "speed-p0") == 0


def test_loads_keep_pools_of_other_namespaces_apart() -> None:
    a = make_table("speed").pairs(1).obj()
    b = make_table("speed").namespace("other").pairs(1).obj()
    loads = Loads()
    with loads.hold_pair(a, "speed-p0"):
        assert loads.for_table(b) == {}
        assert loads.for_table(a) == {"speed-p0": PairLoad(in_flight=1)}


@pytest.mark.parametrize(
    ("own", "engine", "want"),
    [
        pytest.param(0, None, None, id="idle, no engine view: absent"),
        pytest.param(2, None, PairLoad(in_flight=2), id="own counts only"),
        pytest.param(0, PairLoad(in_flight=5, queued=1), PairLoad(in_flight=5, queued=1), id="engine view only"),
        pytest.param(
            3,
            PairLoad(in_flight=1, queued=2, kv_utilization_percent=97.0),
            PairLoad(in_flight=1, queued=2, kv_utilization_percent=97.0),
            id="own holds include the engine queue: each request counted once, engine KV",
        ),
        pytest.param(
            5,
            PairLoad(in_flight=1, queued=2),
            PairLoad(in_flight=3, queued=2),
            id="holds the engines do not show yet count as in flight",
        ),
        pytest.param(
            1,
            PairLoad(in_flight=4, queued=3),
            PairLoad(in_flight=4, queued=3),
            id="other replicas' queue larger than own holds: the engine view",
        ),
        pytest.param(
            2, PairLoad(in_flight=6), PairLoad(in_flight=6), id="engines see other replicas' requests: theirs wins"
        ),
    ],
)
def test_loads_join_own_counts_with_the_engine_view(own: int, engine: PairLoad | None, want: PairLoad | None) -> None:
    table = make_table("speed").pairs(2).obj()
    loads = Loads()
    holds = [loads.hold_pair(table, "speed-p0") for _ in range(own)]
    for hold in holds:
        hold.__enter__()
    view = {} if engine is None else {"speed-p0": engine}
    assert loads.for_table(table, view).get("speed-p0") == want
    for hold in holds:
        hold.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("held", "want"),
    [
        pytest.param([], "10.0.0.1:8000", id="idle: first in table order"),
        pytest.param(["10.0.0.1:8000"], "10.0.0.2:8000", id="least in flight"),
        pytest.param(["10.0.0.1:8000", "10.0.0.2:8000"], "10.0.0.1:8000", id="tie: table order"),
    ],
)
def test_loads_pick_least_loaded_instance_with_an_address(held: list[str], want: str) -> None:
    endpoints = (
        Endpoint(pod="p-0"),
        Endpoint(pod="p-1", address="10.0.0.1:8000"),
        Endpoint(pod="p-2", address="10.0.0.2:8000"),
    )
    loads = Loads()
    holds = [loads.hold_instance(address) for address in held]
    for hold in holds:
        hold.__enter__()
    assert loads.pick(endpoints) == want
    for hold in holds:
        hold.__exit__(None, None, None)
    assert loads.instance_in_flight("10.0.0.1:8000") == 0


def test_loads_pick_none_without_addresses() -> None:
    assert Loads().pick((Endpoint(pod="p-0"),)) is None


def _prefill(addresses: list[str | None]) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(pod=f"speed-p0-prefill-{i}", address=a) for i, a in enumerate(addresses))


def test_loads_pick_for_key_follows_the_key_by_pod_name_not_address() -> None:
    """The prefill instance is the key's (``tandem.routing.pick_instance`` over pod names): a pod that comes back
    with a new address keeps its keys, and an instance without an address is not a candidate."""
    loads = Loads()
    before = _prefill(["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"])
    after = _prefill(["10.0.0.1:8000", "10.0.9.9:8000", "10.0.0.3:8000"])
    moved = {"10.0.0.2:8000": "10.0.9.9:8000"}
    for key in range(100):
        first = loads.pick_for_key(key, before, 125)
        assert first is not None
        assert loads.pick_for_key(key, after, 125) == moved.get(first, first)
    spread = {loads.pick_for_key(key, before, 125) for key in range(100)}
    assert spread == {e.address for e in before}
    missing = _prefill(["10.0.0.1:8000", None, "10.0.0.3:8000"])
    assert {loads.pick_for_key(key, missing, 125) for key in range(100)} == {"10.0.0.1:8000", "10.0.0.3:8000"}
    assert loads.pick_for_key(7, _prefill([None, "10.0.0.3:8000"]), 125) == "10.0.0.3:8000"
    assert loads.pick_for_key(7, _prefill([None]), 125) is None


def test_loads_pick_for_key_moves_a_key_off_an_instance_over_its_share() -> None:
    loads = Loads()
    endpoints = _prefill(["10.0.0.1:8000", "10.0.0.2:8000"])
    keys = [k for k in range(100) if loads.pick_for_key(k, endpoints, 125) == "10.0.0.1:8000"]
    assert keys
    holds = [loads.hold_instance("10.0.0.1:8000") for _ in range(3)]
    for hold in holds:
        hold.__enter__()
    assert {loads.pick_for_key(k, endpoints, 125) for k in keys} == {"10.0.0.2:8000"}
    for hold in holds:
        hold.__exit__(None, None, None)
