"""kopf wiring for `inferencepools`: the process's start-up and one level-based loop per pool.

What it owns: kopf handlers only (no decisions). Events on pools, their engine pods and ConfigMaps, and
nodes *wake* a pool's reconcile; one kopf daemon per pool runs ``tandem.reconcile.pool.reconcile_pool``
one pass at a time, sleeping until woken or until the pass's requeue time. Handlers return None (kopf
would write return values into status, which the strict schema prunes), never branch on kopf's diff, and
kopf persistence uses our own names (testing.md §7): finalizer `tandem.dev/finalizer`, annotations under
`tandem.dev`. Every handler reaches this run's state through ``memo.runtime`` (see ``runtime``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from tandem import GROUP, VERSION
from tandem.adapters.kube import RealKube, load_config
from tandem.adapters.routerstreams import RouterStreamsReader
from tandem.api.labels import COMPONENT_ENGINE, FINALIZER, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_POOL, MANAGED_BY
from tandem.controller import metrics as m
from tandem.controller.config import OperatorConfig
from tandem.controller.runtime import CacheState, Runtime, Wakeups, build_metrics, runtime_of
from tandem.reconcile.pool import PassResult, PoolMemory, reconcile_pool

log = logging.getLogger("tandem.operator")

IDLE_REQUEUE_S = 300.0
"""A pass that names no requeue time runs again after this long (watch events wake it sooner)."""


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf settings from testing.md §7, and this run's ``Runtime`` (from the environment when an
    in-process runner started kopf without `tandem run`)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 310
    settings.watching.connect_timeout = 30
    settings.watching.reconnect_backoff = 2
    settings.watching.inactivity_timeout = 70
    settings.watching.label_selectors["v1", "pods"] = LABEL_COMPONENT
    settings.watching.label_selectors["v1", "configmaps"] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = [1, 2, 4, 8, 16, 30]
    settings.execution.default_backoff = 15
    settings.queueing.worker_limit = 32
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = True
    settings.peering.standalone = True
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, Runtime):
        runtime = memo.runtime = Runtime(OperatorConfig.from_env())
    config = runtime.config
    runtime.kube = RealKube(load_config(config.kubeconfig), may_write=lambda: runtime.is_leader())  # noqa: PLW0108 late-bound
    runtime.loop = asyncio.get_running_loop()
    runtime.metrics = build_metrics(config)
    if config.router_service:
        runtime.router_streams = RouterStreamsReader(runtime.kube.api_client, config.router_service)
    runtime.wakeups = Wakeups()
    runtime.caches = CacheState()
    runtime.placement_lock = asyncio.Lock()
    runtime.pass_slots = asyncio.Semaphore(max(1, config.max_concurrent_passes))
    runtime.started = True
    log.info("tandem operator starting; namespaces=%s", ",".join(config.namespaces) or "(cluster-wide)")


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> Any:
    """Credentials for kopf's own watches: the configured kubeconfig, else the pod's ServiceAccount.

    kopf's default handler goes through the kubernetes client, which fixes its kubeconfig location
    when imported, before `--kubeconfig` is known; reading the file here avoids that trap.
    """
    runtime = getattr(memo, "runtime", None)
    path = (runtime.config.kubeconfig if isinstance(runtime, Runtime) else None) or os.environ.get("KUBECONFIG")
    if path:
        os.environ["KUBECONFIG"] = path
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    runtime = getattr(memo, "runtime", None)
    if isinstance(runtime, Runtime) and runtime.kube is not None:
        await asyncio.to_thread(runtime.kube.api_client.close)


@kopf.on.probe(id="lastReconcileAgeSeconds")
def probe_reconcile(memo: kopf.Memo, **_: Any) -> float:
    return round(time.monotonic() - runtime_of(memo).last_pass, 1)


@kopf.on.probe(id="lastWatchEventAgeSeconds")
def probe_watch(memo: kopf.Memo, **_: Any) -> float:
    return round(time.monotonic() - runtime_of(memo).wakeups.last_watch_event, 1)


@kopf.on.event(GROUP, VERSION, "inferencepools")
def on_pool_event(name: str, namespace: str | None, meta: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    wakeups = runtime_of(memo).wakeups
    wakeups.saw_generation(namespace or "", name, int(meta.get("generation") or 0))
    wakeups.wake(namespace or "", name)


@kopf.on.event("v1", "pods", labels={LABEL_COMPONENT: COMPONENT_ENGINE})
def on_pod_event(labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    wakeups = runtime_of(memo).wakeups
    pool = labels.get(LABEL_POOL)
    if pool:
        wakeups.wake(namespace or "", pool)
    else:
        wakeups.wake_all()


@kopf.on.event("v1", "configmaps", labels={LABEL_POOL: kopf.PRESENT})
def on_configmap_event(labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    runtime_of(memo).wakeups.wake(namespace or "", labels[LABEL_POOL])


@kopf.on.event("v1", "nodes")
def on_node_event(type: str, memo: kopf.Memo, **_: Any) -> None:
    # Node status heartbeats arrive constantly; only membership changes matter to placement. Other
    # changes (allocatable, labels, cordon) are picked up by the next pass of each pool anyway.
    if type in ("ADDED", "DELETED"):
        runtime_of(memo).wakeups.wake_all()


def record(runtime: Runtime, namespace: str, name: str, result: PassResult) -> None:
    runtime.last_pass = time.monotonic()
    m.LAST_PASS.set(time.time())
    m.RECONCILE_SECONDS.labels("InferencePool").observe(result.duration)
    m.RECONCILE_TOTAL.labels("InferencePool", "error" if result.error else "ok").inc()
    for event in result.events:
        m.DECISIONS.labels("InferencePool", event.reason).inc()
    plan = result.plan
    if plan is not None:
        status = plan.status
        m.PAIRS_DESIRED.labels(namespace, name).set(status.pairs.desired)
        m.PAIRS_READY.labels(namespace, name).set(status.pairs.ready)
        m.ROLLOUT_STEP.labels(namespace, name).set(status.rollout.step_index)
        for cond in status.conditions:
            for value in ("True", "False", "Unknown"):
                m.CONDITION.labels(namespace, name, cond.type, value).set(1 if cond.status == value else 0)


@kopf.daemon(GROUP, VERSION, "inferencepools", cancellation_timeout=10.0, id="reconcile")
async def pool_daemon(name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    """The level-based loop of one pool: reconcile, then sleep until woken or requeued."""
    runtime = runtime_of(memo)
    namespace = namespace or ""
    wakeups = runtime.wakeups
    wake = wakeups.event(namespace, name)
    failures = 0
    while not stopped:
        while (settle := wakeups.settle_delay(namespace, name)) > 0:
            await asyncio.sleep(settle)
        wake.clear()
        delay, failures = await one_pass(runtime, namespace, name, failures)
        await wait(wake, delay, failing=bool(failures), generation=lambda: wakeups.generation(namespace, name))
    wakeups.forget(namespace, name)
    runtime.memory.pop((namespace, name), None)


async def one_pass(runtime: Runtime, namespace: str, name: str, failures: int) -> tuple[float, int]:
    """One pass of a pool; returns (seconds until the next, consecutive failures).

    A function of its own so the pass's snapshot and plan (the pool, its revisions, the routing table,
    the status) are freed when it returns, not kept alive by the daemon's frame while it sleeps: 1,000
    idle pools each held their last plan (controller bench C4).
    """
    assert runtime.kube is not None
    if not runtime.is_leader():
        return 2.0, failures  # standing by after a lost Lease: look again soon, act only when leading
    try:
        memory = runtime.memory.setdefault((namespace, name), PoolMemory())
        async with runtime.pass_slots:
            result = await reconcile_pool(
                runtime.kube,
                namespace,
                name,
                metrics=runtime.metrics,
                memory=memory,
                placement_lock=runtime.placement_lock,
                peer_namespaces=runtime.config.namespaces,
                allowed_registries=runtime.config.allowed_registries,
                router_streams=runtime.router_streams,
                router_url=runtime.config.eval_router_url(),
            )
        failures = 0 if not result.error or result.conflict else failures + 1
    except Exception:  # a bug in one pool must not take down the others (OP-06)
        log.exception("reconcile of %s/%s failed", namespace, name)
        failures += 1
        result = PassResult(requeue_after=min(60.0, 10.0 * failures), error="exception")
    record(runtime, namespace, name, result)
    if result.error and not result.conflict:
        log.warning("pool %s/%s: %s (retry in %.0fs)", namespace, name, result.error, result.requeue_after or 0)
    delay = result.requeue_after if result.requeue_after is not None else IDLE_REQUEUE_S
    if failures:
        delay = max(delay, min(60.0, 10.0 * failures))
    return delay, failures


async def wait(wake: asyncio.Event, delay: float, *, failing: bool, generation: Callable[[], int]) -> None:
    """Sleep until woken or ``delay`` passed. A failing pool sits out its whole backoff unless its spec
    changed (a new generation): its own status write, Events and pod churn wake it too, and retrying
    on those turned a 30 s quota backoff into a retry every ~10 s (DP-05)."""
    seen = generation()
    deadline = time.monotonic() + delay
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            await asyncio.wait_for(wake.wait(), timeout=remaining)
        except TimeoutError:
            return
        if not failing or generation() != seen:
            return
        wake.clear()
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # never a busy loop
