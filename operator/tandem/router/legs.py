"""The prefill and decode legs of one request, per vLLM KV connector (pure builders, no I/O).

Protocol (``docs/design/008-router.md``; vLLM 0.30-0.33 as read in ``dataplane.md`` §1):

- **Prefill leg** (every connector): the client's body with ``max_tokens = 1`` (and
  ``max_completion_tokens = 1`` when the client set it: vLLM's chat path prefers it), ``stream = false``,
  no ``stream_options`` (vLLM refuses it without a stream) and no ``min_tokens`` (vLLM requires
  ``min_tokens <= max_tokens``), plus the connector's prefill ``kv_transfer_params``.
- **Decode leg**: the client's body unchanged (stream as the client asked) plus the decode
  ``kv_transfer_params``.
- **NixlConnector** (sequential): prefill params ``{do_remote_decode: true, do_remote_prefill: false,
  remote_engine_id/remote_block_ids/remote_host/remote_port: null}``; the ``kv_transfer_params`` the prefill
  returns go to decode **verbatim** (the router never interprets them).
- **MooncakeConnector**: the router makes one ``transfer_id`` for both legs; prefill params
  ``{do_remote_decode: true, do_remote_prefill: false, transfer_id}``; decode params ``{do_remote_prefill:
  true, do_remote_decode: false, transfer_id, remote_bootstrap_addr: "http://host:port", remote_engine_id}``
  with the engine id of the chosen data-parallel rank from the prefill's bootstrap ``/query``.
- **MoRIIOConnector** (``docs/design/014-moriio.md``): one ``transfer_id`` for both legs; the prefill params
  name the decode's MoRIIO address ``{do_remote_decode: true, do_remote_prefill: false, transfer_id,
  remote_host, remote_handshake_port, remote_notify_port, remote_engine_id/remote_block_ids: null}``.
  *Write* mode (both legs at once): the decode params name the prefill's address ``{do_remote_prefill: true,
  do_remote_decode: false, transfer_id, remote_host, remote_handshake_port, remote_notify_port,
  remote_engine_id/remote_block_ids: null, remote_dp_size}`` (+ ``remote_dp_rank`` when DP > 1). *Read*
  mode (in sequence): the decode params are the ``kv_transfer_params`` the prefill returned, verbatim, over
  the Write-mode fields as defaults (older vLLM versions return no address).

Must not: do I/O, read clocks or randomness (ids are inputs), or change the client's body in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"
MORIIO = "MoRIIOConnector"
SUPPORTED_CONNECTORS: Final = frozenset({NIXL, MOONCAKE, MORIIO})

HEADER_REQUEST_ID = "X-Request-Id"
HEADER_DP_RANK = "X-data-parallel-rank"

NIXL_PREFILL_PARAMS: Final[Mapping[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Fields of the client body the prefill leg must not carry (see module docstring).
_PREFILL_DROPPED = ("stream_options", "min_tokens")


class LegProtocolError(ValueError):
    """An engine answered in a shape the connector's protocol does not allow."""


def build_prefill_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: one token, not streamed, with the connector's prefill params."""
    out = {k: v for k, v in body.items() if k not in _PREFILL_DROPPED}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def build_decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The decode leg's body: the client's body plus the decode params (any the client sent are replaced)."""
    out = dict(body)
    out["kv_transfer_params"] = kv_transfer_params
    return out


def nixl_prefill_params() -> dict[str, Any]:
    """NixlConnector prefill ``kv_transfer_params`` (the pull-mode request of vLLM's toy proxy)."""
    return dict(NIXL_PREFILL_PARAMS)


def nixl_decode_params(prefill_response: Any) -> Any:
    """The ``kv_transfer_params`` a NixlConnector prefill returned, to be sent to decode verbatim."""
    if not isinstance(prefill_response, dict) or not isinstance(prefill_response.get("kv_transfer_params"), dict):
        raise LegProtocolError("prefill response carries no kv_transfer_params")
    return prefill_response["kv_transfer_params"]


def mooncake_prefill_params(transfer_id: str) -> dict[str, Any]:
    """MooncakeConnector prefill ``kv_transfer_params``."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}


def mooncake_decode_params(
    transfer_id: str, bootstrap_addr: str, engine_id: str, dp_rank: int | None = None
) -> dict[str, Any]:
    """MooncakeConnector decode ``kv_transfer_params``; ``dp_rank`` only when the prefill runs DP > 1."""
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        "remote_bootstrap_addr": bootstrap_addr,
        "remote_engine_id": engine_id,
    }
    if dp_rank is not None:
        params["remote_dp_rank"] = dp_rank
    return params


def bootstrap_addr(address: str, port: int) -> str:
    """``http://host:port`` of a prefill's Mooncake bootstrap server, from the pair's ``host:port``."""
    host = address.rsplit(":", 1)[0]
    return f"http://{host}:{port}"


def engine_id_for_rank(query: Any, dp_rank: int) -> str:
    """The engine id of ``dp_rank`` in a bootstrap ``/query`` answer
    (``{"<dp_rank>": {"engine_id": ..., "worker_addr": {...}}}``)."""
    entry = query.get(str(dp_rank)) if isinstance(query, dict) else None
    engine_id = entry.get("engine_id") if isinstance(entry, dict) else None
    if not isinstance(engine_id, str) or not engine_id:
        raise LegProtocolError(f"bootstrap /query has no engine_id for data-parallel rank {dp_rank}")
    return engine_id


def address_host(address: str) -> str:
    """The bare host of a pair endpoint's ``host:port`` (an IPv6 host without its brackets), as MoRIIO
    compares it with the address the engine advertises."""
    return address.rsplit(":", 1)[0].removeprefix("[").removesuffix("]")


def _moriio_peer(host: str, handshake_port: int, notify_port: int) -> dict[str, Any]:
    """The other side's MoRIIO address, as vLLM's ``MoRIIOConnectorMetadata.add_new_req`` reads it when the
    request id does not embed one (Tandem's ids never do). ``remote_engine_id`` and ``remote_block_ids`` are
    indexed by that method, so they are present (null): Write mode derives the engine id from host and
    handshake port, and the blocks come from the decode's notification."""
    return {
        "remote_host": host,
        "remote_handshake_port": handshake_port,
        "remote_notify_port": notify_port,
        "remote_engine_id": None,
        "remote_block_ids": None,
    }


def moriio_prefill_params(transfer_id: str, decode_host: str, handshake_port: int, notify_port: int) -> dict[str, Any]:
    """MoRIIOConnector prefill ``kv_transfer_params`` (both modes): the decode's address, which Write mode
    needs to write into the decode's blocks; Read mode ignores it."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": transfer_id,
        **_moriio_peer(decode_host, handshake_port, notify_port),
    }


def moriio_decode_params(
    transfer_id: str,
    prefill_host: str,
    handshake_port: int,
    notify_port: int,
    dp_size: int = 1,
    dp_rank: int | None = None,
) -> dict[str, Any]:
    """MoRIIOConnector Write-mode decode ``kv_transfer_params``: the prefill's address, where the decode sends
    its "blocks ready" notification (notify port + the rank offset vLLM adds). ``dp_rank`` only with DP > 1."""
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        **_moriio_peer(prefill_host, handshake_port, notify_port),
        "remote_dp_size": dp_size,
    }
    if dp_rank is not None:
        params["remote_dp_rank"] = dp_rank
    return params


def moriio_read_decode_params(prefill_response: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """MoRIIOConnector Read-mode decode ``kv_transfer_params``: what the prefill returned (vLLM's
    ``request_finished``: engine id, block ids, its address and rank), over ``defaults`` (the Write-mode decode
    params) for any field it left out. The returned ``transfer_id`` must be the router's: a different one would
    pair the decode with another request's KV."""
    returned = nixl_decode_params(prefill_response)
    if "transfer_id" in returned and returned["transfer_id"] != defaults.get("transfer_id"):
        raise LegProtocolError("prefill returned another transfer_id than the router sent")
    return {**defaults, **returned}
