"""The router's own load view: pair counts the algorithm reads, instance choice inside a pair."""

from __future__ import annotations

import pytest

from tandem.router.admission import Loads
from tandem.routing import NO_LOAD, Endpoint, PairLoad
from tests.unit.routing.routing_factories import make_table

pytestmark = pytest.mark.unit


def test_loads_count_holds_per_pair_and_release_them() -> None:
    table = make_table("speed").pairs(2).obj()
    loads = Loads()
    with loads.hold_pair(table, "speed-p0"), loads.hold_pair(table, "speed-p0"):
        assert loads.for_table(table) == {"speed-p0": PairLoad(in_flight=2), "speed-p1": NO_LOAD}
        full = PairLoad(in_flight=table.admission.max_in_flight)
        assert loads.for_table(table, {"speed-p1": full})["speed-p1"] == full
    assert loads.for_table(table) == {"speed-p0": NO_LOAD, "speed-p1": NO_LOAD}


def test_loads_keep_pools_of_other_namespaces_apart() -> None:
    a = make_table("speed").pairs(1).obj()
    b = make_table("speed").namespace("other").pairs(1).obj()
    loads = Loads()
    with loads.hold_pair(a, "speed-p0"):
        assert loads.for_table(b) == {"speed-p0": NO_LOAD}


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
