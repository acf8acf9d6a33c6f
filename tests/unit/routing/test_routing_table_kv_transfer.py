"""The compatible v1 additions: servedModelName and per-pair kvTransfer (connector, bootstrap port, DP size)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tandem.routing import KvTransfer, RoutingTable

# A table exactly as the operator published it before the additions (bytes and fingerprint taken from the
# code before this change): it must parse, keep its bytes, and keep its fingerprint.
BEFORE = (
    '{"admission":{"maxInFlight":8,"maxKvUtilizationPercent":100,"maxQueued":4,"rejectStatus":429},'
    '"apiVersion":"tandem.dev/routing-v1","hash":{"loadBoundPercent":125,"maxWalk":4,"prefixChars":1000},'
    '"match":{"headers":[],"images":"Any","maxPromptTokens":null,"minPromptTokens":0},"namespace":"ml",'
    '"pairs":[{"decode":[{"address":"10.0.1.1:8000","pod":"speed-p0-decode-0"}],"drainingSince":null,'
    '"id":"speed-p0","index":0,"prefill":[{"address":"10.0.0.1:8000","pod":"speed-p0-prefill-0"}],'
    '"revision":"r1","state":"serving","weight":100}],"pool":"speed","priority":0,'
    '"revisions":{"canary":null,"canaryWeightPercent":null,"stable":"r1"},"trafficClass":"speed"}'
)
BEFORE_FINGERPRINT = "9cedcfb7a9fbd8d433657ed04f1b7d8dcb696b6de9372893fa481bf7531d3221"


def test_routing_table_published_before_additions_keeps_bytes_and_fingerprint() -> None:
    table = RoutingTable.from_json(BEFORE)
    assert table.canonical_json() == BEFORE
    assert table.fingerprint() == BEFORE_FINGERPRINT


def test_routing_table_before_additions_defaults_to_nixl_and_any_model() -> None:
    table = RoutingTable.from_json(BEFORE)
    assert table.served_model_name is None
    assert table.pairs[0].kv_transfer is None
    assert table.pairs[0].transfer == KvTransfer(connector="NixlConnector", bootstrap_port=8998, data_parallel_size=1)


def test_routing_table_additions_round_trip_in_camel_case() -> None:
    doc = json.loads(BEFORE)
    doc["servedModelName"] = "org/model"
    doc["pairs"][0]["kvTransfer"] = {"connector": "MooncakeConnector", "bootstrapPort": 9000, "dataParallelSize": 2}
    table = RoutingTable.model_validate(doc)
    assert table.served_model_name == "org/model"
    assert table.pairs[0].transfer == KvTransfer(
        connector="MooncakeConnector", bootstrap_port=9000, data_parallel_size=2
    )
    assert json.loads(table.to_json()) == doc
    assert table.fingerprint() != BEFORE_FINGERPRINT


@pytest.mark.parametrize(
    "kv",
    [
        pytest.param({"connector": "LMCacheConnector"}, id="unknown connector"),
        pytest.param({"bootstrapPort": 0}, id="port 0"),
        pytest.param({"dataParallelSize": 0}, id="dp size 0"),
        pytest.param({"extra": 1}, id="unknown key"),
        pytest.param({"connector": "MoRIIOConnector", "moriioMode": "Push"}, id="unknown MoRIIO mode"),
        pytest.param({"connector": "MoRIIOConnector", "notifyPort": 70000}, id="notify port above 65535"),
    ],
)
def test_routing_table_rejects_bad_kv_transfer(kv: dict[str, object]) -> None:
    doc = json.loads(BEFORE)
    doc["pairs"][0]["kvTransfer"] = kv
    with pytest.raises(ValidationError):
        RoutingTable.model_validate(doc)


@pytest.mark.parametrize(
    ("kv", "wire"),
    [
        pytest.param(
            KvTransfer(connector="MoRIIOConnector"),
            {"connector": "MoRIIOConnector", "bootstrapPort": 8998, "dataParallelSize": 1},
            id="MoRIIO at vLLM's defaults: no new keys on the wire",
        ),
        pytest.param(
            KvTransfer(connector="MoRIIOConnector", moriio_mode="Read", handshake_port=7000, notify_port=7001),
            {
                "connector": "MoRIIOConnector",
                "bootstrapPort": 8998,
                "dataParallelSize": 1,
                "moriioMode": "Read",
                "handshakePort": 7000,
                "notifyPort": 7001,
            },
            id="MoRIIO non-defaults written in camelCase",
        ),
        pytest.param(
            KvTransfer(connector="MooncakeConnector"),
            {"connector": "MooncakeConnector", "bootstrapPort": 8998, "dataParallelSize": 1},
            id="Mooncake pairs keep their published bytes",
        ),
    ],
)
def test_routing_table_moriio_fields_are_written_only_when_not_default(kv: KvTransfer, wire: dict[str, object]) -> None:
    """A router that predates the MoRIIO fields (unknown keys are refused) still reads every table that does not
    set them, and tables already published keep their fingerprints."""
    doc = json.loads(BEFORE)
    doc["pairs"][0]["kvTransfer"] = wire
    table = RoutingTable.model_validate(doc)
    assert table.pairs[0].transfer == kv
    assert json.loads(table.to_json()) == doc


def test_routing_table_moriio_defaults_are_vllms() -> None:
    kv = KvTransfer(connector="MoRIIOConnector")
    assert (kv.moriio_mode, kv.handshake_port, kv.notify_port) == ("Write", 6301, 61005)
