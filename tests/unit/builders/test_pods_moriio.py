"""MoRIIOConnector engines: the `--kv-transfer-config` vLLM's MoRIIO connector accepts, and what the table says."""

from __future__ import annotations

import json

import pytest

from tandem.api.revision import revision_id, revision_spec
from tandem.builders.pods import ENGINE_PORT, InstanceParams, build_instance_pod, kv_transfer_config
from tandem.routing import KvTransfer
from tandem.routing.table import DEFAULT_MORIIO_HANDSHAKE_PORT, DEFAULT_MORIIO_NOTIFY_PORT
from tests.support.factories import World, make_nodes, make_pool


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize(
    ("kv", "read_mode"),
    [
        pytest.param({"connector": "MoRIIOConnector"}, False, id="default: Write, vLLM's default"),
        pytest.param({"connector": "MoRIIOConnector", "moriioMode": "Read"}, True, id="Read"),
    ],
)
def test_moriio_kv_transfer_config_names_ports_and_mode_on_both_roles(
    role: str, kv: dict[str, str], read_mode: bool
) -> None:
    """vLLM's `MoRIIOConfig` needs `http_port` (no default); the router hands each leg the other's handshake and
    notify ports from the table, so the config must name the contract's ports; both sides share `read_mode`."""
    spec = revision_spec(make_pool().pairs(1).set("spec.stack.kvTransfer", kv).obj().spec)
    assert kv_transfer_config(spec, role) == {  # type: ignore[arg-type]
        "kv_connector": "MoRIIOConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": {
            "http_port": ENGINE_PORT,
            "handshake_port": DEFAULT_MORIIO_HANDSHAKE_PORT,
            "notify_port": DEFAULT_MORIIO_NOTIFY_PORT,
            "read_mode": read_mode,
        },
    }


def test_moriio_engine_pod_declares_its_ports_and_passes_the_config() -> None:
    spec = revision_spec(make_pool().pairs(1).set("spec.stack.kvTransfer", {"connector": "MoRIIOConnector"}).obj().spec)
    pod = build_instance_pod(
        InstanceParams(
            pool="speed", namespace="ml", pool_uid="u", pair=0, role="decode", instance=0, revision="r1", spec=spec
        )
    )
    engine = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
    assert ports["moriio-hs"] == DEFAULT_MORIIO_HANDSHAKE_PORT
    assert ports["moriio-notify"] == DEFAULT_MORIIO_NOTIFY_PORT
    arg = next(a for a in engine["args"] if a.startswith("--kv-transfer-config="))
    assert json.loads(arg.split("=", 1)[1])["kv_connector"] == "MoRIIOConnector"


def test_moriio_mode_at_its_default_keeps_existing_revision_ids() -> None:
    """The new pool field defaults to vLLM's mode; revision ids leave defaults out, so no pool rolls on upgrade."""
    plain = make_pool().pairs(1).set("spec.stack.kvTransfer", {"connector": "MoRIIOConnector"}).obj().spec
    explicit = (
        (make_pool().pairs(1).set("spec.stack.kvTransfer", {"connector": "MoRIIOConnector", "moriioMode": "Write"}))
        .obj()
        .spec
    )
    assert revision_id(revision_spec(plain)) == revision_id(revision_spec(explicit))


@pytest.mark.parametrize(
    ("kv", "published"),
    [
        pytest.param({"connector": "MoRIIOConnector"}, KvTransfer(connector="MoRIIOConnector"), id="MoRIIO Write"),
        pytest.param(
            {"connector": "MoRIIOConnector", "moriioMode": "Read"},
            KvTransfer(connector="MoRIIOConnector", moriio_mode="Read"),
            id="MoRIIO Read",
        ),
        pytest.param(
            {"connector": "NixlConnector", "moriioMode": "Read"},
            KvTransfer(connector="NixlConnector"),
            id="other connectors ignore the MoRIIO mode",
        ),
    ],
)
def test_plan_table_publishes_the_moriio_mode(kv: dict[str, str], published: KvTransfer) -> None:
    world = World(make_pool().pairs(2).set("spec.stack.kvTransfer", kv).obj(), make_nodes(4))
    table = world.tick().routing
    assert [p.kv_transfer for p in table.pairs] == [published] * 2
