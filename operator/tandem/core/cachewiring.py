"""What a pool needs from its MooncakeCache, read from the cache's status.

What it owns: turning a MooncakeCache object (as read) into the `CacheWiring` that becomes part of a
pool's revision, and into a degradation message when the cache is not healthy. A cache problem alone
never changes a pool's pairs: the wiring is taken from the last published endpoints, and the pool
keeps serving from local prefix caches while `KVCacheDegraded` says why (R-09).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tandem.api.cache import MooncakeCacheSpec, MooncakeCacheStatus
from tandem.api.quantity import quantity_bytes
from tandem.api.revision import CacheWiring


def wiring_from_cache(raw: Mapping[str, Any]) -> tuple[CacheWiring | None, str | None]:
    """(wiring, problem). No wiring until the cache has published a master endpoint."""
    name = (raw.get("metadata") or {}).get("name", "?")
    try:
        spec = MooncakeCacheSpec.model_validate(raw.get("spec") or {})
        status = MooncakeCacheStatus.model_validate(raw.get("status") or {})
    except ValidationError:
        return None, f"MooncakeCache {name} has an unreadable spec or status"
    if not status.endpoints.master:
        return None, f"MooncakeCache {name} has no master endpoint yet"
    transport = spec.store.transport
    wiring = CacheWiring(
        master_address=status.endpoints.master,
        metadata_server=status.endpoints.metadata or "P2PHANDSHAKE",
        protocol=transport.protocol,
        device_names=",".join(transport.devices),
        global_segment_size=0,
        local_buffer_size=quantity_bytes(spec.client.local_buffer_size),
        python_hash_seed=spec.python_hash_seed,
    )
    ready = next((cond for cond in status.conditions if cond.type == "Ready"), None)
    degraded = next((cond for cond in status.conditions if cond.type == "Degraded"), None)
    if degraded is not None and degraded.status == "True":
        return wiring, f"MooncakeCache {name} degraded: {degraded.message}"
    if ready is None or ready.status != "True":
        reason = ready.message if ready is not None else "not ready yet"
        return wiring, f"MooncakeCache {name} not ready: {reason}"
    return wiring, None
