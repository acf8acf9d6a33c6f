"""The pods Tandem's builders produce for examples/speed-pool.yaml, as the realengine tier starts them."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from tandem.api.labels import Role
from tandem.api.resources import InferencePool
from tandem.api.revision import CacheWiring, revision_id, revision_spec
from tandem.builders.pods import InstanceParams, build_instance_pod
from tests.realengine.engines import REPO, Engine

EXAMPLE = REPO / "examples" / "speed-pool.yaml"


def example_pool(connector: str | None = None) -> InferencePool:
    """examples/speed-pool.yaml, optionally with another P->D connector (nothing else changed)."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).update(namespace="default", uid="uid-speed", generation=1)
    if connector is not None:
        obj["spec"]["stack"]["kvTransfer"]["connector"] = connector
    return InferencePool.model_validate(obj)


def example_cache_wiring() -> CacheWiring:
    """A wiring as examples/mooncake-cache.yaml publishes it (placeholder addresses: only parsed, never dialled)."""
    return CacheWiring(master_address="fleet-cache-master.default.svc:50051", metadata_server="P2PHANDSHAKE")


def built_pod(pool: InferencePool, role: Role, cache: CacheWiring | None = None) -> dict[str, Any]:
    spec = revision_spec(pool.spec, cache)
    params = InstanceParams(
        pool=pool.metadata.name,
        namespace="default",
        pool_uid="uid-speed",
        pair=0,
        role=role,
        instance=0,
        revision=revision_id(spec),
        spec=spec,
        cache_name="fleet-cache" if cache is not None else None,
    )
    return build_instance_pod(params)


@dataclass
class BuiltEngine:
    """A real engine started from a built pod, with what the builder emitted kept for comparison."""

    engine: Engine
    pod: dict[str, Any]

    @property
    def container(self) -> dict[str, Any]:
        container: dict[str, Any] = self.pod["spec"]["containers"][0]
        return container
