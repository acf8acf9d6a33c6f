"""One reconcile pass of one InferencePool: observe → plan → act → report.

What it owns: the glue between the Kubernetes adapter, the pure planner and the builders. It makes no
decisions of its own: every choice is in `tandem.core.plan`; this module fetches, applies in a safe
order and reports.

The steps (numbered as in the code):
1. observe: the pool, its pods, other engine pods in the namespace (GPU usage), nodes, the published
   routing table, revision snapshots, the referenced MooncakeCache → one `Snapshot`.
2. plan: `plan_pool(snapshot)` (pure).
3. act, capacity-safe order: persist a changed rollout step first (resourceVersion-guarded, so two
   writers never both advance a step); write missing revision snapshots; delete, then create pods;
   publish the routing table and the Service only when they differ from what is there.
4. report: write status only when it differs; post the plan's Events.

A pass that finds nothing to change performs zero writes (INV-8). API errors end the pass with a
condition instead of a crash: 403 quota → `QuotaExceeded` with a long backoff, 422/admission denial →
`AdmissionBlocked`, 429/5xx → backoff honouring Retry-After, 404 on the pool → nothing to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from tandem.adapters.kube import Conflict, Forbidden, Invalid, KubeApi, KubeError, NotFound, Throttled
from tandem.adapters.prometheus import GateTarget, MetricsProvider, evaluate_metric_gates
from tandem.adapters.routerstreams import RouterStreamsReader
from tandem.api.labels import (
    COMPONENT_ENGINE,
    COMPONENT_REVISION,
    LABEL_COMPONENT,
    LABEL_POOL,
    LABEL_REVISION,
    eval_job_name,
    routing_configmap_name,
    service_name,
)
from tandem.api.pool_status import GateVerdict, InferencePoolStatus
from tandem.api.quantity import parse_duration
from tandem.api.resources import InferencePool
from tandem.api.revision import CacheWiring, RevisionSpec, revision_id, revision_spec
from tandem.builders.evaljob import build_eval_job
from tandem.builders.objects import (
    ANNOTATION_FINGERPRINT,
    build_event,
    build_revision_configmap,
    build_routing_configmap,
    build_service,
    parse_revision_configmap,
)
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core import conditions as c
from tandem.core.analysisplan import AnalysisRequest, analysis_request
from tandem.core.autoscale import AutoscaleState, RatioState
from tandem.core.cachewiring import wiring_from_cache
from tandem.core.drains import wants_reports
from tandem.core.gates import REASON_METRICS_UNAVAILABLE, VERDICT_ERROR
from tandem.core.integrity import credentials_problem, image_allowed
from tandem.core.observed import EvalJobView, ObservedPod, Snapshot, parse_eval_job, parse_node, parse_pod
from tandem.core.plan import Plan, plan_pool
from tandem.core.promql import QueryResult, QueryStatus
from tandem.core.rollout import EVENT_WARNING, Event
from tandem.core.scalemetrics import (
    Freshness,
    ServingInstance,
    build_snapshot,
    freshness_queries,
    scaling_queries,
)
from tandem.routing.table import CONFIGMAP_KEY, RoutingTable

log = logging.getLogger("tandem.reconcile")

PLURAL = "inferencepools"
QUOTA_BACKOFF = 45.0
ERROR_BACKOFF = 15.0


def utcnow() -> datetime:
    """The operator's clock: UTC, whole seconds (status timestamps stay stable and readable)."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class PoolMemory:
    """What the operator remembers about one pool between passes, in memory only (empty after a restart).

    Nothing here is needed for correctness after a restart: the autoscaler restarts its windows (a
    scale-down then waits one full stabilization window) and the next evaluation is simply due.
    """

    autoscale_state: AutoscaleState | None = None
    ratio_state: RatioState | None = None
    last_autoscale_eval: datetime | None = None


@dataclass
class Metrics:
    """How a pass reaches Prometheus: the operator's default provider, plus per-pool overrides.

    A per-pool address (``analysis.prometheusAddress``) is written by whoever may edit the pool, so it gets
    the operator's credentials (``factory``) only when `tandem.core.integrity.credentials_problem` allows
    it: the operator's own Prometheus (``default_url``), or https under an ``allowed_addresses`` entry.
    Any other address is queried through ``anonymous`` (no credentials), or not at all without one.
    """

    default: MetricsProvider | None = None
    factory: Callable[[str], MetricsProvider] | None = None
    scrape_interval_s: float = 15.0
    anonymous: Callable[[str], MetricsProvider] | None = None
    default_url: str = ""
    allowed_addresses: tuple[str, ...] = ()
    _by_url: dict[tuple[str, bool], MetricsProvider] = field(default_factory=dict)

    def credentials_problem(self, pool: InferencePool) -> str:
        """Why this pool's own Prometheus address may not get the credentials ("" when it may, or has none)."""
        url = pool.spec.rollout.analysis.prometheus_address
        if not url or self.factory is None:
            return ""
        return credentials_problem(url, self.default_url, self.allowed_addresses)

    def for_pool(self, pool: InferencePool) -> MetricsProvider | None:
        url = pool.spec.rollout.analysis.prometheus_address
        if url and self.factory is not None:
            trusted = not self.credentials_problem(pool)
            make = self.factory if trusted else self.anonymous
            if make is None:
                return None
            if (url, trusted) not in self._by_url:
                self._by_url[(url, trusted)] = make(url)
            return self._by_url[(url, trusted)]
        return self.default


@dataclass
class PassResult:
    """What one pass did: for metrics, logs and tests."""

    requeue_after: float | None
    writes: int = 0
    plan: Plan | None = None
    error: str = ""
    conflict: bool = False
    """The error was a 409 (someone else wrote first): retry at once, it is not a failure."""
    duration: float = 0.0
    events: list[Event] = field(default_factory=list)


async def observe_pods(
    kube: KubeApi, namespace: str, name: str, resource: str, peer_namespaces: Sequence[str] = ()
) -> tuple[list[ObservedPod], list[ObservedPod]]:
    """(the pool's engine pods, every other engine pod Tandem can see: they hold GPUs too)."""
    own: list[ObservedPod] = []
    others: list[ObservedPod] = []
    for ns in [namespace, *(n for n in peer_namespaces if n != namespace)]:
        for obj in await kube.list_pods(ns, f"{LABEL_COMPONENT}={COMPONENT_ENGINE}"):
            pod = parse_pod(obj, resource)
            (own if ns == namespace and pod.pool == name else others).append(pod)
    return own, others


async def observe(
    kube: KubeApi,
    namespace: str,
    name: str,
    now: datetime,
    metrics: Metrics | None = None,
    peer_namespaces: Sequence[str] = (),
    allowed_registries: Sequence[str] = (),
) -> tuple[Snapshot, dict[str, Any]] | None:
    """Step 1: one snapshot of the cluster state the planner needs (None when the pool is gone)."""
    raw = await kube.get_custom(PLURAL, namespace, name)
    if raw is None:
        return None
    pool = InferencePool.model_validate(raw)
    resource = pool.spec.placement.gpu_resource
    own, others = await observe_pods(kube, namespace, name, resource, peer_namespaces)
    nodes = [parse_node(n) for n in await kube.list_nodes()]
    routing = None
    cm = await kube.get_configmap(namespace, routing_configmap_name(name))
    if cm is not None:
        try:
            routing = RoutingTable.from_json((cm.get("data") or {}).get(CONFIGMAP_KEY, ""))
        except ValidationError:
            log.warning("routing table of %s/%s is not valid; rebuilding it", namespace, name)
    revisions: dict[str, RevisionSpec] = {}
    for item in await kube.list_configmaps(namespace, f"{LABEL_POOL}={name},{LABEL_COMPONENT}={COMPONENT_REVISION}"):
        rev = ((item.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)
        if rev:
            try:
                revisions[rev] = parse_revision_configmap(item.get("data") or {})
            except (ValidationError, KeyError, ValueError):
                log.warning("revision snapshot %s of %s/%s is not valid", rev, namespace, name)
    cache, problem = await observe_cache(kube, pool)
    snapshot = Snapshot(
        pool=pool,
        pods=tuple(own),
        nodes=tuple(nodes),
        now=now,
        other_pods=tuple(others),
        routing=routing,
        revisions=revisions,
        cache=cache,
        cache_problem=problem,
        scrape_interval_s=metrics.scrape_interval_s if metrics else 15.0,
        allowed_registries=tuple(allowed_registries),
        prometheus_problem=metrics.credentials_problem(pool) if metrics else "",
    )
    return snapshot, raw


def _stable_and_desired(snapshot: Snapshot) -> tuple[str, str]:
    pool = snapshot.pool
    desired = revision_id(revision_spec(pool.spec, snapshot.cache))
    stable = pool.status.revisions.stable.name if pool.status and pool.status.revisions.stable else desired
    return stable, desired


async def observe_rollout(kube: KubeApi, snapshot: Snapshot, metrics: Metrics | None) -> Snapshot:
    """The analysis step's inputs: the eval Job (if the step runs one) and, when due, the gate verdicts."""
    pool = snapshot.pool
    status = pool.status.rollout if pool.status else None
    stable, desired = _stable_and_desired(snapshot)
    eval_job: EvalJobView | None = None
    if status is not None and status.phase == "Progressing" and status.revision == desired:
        steps = pool.spec.rollout.steps
        if status.step_index < len(steps) and (step := steps[status.step_index]).analysis and step.analysis.eval:
            name = eval_job_name(pool.metadata.name, desired, status.step_index)
            job = await kube.get_job(pool.metadata.namespace, name)
            if job is not None:
                eval_job = parse_eval_job(job, await kube.list_job_pods(pool.metadata.namespace, name))
    verdicts: tuple[GateVerdict, ...] | None = None
    request = analysis_request(pool, desired, stable, snapshot.now, snapshot.scrape_interval_s)
    if request is not None:
        verdicts = tuple(await _gate_verdicts(pool, request, metrics, snapshot.now))
    return dataclasses.replace(snapshot, eval_job=eval_job, gate_verdicts=verdicts)


async def _gate_verdicts(
    pool: InferencePool, request: AnalysisRequest, metrics: Metrics | None, now: datetime
) -> list[GateVerdict]:
    provider = metrics.for_pool(pool) if metrics else None
    if not request.gates:
        return []
    if provider is None:
        return [
            GateVerdict(
                name=g.name,
                verdict=VERDICT_ERROR,
                reason=REASON_METRICS_UNAVAILABLE,
                condition=g.success_condition or g.failure_condition or "",
                query="(no Prometheus configured: --prometheus-url or analysis.prometheusAddress)",
                evaluated_at=now,
            )
            for g in request.gates
        ]
    target = GateTarget(
        namespace=pool.metadata.namespace,
        pool=pool.metadata.name,
        canary_revision=request.canary,
        stable_revision=request.stable,
        interval=request.rate_window,
        timeout_s=request.timeout_s,
        max_prompt_tokens=pool.spec.longest_prompt,
    )
    return await evaluate_metric_gates(
        provider,
        request.gates,
        target,
        analysis=pool.spec.rollout.analysis,
        step_started_at=request.step_started_at,
        scrape_interval_s=metrics.scrape_interval_s if metrics else 15.0,
        clock=lambda: now,
    )


async def observe_scaling(snapshot: Snapshot, metrics: Metrics | None, memory: PoolMemory | None) -> Snapshot:
    """Autoscaling inputs, read only when an evaluation is due (every autoscaling.interval)."""
    pool = snapshot.pool
    spec = pool.spec.autoscaling
    if not spec.enabled or memory is None:
        return snapshot
    interval = timedelta(seconds=parse_duration(spec.interval))
    if memory.last_autoscale_eval is not None and snapshot.now - memory.last_autoscale_eval < interval:
        return dataclasses.replace(snapshot, autoscale_state=memory.autoscale_state, ratio_state=memory.ratio_state)
    provider = metrics.for_pool(pool) if metrics else None
    serving: list[ServingInstance] = []
    if snapshot.routing is not None:
        for pair in snapshot.routing.pairs:
            if pair.state.value == "serving":
                serving.extend(ServingInstance(e.pod, pair.id, "prefill") for e in pair.prefill)
                serving.extend(ServingInstance(e.pod, pair.id, "decode") for e in pair.decode)
    results: dict[str, QueryResult] = {}
    freshness: Freshness | None = None
    if provider is not None:
        window = f"{int(max(parse_duration(spec.interval), 4 * snapshot.scrape_interval_s))}s"
        profile = spec.capacity_profile
        queries = scaling_queries(
            pool.metadata.namespace,
            pool.metadata.name,
            window,
            work=profile is not None,
            learn=profile is not None and profile.learn_from_engines,
        )
        fresh = freshness_queries(queries)  # the answers are stamped with the evaluation time: ask separately
        asked = [*queries.values(), *fresh.values()]
        timeout = min(10.0, parse_duration(spec.interval) / 2)
        answers = await asyncio.gather(*(provider.aquery(q, timeout_s=timeout) for q in asked))
        results = dict(zip(queries, answers[: len(queries)], strict=True))
        freshness = Freshness(
            dict(zip(fresh, answers[len(queries) :], strict=True)),
            now_s=snapshot.now.timestamp(),
            max_age_s=2 * snapshot.scrape_interval_s,
        )
    else:
        results = {k: QueryResult(QueryStatus.REFUSED, error="no Prometheus configured") for k in ("running",)}
    memory.last_autoscale_eval = snapshot.now
    return dataclasses.replace(
        snapshot,
        scaling_metrics=build_snapshot(results, serving, freshness),
        autoscale_state=memory.autoscale_state,
        ratio_state=memory.ratio_state,
    )


async def observe_router_streams(snapshot: Snapshot, reader: RouterStreamsReader | None) -> Snapshot:
    """The routers' open-streams reports, read only while the published table drains a pair (no reader:
    the operator was not told where the routers are, and drains end on ``drainTimeout`` alone)."""
    if reader is None or not wants_reports(snapshot.routing):
        return snapshot
    return dataclasses.replace(snapshot, router_streams=await reader.read(snapshot.now))


async def observe_cache(kube: KubeApi, pool: InferencePool) -> tuple[CacheWiring | None, str | None]:
    """The pool's MooncakeCache wiring (from the cache's status) and, if any, why it is degraded."""
    ref = pool.spec.kv_cache.mooncake_ref
    if ref is None:
        return None, None
    raw = await kube.get_custom("mooncakecaches", pool.metadata.namespace, ref.name)
    if raw is None:
        return None, f"MooncakeCache {ref.name} not found"
    return wiring_from_cache(raw)


async def act(kube: KubeApi, snapshot: Snapshot, raw: dict[str, Any], plan: Plan) -> int:
    """Step 3: apply the plan in capacity-safe order; returns the number of writes."""
    pool = snapshot.pool
    ns, name, uid = pool.metadata.namespace, pool.metadata.name, pool.metadata.uid
    writes = 0
    if plan.rollout_first is not None:
        status = dict(raw.get("status") or {})
        status["rollout"] = plan.rollout_first.wire()
        result = await replace_status(kube, raw, status)
        raw["metadata"] = result.get("metadata", raw["metadata"])
        raw["status"] = result.get("status", status)
        writes += 1
    for rev in plan.snapshots:
        with contextlib.suppress(Conflict):  # already written by an earlier, interrupted pass
            await kube.create(build_revision_configmap(name, ns, uid, rev, plan.revisions[rev]))
        writes += 1
    for delete in plan.deletes:
        log.info("pool %s/%s: deleting pod %s: %s", ns, name, delete.name, delete.reason)
        await kube.delete_pod(ns, delete.name, delete.uid)
        writes += 1
    for relabel in plan.relabels:
        with contextlib.suppress(NotFound):  # deleted meanwhile: nothing to restore
            await kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": relabel.name, "namespace": ns, "labels": {LABEL_REVISION: relabel.revision}},
                }
            )
        writes += 1
    cache_name = pool.spec.kv_cache.mooncake_ref.name if pool.spec.kv_cache.mooncake_ref else None
    for create in plan.creates:
        # Only what the planner vetted (tandem.core.integrity): never a snapshot it held back, and never an
        # image outside the allow-list unless it is the live spec's own (admitted by the API server).
        spec = plan.revisions.get(create.revision)
        if spec is None or (
            create.revision != plan.desired_revision
            and not image_allowed(spec.stack.image, snapshot.allowed_registries)
        ):
            continue
        body = build_instance_pod(
            InstanceParams(
                pool=name,
                namespace=ns,
                pool_uid=uid,
                pair=create.pair,
                role=create.role,
                instance=create.instance,
                revision=create.revision,
                spec=spec,
                node=create.node,
                shape=create.shape,
                cache_name=cache_name,
                drain_timeout_s=parse_duration(pool.spec.pairs.drain_timeout),
            )
        )
        try:
            await kube.create(body)
        except Conflict:
            log.info("pod %s already exists: adopting it", body["metadata"]["name"])
        writes += 1
    if plan.eval_job is not None and pool.spec.rollout.analysis.eval is not None:
        with contextlib.suppress(Conflict):
            await kube.create(
                build_eval_job(
                    pool=name,
                    namespace=ns,
                    pool_uid=uid,
                    revision=plan.eval_job.revision,
                    step=plan.eval_job.step,
                    gate=pool.spec.rollout.analysis.eval,
                    model=pool.spec.model.served_name,
                    target_urls=list(plan.eval_job.target_urls),
                    target=plan.eval_job.target,
                    target_headers=dict(plan.eval_job.headers),
                )
            )
        writes += 1
    if plan.reshape_to is not None:
        prefill, decode = plan.reshape_to
        pairs: dict[str, Any] = {"prefill": {"instances": prefill}, "decode": {"instances": decode}}
        if plan.scale_to is not None:
            pairs["replicas"] = plan.scale_to
        await kube.patch_custom(PLURAL, ns, name, {"spec": {"pairs": pairs}})
        writes += 1
    elif plan.scale_to is not None:
        await kube.patch_scale(PLURAL, ns, name, plan.scale_to)
        writes += 1
    cm = await kube.get_configmap(ns, routing_configmap_name(name))
    published = ((cm or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_FINGERPRINT)
    desired_cm = build_routing_configmap(plan.routing, uid)
    if cm is None or published != plan.routing.fingerprint() or (cm.get("data") or {}) != desired_cm["data"]:
        await kube.apply(desired_cm)
        writes += 1
    service = await kube.get_service(ns, service_name(name))
    desired_svc = build_service(name, ns, uid)
    if service is None or not _service_matches(service, desired_svc):
        await kube.apply(desired_svc)
        writes += 1
    return writes


def _service_matches(observed: dict[str, Any], desired: dict[str, Any]) -> bool:
    spec = observed.get("spec") or {}
    want = desired["spec"]
    labels = (observed.get("metadata") or {}).get("labels") or {}
    ports = [{k: p.get(k) for k in ("name", "port", "targetPort", "protocol")} for p in spec.get("ports") or []]
    return (
        spec.get("selector") == want["selector"]
        and ports == want["ports"]
        and spec.get("clusterIP") == "None"
        and all(labels.get(k) == v for k, v in desired["metadata"]["labels"].items())
    )


async def report(
    kube: KubeApi, snapshot: Snapshot, raw: dict[str, Any], plan: Plan, status: InferencePoolStatus
) -> int:
    """Step 4: Events (the decisions already acted on), then status when it changed. Returns writes."""
    writes = 0
    for event in plan.events:
        await post_event(kube, snapshot.pool, event, snapshot.now)
        writes += 1
    old = raw.get("status")
    try:
        unchanged = old is not None and InferencePoolStatus.model_validate(old).wire() == status.wire()
    except ValidationError:
        unchanged = False
    if not unchanged:
        await replace_status(kube, raw, status.wire())
        writes += 1
    return writes


_BOOKKEEPING = ("resourceVersion", "finalizers", "managedFields")
"""Metadata a status write may be rebased over: nothing the plan read (kopf adds its finalizer while a new
pool's first pass runs; that patch alone must not cost the pass its status write)."""


async def replace_status(kube: KubeApi, raw: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """PUT ``status`` onto the pool the pass observed (``raw``), guarded by its resourceVersion.

    On a 409 the pool is read again; when only bookkeeping metadata changed (same spec, generation,
    labels, annotations and status, not being deleted), the plan is still right for it and the write is
    retried once on the fresh resourceVersion. Any other change keeps the Conflict: the next pass plans
    from the new object.
    """
    meta = raw["metadata"]
    body = dict(raw)
    body["status"] = status
    try:
        return await kube.replace_status(PLURAL, meta["namespace"], body)
    except Conflict:
        fresh = await kube.get_custom(PLURAL, meta["namespace"], meta["name"])
        if fresh is None or not only_bookkeeping_changed(raw, fresh):
            raise
    body = dict(fresh)
    body["status"] = status
    return await kube.replace_status(PLURAL, meta["namespace"], body)


def only_bookkeeping_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when ``new`` differs from ``old`` in nothing but resourceVersion, finalizers, managedFields."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if new_meta.get("deletionTimestamp") or old_meta.get("deletionTimestamp"):
        return False
    keys = (set(old_meta) | set(new_meta)) - set(_BOOKKEEPING)
    return (
        all(old_meta.get(k) == new_meta.get(k) for k in keys)
        and old.get("spec") == new.get("spec")
        and (old.get("status") or None) == (new.get("status") or None)
    )


async def post_event(kube: KubeApi, pool: InferencePool, event: Event, now: datetime) -> None:
    try:
        await kube.create(
            build_event(
                kind="InferencePool",
                name=pool.metadata.name,
                namespace=pool.metadata.namespace,
                uid=pool.metadata.uid,
                type_=event.type,
                reason=event.reason,
                message=event.message,
                now=now,
            )
        )
    except KubeError as exc:  # an Event is never worth failing a pass for
        log.warning("could not post event %s: %s", event.reason, exc)


async def reconcile_pool(
    kube: KubeApi,
    namespace: str,
    name: str,
    clock: Callable[[], datetime] = utcnow,
    metrics: Metrics | None = None,
    memory: PoolMemory | None = None,
    placement_lock: asyncio.Lock | None = None,
    peer_namespaces: Sequence[str] = (),
    allowed_registries: Sequence[str] = (),
    router_streams: RouterStreamsReader | None = None,
    router_url: str = "",
) -> PassResult:
    """One full pass; never raises for API errors (they become a condition and a backoff).

    Metrics (Prometheus, the eval Job) are read outside ``placement_lock``; listing pods, planning and
    creating them happen inside it, so two pools never place onto the same free GPUs at once and a slow
    Prometheus never stalls another pool.
    """
    started = time.monotonic()
    now = clock()
    lock = placement_lock or contextlib.nullcontext()
    try:
        observed = await observe(kube, namespace, name, now, metrics, peer_namespaces, allowed_registries)  # 1.
        if observed is None:
            return PassResult(requeue_after=None, duration=time.monotonic() - started)
        snapshot, raw = observed
        if snapshot.pool.metadata.deletionTimestamp is not None:
            return PassResult(requeue_after=None, duration=time.monotonic() - started)
        snapshot = await observe_rollout(kube, snapshot, metrics)
        snapshot = await observe_scaling(snapshot, metrics, memory)
        snapshot = await observe_router_streams(snapshot, router_streams)
        if router_url:
            snapshot = dataclasses.replace(snapshot, router_url=router_url)
    except NotFound:
        return PassResult(requeue_after=None, duration=time.monotonic() - started)
    except ValidationError as exc:
        # Stored before a CRD rule existed (or the CRD is stale): never plan from it, never raise every pass.
        first = " ".join(str(exc).split())[:500]
        return PassResult(
            requeue_after=ERROR_BACKOFF * 4,
            error=f"InferencePool {namespace}/{name} is not valid: {first}",
            duration=time.monotonic() - started,
        )
    except KubeError as exc:
        return PassResult(requeue_after=_backoff(exc), error=str(exc), duration=time.monotonic() - started)
    async with lock:
        try:
            if placement_lock is not None:  # pods other pools created while we read metrics
                own, others = await observe_pods(
                    kube, namespace, name, snapshot.pool.spec.placement.gpu_resource, peer_namespaces
                )
                snapshot = dataclasses.replace(snapshot, pods=tuple(own), other_pods=tuple(others))
            plan = plan_pool(snapshot)  # 2. plan (pure)
        except KubeError as exc:
            return PassResult(requeue_after=_backoff(exc), error=str(exc), duration=time.monotonic() - started)
        return await _act_and_report(kube, snapshot, raw, plan, memory, started)


async def _act_and_report(
    kube: KubeApi, snapshot: Snapshot, raw: dict[str, Any], plan: Plan, memory: PoolMemory | None, started: float
) -> PassResult:
    namespace, name, now = snapshot.pool.metadata.namespace, snapshot.pool.metadata.name, snapshot.now
    writes = 0
    status = plan.status
    try:
        writes += await act(kube, snapshot, raw, plan)  # 3. act
    except Conflict as exc:
        return PassResult(
            requeue_after=1.0,
            writes=writes,
            plan=plan,
            error=str(exc),
            conflict=True,
            duration=time.monotonic() - started,
        )
    except NotFound:
        return PassResult(requeue_after=None, writes=writes, plan=plan, duration=time.monotonic() - started)
    except KubeError as exc:
        reason, backoff = _classify(exc)
        # The plan's routing table was most likely not published (it goes out last), so status keeps the
        # fingerprint of the table that is: status is what marks the published table as the operator's own
        # (tandem.core.integrity, rule 2), and a mismatch would restart every drain on each failing pass.
        old_routing = (snapshot.pool.status or InferencePoolStatus()).routing
        status = status.model_copy(
            update={
                "routing": old_routing,
                "conditions": c.set_condition(
                    status.conditions,
                    c.CONDITION_DEGRADED,
                    "True",
                    reason,
                    str(exc)[:1000],
                    now,
                    snapshot.pool.metadata.generation,
                ),
            }
        )
        plan = Plan(
            rollout_first=None,
            snapshots=(),
            creates=(),
            deletes=(),
            routing=plan.routing,
            status=status,
            events=(*plan.events, Event(EVENT_WARNING, reason, str(exc)[:1000])),
            requeue_after=backoff,
        )
        try:
            writes += await report(kube, snapshot, raw, plan, status)
        except KubeError as exc2:
            log.warning("status write failed for %s/%s: %s", namespace, name, exc2)
        return PassResult(
            requeue_after=backoff, writes=writes, plan=plan, error=str(exc), duration=time.monotonic() - started
        )
    if memory is not None and plan.autoscale_state is not None:
        memory.autoscale_state = plan.autoscale_state
    if memory is not None and plan.ratio_state is not None:
        memory.ratio_state = plan.ratio_state
    try:
        writes += await report(kube, snapshot, raw, plan, status)  # 4. report
    except Conflict as exc:
        return PassResult(
            requeue_after=1.0,
            writes=writes,
            plan=plan,
            error=str(exc),
            conflict=True,
            duration=time.monotonic() - started,
        )
    except KubeError as exc:
        return PassResult(
            requeue_after=_backoff(exc), writes=writes, plan=plan, error=str(exc), duration=time.monotonic() - started
        )
    return PassResult(
        requeue_after=plan.requeue_after,
        writes=writes,
        plan=plan,
        events=list(plan.events),
        duration=time.monotonic() - started,
    )


def _classify(exc: KubeError) -> tuple[str, float]:
    if isinstance(exc, Forbidden) and exc.quota:
        return c.REASON_QUOTA_EXCEEDED, QUOTA_BACKOFF
    if isinstance(exc, Forbidden):
        return c.REASON_API_ERROR, QUOTA_BACKOFF
    if isinstance(exc, Invalid) or "admission webhook" in exc.message or "denied" in exc.message:
        return c.REASON_ADMISSION_BLOCKED, QUOTA_BACKOFF
    return c.REASON_API_ERROR, _backoff(exc)


def _backoff(exc: KubeError) -> float:
    if isinstance(exc, Throttled) and exc.retry_after:
        return max(1.0, exc.retry_after)
    return ERROR_BACKOFF
