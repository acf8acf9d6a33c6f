"""Fluent factories for test objects, plus a tiny in-memory world for planner tests.

`make_pool("speed").pairs(3, ratio=(1, 1)).steps(...).obj()` builds a valid InferencePool; `World`
applies a planner's actions to in-memory pods (created pods bind to their node and become Ready on
the next tick), so multi-pass planner behaviour can be table- and property-tested without I/O. It is
a unit-test aid for pure code only; cluster behaviour is tested on the real local control plane.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tandem.api.labels import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_PAIR,
    LABEL_POOL,
    LABEL_REVISION,
    LABEL_ROLE,
    pair_id,
    pod_name,
)
from tandem.api.resources import InferencePool
from tandem.core.observed import ObservedNode, ObservedPod, Snapshot
from tandem.core.plan import Plan, plan_pool

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
IMAGE = "docker.io/vllm/vllm-openai-rocm:v0.33.0@sha256:" + "a" * 64


def image(tag: str) -> str:
    return f"docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + (tag.encode().hex() * 64)[:64]


class PoolBuilder:
    def __init__(self, name: str) -> None:
        self.body: dict[str, Any] = {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "uid": f"uid-{name}"},
            "spec": {
                "model": {"servedName": "org/model", "source": "hf://org/model", "quantization": "fp4"},
                "stack": {"version": "v1", "image": image("v1")},
                "pairs": {"replicas": 1},
                "rollout": {"maxSurge": 1, "maxUnavailable": 0},
            },
        }

    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.body["spec"]
        return spec

    def pairs(self, replicas: int, ratio: tuple[int, int] = (1, 1), gpus: int = 4) -> PoolBuilder:
        self._spec()["pairs"] = {
            "replicas": replicas,
            "prefill": {"instances": ratio[0], "gpusPerInstance": gpus},
            "decode": {"instances": ratio[1], "gpusPerInstance": gpus},
            "drainTimeout": "30s",
            "orphanTimeout": "300s",
        }
        return self

    def version(self, version: str) -> PoolBuilder:
        self._spec()["stack"] = {"version": version, "image": image(version)}
        return self

    def steps(self, *steps: dict[str, Any]) -> PoolBuilder:
        self._spec()["rollout"]["steps"] = list(steps)
        return self

    def rollout(self, **fields: Any) -> PoolBuilder:
        self._spec()["rollout"].update(fields)
        return self

    def placement(self, **fields: Any) -> PoolBuilder:
        self._spec().setdefault("placement", {}).update(fields)
        return self

    def set(self, path: str, value: Any) -> PoolBuilder:
        cur = self.body
        keys = path.split(".")
        for key in keys[:-1]:
            cur = cur.setdefault(key, {})
        cur[keys[-1]] = value
        return self

    def obj(self) -> InferencePool:
        return InferencePool.model_validate(copy.deepcopy(self.body))


def make_pool(name: str = "speed") -> PoolBuilder:
    return PoolBuilder(name)


def make_nodes(count: int, gpus: int = 8, zones: int = 2, product_id: str = "74a5") -> list[ObservedNode]:
    return [
        ObservedNode(
            name=f"gpu-{i:03d}",
            labels={
                "kubernetes.io/hostname": f"gpu-{i:03d}",
                "topology.kubernetes.io/zone": f"zone-{chr(ord('a') + i % zones)}",
                "amd.com/gpu.device-id": product_id,
            },
            allocatable={"amd.com/gpu": gpus},
        )
        for i in range(count)
    ]


@dataclass
class World:
    """In-memory pods + pool status + routing table, advanced by applying plans."""

    pool: InferencePool
    nodes: list[ObservedNode]
    now: datetime = T0
    pods: dict[str, ObservedPod] = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)
    ready_delay_ticks: int = 1
    _age: dict[str, int] = field(default_factory=dict)
    routing: Any = None
    revisions: dict[str, Any] = field(default_factory=dict)
    never_ready: set[str] = field(default_factory=set)
    never_ready_pairs: set[str] = field(default_factory=set)
    """Pair ids whose pods stay unready (an image pull or a model load that takes long)."""
    allowed_registries: tuple[str, ...] = ()
    router_streams: Any = None
    """What the routers report this pass (`tandem.core.drains.RouterStreams`, or None: not configured)."""
    router_url: str = ""
    """The operator's router URL for eval Jobs ("" : none configured)."""

    def snapshot(self) -> Snapshot:
        return Snapshot(
            pool=self.pool,
            pods=tuple(sorted(self.pods.values(), key=lambda p: p.name)),
            nodes=tuple(self.nodes),
            now=self.now,
            routing=self.routing,
            revisions=dict(self.revisions),
            allowed_registries=self.allowed_registries,
            router_streams=self.router_streams,
            router_url=self.router_url,
        )

    def tick(self, seconds: float = 5.0) -> Plan:
        """Advance time, let created pods become Ready, run one planning pass and apply it."""
        self.now += timedelta(seconds=seconds)
        for name, pod in list(self.pods.items()):
            if pod.deleting:
                del self.pods[name]
                continue
        self._schedule()
        for name, pod in list(self.pods.items()):
            self._age[name] = self._age.get(name, 0) + 1
            if (
                pod.node
                and not pod.ready
                and self._age[name] >= self.ready_delay_ticks
                and pod.revision not in self.never_ready
                and pod.labels.get(LABEL_PAIR) not in self.never_ready_pairs
            ):
                self.pods[name] = replace(pod, ready=True, phase="Running", pod_ip=f"10.0.0.{len(self.pods)}")
        plan = plan_pool(self.snapshot())
        self.apply(plan)
        return plan

    def _schedule(self) -> None:
        """Bind unbound pods like the scheduler would: a partner's node if it fits, else the first fit."""
        free = {n.name: n.allocatable.get("amd.com/gpu", 0) for n in self.nodes if not n.unschedulable}
        for pod in self.pods.values():
            if pod.node in free:
                free[pod.node] -= pod.gpus
        for name, pod in sorted(self.pods.items()):
            if pod.node is not None or pod.deleting:
                continue
            partners = [
                p.node for p in self.pods.values() if p.labels.get(LABEL_PAIR) == pod.labels.get(LABEL_PAIR) and p.node
            ]
            options = [n for n in partners if free.get(n, 0) >= pod.gpus] or (
                [] if partners else [n for n in sorted(free) if free[n] >= pod.gpus]
            )
            if options:
                free[options[0]] -= pod.gpus
                self.pods[name] = replace(pod, node=options[0])

    def apply(self, plan: Plan) -> None:
        self.plans.append(plan)
        for rev in plan.snapshots:
            self.revisions[rev] = plan.revisions[rev]
        for rev, spec in plan.revisions.items():
            if rev == plan.desired_revision:
                self.revisions.setdefault(rev, spec)
        for delete in plan.deletes:
            pod = self.pods.get(delete.name)
            if pod is not None and pod.uid == delete.uid:
                self.pods[delete.name] = replace(pod, deleting=True)
        for relabel in plan.relabels:
            pod = self.pods.get(relabel.name)
            if pod is not None:
                self.pods[relabel.name] = replace(pod, labels={**pod.labels, LABEL_REVISION: relabel.revision})
        for create in plan.creates:
            name = pod_name(self.pool.metadata.name, create.pair, create.role, create.instance)
            if name in self.pods:
                continue
            spec = self.revisions[create.revision]
            gpus = spec.prefill.gpus_per_instance if create.role == "prefill" else spec.decode.gpus_per_instance
            self.pods[name] = ObservedPod(
                name=name,
                uid=f"uid-{name}-{self.now.timestamp()}",
                labels={
                    LABEL_POOL: self.pool.metadata.name,
                    LABEL_PAIR: pair_id(self.pool.metadata.name, create.pair),
                    LABEL_ROLE: create.role,
                    LABEL_INSTANCE: str(create.instance),
                    LABEL_REVISION: create.revision,
                    LABEL_COMPONENT: "engine",
                },
                node=create.node,
                phase="Pending",
                ready=False,
                deleting=False,
                created=self.now,
                gpus=gpus,
                built_revision=create.revision,  # the builders record it in the pod's env (TANDEM_REVISION)
                built_shape=create.shape,  # and the group's shape (TANDEM_PAIR_SHAPE)
                controller_uid=self.pool.metadata.uid,  # the builders set the pool as controller owner
            )
            self._age[name] = 0
        self.routing = plan.routing
        self.pool = self.pool.model_copy(update={"status": plan.status})

    def set_spec(self, builder: PoolBuilder) -> None:
        new = builder.obj()
        meta = self.pool.metadata.model_copy(update={"generation": self.pool.metadata.generation + 1})
        self.pool = self.pool.model_copy(update={"spec": new.spec, "metadata": meta})

    def delete_pod(self, name: str) -> None:
        """Someone (a user, an eviction, a node loss) deleted a pod."""
        del self.pods[name]

    def remove_node(self, name: str) -> None:
        """A node is gone; the pod GC removes its pods."""
        self.nodes = [n for n in self.nodes if n.name != name]
        for pod_name_, pod in list(self.pods.items()):
            if pod.node == name:
                del self.pods[pod_name_]

    def ready_pairs(self) -> int:
        return self.pool.status.pairs.ready if self.pool.status else 0

    def run_until(self, predicate: Any, max_ticks: int = 200, seconds: float = 5.0) -> int:
        for i in range(max_ticks):
            self.tick(seconds)
            if predicate(self):
                return i + 1
        raise AssertionError("world did not converge")
