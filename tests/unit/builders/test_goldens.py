"""Golden files of what the builders make for each example in examples/ (tests/golden/builders/).

One file per example, the objects in a fixed order: for a pool, the prefill and decode pods of pair 0
(built with the parameters the pool reconcile's act step passes), the engine Service, the revision
snapshot ConfigMap, the routing ConfigMap after the first planning pass, and the eval Job when the
example has an eval gate; for a MooncakeCache, the first pass's component pods (built by the cache
reconcile's own builder dispatch), the Services and the client ConfigMap. Regenerate on purpose with
``pytest --update-golden`` (tests/support/golden.py).

The clock, uids and node names are fixed here, so every field is deterministic and nothing is skipped
but what the API server would set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.labels import LABEL_COMPONENT, Role
from tandem.api.pool import EvalGate
from tandem.api.quantity import parse_duration
from tandem.api.resources import InferencePool, MooncakeCache
from tandem.api.revision import CacheWiring, revision_id, revision_spec
from tandem.builders import mooncake as mb
from tandem.builders.evaljob import build_eval_job
from tandem.builders.objects import build_revision_configmap, build_routing_configmap, build_service
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core import mooncake as m
from tandem.core.cachewiring import wiring_from_cache
from tandem.core.observed import Snapshot
from tandem.core.plan import plan_pool
from tandem.reconcile.cache import _build as build_cache_pod
from tests.support.factories import T0, make_nodes
from tests.support.golden import assert_golden, render, scrub

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
GOLDEN = REPO / "tests" / "golden" / "builders"
NAMESPACE = "llm"
POOL_UID = "00000000-0000-4000-8000-000000000001"
CACHE_UID = "00000000-0000-4000-8000-000000000002"
NODE = "gpu-000"
CACHE_EXAMPLE = EXAMPLES / "mooncake-cache.yaml"


def load(path: Path) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(path.read_text())
    obj["metadata"].update(namespace=NAMESPACE, generation=1)
    return obj


def example_cache() -> MooncakeCache:
    obj = load(CACHE_EXAMPLE)
    obj["metadata"]["uid"] = CACHE_UID
    return MooncakeCache.model_validate(obj)


def cache_wiring(pool: InferencePool) -> CacheWiring | None:
    """The wiring the pool reconcile reads from examples/mooncake-cache.yaml once it has published endpoints."""
    ref = pool.spec.kv_cache.mooncake_ref
    if ref is None:
        return None
    cache = example_cache()
    assert ref.name == cache.metadata.name, "the pool examples reference examples/mooncake-cache.yaml"
    endpoints = mb.cache_endpoints(cache.metadata.name, NAMESPACE, cache.spec)
    raw = {**cache.model_dump(mode="json", by_alias=True, exclude_none=True), "status": {"endpoints": endpoints.wire()}}
    wiring, _ = wiring_from_cache(raw)
    assert wiring is not None
    return wiring


def pool_objects(path: Path) -> list[dict[str, Any]]:
    obj = load(path)
    obj["metadata"]["uid"] = POOL_UID
    pool = InferencePool.model_validate(obj)
    name = pool.metadata.name
    wiring = cache_wiring(pool)
    spec = revision_spec(pool.spec, wiring)
    rev = revision_id(spec)
    cache_name = pool.spec.kv_cache.mooncake_ref.name if pool.spec.kv_cache.mooncake_ref else None

    def pod(role: Role) -> dict[str, Any]:  # as tandem.reconcile.pool.act builds a planned create
        return build_instance_pod(
            InstanceParams(
                pool=name,
                namespace=NAMESPACE,
                pool_uid=POOL_UID,
                pair=0,
                role=role,
                instance=0,
                revision=rev,
                spec=spec,
                node=NODE,
                cache_name=cache_name,
                drain_timeout_s=parse_duration(pool.spec.pairs.drain_timeout),
            )
        )

    plan = plan_pool(Snapshot(pool=pool, pods=(), nodes=tuple(make_nodes(4)), now=T0, cache=wiring))
    objects = [
        pod("prefill"),
        pod("decode"),
        build_service(name, NAMESPACE, POOL_UID),
        build_revision_configmap(name, NAMESPACE, POOL_UID, rev, spec),
        build_routing_configmap(plan.routing, POOL_UID),
    ]
    gate: EvalGate | None = pool.spec.rollout.analysis.eval
    if gate is not None:
        objects.append(
            build_eval_job(
                pool=name,
                namespace=NAMESPACE,
                pool_uid=POOL_UID,
                revision=rev,
                step=0,
                gate=gate,
                model=pool.spec.model.served_name,
                target_urls=["http://10.0.0.1:8000"],
            )
        )
    return objects


def cache_nodes(cache: MooncakeCache) -> tuple[m.StoreNode, ...]:
    """Two nodes in two zones that match the example's store nodeSelector."""
    selector = dict(cache.spec.store.node_selector)
    return tuple(
        m.StoreNode(
            name=f"gpu-{i:03d}",
            labels={"kubernetes.io/hostname": f"gpu-{i:03d}", "topology.kubernetes.io/zone": f"zone-{z}", **selector},
            memory_bytes=2048 * 2**30,
        )
        for i, z in enumerate("ab")
    )


def cache_objects() -> list[dict[str, Any]]:
    cache = example_cache()
    name = cache.metadata.name
    endpoints = mb.cache_endpoints(name, NAMESPACE, cache.spec)
    snapshot = m.CacheSnapshot(
        cache=cache,
        nodes=cache_nodes(cache),
        masters=(),
        metadata_pods=(),
        stores=(),
        endpoints=endpoints,
        client_config_hash=mb.client_config_hash(mb.client_config_text(cache.spec, endpoints)),
        referenced_by=(),
        now=T0,
    )
    plan = m.plan_cache(snapshot)
    ref = mb.CacheRef(name=name, namespace=NAMESPACE, uid=CACHE_UID, spec=cache.spec)
    pods = [build_cache_pod(ref, snapshot, create) for create in plan.creates]
    assert {p["metadata"]["labels"][LABEL_COMPONENT] for p in pods} >= {mb.COMPONENT_MASTER, mb.COMPONENT_STORE}
    objects = [*pods, mb.build_master_service(ref)]
    if plan.metadata_server:
        objects.append(mb.build_metadata_service(ref))
    objects.append(mb.build_client_configmap(ref, endpoints))
    return objects


def pool_examples() -> list[Path]:
    return sorted(p for p in EXAMPLES.glob("*.yaml") if yaml.safe_load(p.read_text()).get("kind") == "InferencePool")


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in pool_examples()])
def test_pool_example_objects_match_golden(path: Path) -> None:
    assert_golden(GOLDEN / f"{path.stem}.yaml", pool_objects(path))


def test_mooncake_example_objects_match_golden() -> None:
    assert_golden(GOLDEN / f"{CACHE_EXAMPLE.stem}.yaml", cache_objects())


def test_every_example_has_a_golden_and_no_golden_is_orphaned() -> None:
    want = {p.stem for p in pool_examples()} | {CACHE_EXAMPLE.stem}
    have = {p.stem for p in GOLDEN.glob("*.yaml")}
    assert have == want, f"missing: {sorted(want - have)}, orphaned: {sorted(have - want)}"


def test_golden_rendering_is_deterministic_and_drops_only_server_fields() -> None:
    objects = pool_objects(EXAMPLES / "minimal-pool.yaml")
    assert render(objects) == render(pool_objects(EXAMPLES / "minimal-pool.yaml"))
    served = {**objects[0], "metadata": {**objects[0]["metadata"], "uid": "x", "resourceVersion": "7"}}
    assert scrub(served) == scrub(objects[0])
    assert scrub(served)["metadata"]["labels"]["tandem.dev/revision"]  # content-derived: kept, compared
    assert yaml.safe_load_all(render(objects)) is not None
    assert [d["kind"] for d in yaml.safe_load_all(render(objects))] == [o["kind"] for o in objects]
