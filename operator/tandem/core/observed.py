"""The observed world, as the pure planner sees it: one immutable snapshot per reconcile pass.

What it owns: plain data types for what `adapters/` read (pods, nodes, the published routing table,
revision snapshots, the eval Job) and the parsing of raw Kubernetes objects (dicts) into them. Parsing
lives here, not in adapters, so it is pure and table-testable; adapters only fetch the dicts.

Invariant: nothing here performs I/O or reads the clock; `Snapshot.now` is the injected time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tandem.api.labels import (
    ANNOTATION_EVAL_TARGET,
    LABEL_INSTANCE,
    LABEL_PAIR,
    LABEL_POOL,
    LABEL_REVISION,
    LABEL_ROLE,
    ROLES,
    Role,
    parse_shape,
)
from tandem.api.pool_status import GateVerdict
from tandem.api.quantity import parse_quantity
from tandem.api.resources import InferencePool
from tandem.api.revision import CacheWiring, RevisionSpec
from tandem.core.autoscale import AutoscaleState, MetricsSnapshot, RatioState
from tandem.core.drains import RouterStreams
from tandem.routing.table import RoutingTable

LABEL_HOSTNAME = "kubernetes.io/hostname"


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API server (``...Z``), or None."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class ObservedPod:
    """One pod, reduced to what the planner decides on."""

    name: str
    uid: str
    labels: Mapping[str, str]
    node: str | None
    phase: str
    ready: bool
    deleting: bool
    created: datetime | None
    pod_ip: str | None = None
    unschedulable: bool = False
    crash_looping: bool = False
    restarts: int = 0
    gpus: int = 0
    resource_version: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    affinity_nodes: tuple[str, ...] = ()
    built_revision: str | None = None
    """The revision the pod was built from (its immutable ``TANDEM_REVISION`` env); None on older pods."""
    built_shape: tuple[int, int] | None = None
    """The shape of the pair group the pod was built for (its immutable ``TANDEM_PAIR_SHAPE`` env, e.g. ``2p1d``);
    None on older pods and on a value outside the API's bounds."""
    controller_uid: str | None = None
    """uid in the pod's controller owner reference (None without one): only the pool's uid makes it the pool's."""
    scheduled_at: datetime | None = None
    """When the pod was bound to its node (``PodScheduled=True`` lastTransitionTime); None while unbound."""
    ready_at: datetime | None = None
    """When the pod last turned Ready (``Ready=True`` lastTransitionTime); None while not Ready."""

    @property
    def pool(self) -> str | None:
        return self.labels.get(LABEL_POOL)

    @property
    def pair_index(self) -> int | None:
        value = self.labels.get(LABEL_PAIR, "")
        tail = value.rsplit("-p", 1)[-1]
        return int(tail) if tail.isdigit() else None

    @property
    def role(self) -> Role | None:
        role = self.labels.get(LABEL_ROLE)
        return role if role in ROLES else None

    @property
    def instance(self) -> int | None:
        value = self.labels.get(LABEL_INSTANCE, "")
        return int(value) if value.isdigit() else None

    @property
    def revision(self) -> str | None:
        """The built revision when the pod records one (labels can be edited by anyone), else the label."""
        return self.built_revision or self.labels.get(LABEL_REVISION)

    @property
    def label_drift(self) -> bool:
        """The revision label no longer says what the pod was built from (a foreign edit)."""
        return self.built_revision is not None and self.labels.get(LABEL_REVISION) != self.built_revision

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def holds_gpus(self) -> bool:
        """Whether the pod occupies GPUs on its node (bound, not finished)."""
        return self.node is not None and not self.terminal


@dataclass(frozen=True)
class ObservedNode:
    """One node: identity, labels, GPU allocatable and whether it takes new pods."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Mapping[str, str], ...] = ()

    def gpus(self, resource: str) -> int:
        return self.allocatable.get(resource, 0)


@dataclass(frozen=True)
class EvalJobView:
    """The eval Job of an analysis step, as observed."""

    name: str
    revision: str
    step: int
    active: bool
    succeeded: bool
    failed: bool
    score: float | None
    started: datetime | None
    termination_message: str | None = None
    target: str = ""
    """What the Job's client calls (its ``tandem.dev/eval-target`` annotation; "" on Jobs made before it)."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile pass of one pool decides on."""

    pool: InferencePool
    pods: tuple[ObservedPod, ...]
    nodes: tuple[ObservedNode, ...]
    now: datetime
    other_pods: tuple[ObservedPod, ...] = ()
    routing: RoutingTable | None = None
    revisions: Mapping[str, RevisionSpec] = field(default_factory=dict)
    cache: CacheWiring | None = None
    cache_problem: str | None = None
    eval_job: EvalJobView | None = None
    gate_verdicts: tuple[GateVerdict, ...] | None = None
    """Verdicts of the metric gates evaluated this pass (None: no evaluation was due)."""
    scaling_metrics: MetricsSnapshot | None = None
    """Autoscaling inputs read this pass (None: no autoscaling evaluation was due)."""
    autoscale_state: AutoscaleState | None = None
    """What the autoscaler remembered from its previous call (in memory; empty after a restart)."""
    ratio_state: RatioState | None = None
    """What the P:D adjustment remembered (in memory; empty after a restart)."""
    scrape_interval_s: float = 15.0
    allowed_registries: tuple[str, ...] = ()
    """The operator's image registry allow-list (``--allowed-registry``); empty: digest pinning only."""
    prometheus_problem: str = ""
    """Why this pool's analysis.prometheusAddress gets no credentials ("" when it does or is unset)."""
    router_streams: RouterStreams | None = None
    """The router replicas' open-streams reports, read this pass (None: not configured, or no pair drains)."""
    router_url: str = ""
    """Where eval Jobs reach `tandem router` (the operator's ``--router-url``/``--router-service``); "" : no
    router configured, so eval Jobs call the canary's decode pods."""


# --- parsing raw objects -------------------------------------------------------------------------


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        value = limits.get(resource, requests.get(resource))
        if value is not None:
            total += int(parse_quantity(str(value)))
    return total


def _affinity_nodes(pod: Mapping[str, Any]) -> tuple[str, ...]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    nodes: list[str] = []
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == LABEL_HOSTNAME and expr.get("operator") == "In":
                nodes.extend(expr.get("values") or [])
    return tuple(nodes)


def parse_pod(obj: Mapping[str, Any], gpu_resource: str = "amd.com/gpu") -> ObservedPod:
    """Reduce a Pod (as returned by the API server, JSON-shaped) to an ObservedPod."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ready = _condition(obj, "Ready")
    scheduled = _condition(obj, "PodScheduled")
    statuses = status.get("containerStatuses") or []
    crash = any(((s.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff" for s in statuses)
    return ObservedPod(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        node=(obj.get("spec") or {}).get("nodeName") or None,
        phase=status.get("phase") or "Pending",
        ready=bool(ready and ready.get("status") == "True"),
        deleting=meta.get("deletionTimestamp") is not None,
        created=parse_time(meta.get("creationTimestamp")),
        pod_ip=status.get("podIP") or None,
        unschedulable=bool(
            scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        ),
        crash_looping=crash,
        restarts=sum(int(s.get("restartCount") or 0) for s in statuses),
        gpus=_gpu_request(obj, gpu_resource),
        resource_version=meta.get("resourceVersion", ""),
        affinity_nodes=_affinity_nodes(obj),
        built_revision=_env_value(obj, "TANDEM_REVISION"),
        built_shape=parse_shape(_env_value(obj, "TANDEM_PAIR_SHAPE")),
        controller_uid=_controller_uid(meta),
        scheduled_at=_true_since(scheduled),
        ready_at=_true_since(ready),
    )


def _true_since(condition: Mapping[str, Any] | None) -> datetime | None:
    """A condition's lastTransitionTime when it is True (when it became True), else None."""
    if not condition or condition.get("status") != "True":
        return None
    try:
        return parse_time(condition.get("lastTransitionTime"))
    except ValueError:
        return None


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the owner reference with ``controller: true`` (there is at most one), else None."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid"):
            return str(ref["uid"])
    return None


def _env_value(obj: Mapping[str, Any], name: str) -> str | None:
    """A literal env value of the pod's first container that sets ``name`` (None when none does)."""
    for container in (obj.get("spec") or {}).get("containers") or []:
        for var in container.get("env") or []:
            if var.get("name") == name and isinstance(var.get("value"), str) and var["value"]:
                return str(var["value"])
    return None


def parse_node(obj: Mapping[str, Any]) -> ObservedNode:
    """Reduce a Node to an ObservedNode (extended resources as integers)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    allocatable: dict[str, int] = {}
    for key, value in (status.get("allocatable") or {}).items():
        if "/" in key:
            try:
                allocatable[key] = int(parse_quantity(str(value)))
            except ValueError:
                continue
    ready = _condition(obj, "Ready")
    return ObservedNode(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        allocatable=allocatable,
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        ready=ready is None or ready.get("status") == "True",
        taints=tuple(dict(t) for t in (obj.get("spec") or {}).get("taints") or []),
    )


def parse_eval_job(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> EvalJobView:
    """The eval Job and its (newest) pod's termination message."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    message = None
    newest = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    for pod in reversed(newest):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                message = str(terminated["message"])
                break
        if message:
            break
    labels = meta.get("labels") or {}
    return EvalJobView(
        name=meta.get("name", ""),
        revision=labels.get(LABEL_REVISION, ""),
        step=0,
        active=bool(status.get("active")),
        succeeded=conditions.get("Complete") == "True" or bool(status.get("succeeded")),
        failed=conditions.get("Failed") == "True",
        score=None,
        started=parse_time(meta.get("creationTimestamp")),
        termination_message=message,
        target=(meta.get("annotations") or {}).get(ANNOTATION_EVAL_TARGET, ""),
    )
