"""Pair placement on GPU nodes: which node each instance of a new pair goes to.

What it owns: a pure, deterministic placement of pairs (and of single missing instances) onto nodes,
from node allocatable GPUs minus what bound pods already hold. The chosen node becomes a required
node affinity on the pod, so the scheduler still checks fit, but a pair is never split by chance.

Rules, in order (architecture.md §2 `placement`):
1. Eligible nodes: schedulable and Ready, carrying every `nodeSelector` label and, with `gpuProduct`,
   the AMD node labeller's `amd.com/gpu.device-id` of that product; taints must be tolerated.
2. `SameNodeWhenFits`: a pair whose instances fit one node goes to one node (one 1P+1D pair of 4-GPU
   instances per 8-GPU MI325X node); otherwise, and for `SameTopologyDomain`, all instances go to nodes
   sharing one value of `pairTopologyKey`; `None` places instances independently.
3. Spread: among candidates, the `spreadTopologyKey` domain holding the fewest of this pool's pairs
   wins; then the node with the least free GPUs that still fits (best fit keeps whole nodes free for
   whole pairs); then the node name (determinism).
4. Nothing fits: no placement (the caller creates at most `maxSurge` unplaced pairs, so a cluster
   autoscaler sees Pending pods, and reports `InsufficientGPU`). Serving pairs are never moved.

Worked example: 3 empty 8-GPU nodes n1,n2 (zone a) and n3 (zone b), pool already has one pair in
zone a. A 1P+1D pair of 4-GPU instances fits one node; zone b has fewer pairs, so both instances go
to n3.

Limitation (documented in docs/design/002-pairs.md): the operator sees only pods in the namespaces it
watches; GPUs used by other workloads show up as Unschedulable pods, which the caller re-places.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tandem.api.common import Toleration
from tandem.api.labels import GPU_DEVICE_IDS, LABEL_GPU_DEVICE_ID
from tandem.api.pool import PlacementSpec
from tandem.core.observed import ObservedNode, ObservedPod

DEVICE_IDS: Mapping[str, str] = GPU_DEVICE_IDS  # AMD node labeller ids (integration.md §1.2)
LABEL_DEVICE_ID = LABEL_GPU_DEVICE_ID


@dataclass
class NodePool:
    """Mutable free-GPU ledger for one planning pass (a copy per pass; never shared)."""

    resource: str
    free: dict[str, int]
    nodes: dict[str, ObservedNode]
    pairs_per_domain: Counter[str] = field(default_factory=Counter)

    def take(self, node: str, gpus: int) -> None:
        self.free[node] -= gpus


def eligible(node: ObservedNode, placement: PlacementSpec) -> bool:
    """Whether instances of a pool with ``placement`` may run on ``node``."""
    if not node.ready or node.unschedulable:
        return False
    if node.gpus(placement.gpu_resource) <= 0:
        return False
    for key, value in placement.node_selector.items():
        if node.labels.get(key) != value:
            return False
    if placement.gpu_product is not None and node.labels.get(LABEL_DEVICE_ID) != DEVICE_IDS[placement.gpu_product]:
        return False
    return _tolerates_all(node, placement.tolerations)


def _tolerates_all(node: ObservedNode, tolerations: Sequence[Toleration]) -> bool:
    for taint in node.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if taint.get("key", "").startswith("kwok.x-k8s.io/"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(tol: Toleration, taint: Mapping[str, str]) -> bool:
    if tol.effect is not None and tol.effect != taint.get("effect"):
        return False
    if tol.operator == "Exists":
        return tol.key is None or tol.key == taint.get("key")
    return tol.key == taint.get("key") and (tol.value or "") == taint.get("value", "")


def build_node_pool(
    nodes: Iterable[ObservedNode],
    bound_pods: Iterable[ObservedPod],
    placement: PlacementSpec,
    pool_pair_domains: Iterable[str] = (),
) -> NodePool:
    """Free GPUs per eligible node: allocatable minus the GPUs of every bound, unfinished pod seen."""
    usable = {n.name: n for n in nodes if eligible(n, placement)}
    used: Counter[str] = Counter()
    for pod in bound_pods:
        if pod.holds_gpus and pod.node in usable:
            used[pod.node] += pod.gpus
    free = {name: max(0, node.gpus(placement.gpu_resource) - used[name]) for name, node in usable.items()}
    return NodePool(placement.gpu_resource, free, usable, Counter(pool_pair_domains))


def domain_of(node: ObservedNode, key: str) -> str:
    return node.labels.get(key, "")


def _rank(ledger: NodePool, spread_key: str, name: str, need: int) -> tuple[int, int, str]:
    node = ledger.nodes[name]
    return (ledger.pairs_per_domain[domain_of(node, spread_key)], ledger.free[name] - need, name)


def place_pair(ledger: NodePool, gpus: Sequence[int], placement: PlacementSpec) -> list[str] | None:
    """Nodes for each instance of one new pair (same order as ``gpus``), or None; updates ``ledger``."""
    total = sum(gpus)
    largest = max((n.gpus(ledger.resource) for n in ledger.nodes.values()), default=0)
    choice: list[str] | None = None
    if placement.pair_colocation == "SameNodeWhenFits" and total <= largest:
        fits = [name for name, free in ledger.free.items() if free >= total]
        if fits:
            best = min(fits, key=lambda n: _rank(ledger, placement.spread_topology_key, n, total))
            choice = [best] * len(gpus)
    if choice is None and placement.pair_colocation in ("SameNodeWhenFits", "SameTopologyDomain"):
        choice = _place_in_one_domain(ledger, gpus, placement)
    if choice is None and placement.pair_colocation == "None":
        choice = _place_independently(ledger, gpus, placement)
    if choice is None:
        return None
    for name, need in zip(choice, gpus, strict=True):
        ledger.take(name, need)
    ledger.pairs_per_domain[domain_of(ledger.nodes[choice[0]], placement.spread_topology_key)] += 1
    return choice


def _first_fit(ledger: NodePool, candidates: Sequence[str], gpus: Sequence[int], spread_key: str) -> list[str] | None:
    free = {n: ledger.free[n] for n in candidates}
    out: list[str | None] = [None] * len(gpus)
    for i in sorted(range(len(gpus)), key=lambda i: -gpus[i]):
        fitting = [n for n in candidates if free[n] >= gpus[i]]
        if not fitting:
            return None
        best = min(fitting, key=lambda n: (free[n] - gpus[i], n))
        free[best] -= gpus[i]
        out[i] = best
    return [n for n in out if n is not None]


def _place_in_one_domain(ledger: NodePool, gpus: Sequence[int], placement: PlacementSpec) -> list[str] | None:
    domains: dict[str, list[str]] = {}
    for name, node in sorted(ledger.nodes.items()):
        domains.setdefault(domain_of(node, placement.pair_topology_key), []).append(name)
    options = []
    for domain, names in domains.items():
        fit = _first_fit(ledger, names, gpus, placement.spread_topology_key)
        if fit is not None:
            spread = ledger.pairs_per_domain[domain_of(ledger.nodes[fit[0]], placement.spread_topology_key)]
            options.append((spread, domain, fit))
    if not options:
        return None
    return min(options, key=lambda o: (o[0], o[1]))[2]


def _place_independently(ledger: NodePool, gpus: Sequence[int], placement: PlacementSpec) -> list[str] | None:
    names = sorted(ledger.nodes, key=lambda n: _rank(ledger, placement.spread_topology_key, n, 0))
    return _first_fit(ledger, names, gpus, placement.spread_topology_key)


def place_instance(ledger: NodePool, need: int, partners: Sequence[str], placement: PlacementSpec) -> str | None:
    """A node for one missing instance of an existing pair: a partner's node, else the partners' domain."""
    for name in sorted(set(partners)):
        if name in ledger.free and ledger.free[name] >= need:
            ledger.take(name, need)
            return name
    if placement.pair_colocation != "None" and partners:
        known = [p for p in partners if p in ledger.nodes]
        if known:
            domain = domain_of(ledger.nodes[known[0]], placement.pair_topology_key)
            same = [n for n in ledger.nodes if domain_of(ledger.nodes[n], placement.pair_topology_key) == domain]
            fit = _first_fit(ledger, sorted(same), [need], placement.spread_topology_key)
            if fit:
                ledger.take(fit[0], need)
                return fit[0]
        return None
    fit = _first_fit(ledger, sorted(ledger.nodes), [need], placement.spread_topology_key)
    if fit:
        ledger.take(fit[0], need)
        return fit[0]
    return None
