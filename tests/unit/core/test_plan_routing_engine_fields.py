"""The published table carries what the router needs to drive the legs: served model name and connector."""

from __future__ import annotations

from tandem.builders.pods import MOONCAKE_BOOTSTRAP_PORT
from tandem.routing import KvTransfer, RoutingTable
from tandem.routing.table import DEFAULT_MOONCAKE_BOOTSTRAP_PORT
from tests.support.factories import World, make_nodes, make_pool


def test_plan_table_names_served_model_and_each_pairs_connector() -> None:
    world = World(make_pool().pairs(2).obj(), make_nodes(4))
    table = world.tick().routing
    assert table.served_model_name == world.pool.spec.model.served_name
    connector = world.pool.spec.stack.kv_transfer.connector
    assert [p.kv_transfer for p in table.pairs] == [KvTransfer(connector=connector)] * 2
    assert RoutingTable.from_json(table.to_json()) == table


def test_contract_bootstrap_port_default_is_the_port_the_pod_builder_opens() -> None:
    assert DEFAULT_MOONCAKE_BOOTSTRAP_PORT == MOONCAKE_BOOTSTRAP_PORT
