"""The pods Tandem's builders produce for examples/speed-pool.yaml (and the Mooncake master and client
config they produce for examples/mooncake-cache.yaml), as the realengine tier starts them."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from tandem.api.cache import CacheEndpoints
from tandem.api.labels import Role
from tandem.api.resources import InferencePool, MooncakeCache
from tandem.api.revision import CacheWiring, revision_id, revision_spec
from tandem.builders.mooncake import CacheRef, build_master_pod, cache_endpoints, client_config
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.cachewiring import wiring_from_cache
from tests.realengine.engines import REPO, Engine

EXAMPLE = REPO / "examples" / "speed-pool.yaml"
CACHE_EXAMPLE = REPO / "examples" / "mooncake-cache.yaml"


def example_pool(connector: str | None = None) -> InferencePool:
    """examples/speed-pool.yaml, optionally with another P->D connector (nothing else changed)."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).update(namespace="default", uid="uid-speed", generation=1)
    if connector is not None:
        obj["spec"]["stack"]["kvTransfer"]["connector"] = connector
    return InferencePool.model_validate(obj)


def example_cache() -> MooncakeCache:
    """examples/mooncake-cache.yaml (the cache speed-pool's kvCache.mooncakeRef names)."""
    obj = copy.deepcopy(yaml.safe_load(CACHE_EXAMPLE.read_text()))
    obj.setdefault("metadata", {}).update(namespace="default", uid="uid-cache", generation=1)
    return MooncakeCache.model_validate(obj)


def example_cache_ref() -> CacheRef:
    cache = example_cache()
    return CacheRef(name=cache.metadata.name, namespace="default", uid="uid-cache", spec=cache.spec)


def example_cache_wiring() -> CacheWiring:
    """The wiring the operator derives from examples/mooncake-cache.yaml once its master is published
    (core/cachewiring.py): the same function, fed the endpoints the cache builders publish."""
    ref = example_cache_ref()
    endpoints = cache_endpoints(ref.name, ref.namespace, ref.spec)
    raw = {"metadata": {"name": ref.name}, "spec": ref.spec.model_dump(by_alias=True, exclude_none=True)}
    raw["status"] = {"endpoints": endpoints.model_dump(by_alias=True)}
    wiring, _problem = wiring_from_cache(raw)  # a problem is "not ready": irrelevant to what pods get
    assert wiring is not None
    return wiring


def master_container() -> dict[str, Any]:
    """The container of the Mooncake master pod the cache builders produce for the example cache."""
    container: dict[str, Any] = build_master_pod(example_cache_ref(), 0, {})["spec"]["containers"][0]
    return container


def loopback_client_config(master: str) -> dict[str, Any]:
    """The builders' `mooncake.json` (the client ConfigMap engines mount) with the master on loopback."""
    ref = example_cache_ref()
    endpoints = cache_endpoints(ref.name, ref.namespace, ref.spec)
    return client_config(ref.spec, CacheEndpoints(master=master, metadata=endpoints.metadata))


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
