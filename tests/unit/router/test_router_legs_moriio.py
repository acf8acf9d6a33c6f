"""MoRIIOConnector legs (pure): what each leg carries, per mode, as vLLM's MoRIIO connector reads it."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.router import legs

TID = "xfer-1"
HS, NOTIFY = 6301, 61005


def _peer(host: str) -> dict[str, Any]:
    return {
        "remote_host": host,
        "remote_handshake_port": HS,
        "remote_notify_port": NOTIFY,
        "remote_engine_id": None,
        "remote_block_ids": None,
    }


def test_moriio_prefill_params_name_the_decodes_address() -> None:
    assert legs.moriio_prefill_params(TID, "10.0.1.1", HS, NOTIFY) == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": TID,
        **_peer("10.0.1.1"),
    }


@pytest.mark.parametrize(
    ("dp_size", "dp_rank", "extra"),
    [
        pytest.param(1, None, {"remote_dp_size": 1}, id="one rank: no remote_dp_rank"),
        pytest.param(4, 2, {"remote_dp_size": 4, "remote_dp_rank": 2}, id="DP 4: the chosen rank"),
        pytest.param(2, 0, {"remote_dp_size": 2, "remote_dp_rank": 0}, id="rank 0 is still written"),
    ],
)
def test_moriio_write_decode_params_name_the_prefills_address(
    dp_size: int, dp_rank: int | None, extra: dict[str, Any]
) -> None:
    got = legs.moriio_decode_params(TID, "10.0.0.1", HS, NOTIFY, dp_size, dp_rank)
    assert got == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": TID,
        **_peer("10.0.0.1"),
        **extra,
    }


RETURNED = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[3, 7]],
    "remote_engine_id": "10.0.0.9:6301",
    "remote_host": "10.0.0.9",
    "remote_handshake_port": 7000,
    "remote_notify_port": 7001,
    "remote_dp_rank": 1,
    "remote_dp_rank_override": True,
    "remote_dp_size": 2,
    "tp_size": 1,
    "transfer_id": TID,
}
OLD_RETURNED = {  # an older vLLM's request_finished: no address, the router's fields fill it in
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[3, 7]],
    "remote_engine_id": "10.0.0.9:6301",
    "tp_size": 1,
    "transfer_id": TID,
}


@pytest.mark.parametrize(
    ("returned", "want"),
    [
        pytest.param(RETURNED, RETURNED, id="current vLLM: every returned field wins, verbatim"),
        pytest.param(
            OLD_RETURNED,
            {**_peer("10.0.0.1"), "remote_dp_size": 1, **OLD_RETURNED},
            id="older vLLM without an address: the router's address fills the gaps",
        ),
        pytest.param(
            {k: v for k, v in RETURNED.items() if k != "transfer_id"},
            RETURNED,
            id="no transfer_id returned: the router's",
        ),
    ],
)
def test_moriio_read_decode_params_are_the_prefills_answer_over_defaults(
    returned: dict[str, Any], want: dict[str, Any]
) -> None:
    defaults = legs.moriio_decode_params(TID, "10.0.0.1", HS, NOTIFY)
    assert legs.moriio_read_decode_params({"id": "cmpl-1", "kv_transfer_params": returned}, defaults) == want


@pytest.mark.parametrize(
    "response",
    [
        pytest.param({"id": "x"}, id="no kv_transfer_params"),
        pytest.param({"kv_transfer_params": None}, id="null"),
        pytest.param({"kv_transfer_params": {**RETURNED, "transfer_id": "xfer-other"}}, id="another transfer_id"),
    ],
)
def test_moriio_read_decode_params_refuse_an_unusable_answer(response: dict[str, Any]) -> None:
    with pytest.raises(legs.LegProtocolError):
        legs.moriio_read_decode_params(response, legs.moriio_decode_params(TID, "10.0.0.1", HS, NOTIFY))


@pytest.mark.parametrize(
    ("address", "host"),
    [
        pytest.param("10.0.0.1:8000", "10.0.0.1", id="IPv4"),
        pytest.param("[fd00::1]:8000", "fd00::1", id="IPv6 without brackets"),
        pytest.param("engine-0.ns.svc:8000", "engine-0.ns.svc", id="DNS name"),
    ],
)
def test_address_host(address: str, host: str) -> None:
    assert legs.address_host(address) == host


def test_moriio_is_a_supported_connector() -> None:
    assert legs.MORIIO in legs.SUPPORTED_CONNECTORS
