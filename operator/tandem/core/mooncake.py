"""The MooncakeCache planner: store placement, component pods, health and status of one cache (pure).

What it owns: `place_stores` (which nodes get stores, how many, and which move on churn) and
`plan_cache(snapshot) -> CachePlan` (the pods to create and delete, the status, the Events). It never
performs I/O, never reads the clock (`snapshot.now`), never imports kopf or a client, and knows no
manifest: names, labels and pod specs belong to `tandem.builders.mooncake`, which the reconcile feeds
with this plan. A converged snapshot gives a plan with no actions and an unchanged status.

Placement (docs/design/003-mooncake.md has the long form):

1. A node can *keep* stores when it exists, is Ready, carries every `store.nodeSelector` label, has
   only tolerated NoSchedule/NoExecute taints and has at least one slot; it can *take new* stores
   when, in addition, it is schedulable (a cordoned node keeps what it has and gets nothing new).
2. Slots per node = min(maxPerNode, ⌊(allocatable memory − reserveForEngines) / memoryLimit⌋, and
   with an RDMA device resource ⌊allocatable of it / per-store count⌋). Stores on a node never exceed
   its slots, so `stores × memoryLimit ≤ allocatable − reserveForEngines` on every node.
3. Wanted stores: `stores`, else ⌈capacity / segmentSize⌉, else every slot of every node that can
   take stores (one per eligible node with the default maxPerNode 1) plus the stores a cordoned node
   already holds.
4. Stability first: an existing store stays where it is while its node can keep it (lowest ids win
   when a node lost slots). Only then, and only if more stores are kept than wanted, the surplus is
   removed from the fullest domain, fullest node, not-Ready first, highest id first.
5. Missing stores go one at a time to the spread domain (`spreadTopologyKey`) with the fewest stores
   that still has a free slot, then to the node of that domain with the fewest stores, ties broken by
   a rendezvous hash of (cache, node) so the choice does not depend on list order; new ids are the
   lowest free ones. Existing stores are never moved to improve spread: moving a store empties its
   segment, which costs more than a skew that churn created.
6. Placed < wanted: `InsufficientCapacity` says how many stores and bytes are missing and why.

Worked example (cache `llm/fleet-cache`): 5 nodes with 2 TiB allocatable (n1, n2, n3 in zone a; n4,
n5 in zone b), memoryLimit 80Gi, reserveForEngines 256Gi, maxPerNode 2, `stores: 6`, segmentSize 64Gi.
Slots per node = min(2, ⌊(2048 − 256) / 80⌋) = 2. Fill, alternating the emptier zone and taking the
emptiest node by rendezvous score: a → n3, b → n4, a → n2, b → n5, a → n1, b → n4 (ids 0-5; n4 holds
two): capacity 6 × 64 GiB = 384 GiB. Lose n2: only its store (id 2) moves, to n3 (zone a has 2 stores
left against b's 3; n1 and n3 hold one each, n3 has the higher score) as id 6. Add a node n6 in zone
b: nothing moves (6 wanted, 6 placed).

Health: `Ready` = a master Ready, the metadata server Ready (HTTP only), every placed store Ready.
`Degraded` = something that was serving is not (master, metadata, stores), a component crash-loops,
or capacity is short; while the cache is first coming up it only reports `Progressing`. Pools read
these conditions (core/cachewiring.py) and report `KVCacheDegraded`; they never change pairs for it.

Deletion: while pools still reference the cache (and `tandem.dev/confirm-delete: "true"` is not set)
the plan keeps `release` False and reports `DeletionBlocked`; the cache keeps serving meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from tandem import GROUP
from tandem.api.cache import CacheEndpoints, MooncakeCacheSpec, MooncakeCacheStatus, StorePlacement, StoreSpec
from tandem.api.common import Condition, Toleration
from tandem.api.labels import ANNOTATION_CONFIRM_DELETE, LABEL_INSTANCE
from tandem.api.quantity import format_bytes, parse_quantity, quantity_bytes
from tandem.api.resources import MooncakeCache
from tandem.core import conditions as c
from tandem.core.observed import ObservedNode, ObservedPod, parse_node
from tandem.core.placement import _tolerates_all
from tandem.core.reasons import (
    REASON_DELETION_BLOCKED,
    REASON_DELETION_RELEASED,
    REASON_STORE_PLACED,
    REASON_STORE_REMOVED,
    REASON_STORE_REPLACED,
)
from tandem.core.rollout import EVENT_NORMAL, EVENT_WARNING, Event

ANNOTATION_TEMPLATE_HASH: Final = f"{GROUP}/template-hash"
"""Hash of the spec fields a component pod is built from; a pod with another hash is replaced."""
ANNOTATION_STORE_SLOT: Final = f"{GROUP}/store-slot"
"""Index of a store among the stores of its node (ports differ per slot on the host network)."""

CONDITION_DELETION_BLOCKED: Final = "DeletionBlocked"

REASON_ALL_READY: Final = "AllComponentsReady"
REASON_MASTER_UNAVAILABLE: Final = "MasterUnavailable"
REASON_METADATA_UNAVAILABLE: Final = "MetadataUnavailable"
REASON_STORES_NOT_READY: Final = "StoresNotReady"
REASON_NO_STORES: Final = "NoStoresPlaced"
REASON_INSUFFICIENT_CAPACITY: Final = "InsufficientCapacity"
REASON_CRASH_LOOPING: Final = "ComponentCrashLooping"
REASON_HEALTHY: Final = c.REASON_HEALTHY
REASON_PLACING: Final = "Placing"
REASON_STARTING: Final = "Starting"
REASON_STEADY: Final = c.REASON_STEADY
REASON_REFERENCED: Final = "ReferencedByPools"
REASON_CONFIRMED: Final = "DeletionConfirmed"
REASON_UNREFERENCED: Final = "NotReferenced"

# Why an existing store leaves its node.
MOVE_NODE_GONE: Final = "node is gone"
MOVE_NODE_NOT_READY: Final = "node is not Ready"
MOVE_NODE_NOT_ELIGIBLE: Final = "node no longer matches store.nodeSelector or tolerations"
MOVE_NO_ROOM: Final = "node has no slot left for it (memory, maxPerNode or RDMA devices)"
MOVE_SURPLUS: Final = "more stores than wanted"
MOVE_DUPLICATE_SLOT: Final = "another store holds the same slot on the node"

REQUEUE_CONVERGING = 5.0
REQUEUE_STEADY = 120.0
HASH_LENGTH = 16

Component = Literal["master", "metadata", "store"]


# --- nodes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreNode:
    """A node as store placement sees it: identity, labels, memory, devices and whether it takes pods."""

    name: str
    labels: Mapping[str, str]
    memory_bytes: int
    extended: Mapping[str, int] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Mapping[str, str], ...] = ()


def parse_store_node(obj: Mapping[str, Any]) -> StoreNode:
    """A Node (JSON-shaped dict) reduced to what placement needs; unreadable memory counts as 0."""
    node = parse_node(obj)
    raw = ((obj.get("status") or {}).get("allocatable") or {}).get("memory")
    try:
        memory = int(parse_quantity(str(raw))) if raw is not None else 0
    except ValueError:
        memory = 0
    return StoreNode(
        name=node.name,
        labels=node.labels,
        memory_bytes=memory,
        extended=node.allocatable,
        ready=node.ready,
        unschedulable=node.unschedulable,
        taints=node.taints,
    )


# --- placement -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StorePolicy:
    """The placement inputs of `store`, in bytes."""

    segment_bytes: int
    memory_limit_bytes: int
    reserve_bytes: int
    max_per_node: int = 1
    stores: int | None = None
    capacity_bytes: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    spread_key: str = "topology.kubernetes.io/zone"
    rdma_resource: str | None = None
    rdma_per_store: int = 1

    @classmethod
    def from_spec(cls, spec: StoreSpec) -> StorePolicy:
        rdma = spec.transport.rdma if spec.transport.protocol == "rdma" else None
        return cls(
            segment_bytes=quantity_bytes(spec.segment_size),
            memory_limit_bytes=quantity_bytes(spec.memory_limit),
            reserve_bytes=quantity_bytes(spec.reserve_for_engines),
            max_per_node=spec.max_per_node,
            stores=spec.stores,
            capacity_bytes=quantity_bytes(spec.capacity) if spec.capacity is not None else None,
            node_selector=dict(spec.node_selector),
            tolerations=tuple(spec.tolerations),
            spread_key=spec.spread_topology_key,
            rdma_resource=rdma.name if rdma is not None else None,
            rdma_per_store=rdma.per_instance if rdma is not None else 1,
        )


@dataclass(frozen=True)
class ExistingStore:
    """A store pod that is there (not terminating): its id, node, slot and readiness."""

    id: int
    node: str
    slot: int = 0
    ready: bool = False


@dataclass(frozen=True)
class StoreAssignment:
    """One placed store."""

    id: int
    node: str
    slot: int
    domain: str
    ready: bool = False


@dataclass(frozen=True)
class StoreRemoval:
    """An existing store that leaves its node, and why."""

    id: int
    node: str
    reason: str


@dataclass(frozen=True)
class PlacementResult:
    """Where stores go this pass."""

    wanted: int
    kept: tuple[StoreAssignment, ...]
    added: tuple[StoreAssignment, ...]
    removed: tuple[StoreRemoval, ...]
    eligible_nodes: int
    free_slots: int
    why_short: str = ""

    @property
    def placed(self) -> tuple[StoreAssignment, ...]:
        return tuple(sorted((*self.kept, *self.added), key=lambda a: a.id))

    @property
    def short(self) -> int:
        return max(0, self.wanted - len(self.kept) - len(self.added))


def node_slots(node: StoreNode, policy: StorePolicy) -> int:
    """How many stores fit on ``node`` (memory after the engine reserve, maxPerNode, RDMA devices)."""
    usable = node.memory_bytes - policy.reserve_bytes
    by_memory = usable // policy.memory_limit_bytes if usable > 0 and policy.memory_limit_bytes > 0 else 0
    slots = min(policy.max_per_node, by_memory)
    if policy.rdma_resource is not None:
        slots = min(slots, node.extended.get(policy.rdma_resource, 0) // max(1, policy.rdma_per_store))
    return max(0, slots)


def node_matches(node: StoreNode, policy: StorePolicy) -> bool:
    """Labels and taints allow stores on ``node`` (readiness and room aside)."""
    if any(node.labels.get(key) != value for key, value in policy.node_selector.items()):
        return False
    # The pool placement's taint rule, so stores and engines agree on what a toleration allows.
    view = ObservedNode(name=node.name, labels=node.labels, allocatable={}, taints=node.taints)
    return _tolerates_all(view, policy.tolerations)


def rendezvous(seed: str, node: str) -> int:
    """Stable per (cache, node) score: the tie-break that keeps a choice independent of list order."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{node}".encode()).digest()[:8], "big")


def wanted_stores(policy: StorePolicy, slots_for_new: int, held_on_cordoned: int) -> int:
    """Rule 3: how many stores the cache asks for."""
    if policy.stores is not None:
        return policy.stores
    if policy.capacity_bytes is not None:
        return math.ceil(policy.capacity_bytes / policy.segment_bytes) if policy.segment_bytes > 0 else 0
    return slots_for_new + held_on_cordoned


def place_stores(
    policy: StorePolicy,
    nodes: Iterable[StoreNode],
    existing: Iterable[ExistingStore],
    taken_ids: Iterable[int] = (),
    seed: str = "",
) -> PlacementResult:
    """Rules 1-6 of the module docstring. ``taken_ids`` are ids still used by terminating pods."""
    by_name = {n.name: n for n in nodes}
    slots = {name: node_slots(n, policy) for name, n in by_name.items()}
    matches = {name: node_matches(n, policy) for name, n in by_name.items()}
    keepable = {name for name, n in by_name.items() if n.ready and matches[name] and slots[name] > 0}
    placeable = {name for name in keepable if not by_name[name].unschedulable}

    def domain(name: str) -> str:
        return by_name[name].labels.get(policy.spread_key, "")

    # 4. keep what can stay (lowest ids first when a node lost room)
    kept: list[StoreAssignment] = []
    removed: list[StoreRemoval] = []
    per_node: Counter[str] = Counter()
    slots_used: dict[str, set[int]] = {}
    for store in sorted(existing, key=lambda s: s.id):
        node = by_name.get(store.node)
        reason = ""
        if node is None:
            reason = MOVE_NODE_GONE
        elif not node.ready:
            reason = MOVE_NODE_NOT_READY
        elif not matches[store.node]:
            reason = MOVE_NODE_NOT_ELIGIBLE
        elif per_node[store.node] >= slots[store.node]:
            reason = MOVE_NO_ROOM
        elif store.slot in slots_used.get(store.node, set()):
            reason = MOVE_DUPLICATE_SLOT
        if reason:
            removed.append(StoreRemoval(store.id, store.node, reason))
            continue
        per_node[store.node] += 1
        slots_used.setdefault(store.node, set()).add(store.slot)
        kept.append(StoreAssignment(store.id, store.node, store.slot, domain(store.node), store.ready))

    held_on_cordoned = sum(per_node[name] for name in keepable - placeable)
    wanted = wanted_stores(policy, sum(slots[name] for name in placeable), held_on_cordoned)

    # 4b. surplus: fullest domain, fullest node, not-Ready first, highest id first
    per_domain: Counter[str] = Counter(a.domain for a in kept)
    while len(kept) > wanted:
        victim = max(kept, key=lambda a: (per_domain[a.domain], per_node[a.node], not a.ready, a.id))
        kept.remove(victim)
        per_domain[victim.domain] -= 1
        per_node[victim.node] -= 1
        slots_used[victim.node].discard(victim.slot)
        removed.append(StoreRemoval(victim.id, victim.node, MOVE_SURPLUS))

    # 5. add missing stores: emptiest domain with room, emptiest node, rendezvous tie-break
    used_ids = {a.id for a in kept} | {r.id for r in removed} | set(taken_ids)
    added: list[StoreAssignment] = []
    next_id = 0
    for _ in range(max(0, wanted - len(kept))):
        candidates = [name for name in placeable if per_node[name] < slots[name]]
        if not candidates:
            break
        domains = {domain(name) for name in candidates}
        target = min(domains, key=lambda d: (per_domain[d], d))
        node_name = min(
            (name for name in candidates if domain(name) == target),
            key=lambda name: (per_node[name], -rendezvous(seed, name), name),
        )
        while next_id in used_ids:
            next_id += 1
        used = slots_used.setdefault(node_name, set())
        slot = next(i for i in range(len(used) + 1) if i not in used)
        used.add(slot)
        used_ids.add(next_id)
        per_node[node_name] += 1
        per_domain[target] += 1
        added.append(StoreAssignment(next_id, node_name, slot, target))

    free = sum(max(0, slots[name] - per_node[name]) for name in placeable)
    short = wanted - len(kept) - len(added)
    why = ""
    if short > 0:
        why = _why_short(policy, list(by_name.values()), slots, placeable, short)
    return PlacementResult(
        wanted=wanted,
        kept=tuple(kept),
        added=tuple(added),
        removed=tuple(sorted(removed, key=lambda r: r.id)),
        eligible_nodes=len(placeable),
        free_slots=free,
        why_short=why,
    )


def _why_short(
    policy: StorePolicy, nodes: Sequence[StoreNode], slots: Mapping[str, int], placeable: set[str], short: int
) -> str:
    missing = format_bytes(short * policy.segment_bytes)
    matching = [n for n in nodes if node_matches(n, policy)]
    if not matching:
        return f"{short} store(s) ({missing}) unplaced: no node matches store.nodeSelector and tolerations"
    usable = [n for n in matching if n.ready and not n.unschedulable]
    if not usable:
        return f"{short} store(s) ({missing}) unplaced: no matching node is Ready and schedulable"
    total = sum(slots[n.name] for n in usable if n.name in placeable)
    return (
        f"{short} store(s) ({missing}) unplaced: {len(usable)} eligible node(s) hold {total} store(s) "
        f"(each needs memoryLimit {format_bytes(policy.memory_limit_bytes)} beyond reserveForEngines "
        f"{format_bytes(policy.reserve_bytes)}, at most {policy.max_per_node} per node)"
    )


# --- the cache plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateHashes:
    """Per component, the hash of the spec fields its pods are built from."""

    master: str
    metadata: str
    store: str


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def template_hashes(spec: MooncakeCacheSpec, endpoints: CacheEndpoints) -> TemplateHashes:
    """Hashes of what shapes each component's pods. Placement-only store fields (counts, selectors,
    tolerations, spread, reserve) are left out: changing them moves stores, it does not restart them.
    Defaults are excluded, so a new defaulted API field does not restart anything."""

    def dump(model: Any, **kwargs: Any) -> Any:
        return model.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True, **kwargs)

    placement_only = {"stores", "capacity", "max_per_node", "node_selector", "tolerations"}
    placement_only |= {"spread_topology_key", "reserve_for_engines"}
    return TemplateHashes(
        master=_digest({"image": spec.image, "version": spec.version, "master": dump(spec.master)}),
        metadata=_digest({"image": spec.image, "version": spec.version, "metadata": dump(spec.metadata_service)}),
        store=_digest(
            {
                "image": spec.image,
                "version": spec.version,
                "store": dump(spec.store, exclude=placement_only),
                "endpoints": endpoints.wire(),
            }
        ),
    )


@dataclass(frozen=True)
class CacheSnapshot:
    """Everything one pass over one cache decides on (the reconcile fills it; parsing is in here)."""

    cache: MooncakeCache
    nodes: tuple[StoreNode, ...]
    masters: tuple[ObservedPod, ...]
    metadata_pods: tuple[ObservedPod, ...]
    stores: tuple[ObservedPod, ...]
    endpoints: CacheEndpoints
    client_config_hash: str
    referenced_by: tuple[str, ...]
    now: datetime


@dataclass(frozen=True)
class PodCreate:
    """A component pod to create (the reconcile builds it with tandem.builders.mooncake)."""

    component: Component
    index: int
    node: str | None = None
    slot: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodDelete:
    name: str
    uid: str
    reason: str


@dataclass(frozen=True)
class CachePlan:
    """What one pass does."""

    creates: tuple[PodCreate, ...]
    deletes: tuple[PodDelete, ...]
    status: MooncakeCacheStatus
    events: tuple[Event, ...]
    requeue_after: float
    metadata_server: bool
    """Whether the HTTP metadata server (pod and Service) should exist."""
    release: bool
    """Deletion may proceed (the cache is being deleted and nothing holds it)."""
    placement: PlacementResult
    hashes: TemplateHashes

    @property
    def changes(self) -> bool:
        return bool(self.creates or self.deletes)


def index_of(pod: ObservedPod) -> int | None:
    value = pod.labels.get(LABEL_INSTANCE, "")
    return int(value) if value.isdigit() else None


def store_node(pod: ObservedPod) -> str | None:
    """The node a store pod is pinned to (its required node affinity), else where it runs."""
    return pod.affinity_nodes[0] if pod.affinity_nodes else pod.node


def _slot_of(pod: ObservedPod) -> int:
    value = pod.annotations.get(ANNOTATION_STORE_SLOT, "0")
    return int(value) if value.isdigit() else 0


def _live(pod: ObservedPod) -> bool:
    return not pod.deleting and not pod.terminal


def _plan_fixed(
    pods: Sequence[ObservedPod], count: int, component: Component, template: str
) -> tuple[list[PodCreate], list[PodDelete]]:
    """Masters and the metadata server: indexes 0..count-1; failed, surplus or stale pods go (stale ones
    that are not Ready at once, a Ready stale one only while every other one is Ready)."""
    creates: list[PodCreate] = []
    deletes: list[PodDelete] = []
    present: dict[int, ObservedPod] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        index = index_of(pod)
        if pod.deleting:
            if index is not None:
                present.setdefault(index, pod)
            continue
        if index is None or index >= count:
            deletes.append(PodDelete(pod.name, pod.uid, f"surplus {component}"))
        elif pod.terminal:
            deletes.append(PodDelete(pod.name, pod.uid, f"{component} pod {pod.phase}"))
            present[index] = pod
        else:
            present[index] = pod
    for index in range(count):
        if index not in present:
            creates.append(PodCreate(component, index, annotations={ANNOTATION_TEMPLATE_HASH: template}))
    if not creates and not deletes:
        live = [present[i] for i in range(count) if i in present and _live(present[i])]
        stale = [p for p in live if p.annotations.get(ANNOTATION_TEMPLATE_HASH) != template]
        broken = [p for p in stale if not p.ready]
        others_ready = len(live) == count and all(p.ready for p in live if p not in stale[:1])
        for pod in broken or (stale[:1] if others_ready else []):
            deletes.append(PodDelete(pod.name, pod.uid, f"{component} spec changed"))
    return creates, deletes


def plan_cache(snapshot: CacheSnapshot) -> CachePlan:
    """One pure planning pass for one cache."""
    cache = snapshot.cache
    spec = cache.spec
    meta = cache.metadata
    old = cache.status or MooncakeCacheStatus()
    hashes = template_hashes(spec, snapshot.endpoints)
    events: list[Event] = []

    # 1. master(s) and the metadata server
    masters_wanted = spec.master.replicas if spec.master.ha.enabled else 1
    creates, deletes = _plan_fixed(snapshot.masters, masters_wanted, "master", hashes.master)
    want_metadata = spec.metadata_service.type == "HTTP"
    meta_creates, meta_deletes = _plan_fixed(
        snapshot.metadata_pods, 1 if want_metadata else 0, "metadata", hashes.metadata
    )
    creates += meta_creates
    deletes += meta_deletes

    # 2. stores: placement, then at most one rolling replacement of a stale store
    policy = StorePolicy.from_spec(spec.store)
    existing: list[ExistingStore] = []
    taken: set[int] = set()
    store_pods: dict[int, ObservedPod] = {}
    for pod in snapshot.stores:
        sid = index_of(pod)
        node = store_node(pod)
        if sid is not None:
            taken.add(sid)
        if pod.deleting:
            continue
        if sid is None or node is None or sid in store_pods:
            deletes.append(PodDelete(pod.name, pod.uid, "store without an id or a node"))
            continue
        if pod.terminal:
            deletes.append(PodDelete(pod.name, pod.uid, f"store pod {pod.phase}"))
            continue
        store_pods[sid] = pod
        existing.append(ExistingStore(sid, node, _slot_of(pod), pod.ready))
    placement = place_stores(policy, snapshot.nodes, existing, taken, seed=f"{meta.namespace}/{meta.name}")
    for removal in placement.removed:
        pod = store_pods[removal.id]
        deletes.append(PodDelete(pod.name, pod.uid, f"store {removal.id} on {removal.node}: {removal.reason}"))
        events.append(
            Event(
                EVENT_NORMAL, REASON_STORE_REMOVED, f"store {removal.id} removed from {removal.node}: {removal.reason}"
            )
        )
    added = list(placement.added)
    for store in added:
        events.append(
            Event(EVENT_NORMAL, REASON_STORE_PLACED, f"store {store.id} placed on {store.node} ({store.domain})")
        )
    # Stale stores (another template hash): the not-Ready ones hold nothing and all go at once (so a fixed
    # image or flag reaches a crash-looping fleet); a Ready one goes only while every other store is
    # Ready, one per pass. A replacement takes a fresh id on the same node and slot.
    replaced: dict[int, StoreAssignment] = {}
    if not placement.added and not placement.removed and not any(p.deleting for p in snapshot.stores):
        stale = [
            a for a in placement.kept if store_pods[a.id].annotations.get(ANNOTATION_TEMPLATE_HASH) != hashes.store
        ]
        broken = [a for a in stale if not a.ready]
        if broken:
            chosen = broken
        elif stale and all(a.ready for a in placement.kept):
            chosen = stale[:1]
        else:
            chosen = []
        free_ids = (i for i in range(len(taken) + len(chosen) + 1) if i not in taken)
        for old_store in chosen:
            new_store = StoreAssignment(next(free_ids), old_store.node, old_store.slot, old_store.domain)
            replaced[old_store.id] = new_store
            pod = store_pods[old_store.id]
            deletes.append(PodDelete(pod.name, pod.uid, f"store {old_store.id}: spec changed"))
            added.append(new_store)
            events.append(
                Event(
                    EVENT_NORMAL,
                    REASON_STORE_REPLACED,
                    f"store {old_store.id} on {old_store.node} replaced by store {new_store.id} (spec changed)",
                )
            )
    for store in added:
        creates.append(
            PodCreate(
                "store",
                store.id,
                node=store.node,
                slot=store.slot,
                annotations={ANNOTATION_TEMPLATE_HASH: hashes.store, ANNOTATION_STORE_SLOT: str(store.slot)},
            )
        )
    placed = sorted([a for a in placement.placed if a.id not in replaced] + list(replaced.values()), key=lambda a: a.id)

    # 3. health
    ready_ids = {sid for sid, pod in store_pods.items() if pod.ready and not pod.deleting}
    placed_ready = [a for a in placed if a.id in ready_ids]
    master_ready = any(p.ready and _live(p) for p in snapshot.masters)
    metadata_ready = not want_metadata or any(p.ready and _live(p) for p in snapshot.metadata_pods)
    crashing = sorted(
        p.name
        for p in (*snapshot.masters, *snapshot.metadata_pods, *snapshot.stores)
        if p.crash_looping and not p.deleting
    )
    status = _status(
        snapshot,
        old,
        placement,
        placed,
        placed_ready,
        master_ready,
        metadata_ready,
        crashing,
        len(creates) + len(deletes),
    )
    events.extend(_condition_events(old.conditions, status.conditions))

    # 4. deletion hold
    release = False
    if meta.deletionTimestamp is not None:
        confirmed = meta.annotations.get(ANNOTATION_CONFIRM_DELETE) == "true"
        release = confirmed or not snapshot.referenced_by
        conditions, event = _deletion_condition(snapshot, old.conditions, status.conditions, confirmed)
        status = status.model_copy(update={"conditions": conditions})
        if release:  # the cache is going: nothing to create or move, only the release itself is news
            creates, deletes, events = [], [], []
        if event is not None:
            events.append(event)
    else:
        status = status.model_copy(
            update={"conditions": [x for x in status.conditions if x.type != CONDITION_DELETION_BLOCKED]}
        )

    converging = bool(creates or deletes) or len(placed_ready) < len(placed) or not master_ready
    return CachePlan(
        creates=tuple(creates),
        deletes=tuple(deletes),
        status=status,
        events=tuple(events),
        requeue_after=REQUEUE_CONVERGING if converging else REQUEUE_STEADY,
        metadata_server=want_metadata,
        release=release,
        placement=placement,
        hashes=hashes,
    )


def _was_serving(old: Sequence[Condition]) -> bool:
    """Whether the cache had come up before: a loss after that is `Degraded`, before it `Progressing`."""
    ready = c.find(old, c.CONDITION_READY)
    degraded = c.find(old, c.CONDITION_DEGRADED)
    serving_losses = (REASON_MASTER_UNAVAILABLE, REASON_METADATA_UNAVAILABLE, REASON_STORES_NOT_READY)
    return (ready is not None and ready.status == "True") or (
        degraded is not None
        and degraded.status == "True"
        and degraded.reason in (*serving_losses, REASON_CRASH_LOOPING)
    )


def _status(
    snapshot: CacheSnapshot,
    old: MooncakeCacheStatus,
    placement: PlacementResult,
    placed: Sequence[StoreAssignment],
    placed_ready: Sequence[StoreAssignment],
    master_ready: bool,
    metadata_ready: bool,
    crashing: Sequence[str],
    changes: int,
) -> MooncakeCacheStatus:
    cache = snapshot.cache
    now = snapshot.now
    generation = cache.metadata.generation
    segment = quantity_bytes(cache.spec.store.segment_size)
    ready_ids = {a.id for a in placed_ready}
    was_serving = _was_serving(old.conditions)
    counts = f"{len(placed_ready)}/{len(placed)} stores Ready"

    # Ready: master, metadata server (HTTP only) and every placed store
    ready_status: c.Status = "False"
    if not master_ready:
        reason, message = REASON_MASTER_UNAVAILABLE, "no Mooncake master is Ready"
    elif not metadata_ready:
        reason, message = REASON_METADATA_UNAVAILABLE, "the HTTP metadata server is not Ready"
    elif not placed:
        reason, message = REASON_NO_STORES, placement.why_short or "no store is placed"
    elif len(placed_ready) < len(placed):
        reason, message = REASON_STORES_NOT_READY, counts
    else:
        ready_status, reason, message = "True", REASON_ALL_READY, f"master and {len(placed)} store(s) Ready"
    conditions = c.set_condition(old.conditions, c.CONDITION_READY, ready_status, reason, message, now, generation)

    # Degraded: crash loops, missing capacity, and what was serving and is not
    degraded: tuple[str, str] | None = None
    if crashing:
        degraded = (REASON_CRASH_LOOPING, "crash-looping: " + ", ".join(crashing[:8]))
    elif not master_ready and was_serving:
        degraded = (REASON_MASTER_UNAVAILABLE, "no Mooncake master is Ready; engines serve from local prefix caches")
    elif not metadata_ready and was_serving:
        degraded = (REASON_METADATA_UNAVAILABLE, "the HTTP metadata server is not Ready")
    elif placement.short > 0:
        degraded = (REASON_INSUFFICIENT_CAPACITY, placement.why_short)
    elif len(placed_ready) < len(placed) and was_serving:
        degraded = (REASON_STORES_NOT_READY, counts)
    if degraded is None:
        conditions = c.set_condition(
            conditions, c.CONDITION_DEGRADED, "False", REASON_HEALTHY, "all components healthy", now, generation
        )
    else:
        conditions = c.set_condition(conditions, c.CONDITION_DEGRADED, "True", *degraded, now, generation)

    # Progressing
    if changes:
        conditions = c.set_condition(
            conditions, c.CONDITION_PROGRESSING, "True", REASON_PLACING, f"{changes} pod change(s)", now, generation
        )
    elif ready_status != "True" and degraded is None:
        conditions = c.set_condition(
            conditions, c.CONDITION_PROGRESSING, "True", REASON_STARTING, message, now, generation
        )
    else:
        conditions = c.set_condition(
            conditions, c.CONDITION_PROGRESSING, "False", REASON_STEADY, "nothing to change", now, generation
        )

    placement_status = [
        StorePlacement(node=a.node, domain=a.domain[:63], segment_bytes=segment, ready=a.id in ready_ids)
        for a in sorted(placed, key=lambda a: (a.node, a.id))
    ]
    last_change = old.last_placement_change
    if sorted(p.node for p in old.placement) != sorted(p.node for p in placement_status) and placement_status:
        last_change = now
    ready_bytes = segment * len(placed_ready)
    return MooncakeCacheStatus(
        observed_generation=generation,
        conditions=conditions,
        stores_desired=len(placed),
        stores_ready=len(placed_ready),
        stores=f"{len(placed_ready)}/{len(placed)}",
        capacity_bytes=segment * len(placed),
        ready_capacity_bytes=ready_bytes,
        capacity=format_bytes(ready_bytes),
        placement=placement_status,
        endpoints=snapshot.endpoints,
        python_hash_seed=cache.spec.python_hash_seed,
        config_hash=snapshot.client_config_hash[:HASH_LENGTH],
        referenced_by=sorted(snapshot.referenced_by)[:256],
        last_placement_change=last_change,
    )


def _condition_events(old: Sequence[Condition], new: Sequence[Condition]) -> list[Event]:
    """An Event whenever Ready or Degraded changes status or reason (never one per pass)."""
    events: list[Event] = []
    for kind in (c.CONDITION_READY, c.CONDITION_DEGRADED):
        before, after = c.find(old, kind), c.find(new, kind)
        if after is None or before is None:  # the first status of a new cache is not news
            continue
        if (before.status, before.reason) == (after.status, after.reason):
            continue
        bad = (kind == c.CONDITION_READY) == (after.status == "False")
        events.append(
            Event(EVENT_WARNING if bad else EVENT_NORMAL, after.reason, f"{kind}={after.status}: {after.message}")
        )
    return events


def _deletion_condition(
    snapshot: CacheSnapshot, old: Sequence[Condition], conditions: Sequence[Condition], confirmed: bool
) -> tuple[list[Condition], Event | None]:
    now, generation = snapshot.now, snapshot.cache.metadata.generation
    pools = sorted(snapshot.referenced_by)
    before = c.find(old, CONDITION_DELETION_BLOCKED)
    if pools and not confirmed:
        message = (
            f"deletion held: referenced by InferencePool(s) {', '.join(pools)}; remove their kvCache.mooncakeRef "
            f'(they roll to a revision without the cache) or annotate {ANNOTATION_CONFIRM_DELETE}="true"'
        )
        out = c.set_condition(
            conditions, CONDITION_DELETION_BLOCKED, "True", REASON_REFERENCED, message, now, generation
        )
        changed = before is None or before.status != "True" or before.message != message
        return out, Event(EVENT_WARNING, REASON_DELETION_BLOCKED, message) if changed else None
    reason = REASON_CONFIRMED if pools else REASON_UNREFERENCED
    message = (
        f"deletion confirmed by {ANNOTATION_CONFIRM_DELETE} while referenced by {', '.join(pools)}"
        if pools
        else "no InferencePool references the cache; deleting"
    )
    out = c.set_condition(conditions, CONDITION_DELETION_BLOCKED, "False", reason, message, now, generation)
    changed = before is None or before.status != "False"
    kind = EVENT_WARNING if pools else EVENT_NORMAL
    return out, Event(kind, REASON_DELETION_RELEASED, message) if changed else None


# --- references ------------------------------------------------------------------------------------


def referencing_pools(pools: Iterable[Mapping[str, Any]], cache: str) -> tuple[str, ...]:
    """Names of the InferencePools (raw dicts) whose kvCache.mooncakeRef names ``cache``, sorted."""
    names = []
    for pool in pools:
        ref = (((pool.get("spec") or {}).get("kvCache") or {}).get("mooncakeRef") or {}).get("name")
        if ref == cache:
            names.append(str((pool.get("metadata") or {}).get("name", "")))
    return tuple(sorted(n for n in names if n))
