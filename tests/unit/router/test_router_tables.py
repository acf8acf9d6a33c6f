"""Table payloads and the store: formats, refusal reasons, atomic swap, last good table kept."""

from __future__ import annotations

import json

import pytest
import yaml

from tandem.router.tables import REASON_INVALID, REASON_UNKNOWN_VERSION, TableError, TableStore, parse_payload
from tandem.routing import CONFIGMAP_KEY, RoutingTable
from tests.unit.routing.routing_factories import make_table


def _table(pairs: int = 2) -> RoutingTable:
    return make_table("speed").namespace("ml").pairs(pairs).obj()


def _configmap(table: RoutingTable) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "speed-routing"},
        "data": {CONFIGMAP_KEY: table.to_json()},
    }


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(_table().to_json(), id="routing.json value"),
        pytest.param(_table().canonical_json().encode(), id="canonical bytes"),
        pytest.param(yaml.safe_dump(_configmap(_table())), id="ConfigMap as kubectl -o yaml"),
        pytest.param(json.dumps(_configmap(_table())), id="ConfigMap as kubectl -o json"),
    ],
)
def test_parse_payload_accepts_published_formats(payload: str | bytes) -> None:
    assert parse_payload(payload) == _table()


@pytest.mark.parametrize(
    ("payload", "want_reason"),
    [
        pytest.param(
            json.dumps({**json.loads(_table().to_json()), "apiVersion": "tandem.dev/routing-v2"}),
            REASON_UNKNOWN_VERSION,
            id="v2",
        ),
        pytest.param(json.dumps({**json.loads(_table().to_json()), "surprise": 1}), REASON_INVALID, id="unknown key"),
        pytest.param("{not json", REASON_INVALID, id="not JSON, not a mapping"),
        pytest.param("[1, 2]", REASON_INVALID, id="a list"),
        pytest.param(
            json.dumps({"kind": "ConfigMap", "data": {}}), REASON_INVALID, id="ConfigMap without routing.json"
        ),
        pytest.param(
            json.dumps({"kind": "ConfigMap", "data": {CONFIGMAP_KEY: "{"}}), REASON_INVALID, id="ConfigMap bad JSON"
        ),
    ],
)
def test_parse_payload_refuses_with_reason(payload: str, want_reason: str) -> None:
    with pytest.raises(TableError) as info:
        parse_payload(payload)
    assert info.value.reason == want_reason


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_table_store_swaps_snapshot_and_keeps_last_good_on_invalid() -> None:
    clock = _Clock()
    store = TableStore(clock)
    seen: list[tuple[str, str | None]] = []
    store.listeners.append(lambda source, reason, _live: seen.append((source, reason)))
    first = _table(2)
    assert store.offer("f", first.to_json())
    before = store.snapshot
    assert [t.table for t in before] == [first]

    clock.t = 200.0
    assert not store.offer("f", first.to_json(indent=None))  # same fingerprint, other bytes: no swap
    assert store.snapshot is before
    assert not store.offer("f", "{broken")
    assert not store.offer("f", json.dumps({**json.loads(first.to_json()), "apiVersion": "tandem.dev/routing-v9"}))
    assert store.snapshot is before and store.get("f") is not None
    assert store.get("f").loaded_at == 100.0  # type: ignore[union-attr]

    second = _table(3)
    assert store.offer("f", second.to_json())
    assert [t.table for t in store.snapshot] == [second]
    assert [t.table for t in before] == [first]  # a request holding the old snapshot still sees the old table
    assert seen == [("f", None), ("f", None), ("f", REASON_INVALID), ("f", REASON_UNKNOWN_VERSION), ("f", None)]


def test_table_store_refuses_one_pool_from_two_sources_and_removes() -> None:
    store = TableStore(_Clock())
    assert store.offer("a", _table().to_json())
    assert not store.offer("b", _table(3).to_json())
    assert [t.source for t in store.snapshot] == ["a"]
    store.remove("a")
    assert store.snapshot == ()
