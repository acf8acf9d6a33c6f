"""The routing-table contract: wire format, validation, canonical JSON and fingerprint."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tandem.routing import (
    CONFIGMAP_KEY,
    ROUTING_API_VERSION,
    HeaderMatch,
    ImagesMatch,
    Match,
    Pair,
    PairState,
    RoutingTable,
    configmap_name,
)
from tests.unit.routing.routing_factories import make_table, scaled_examples


def _full_table() -> RoutingTable:
    return (
        make_table("speed")
        .match(
            max_prompt_tokens=32768,
            images=ImagesMatch.FORBIDDEN,
            headers=[HeaderMatch(name="x-a", value="1")],
        )
        .hash(prefix_chars=800, load_bound_percent=150, max_walk=3)
        .pairs(3)
        .pairs(1, state=PairState.DRAINING)
        .canary("r2", percent=10, pairs=1)
        .obj()
    )


def _wire(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(make_table("speed").pairs(2).obj().to_json())
    doc.update(overrides)
    return doc


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(make_table("speed").obj(), id="no pairs, all defaults"),
        pytest.param(make_table("speed").pairs(4).obj(), id="four serving pairs"),
        pytest.param(_full_table(), id="canary, headers, draining pair, custom hash"),
    ],
)
def test_routing_table_round_trips_json(table: RoutingTable) -> None:
    assert RoutingTable.from_json(table.to_json()) == table
    assert RoutingTable.from_json(table.to_json(indent=None).encode()) == table
    assert RoutingTable.from_json(table.canonical_json()).fingerprint() == table.fingerprint()


def test_routing_table_wire_keys_are_camel_case_and_sorted() -> None:
    text = _full_table().to_json()
    doc = json.loads(text)
    assert list(doc) == sorted(doc)
    assert doc["apiVersion"] == ROUTING_API_VERSION == "tandem.dev/routing-v1"
    assert set(doc) == {
        "apiVersion", "pool", "namespace", "trafficClass", "priority", "match", "hash",
        "admission", "revisions", "pairs",
    }  # fmt: skip
    assert doc["hash"] == {"loadBoundPercent": 150, "maxWalk": 3, "prefixChars": 800}
    assert set(doc["admission"]) == {"maxInFlight", "maxQueued", "maxKvUtilizationPercent", "rejectStatus"}
    assert set(doc["match"]) == {"minPromptTokens", "maxPromptTokens", "images", "headers"}
    assert doc["match"]["images"] == "Forbidden"
    assert doc["revisions"] == {"stable": "r1", "canary": "r2", "canaryWeightPercent": 10}
    pair = doc["pairs"][0]
    assert set(pair) == {"id", "index", "revision", "state", "weight", "prefill", "decode", "drainingSince"}
    assert pair["state"] == "serving"
    assert pair["prefill"][0] == {"pod": "speed-p0-prefill-0", "address": "10.0.0.1:8000"}
    assert CONFIGMAP_KEY == "routing.json"
    assert configmap_name("speed") == "speed-routing"


def test_routing_table_defaults_match_the_contract() -> None:
    table = RoutingTable.model_validate(
        {
            "pool": "speed",
            "namespace": "ns",
            "trafficClass": "speed",
            "admission": {"maxInFlight": 4, "maxQueued": 2},
            "revisions": {"stable": "r1"},
            "pairs": [{"id": "speed-p0", "index": 0, "revision": "r1", "state": "warming"}],
        }
    )
    assert (table.hash.prefix_chars, table.hash.load_bound_percent, table.hash.max_walk) == (1000, 125, 4)
    assert table.admission.reject_status == 429
    assert table.admission.max_kv_utilization_percent == 100
    assert table.match == Match()
    assert table.priority == 0
    assert table.pairs[0].weight == 100
    assert table.pairs[0].state is PairState.WARMING
    assert table.serving_pairs() == ()


def test_routing_table_accepts_snake_case_names_in_python() -> None:
    doc = _wire()
    doc["traffic_class"] = doc.pop("trafficClass")
    doc["hash"] = {"max_walk": 2}
    by_name = RoutingTable.model_validate(doc)
    assert (by_name.traffic_class, by_name.hash.max_walk) == ("speed", 2)
    assert "trafficClass" in by_name.to_json()


def _pair(i: int, **kw: Any) -> dict[str, Any]:
    return {"id": f"speed-p{i}", "index": i, "revision": "r1", "state": "serving"} | kw


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(_wire(extra=1), id="unknown top-level key"),
        pytest.param(_wire(apiVersion="tandem.dev/routing-v2"), id="unknown api version"),
        pytest.param(_wire(pairs=[_pair(0), _pair(0) | {"index": 1}]), id="duplicate pair id"),
        pytest.param(_wire(pairs=[_pair(0), _pair(1) | {"index": 0}]), id="duplicate pair index"),
        pytest.param(_wire(pairs=[_pair(1), _pair(0)]), id="pairs not in ring order"),
        pytest.param(_wire(pairs=[_pair(0, state="ready")]), id="unknown pair state"),
        pytest.param(_wire(pairs=[_pair(0, weight=-1)]), id="negative weight"),
        pytest.param(_wire(pairs=[_pair(0, color="red")]), id="unknown pair key"),
        pytest.param(_wire(pairs=[_pair(0, prefill=[{"pod": "x", "address": "10.0.0.1"}])]), id="no port"),
        pytest.param(_wire(pairs=[_pair(0, decode=[{"pod": "x", "address": "a b:80"}])]), id="space in host"),
        pytest.param(_wire(match={"minPromptTokens": 10, "maxPromptTokens": 9}), id="max below min"),
        pytest.param(_wire(match={"images": "Maybe"}), id="unknown images rule"),
        pytest.param(_wire(hash={"loadBoundPercent": 99}), id="load bound below 100"),
        pytest.param(_wire(hash={"maxWalk": 0}), id="zero max walk"),
        pytest.param(_wire(hash={"prefixChars": 0}), id="zero prefix chars"),
        pytest.param(_wire(admission={"maxInFlight": 1, "maxQueued": 1, "rejectStatus": 500}), id="reject status 500"),
        pytest.param(_wire(admission={"maxInFlight": 1, "maxQueued": 0}), id="zero max queued"),
        pytest.param(_wire(revisions={"stable": "r1", "canary": "r2"}), id="canary without percent"),
        pytest.param(_wire(revisions={"stable": "r1", "canaryWeightPercent": 5}), id="percent without canary"),
        pytest.param(
            _wire(revisions={"stable": "r1", "canary": "r1", "canaryWeightPercent": 5}), id="canary is stable"
        ),
        pytest.param(
            _wire(revisions={"stable": "r1", "canary": "r2", "canaryWeightPercent": 101}),
            id="percent over 100",
        ),
    ],
)
def test_routing_table_rejects_bad_input(doc: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RoutingTable.model_validate(doc)
    with pytest.raises(ValidationError):
        RoutingTable.from_json(json.dumps(doc))


def test_routing_table_is_frozen() -> None:
    table = make_table("speed").pairs(1).obj()
    with pytest.raises(ValidationError):
        table.pool = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        table.pairs[0].state = PairState.DRAINING  # type: ignore[misc]


def test_routing_table_fingerprint_ignores_construction_path_and_formatting() -> None:
    table = _full_table()
    rebuilt = RoutingTable.model_validate(json.loads(table.to_json(indent=4)))
    shuffled_keys = RoutingTable.from_json(json.dumps(dict(reversed(list(json.loads(table.to_json()).items())))))
    assert rebuilt.fingerprint() == shuffled_keys.fingerprint() == table.fingerprint()
    assert len(table.fingerprint()) == 64
    assert table.fingerprint() == table.fingerprint()


@pytest.mark.parametrize(
    "update",
    [
        pytest.param({"priority": 1}, id="priority"),
        pytest.param({"namespace": "other"}, id="namespace"),
        pytest.param({"pairs": ()}, id="pairs removed"),
    ],
)
def test_routing_table_fingerprint_changes_with_content(update: dict[str, Any]) -> None:
    table = _full_table()
    assert table.model_copy(update=update).fingerprint() != table.fingerprint()


def test_routing_table_fingerprint_changes_when_a_pair_starts_draining() -> None:
    table = make_table("speed").pairs(3).obj()
    drained = table.model_copy(
        update={"pairs": (table.pairs[0].model_copy(update={"state": PairState.DRAINING}), *table.pairs[1:])}
    )
    assert drained.fingerprint() != table.fingerprint()


def test_routing_table_fingerprint_is_pinned() -> None:
    # The canonical bytes are part of the contract: a change here means every published table is
    # rewritten once on upgrade. Update on purpose only.
    table = RoutingTable.model_validate(
        {
            "pool": "speed",
            "namespace": "ns",
            "trafficClass": "speed",
            "admission": {"maxInFlight": 4, "maxQueued": 2},
            "revisions": {"stable": "r1"},
            "pairs": [{"id": "speed-p0", "index": 0, "revision": "r1", "state": "serving"}],
        }
    )
    assert table.canonical_json() == (
        '{"admission":{"maxInFlight":4,"maxKvUtilizationPercent":100,"maxQueued":2,"rejectStatus":429},'
        '"apiVersion":"tandem.dev/routing-v1","hash":{"loadBoundPercent":125,"maxWalk":4,"prefixChars":1000},'
        '"match":{"headers":[],"images":"Any","maxPromptTokens":null,"minPromptTokens":0},"namespace":"ns",'
        '"pairs":[{"decode":[],"drainingSince":null,"id":"speed-p0","index":0,"prefill":[],"revision":"r1","state":"serving",'
        '"weight":100}],"pool":"speed","priority":0,"revisions":{"canary":null,"canaryWeightPercent":null,'
        '"stable":"r1"},"trafficClass":"speed"}'
    )


_states = st.sampled_from(list(PairState))


@st.composite
def _tables(draw: st.DrawFn) -> RoutingTable:
    n = draw(st.integers(0, 6))
    indexes = sorted(draw(st.sets(st.integers(0, 50), min_size=n, max_size=n)))
    pairs = tuple(
        Pair(
            id=f"pool-p{i}",
            index=i,
            revision=draw(st.sampled_from(["r1", "r2"])),
            state=draw(_states),
            weight=draw(st.integers(0, 1000)),
        )
        for i in indexes
    )
    builder = make_table(draw(st.sampled_from(["speed", "long-context", "images"])))
    builder.priority(draw(st.integers(-5, 5)))
    lo = draw(st.integers(0, 10_000))
    hi = draw(st.none() | st.integers(lo, 2_000_000))
    builder.match(
        min_prompt_tokens=lo,
        max_prompt_tokens=hi,
        images=draw(st.sampled_from(list(ImagesMatch))),
        headers=[HeaderMatch(name="x-tenant", value=draw(st.text(max_size=5)))] if draw(st.booleans()) else [],
    )
    return builder.obj().model_copy(update={"pairs": pairs})


@scaled_examples(0.5)
@given(_tables())
def test_routing_table_json_round_trip_property(table: RoutingTable) -> None:
    again = RoutingTable.from_json(table.to_json())
    assert again == table
    assert again.fingerprint() == table.fingerprint()
    assert again.to_json() == table.to_json()
