"""The MooncakeCache planner: store placement (spread, capacity, memory bound, stability under churn), health,
conditions, deletion hold and zero-change passes (pure, table + property)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.api.cache import MooncakeCacheStatus
from tandem.api.common import Toleration
from tandem.api.labels import LABEL_INSTANCE
from tandem.api.quantity import quantity_bytes
from tandem.api.resources import MooncakeCache
from tandem.builders import mooncake as b
from tandem.core import conditions as c
from tandem.core import mooncake as m
from tandem.core.observed import ObservedPod

GI = 2**30
T0 = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
IMAGE = "ghcr.io/example/mooncake@sha256:" + "a" * 64


def node(
    name: str,
    zone: str = "zone-a",
    mem_gi: int = 2048,
    *,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    taints: tuple[dict[str, str], ...] = (),
    extended: dict[str, int] | None = None,
) -> m.StoreNode:
    return m.StoreNode(
        name=name,
        labels={"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone, **(labels or {})},
        memory_bytes=mem_gi * GI,
        extended=extended or {},
        ready=ready,
        unschedulable=unschedulable,
        taints=taints,
    )


def nodes(count: int, zones: int = 2, mem_gi: int = 2048) -> list[m.StoreNode]:
    return [node(f"n{i}", f"zone-{chr(ord('a') + i % zones)}", mem_gi) for i in range(count)]


def policy(**changes: Any) -> m.StorePolicy:
    base = m.StorePolicy(segment_bytes=64 * GI, memory_limit_bytes=80 * GI, reserve_bytes=256 * GI)
    return replace(base, **changes)


def existing_from(result: m.PlacementResult) -> list[m.ExistingStore]:
    return [m.ExistingStore(a.id, a.node, a.slot, ready=True) for a in result.placed]


def per_node(result: m.PlacementResult) -> Counter[str]:
    return Counter(a.node for a in result.placed)


def per_domain(result: m.PlacementResult) -> Counter[str]:
    return Counter(a.domain for a in result.placed)


# --- placement: tables -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pol", "fleet", "want_placed", "want_per_node_max"),
    [
        pytest.param(policy(), nodes(4), 4, 1, id="default: one store per eligible node"),
        pytest.param(policy(max_per_node=2), nodes(4), 8, 2, id="default with maxPerNode 2 fills every slot"),
        pytest.param(policy(stores=3), nodes(4), 3, 1, id="stores: exact count"),
        pytest.param(policy(capacity_bytes=200 * GI), nodes(4), 4, 1, id="capacity: ceil(200Gi / 64Gi) = 4"),
        pytest.param(policy(stores=6, max_per_node=2), nodes(5), 6, 2, id="worked example: 6 stores on 5 nodes"),
        pytest.param(policy(), nodes(3, mem_gi=300), 0, 0, id="300Gi nodes minus 256Gi reserve fit no 80Gi store"),
        pytest.param(policy(max_per_node=8), nodes(1, mem_gi=512), 3, 3, id="memory bounds slots: (512-256)//80 = 3"),
    ],
)
def test_place_stores_counts(
    pol: m.StorePolicy, fleet: list[m.StoreNode], want_placed: int, want_per_node_max: int
) -> None:
    result = m.place_stores(pol, fleet, [], seed="ns/cache")
    assert len(result.placed) == want_placed
    assert max(per_node(result).values(), default=0) == want_per_node_max
    assert [a.id for a in result.placed] == list(range(want_placed))


def test_place_stores_worked_example_spreads_three_and_three() -> None:
    fleet = [node("n1", "a"), node("n2", "a"), node("n3", "a"), node("n4", "b"), node("n5", "b")]
    result = m.place_stores(policy(stores=6, max_per_node=2), fleet, [], seed="ns/cache")
    assert per_domain(result) == {"a": 3, "b": 3}
    assert set(per_node(result)) == {"n1", "n2", "n3", "n4", "n5"}
    assert result.short == 0


def test_place_stores_module_docstring_worked_example() -> None:
    fleet = [node("n1", "a"), node("n2", "a"), node("n3", "a"), node("n4", "b"), node("n5", "b")]
    pol = policy(stores=6, max_per_node=2)
    first = m.place_stores(pol, fleet, [], seed="llm/fleet-cache")
    assert [(a.id, a.node) for a in first.added] == [(0, "n3"), (1, "n4"), (2, "n2"), (3, "n5"), (4, "n1"), (5, "n4")]
    assert len(first.placed) * pol.segment_bytes == 384 * GI
    lost = m.place_stores(pol, [n for n in fleet if n.name != "n2"], existing_from(first), seed="llm/fleet-cache")
    assert [(r.id, r.node) for r in lost.removed] == [(2, "n2")]
    assert [(a.id, a.node) for a in lost.added] == [(6, "n3")]
    grown = m.place_stores(pol, [*fleet, node("n6", "b")], existing_from(first), seed="llm/fleet-cache")
    assert not grown.added and not grown.removed


def test_place_stores_reports_shortfall_with_reason() -> None:
    result = m.place_stores(policy(stores=6), nodes(4), [], seed="s")
    assert (len(result.placed), result.short) == (4, 2)
    assert "2 store(s) (128Gi) unplaced" in result.why_short
    assert "4 eligible node(s) hold 4 store(s)" in result.why_short


def test_place_stores_node_selector_and_taints() -> None:
    taint = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    fleet = [
        node("plain", labels={"pool": "kv"}),
        node("tainted", labels={"pool": "kv"}, taints=(taint,)),
        node("other", labels={"pool": "engines"}),
    ]
    result = m.place_stores(policy(node_selector={"pool": "kv"}), fleet, [], seed="s")
    assert set(per_node(result)) == {"plain"}
    tolerant = policy(node_selector={"pool": "kv"}, tolerations=(Toleration(key="gpu", operator="Exists"),))
    assert set(per_node(m.place_stores(tolerant, fleet, [], seed="s"))) == {"plain", "tainted"}
    nothing = m.place_stores(policy(node_selector={"pool": "none"}, stores=1), fleet, [], seed="s")
    assert "no node matches store.nodeSelector" in nothing.why_short


def test_place_stores_rdma_resource_bounds_slots() -> None:
    fleet = [node("nic", extended={"amd.com/vnic": 2}), node("nonic")]
    result = m.place_stores(policy(max_per_node=4, rdma_resource="amd.com/vnic"), fleet, [], seed="s")
    assert per_node(result) == {"nic": 2}


def test_place_stores_cordoned_node_keeps_its_store_but_gets_no_new_one() -> None:
    fleet = nodes(2)
    first = m.place_stores(policy(max_per_node=2), fleet, [], seed="s")
    assert len(first.placed) == 4
    cordoned = [replace(fleet[0], unschedulable=True), fleet[1]]
    # one of n0's two stores is gone (e.g. evicted): the other stays, the lost slot is not refilled there
    kept = [e for e in existing_from(first) if not (e.node == "n0" and e.slot == 1)]
    again = m.place_stores(policy(max_per_node=2), cordoned, kept, seed="s")
    assert per_node(again) == {"n0": 1, "n1": 2}
    assert not again.removed and not again.added


def test_place_stores_not_ready_node_loses_its_store_to_a_spare() -> None:
    fleet = nodes(3)
    first = m.place_stores(policy(stores=2), fleet, [], seed="s")
    victim = first.placed[0].node
    fleet = [replace(n, ready=False) if n.name == victim else n for n in fleet]
    again = m.place_stores(policy(stores=2), fleet, existing_from(first), seed="s")
    assert [(r.node, r.reason) for r in again.removed] == [(victim, m.MOVE_NODE_NOT_READY)]
    assert len(again.added) == 1 and again.added[0].node not in {victim, first.placed[1].node}
    assert again.added[0].id == 2  # ids of removed stores are not reused in the same pass


def test_place_stores_scale_down_removes_from_the_fullest_domain() -> None:
    fleet = [node("a1", "a"), node("a2", "a"), node("a3", "a"), node("b1", "b")]
    first = m.place_stores(policy(stores=4), fleet, [], seed="s")
    assert per_domain(first) == {"a": 3, "b": 1}
    down = m.place_stores(policy(stores=2), fleet, existing_from(first), seed="s")
    assert per_domain(down) == {"a": 1, "b": 1}
    assert all(r.reason == m.MOVE_SURPLUS for r in down.removed)


def test_place_stores_new_ids_skip_ids_still_held_by_terminating_pods() -> None:
    result = m.place_stores(policy(stores=2), nodes(2), [], taken_ids={0, 2}, seed="s")
    assert [a.id for a in result.placed] == [1, 3]


def test_place_stores_lost_room_keeps_lowest_ids() -> None:
    fleet = nodes(1)
    first = m.place_stores(policy(max_per_node=3), fleet, [], seed="s")
    smaller = [replace(fleet[0], memory_bytes=(256 + 160) * GI)]  # room for 2 stores now
    again = m.place_stores(policy(max_per_node=3), smaller, existing_from(first), seed="s")
    assert [a.id for a in again.placed] == [0, 1]
    assert [(r.id, r.reason) for r in again.removed] == [(2, m.MOVE_NO_ROOM)]


# --- placement: properties -------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> tuple[m.StorePolicy, list[m.StoreNode]]:
    count = draw(st.integers(1, 12))
    zones = draw(st.integers(1, 3))
    mems = draw(st.lists(st.sampled_from([300, 420, 512, 1024, 2048]), min_size=count, max_size=count))
    fleet = [node(f"n{i}", f"z{i % zones}", mem) for i, mem in enumerate(mems)]
    mode = draw(st.sampled_from(["default", "stores", "capacity"]))
    pol = policy(max_per_node=draw(st.integers(1, 3)))
    if mode == "stores":
        pol = replace(pol, stores=draw(st.integers(1, 20)))
    elif mode == "capacity":
        pol = replace(pol, capacity_bytes=draw(st.integers(1, 20)) * 50 * GI)
    return pol, fleet


def slots_of(pol: m.StorePolicy, fleet: Sequence[m.StoreNode]) -> dict[str, int]:
    return {n.name: m.node_slots(n, pol) for n in fleet}


def check_spread(result: m.PlacementResult, pol: m.StorePolicy, fleet: Sequence[m.StoreNode]) -> None:
    slots = slots_of(pol, fleet)
    counts = per_node(result)
    domains = {n.labels["topology.kubernetes.io/zone"] for n in fleet if slots[n.name] > 0}
    load = {d: per_domain(result)[d] for d in domains}
    room = {
        d: any(counts[n.name] < slots[n.name] for n in fleet if n.labels["topology.kubernetes.io/zone"] == d)
        for d in domains
    }
    for a in domains:
        for z in domains:
            if load[a] > load[z] + 1:
                assert not room[z], f"{a} has {load[a]}, {z} has {load[z]} and free slots"


@given(fleets())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_fresh_placement_respects_memory_capacity_and_spread(data: Any) -> None:
    pol, fleet = data
    result = m.place_stores(pol, fleet, [], seed="ns/c")
    slots = slots_of(pol, fleet)
    by_name = {n.name: n for n in fleet}
    for name, count in per_node(result).items():
        assert count <= slots[name]
        assert count * pol.memory_limit_bytes <= by_name[name].memory_bytes - pol.reserve_bytes  # memory bound
        assert count <= pol.max_per_node
    assert len(result.placed) == min(result.wanted, sum(slots.values()))  # capacity: as much as fits
    if result.short == 0:
        assert len(result.placed) * pol.segment_bytes >= (pol.capacity_bytes or 0)
    else:
        assert result.why_short
    check_spread(result, pol, fleet)
    shuffled = list(fleet)
    random.Random(7).shuffle(shuffled)
    again = m.place_stores(pol, shuffled, [], seed="ns/c")
    assert [(a.id, a.node) for a in again.placed] == [(a.id, a.node) for a in result.placed]  # order-independent


@given(fleets(), st.sampled_from([300, 2048]), st.sampled_from(["z0", "z1", "z9"]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_adding_a_node_moves_no_store(data: Any, mem: int, zone: str) -> None:
    pol, fleet = data
    first = m.place_stores(pol, fleet, [], seed="ns/c")
    grown = [*fleet, node("new", zone, mem)]
    again = m.place_stores(pol, grown, existing_from(first), seed="ns/c")
    assert not again.removed
    assert {(a.id, a.node) for a in again.kept} == {(a.id, a.node) for a in first.placed}
    assert all(a.node == "new" or a.id not in {p.id for p in first.placed} for a in again.added)


@given(fleets(), st.integers(0, 11))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_removing_a_node_moves_only_its_stores(data: Any, which: int) -> None:
    pol, fleet = data
    first = m.place_stores(pol, fleet, [], seed="ns/c")
    lost = fleet[which % len(fleet)].name
    on_lost = {a.id for a in first.placed if a.node == lost}
    shrunk = [n for n in fleet if n.name != lost]
    again = m.place_stores(pol, shrunk, existing_from(first), seed="ns/c")
    assert {r.id for r in again.removed} == on_lost
    assert all(r.reason == m.MOVE_NODE_GONE for r in again.removed)
    untouched = {(a.id, a.node) for a in first.placed if a.node != lost}
    assert {(a.id, a.node) for a in again.kept} == untouched
    assert len(again.added) <= len(on_lost)  # at most the stores that had to move are placed anew


@given(fleets())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_placement_is_idempotent(data: Any) -> None:
    pol, fleet = data
    first = m.place_stores(pol, fleet, [], seed="ns/c")
    again = m.place_stores(pol, fleet, existing_from(first), seed="ns/c")
    assert not again.added and not again.removed
    assert again.placed == tuple(replace(a, ready=True) for a in first.placed)


# --- the cache plan --------------------------------------------------------------------------------


def make_cache(name: str = "fleet-cache", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"image": IMAGE, "version": "0.3.13"}
    body.update(spec)
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "MooncakeCache",
        "metadata": {"name": name, "namespace": "llm", "uid": "cache-uid", "generation": 1},
        "spec": body,
    }


@dataclass
class CacheWorld:
    """Pods + cache status advanced by applying plans (pods become Ready one tick after creation)."""

    raw: dict[str, Any]
    fleet: list[m.StoreNode]
    referenced_by: tuple[str, ...] = ()
    now: datetime = T0
    pods: dict[str, tuple[str, ObservedPod]] = field(default_factory=dict)
    never_ready: set[str] = field(default_factory=set)
    plans: list[m.CachePlan] = field(default_factory=list)

    @property
    def cache(self) -> MooncakeCache:
        return MooncakeCache.model_validate(self.raw)

    def snapshot(self) -> m.CacheSnapshot:
        cache = self.cache
        endpoints = b.cache_endpoints(cache.metadata.name, cache.metadata.namespace, cache.spec)
        groups: dict[str, list[ObservedPod]] = {"master": [], "metadata": [], "store": []}
        for kind, pod in self.pods.values():
            groups[kind].append(pod)
        return m.CacheSnapshot(
            cache=cache,
            nodes=tuple(self.fleet),
            masters=tuple(groups["master"]),
            metadata_pods=tuple(groups["metadata"]),
            stores=tuple(groups["store"]),
            endpoints=endpoints,
            client_config_hash=b.client_config_hash(b.client_config_text(cache.spec, endpoints)),
            referenced_by=self.referenced_by,
            now=self.now,
        )

    def tick(self, seconds: float = 5.0) -> m.CachePlan:
        for name, (kind, pod) in list(self.pods.items()):
            if pod.deleting:
                del self.pods[name]
            elif not pod.ready and name not in self.never_ready and pod.node in {n.name for n in self.fleet}:
                self.pods[name] = (kind, replace(pod, ready=True, phase="Running"))
        plan = m.plan_cache(self.snapshot())
        self.apply(plan)
        self.plans.append(plan)
        self.now += timedelta(seconds=seconds)
        return plan

    def apply(self, plan: m.CachePlan) -> None:
        for delete in plan.deletes:
            kind, pod = self.pods[delete.name]
            self.pods[delete.name] = (kind, replace(pod, deleting=True, ready=False))
        cache = self.cache.metadata.name
        for create in plan.creates:
            if create.component == "master":
                name = b.master_pod_name(cache, create.index)
                node_name: str | None = self.fleet[0].name
            elif create.component == "metadata":
                name, node_name = b.metadata_pod_name(cache), self.fleet[0].name
            else:
                name, node_name = b.store_pod_name(cache, create.index), create.node
            self.pods[name] = (
                create.component,
                ObservedPod(
                    name=name,
                    uid=f"uid-{name}-{len(self.plans)}",
                    labels={LABEL_INSTANCE: str(create.index)},
                    annotations=dict(create.annotations),
                    node=node_name,
                    phase="Pending",
                    ready=False,
                    deleting=False,
                    created=self.now,
                    affinity_nodes=(create.node,) if create.node else (),
                ),
            )
        self.raw["status"] = plan.status.wire()

    def run(self, ticks: int = 5) -> m.CachePlan:
        plan = self.tick()
        for _ in range(ticks - 1):
            plan = self.tick()
        return plan

    def status(self) -> MooncakeCacheStatus:
        assert self.cache.status is not None
        return self.cache.status

    def condition(self, kind: str) -> tuple[str, str]:
        cond = c.find(self.status().conditions, kind)
        assert cond is not None, kind
        return cond.status, cond.reason

    def set_ready(self, name: str, ready: bool) -> None:
        kind, pod = self.pods[name]
        self.pods[name] = (kind, replace(pod, ready=ready))
        (self.never_ready.discard if ready else self.never_ready.add)(name)


def test_plan_new_cache_creates_master_and_one_store_per_node_then_converges() -> None:
    world = CacheWorld(make_cache(), nodes(4))
    first = world.tick()
    assert Counter(x.component for x in first.creates) == {"master": 1, "store": 4}
    assert {x.node for x in first.creates if x.component == "store"} == {"n0", "n1", "n2", "n3"}
    assert world.condition(c.CONDITION_READY)[0] == "False"
    assert world.condition(c.CONDITION_PROGRESSING) == ("True", m.REASON_PLACING)
    assert world.condition(c.CONDITION_DEGRADED) == ("False", m.REASON_HEALTHY)
    assert world.status().endpoints.master == "fleet-cache-master.llm.svc:50051"
    assert world.status().endpoints.metadata == "P2PHANDSHAKE"
    world.run(3)
    status = world.status()
    assert world.condition(c.CONDITION_READY) == ("True", m.REASON_ALL_READY)
    assert (status.stores, status.capacity, status.capacity_bytes) == ("4/4", "256Gi", 256 * GI)
    assert [p.node for p in status.placement] == ["n0", "n1", "n2", "n3"]
    assert {p.domain for p in status.placement} == {"zone-a", "zone-b"}
    assert len(status.config_hash) == 16


def test_plan_converged_cache_changes_nothing() -> None:
    world = CacheWorld(make_cache(), nodes(4), referenced_by=("speed",))
    world.run(4)
    before = world.status().wire()
    plan = world.tick()
    assert not plan.creates and not plan.deletes and not plan.events
    assert plan.status.wire() == before  # zero writes
    assert plan.requeue_after == m.REQUEUE_STEADY
    assert world.status().referenced_by == ["speed"]


def test_plan_master_down_degrades_without_touching_stores() -> None:
    world = CacheWorld(make_cache(), nodes(3))
    world.run(4)
    world.set_ready("fleet-cache-master-0", False)
    plan = world.tick()
    assert not plan.creates and not plan.deletes
    assert world.condition(c.CONDITION_DEGRADED) == ("True", m.REASON_MASTER_UNAVAILABLE)
    assert world.condition(c.CONDITION_READY) == ("False", m.REASON_MASTER_UNAVAILABLE)
    assert [e.reason for e in plan.events] == [m.REASON_MASTER_UNAVAILABLE, m.REASON_MASTER_UNAVAILABLE]
    world.set_ready("fleet-cache-master-0", True)
    world.tick()
    assert world.condition(c.CONDITION_DEGRADED) == ("False", m.REASON_HEALTHY)


def test_plan_deleted_master_is_recreated() -> None:
    world = CacheWorld(make_cache(), nodes(2))
    world.run(3)
    del world.pods["fleet-cache-master-0"]
    plan = world.tick()
    assert [(x.component, x.index) for x in plan.creates] == [("master", 0)]
    assert world.condition(c.CONDITION_DEGRADED) == ("True", m.REASON_MASTER_UNAVAILABLE)


def test_plan_crash_looping_store_is_reported_not_deleted() -> None:
    world = CacheWorld(make_cache(), nodes(2))
    world.run(3)
    kind, pod = world.pods["fleet-cache-store-1"]
    world.pods["fleet-cache-store-1"] = (kind, replace(pod, ready=False, crash_looping=True))
    world.never_ready.add("fleet-cache-store-1")
    plan = world.tick()
    assert not plan.deletes
    assert world.condition(c.CONDITION_DEGRADED) == ("True", m.REASON_CRASH_LOOPING)
    assert world.status().stores == "1/2"


def test_plan_lost_node_re_places_its_store_on_the_spare() -> None:
    world = CacheWorld(make_cache(store={"stores": 3}), nodes(4))
    world.run(3)
    placed = [p.node for p in world.status().placement]
    spare = ({"n0", "n1", "n2", "n3"} - set(placed)).pop()
    lost = placed[0]
    world.fleet = [n for n in world.fleet if n.name != lost]
    plan = world.tick()
    moves = ("StoreRemoved", "StorePlaced")
    assert [e.reason for e in plan.events if e.reason in moves] == list(moves)
    assert [x.node for x in plan.creates] == [spare]
    assert world.condition(c.CONDITION_DEGRADED) == ("True", m.REASON_STORES_NOT_READY)
    world.run(3)
    assert sorted(p.node for p in world.status().placement) == sorted({*placed, spare} - {lost})
    assert world.status().stores == "3/3"
    assert world.status().last_placement_change is not None


def test_plan_short_capacity_is_degraded_with_reason() -> None:
    world = CacheWorld(make_cache(store={"capacity": "1Ti"}), nodes(4))
    world.run(3)
    status, reason = world.condition(c.CONDITION_DEGRADED)
    assert (status, reason) == ("True", m.REASON_INSUFFICIENT_CAPACITY)
    assert world.status().stores == "4/4"
    cond = c.find(world.status().conditions, c.CONDITION_DEGRADED)
    assert cond is not None and "12 store(s) (768Gi) unplaced" in cond.message


def test_plan_spec_change_replaces_one_store_at_a_time() -> None:
    world = CacheWorld(make_cache(), nodes(3))
    world.run(3)
    world.raw["spec"]["store"] = {"segmentSize": "32Gi"}
    replacements = []
    for _ in range(12):
        plan = world.tick()
        replacements.append(sum(1 for d in plan.deletes if "spec changed" in d.reason))
    assert max(replacements) == 1 and sum(replacements) == 3
    hashes = {pod.annotations[m.ANNOTATION_TEMPLATE_HASH] for kind, pod in world.pods.values() if kind == "store"}
    assert len(hashes) == 1
    assert sorted(p.node for p in world.status().placement) == ["n0", "n1", "n2"]  # nodes kept
    assert world.status().capacity == "96Gi"


def test_plan_spec_fix_reaches_crash_looping_stores_at_once() -> None:
    world = CacheWorld(make_cache(), nodes(3))
    world.run(3)
    for name in ("fleet-cache-store-0", "fleet-cache-store-1", "fleet-cache-store-2"):
        kind, pod = world.pods[name]
        world.pods[name] = (kind, replace(pod, ready=False, crash_looping=True))
        world.never_ready.add(name)
    world.raw["spec"]["image"] = "ghcr.io/example/mooncake@sha256:" + "b" * 64  # the fix
    plan = world.tick()
    assert sum(1 for d in plan.deletes if d.name.startswith("fleet-cache-store")) == 3
    assert sorted(x.node for x in plan.creates if x.component == "store") == ["n0", "n1", "n2"]
    world.run(3)
    assert world.status().stores == "3/3"


def test_plan_http_metadata_and_etcd_ha() -> None:
    spec: dict[str, Any] = {
        "master": {"replicas": 2, "ha": {"enabled": True, "backend": "etcd", "connString": "etcd-0:2379;etcd-1:2379"}},
        "metadataService": {"type": "HTTP"},
    }
    world = CacheWorld(make_cache(**spec), nodes(2))
    plan = world.tick()
    assert Counter(x.component for x in plan.creates) == {"master": 2, "metadata": 1, "store": 2}
    assert plan.metadata_server
    assert world.status().endpoints.master == "etcd://etcd-0:2379;etcd-1:2379"
    assert world.status().endpoints.metadata == "http://fleet-cache-metadata.llm.svc:8080/metadata"
    world.run(3)
    assert world.condition(c.CONDITION_READY)[0] == "True"
    world.set_ready("fleet-cache-master-0", False)  # the primary dies, the standby serves
    world.tick()
    assert world.condition(c.CONDITION_READY)[0] == "True"


def test_plan_deletion_is_held_while_referenced() -> None:
    world = CacheWorld(make_cache(), nodes(2), referenced_by=("speed", "long"))
    world.run(3)
    world.raw["metadata"]["deletionTimestamp"] = "2026-09-01T12:05:00Z"
    plan = world.tick()
    assert not plan.release
    cond = c.find(world.status().conditions, m.CONDITION_DELETION_BLOCKED)
    assert cond is not None and cond.status == "True" and "long, speed" in cond.message
    assert [e.reason for e in plan.events] == ["DeletionBlocked"]
    assert not world.tick().events  # no Event per pass
    world.referenced_by = ("speed",)
    assert [e.reason for e in world.tick().events] == ["DeletionBlocked"]  # the pool list changed
    world.referenced_by = ()
    plan = world.tick()
    assert plan.release and [e.reason for e in plan.events] == ["DeletionReleased"]


def test_plan_confirmed_deletion_is_released_even_when_referenced() -> None:
    world = CacheWorld(make_cache(), nodes(2), referenced_by=("speed",))
    world.run(2)
    world.raw["metadata"]["deletionTimestamp"] = "2026-09-01T12:05:00Z"
    world.raw["metadata"]["annotations"] = {"tandem.dev/confirm-delete": "true"}
    plan = world.tick()
    assert plan.release
    assert c.find(world.status().conditions, m.CONDITION_DELETION_BLOCKED).reason == m.REASON_CONFIRMED  # type: ignore[union-attr]


def test_plan_terminating_store_pod_id_is_not_reused() -> None:
    world = CacheWorld(make_cache(store={"stores": 2}), nodes(3))
    world.run(3)
    kind, pod = world.pods["fleet-cache-store-0"]
    world.pods["fleet-cache-store-0"] = (kind, replace(pod, deleting=True, ready=False))
    plan = m.plan_cache(world.snapshot())
    assert [x.index for x in plan.creates] == [2]


def test_referencing_pools_reads_mooncake_ref() -> None:
    pools = [
        {"metadata": {"name": "speed"}, "spec": {"kvCache": {"mooncakeRef": {"name": "fleet-cache"}}}},
        {"metadata": {"name": "images"}, "spec": {"kvCache": {}}},
        {"metadata": {"name": "long"}, "spec": {"kvCache": {"mooncakeRef": {"name": "other"}}}},
    ]
    assert m.referencing_pools(pools, "fleet-cache") == ("speed",)


def test_parse_store_node_reads_memory() -> None:
    raw = {
        "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}},
        "spec": {"unschedulable": True},
        "status": {
            "allocatable": {"memory": "2040Gi", "amd.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    parsed = m.parse_store_node(raw)
    assert parsed.memory_bytes == quantity_bytes("2040Gi")
    assert parsed.unschedulable and parsed.ready and parsed.extended["amd.com/gpu"] == 8


def test_template_hash_ignores_placement_only_fields() -> None:
    cache = MooncakeCache.model_validate(make_cache())
    endpoints = b.cache_endpoints("fleet-cache", "llm", cache.spec)
    base = m.template_hashes(cache.spec, endpoints)
    moved = cache.spec.model_copy(
        update={"store": cache.spec.store.model_copy(update={"stores": 7, "node_selector": {"x": "y"}})}
    )
    assert m.template_hashes(moved, endpoints).store == base.store
    resized = cache.spec.model_copy(update={"store": cache.spec.store.model_copy(update={"segment_size": "32Gi"})})
    assert m.template_hashes(resized, endpoints).store != base.store
