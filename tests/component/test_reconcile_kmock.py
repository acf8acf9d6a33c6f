"""A pool reconcile pass through the real HTTP client against KMock's Kubernetes emulator.

Why KMock and not an in-memory `KubeApi` fake: these passes run the product's own adapter
(`tandem.adapters.kube.RealKube`: the official client in worker threads, `fieldValidation=Strict`, server-side
apply content type, the status subresource, error mapping from HTTP statuses), so the writes asserted here
are HTTP requests as the API server would receive them. That makes the level-based invariant (INV-8:
unchanged inputs, zero writes) checkable at the wire, where the audit log of the cluster tier sees it,
in a test that needs no control plane.

KMock stores objects as plain JSON and merges updates: it has no label selectors, resourceVersion, SSA
field ownership or status-subresource split (testing.md §1), so nothing here asserts on those. One SSA
behaviour the reconcile relies on is added (`ApplyingEmulator`): an apply creates a missing object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import aiohttp.web
import kmock
import pytest
from kubernetes import client

from tandem.adapters.kube import RealKube
from tandem.api.labels import LABEL_COMPONENT, LABEL_POOL, LABEL_ROLE
from tandem.core.reasons import REASON_PAIRS_CREATED
from tandem.reconcile.pool import reconcile_pool
from tests.support.factories import T0, make_pool

NAMESPACE = "ns"
POOL = "speed"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
POOLS = kmock.resource("tandem.dev", "v1alpha1", "inferencepools")
CONFIGMAPS = kmock.resource("", "v1", "configmaps")


def gpu_node(index: int) -> dict[str, Any]:
    name = f"gpu-{index:03d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": f"zone-{'ab'[index % 2]}",
                "amd.com/gpu.device-id": "74a5",
            },
        },
        "spec": {},
        "status": {"allocatable": {"amd.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def fixed_clock() -> datetime:
    return T0


class ApplyingEmulator(kmock.KubernetesEmulator):
    """KMock's emulator plus two API-server behaviours the reconcile relies on.

    - Server-side apply creates a missing object (an ``application/apply-patch+yaml`` PATCH); the plain
      emulator answers 404, which the reconcile rightly takes as "deleted mid-pass" and ends the pass (R-11).
    - ``metadata.generateName`` gets a unique name (Events use it); the plain emulator stores every such
      object under the name None, so the second Event of a pass is a 409.
    - PUT on the ``status`` subresource replaces the status (the emulator serves no PUT at all).
    """

    generated: int = 0

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        meta = request.data.get("metadata") if request.method == "POST" and isinstance(request.data, dict) else None
        if isinstance(meta, dict) and meta.get("generateName") and not meta.get("name"):
            type(self).generated += 1
            meta["name"] = f"{meta['generateName']}{type(self).generated:05d}"
        if request.method == "PUT" and request.resource is not None and request.subresource == "status":
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
            stored = self.objects[key]
            stored.patch({"status": None})  # a replace, not a merge: fields that went away must go
            stored.patch({"status": request.data.get("status") or {}})
            return aiohttp.web.json_response(stored.raw)
        applying = str(request.headers.get("Content-Type", "")).startswith("application/apply-patch")
        if request.resource is not None and request.method == "PATCH" and applying and request.name:
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                self.objects[key] = request.data
        return await super()._handle(request)


@pytest.fixture
async def emulator() -> AsyncIterator[ApplyingEmulator]:
    """The emulator on a local port, knowing the built-in resources and the InferencePool CRD."""
    async with ApplyingEmulator() as handler, kmock.Server(handler):
        handler.resources.load_bundled()
        handler.resources[POOLS] = kmock.ResourceInfo(
            namespaced=True,
            kind="InferencePool",
            singular="inferencepool",
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources={"status", "scale"},
        )
        yield handler


@pytest.fixture
def kube(emulator: ApplyingEmulator) -> Iterator[RealKube]:
    """The product's adapter over the official client, pointed at the emulator."""
    configuration = client.Configuration(host=str(emulator.url).rstrip("/"))
    configuration.retries = 0
    api = client.ApiClient(configuration)
    try:
        yield RealKube(api)
    finally:
        api.close()


def seed(emulator: kmock.KubernetesEmulator, pairs: int, nodes: int) -> None:
    pool = make_pool(POOL).pairs(pairs).obj().model_dump(mode="json", by_alias=True, exclude_none=True)
    emulator.objects[POOLS, NAMESPACE, POOL] = pool
    for i in range(nodes):
        emulator.objects[NODES, None, f"gpu-{i:03d}"] = gpu_node(i)


def writes(emulator: kmock.KubernetesEmulator, since: int = 0) -> list[str]:
    """`METHOD path` of every write request the emulator received after the first ``since`` requests."""
    return [f"{r.method.value} {r.url.path}" for r in list(emulator)[since:] if r.method.value in WRITE_METHODS]


def engine_pods(emulator: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    return [
        obj.raw
        for (resource, namespace, _), obj in emulator.objects.items()
        if resource == PODS and namespace == NAMESPACE and not obj.deleted
    ]


async def test_fresh_pool_pass_creates_every_pair_over_http(emulator: ApplyingEmulator, kube: RealKube) -> None:
    seed(emulator, pairs=2, nodes=2)
    result = await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    assert not result.error, result.error
    pods = engine_pods(emulator)
    roles = sorted(p["metadata"]["labels"][LABEL_ROLE] for p in pods)
    assert roles == ["decode", "decode", "prefill", "prefill"]
    assert {p["metadata"]["labels"][LABEL_POOL] for p in pods} == {POOL}
    assert all(p["metadata"]["labels"][LABEL_COMPONENT] == "engine" for p in pods)
    sent = writes(emulator)
    assert sum(w.startswith(f"POST /api/v1/namespaces/{NAMESPACE}/pods") for w in sent) == 4
    events = [
        obj.raw for (resource, _, _), obj in emulator.objects.items() if resource.plural == "events" and not obj.deleted
    ]
    assert REASON_PAIRS_CREATED in {e.get("reason") for e in events}


async def test_second_pass_on_unchanged_state_writes_nothing(emulator: ApplyingEmulator, kube: RealKube) -> None:
    """INV-8 at the wire: once the status has caught up with the pods it created, a pass sends no write."""
    seed(emulator, pairs=2, nodes=2)
    await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    # The pass after the creates observes them (its input changed): it may record that in status and
    # report the condition that flipped, but it creates, applies and deletes nothing.
    before = len(list(emulator))
    await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    catching_up = writes(emulator, before)
    assert not [w for w in catching_up if not w.endswith(("/status", "/events"))], catching_up
    before = len(list(emulator))
    result = await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    assert not result.error, result.error
    assert writes(emulator, before) == []
    assert len(engine_pods(emulator)) == 4


async def test_foreign_edit_of_the_routing_table_is_restored_once(emulator: ApplyingEmulator, kube: RealKube) -> None:
    """CC-02 at the wire: a foreign writer's edit to the published table is re-applied, then quiet again."""
    seed(emulator, pairs=1, nodes=1)
    for _ in range(3):  # create, catch up, settle
        await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    key = (CONFIGMAPS, NAMESPACE, f"{POOL}-routing")
    published = dict(emulator.objects[key].raw["data"])
    emulator.objects[key].patch({"data": {"routing.json": "{}"}})
    before = len(list(emulator))
    await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    assert writes(emulator, before) == [f"PATCH /api/v1/namespaces/{NAMESPACE}/configmaps/{POOL}-routing"]
    assert emulator.objects[key].raw["data"] == published
    before = len(list(emulator))
    await reconcile_pool(kube, NAMESPACE, POOL, clock=fixed_clock)
    assert writes(emulator, before) == []
