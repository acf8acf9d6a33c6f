"""One reconcile pass of one MooncakeCache: observe → plan → act → report.

What it owns: the glue between the Kubernetes adapter, the pure cache planner
(`tandem.core.mooncake.plan_cache`) and the cache builders. It makes no decision of its own.

The steps (numbered as in the code):
1. observe: the cache, its own children (pods labelled `tandem.dev/cache=<name>` *and* owned by it;
   a look-alike is never touched), nodes, the pools of the namespace that reference it → one
   `CacheSnapshot`. The addresses engines use and the client config come from the builders.
2. plan: `plan_cache(snapshot)` (pure).
3. act, in an order that never publishes an address before it exists: the client ConfigMap and the
   Services first (only when they differ), then pod deletions, then pod creations.
4. report: the plan's Events, then status when it differs (resourceVersion-guarded PUT). Status is
   written after act, so pools (which read `status.endpoints`) only see a cache whose ConfigMap is
   already there.

A pass that finds nothing to change makes zero API writes. API errors end the pass with a `Degraded`
condition and a backoff instead of a crash (403 quota → QuotaExceeded, 422 or an admission denial,
e.g. PodSecurity refusing RDMA stores in a baseline namespace → AdmissionBlocked, 429/5xx → backoff).
`release` in the result tells the kopf layer that a cache being deleted may go (nothing references it,
or deletion was confirmed); a pass on a released cache acts on nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from tandem.adapters.kube import Conflict, Forbidden, Invalid, KubeApi, KubeError, NotFound, Throttled
from tandem.api.cache import MooncakeCacheStatus
from tandem.api.labels import LABEL_COMPONENT
from tandem.api.resources import MooncakeCache
from tandem.builders import mooncake as b
from tandem.builders.objects import build_event
from tandem.core import conditions as c
from tandem.core import mooncake as m
from tandem.core.observed import ObservedPod, parse_pod
from tandem.core.rollout import EVENT_WARNING, Event

log = logging.getLogger("tandem.reconcile.cache")

PLURAL = "mooncakecaches"
POOLS = "inferencepools"
QUOTA_BACKOFF = 30.0
ERROR_BACKOFF = 15.0
CONFLICT_RETRY = 1.0


def utcnow() -> datetime:
    """The operator's clock: UTC, whole seconds."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class CachePassResult:
    """What one pass did: for metrics, logs, the kopf layer and tests."""

    requeue_after: float | None
    writes: int = 0
    plan: m.CachePlan | None = None
    error: str = ""
    duration: float = 0.0
    events: list[Event] = field(default_factory=list)
    release: bool = False
    """The cache is being deleted and nothing holds it: the kopf layer may let the deletion finish."""
    gone: bool = False
    """The cache no longer exists."""


@dataclass(frozen=True)
class Observed:
    snapshot: m.CacheSnapshot
    raw: dict[str, Any]
    ref: b.CacheRef
    configmap: dict[str, Any] | None
    services: Mapping[str, dict[str, Any] | None]


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid for o in (obj.get("metadata") or {}).get("ownerReferences") or [])


async def observe(kube: KubeApi, namespace: str, name: str, now: datetime) -> Observed | None:
    """Step 1: one snapshot (None when the cache is gone)."""
    raw = await kube.get_custom(PLURAL, namespace, name)
    if raw is None:
        return None
    cache = MooncakeCache.model_validate(raw)
    uid = cache.metadata.uid
    groups: dict[str, list[ObservedPod]] = {component: [] for component in b.COMPONENTS}
    for obj in await kube.list_pods(namespace, b.cache_selector_string(name)):
        if not _owned_by(obj, uid):
            continue
        component = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT, "")
        if component in groups:
            groups[component].append(parse_pod(obj))
    nodes = tuple(m.parse_store_node(n) for n in await kube.list_nodes())
    pools = await kube.list_custom(POOLS, namespace)
    endpoints = b.cache_endpoints(name, namespace, cache.spec)
    ref = b.CacheRef(name=name, namespace=namespace, uid=uid, spec=cache.spec)
    snapshot = m.CacheSnapshot(
        cache=cache,
        nodes=nodes,
        masters=tuple(groups[b.COMPONENT_MASTER]),
        metadata_pods=tuple(groups[b.COMPONENT_METADATA]),
        stores=tuple(groups[b.COMPONENT_STORE]),
        endpoints=endpoints,
        client_config_hash=b.client_config_hash(b.client_config_text(cache.spec, endpoints)),
        referenced_by=m.referencing_pools(pools, name),
        now=now,
    )
    services = {
        b.master_service_name(name): await kube.get_service(namespace, b.master_service_name(name)),
        b.metadata_service_name(name): await kube.get_service(namespace, b.metadata_service_name(name)),
    }
    configmap = await kube.get_configmap(namespace, b.client_configmap_name(name))
    return Observed(snapshot, raw, ref, configmap, services)


async def act(kube: KubeApi, observed: Observed, plan: m.CachePlan) -> int:
    """Step 3: apply the plan; returns the number of writes."""
    ref, snapshot = observed.ref, observed.snapshot
    writes = 0
    desired_cm = b.build_client_configmap(ref, snapshot.endpoints)
    if observed.configmap is None or not b.configmap_matches(observed.configmap, desired_cm):
        await kube.apply(desired_cm)
        writes += 1
    desired_master = b.build_master_service(ref)
    current = observed.services.get(desired_master["metadata"]["name"])
    if current is None or not b.service_matches(current, desired_master):
        await kube.apply(desired_master)
        writes += 1
    metadata_name = b.metadata_service_name(ref.name)
    current = observed.services.get(metadata_name)
    if plan.metadata_server:
        desired_meta = b.build_metadata_service(ref)
        if current is None or not b.service_matches(current, desired_meta):
            await kube.apply(desired_meta)
            writes += 1
    elif current is not None and _owned_by(current, ref.uid):
        await kube.delete_service(ref.namespace, metadata_name, current["metadata"].get("uid", ""))
        writes += 1
    for delete in plan.deletes:
        log.info("cache %s/%s: deleting %s (%s)", ref.namespace, ref.name, delete.name, delete.reason)
        await kube.delete_pod(ref.namespace, delete.name, delete.uid)
        writes += 1
    for create in plan.creates:
        body = _build(ref, snapshot, create)
        try:
            await kube.create(body)
        except Conflict:
            log.info("pod %s already exists: adopting it", body["metadata"]["name"])
        writes += 1
    return writes


def _build(ref: b.CacheRef, snapshot: m.CacheSnapshot, create: m.PodCreate) -> dict[str, Any]:
    if create.component == "master":
        return b.build_master_pod(ref, create.index, create.annotations)
    if create.component == "metadata":
        return b.build_metadata_pod(ref, create.annotations)
    assert create.node is not None
    params = b.StoreParams(ref, create.index, create.node, create.slot, create.annotations)
    return b.build_store_pod(params, snapshot.endpoints)


async def report(kube: KubeApi, observed: Observed, plan: m.CachePlan, status: MooncakeCacheStatus) -> int:
    """Step 4: Events, then status when it changed. Returns writes."""
    writes = 0
    for event in plan.events:
        await post_event(kube, observed, event)
        writes += 1
    raw = observed.raw
    old = raw.get("status")
    try:
        unchanged = old is not None and MooncakeCacheStatus.model_validate(old).wire() == status.wire()
    except ValidationError:
        unchanged = False
    if not unchanged:
        body = dict(raw)
        body["status"] = status.wire()
        await kube.replace_status(PLURAL, observed.ref.namespace, body)
        writes += 1
    return writes


async def post_event(kube: KubeApi, observed: Observed, event: Event) -> None:
    ref = observed.ref
    try:
        await kube.create(
            build_event(
                kind=b.KIND,
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
                type_=event.type,
                reason=event.reason,
                message=event.message,
                now=observed.snapshot.now,
            )
        )
    except KubeError as exc:  # an Event is never worth failing a pass for
        log.warning("could not post event %s: %s", event.reason, exc)


async def reconcile_cache(
    kube: KubeApi, namespace: str, name: str, clock: Callable[[], datetime] = utcnow
) -> CachePassResult:
    """One full pass; never raises for API errors (they become a condition and a backoff)."""
    started = time.monotonic()

    def result(**kwargs: Any) -> CachePassResult:
        return CachePassResult(duration=time.monotonic() - started, **kwargs)

    try:
        observed = await observe(kube, namespace, name, clock())  # 1. observe
        if observed is None:
            return result(requeue_after=None, release=True, gone=True)
        plan = m.plan_cache(observed.snapshot)  # 2. plan (pure)
    except NotFound:
        return result(requeue_after=None, release=True, gone=True)
    except ValidationError as exc:
        return result(requeue_after=ERROR_BACKOFF * 4, error=f"MooncakeCache {namespace}/{name} is not valid: {exc}")
    except KubeError as exc:
        return result(requeue_after=_backoff(exc), error=str(exc))
    writes = 0
    status = plan.status
    try:
        if not plan.release:
            writes += await act(kube, observed, plan)  # 3. act
    except Conflict as exc:  # a concurrent writer (kopf's finalizer, a user): not a failure, look again at once
        log.info("cache %s/%s: %s; retrying", namespace, name, exc)
        return result(requeue_after=CONFLICT_RETRY, writes=writes, plan=plan)
    except NotFound:
        return result(requeue_after=None, writes=writes, plan=plan, release=True, gone=True)
    except KubeError as exc:
        reason, backoff = _classify(exc)
        generation = observed.snapshot.cache.metadata.generation
        message = str(exc)[:1000]
        # Judge the failure against the stored status (not this pass's plan), so a repeated failure keeps
        # its lastTransitionTime, rewrites nothing and posts one Event, not one per retry. The plan's own
        # Events describe actions that did not all happen, so they are not posted.
        before = c.find((observed.snapshot.cache.status or MooncakeCacheStatus()).conditions, c.CONDITION_DEGRADED)
        conditions = c.set_condition(
            status.conditions, c.CONDITION_DEGRADED, "True", reason, message, observed.snapshot.now, generation
        )
        if before is not None and before.status == "True":
            conditions = [
                x.model_copy(update={"last_transition_time": before.last_transition_time})
                if x.type == c.CONDITION_DEGRADED
                else x
                for x in conditions
            ]
        status = status.model_copy(update={"conditions": conditions})
        repeat = before is not None and (before.status, before.reason, before.message) == ("True", reason, message)
        failed = m.CachePlan(
            creates=(),
            deletes=(),
            status=status,
            events=() if repeat else (Event(EVENT_WARNING, reason, str(exc)[:1000]),),
            requeue_after=backoff,
            metadata_server=plan.metadata_server,
            release=False,
            placement=plan.placement,
            hashes=plan.hashes,
        )
        with contextlib.suppress(KubeError):
            writes += await report(kube, observed, failed, status)
        return result(requeue_after=backoff, writes=writes, plan=failed, error=str(exc))
    try:
        writes += await report(kube, observed, plan, status)  # 4. report
    except Conflict as exc:  # a concurrent writer (kopf's finalizer, a user): not a failure, look again at once
        log.info("cache %s/%s: %s; retrying", namespace, name, exc)
        return result(requeue_after=CONFLICT_RETRY, writes=writes, plan=plan)
    except NotFound:
        return result(requeue_after=None, writes=writes, plan=plan, release=True, gone=True)
    except KubeError as exc:
        return result(requeue_after=_backoff(exc), writes=writes, plan=plan, error=str(exc))
    return result(
        requeue_after=plan.requeue_after, writes=writes, plan=plan, events=list(plan.events), release=plan.release
    )


def _classify(exc: KubeError) -> tuple[str, float]:
    if isinstance(exc, Forbidden) and exc.quota:
        return c.REASON_QUOTA_EXCEEDED, QUOTA_BACKOFF
    if isinstance(exc, Invalid) or "denied" in exc.message or "violates PodSecurity" in exc.message:
        return c.REASON_ADMISSION_BLOCKED, QUOTA_BACKOFF
    if isinstance(exc, Forbidden):
        return c.REASON_API_ERROR, QUOTA_BACKOFF
    return c.REASON_API_ERROR, _backoff(exc)


def _backoff(exc: KubeError) -> float:
    if isinstance(exc, Throttled) and exc.retry_after:
        return max(1.0, exc.retry_after)
    return ERROR_BACKOFF
