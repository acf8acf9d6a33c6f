"""The router's open-streams report: what one router replica tells the operator about its open streams.

Why it exists: a draining pair may be deleted once no router has a stream open on it (issue 15, item 6);
before this report the operator could only wait ``drainTimeout``. Each router replica serves the report
at ``GET /streams`` on its health/metrics listener; the operator reads every replica listed in the router
Service's EndpointSlices (``tandem.adapters.routerstreams``) and decides in ``tandem.core.drains``.

Contract (``tandem.dev/router-streams-v1``), per pool ``namespace/pool``:

- ``fingerprint``: the fingerprint of the table this replica routes with (the operator only believes a
  replica that routes with the table it published, in which the pair is draining);
- ``openStreams``: requests holding a pair, by pair id, counted from the moment the router chose the pair
  until the last decode byte (or failure) — streams that began before the pair turned draining included;
- ``olderTableRequests``: requests still walking with a table that is no longer live: they may pick a pair
  the live table already drains, so the report is "not done" while any exist.

Pure pydantic; no I/O. Changes must stay compatible (a new optional field, never a renamed one).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

STREAMS_API_VERSION: Final = "tandem.dev/router-streams-v1"
STREAMS_PATH: Final = "/streams"
"""Served on the router's health/metrics listener (not the request listener: load cannot starve it)."""


class _Wire(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, use_attribute_docstrings=True
    )


class PoolStreams(_Wire):
    """One pool as one router replica sees it."""

    fingerprint: Annotated[str, Field(min_length=1, max_length=128)]
    """Fingerprint of the live table of this pool on this replica."""
    open_streams: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """Requests holding each pair (pairs with none are left out)."""
    older_table_requests: Annotated[int, Field(ge=0)] = 0
    """Requests still walking with a table of this pool that is no longer live."""


class StreamsReport(_Wire):
    """The body of ``GET /streams``."""

    api_version: Literal["tandem.dev/router-streams-v1"] = STREAMS_API_VERSION
    pools: dict[str, PoolStreams] = Field(default_factory=dict)
    """Keyed by ``namespace/pool``."""


__all__ = ["STREAMS_API_VERSION", "STREAMS_PATH", "PoolStreams", "StreamsReport"]
