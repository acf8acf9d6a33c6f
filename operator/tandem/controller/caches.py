"""kopf wiring for `mooncakecaches`: one level-based loop per cache, and the wake-ups around it.

What it owns: kopf handlers only (no decisions). Imported by `tandem.controller.main` for its side
effect of registering these handlers; it reaches the run's state (client, pool wake-ups, its own
``CacheState``, liveness) through kopf's ``memo.runtime``, like the pool handlers.

- A daemon per cache runs `tandem.reconcile.cache.reconcile_cache` one pass at a time and sleeps until
  woken or until the pass's requeue time.
- Wake-ups: events on the cache itself, on its pods (label `tandem.dev/cache`), on its ConfigMap
  (only once the operator's server-side ConfigMap selector lets it through: docs/design/003-mooncake.md
  §7), on nodes whose placement-relevant fields changed, and on pools whose `kvCache.mooncakeRef`
  changed (the old and the new cache are woken: `referencedBy` moves).
- Pools are woken when a cache's spec, `status.endpoints` or Ready/Degraded conditions change, so a
  pool reports `KVCacheDegraded` (or picks up a new endpoint through its normal rollout) promptly.
- Deletion: kopf stops the daemon when a cache is marked for deletion; the `release` on-delete handler
  then keeps running the same loop (so a held cache is still repaired) and returns only when the pass
  says the cache may go: no pool references it, or `tandem.dev/confirm-delete: "true"` is set. Until
  then kopf keeps the `tandem.dev/finalizer` finalizer on it. The handler is restart-safe: after an
  operator restart kopf runs it again because the finalizer is still there.

Handlers return None and never branch on kopf's diff (testing.md §7).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from tandem import GROUP, VERSION
from tandem.api.labels import LABEL_CACHE
from tandem.controller import metrics as m
from tandem.controller.runtime import Runtime, runtime_of
from tandem.reconcile.cache import CachePassResult, reconcile_cache

log = logging.getLogger("tandem.operator.cache")

KIND = "MooncakeCache"
PLURAL = "mooncakecaches"
DEFAULT_DELAY = 120.0
HELD_DELAY = 15.0


def _mark_watch_event(runtime: Runtime) -> None:
    runtime.wakeups.last_watch_event = time.monotonic()


def cache_signature(body: Mapping[str, Any]) -> str:
    """What pools derive from a cache: its spec, published endpoints and Ready/Degraded conditions."""
    status = body.get("status") or {}
    conditions = [
        [x.get("type"), x.get("status"), x.get("reason"), x.get("message")]
        for x in status.get("conditions") or []
        if x.get("type") in ("Ready", "Degraded")
    ]
    payload = {"spec": body.get("spec") or {}, "endpoints": status.get("endpoints") or {}, "conditions": conditions}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def node_signature(body: Mapping[str, Any]) -> str:
    """The node fields store placement depends on (heartbeats and images excluded)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ready = next((x.get("status") for x in status.get("conditions") or [] if x.get("type") == "Ready"), None)
    payload = {
        "labels": meta.get("labels") or {},
        "unschedulable": bool(spec.get("unschedulable")),
        "taints": spec.get("taints") or [],
        "allocatable": status.get("allocatable") or {},
        "ready": ready,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_cache_event(
    body: Mapping[str, Any], name: str, namespace: str | None, type: str | None, memo: kopf.Memo, **_: Any
) -> None:
    runtime = runtime_of(memo)
    state = runtime.caches
    ns = namespace or ""
    _mark_watch_event(runtime)
    state.wake(ns, name)
    key = (ns, name)
    referenced = set((body.get("status") or {}).get("referencedBy") or []) | state.pools_of(ns, name)
    if type == "DELETED":
        state.signatures.pop(key, None)
    else:
        signature = cache_signature(body)
        if state.signatures.get(key) == signature:
            return
        state.signatures[key] = signature
    for pool in sorted(referenced):
        runtime.wakeups.wake(ns, pool)


@kopf.on.event("v1", "pods", labels={LABEL_CACHE: kopf.PRESENT})
def on_cache_pod_event(labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    runtime = runtime_of(memo)
    _mark_watch_event(runtime)
    runtime.caches.wake(namespace or "", labels[LABEL_CACHE])


@kopf.on.event("v1", "configmaps", labels={LABEL_CACHE: kopf.PRESENT})
def on_cache_configmap_event(labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    runtime = runtime_of(memo)
    _mark_watch_event(runtime)
    runtime.caches.wake(namespace or "", labels[LABEL_CACHE])


@kopf.on.event(GROUP, VERSION, "inferencepools")
def on_pool_reference(
    body: Mapping[str, Any], name: str, namespace: str | None, type: str | None, memo: kopf.Memo, **_: Any
) -> None:
    state = runtime_of(memo).caches
    ns = namespace or ""
    key = (ns, name)
    ref = None
    if type != "DELETED":
        ref = (((body.get("spec") or {}).get("kvCache") or {}).get("mooncakeRef") or {}).get("name")
    old = state.pool_refs.get(key)
    if old == ref:
        return
    if ref:
        state.pool_refs[key] = ref
        state.wake(ns, ref)
    else:
        state.pool_refs.pop(key, None)
    if old:
        state.wake(ns, old)


@kopf.on.event("v1", "nodes")
def on_node_for_caches(body: Mapping[str, Any], name: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    state = runtime_of(memo).caches
    signature = None if type == "DELETED" else node_signature(body)
    if state.nodes.get(name) == signature:
        return
    if signature is None:
        state.nodes.pop(name, None)
    else:
        state.nodes[name] = signature
    state.wake_all()


def _record(runtime: Runtime, namespace: str, name: str, result: CachePassResult) -> None:
    runtime.last_pass = time.monotonic()
    m.LAST_PASS.set(time.time())
    m.RECONCILE_SECONDS.labels(KIND).observe(result.duration)
    m.RECONCILE_TOTAL.labels(KIND, "error" if result.error else "ok").inc()
    for event in result.events:
        m.DECISIONS.labels(KIND, event.reason).inc()
    if result.plan is not None:
        status = result.plan.status
        m.STORES_DESIRED.labels(namespace, name).set(status.stores_desired)
        m.STORES_READY.labels(namespace, name).set(status.stores_ready)
        m.CAPACITY_BYTES.labels(namespace, name).set(status.ready_capacity_bytes)


async def _one_pass(runtime: Runtime, namespace: str, name: str, failures: int) -> tuple[CachePassResult, int]:
    assert runtime.kube is not None
    if not runtime.is_leader():  # standing by after a lost Lease (tandem.controller.election)
        return CachePassResult(requeue_after=2.0), failures
    try:
        result = await reconcile_cache(runtime.kube, namespace, name)
        failures = 0 if not result.error else failures + 1
    except Exception:  # a bug in one cache must not take down the operator
        log.exception("reconcile of MooncakeCache %s/%s failed", namespace, name)
        failures += 1
        result = CachePassResult(requeue_after=min(60.0, 10.0 * failures), error="exception")
    _record(runtime, namespace, name, result)
    if result.error:
        log.warning("cache %s/%s: %s (retry in %.0fs)", namespace, name, result.error, result.requeue_after or 0)
    return result, failures


def _delay(result: CachePassResult, failures: int, cap: float | None = None) -> float:
    delay = result.requeue_after if result.requeue_after is not None else DEFAULT_DELAY
    if failures:
        delay = max(delay, min(60.0, 10.0 * failures))
    return min(delay, cap) if cap is not None else delay


async def _until(stopped: kopf.DaemonStopped) -> None:
    await stopped.wait()


async def _sleep(wake: asyncio.Event | None, delay: float, stopped: kopf.DaemonStopped | None = None) -> None:
    """Until woken (``wake``), stopped (daemon) or ``delay`` seconds passed."""
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(asyncio.sleep(delay))]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    if stopped is not None:
        waiters.append(asyncio.ensure_future(_until(stopped)))
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_backoff=5.0, cancellation_timeout=10.0)
async def cache_daemon(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
) -> None:
    """The level-based loop of one cache: reconcile, then sleep until woken, requeued or stopped."""
    runtime = runtime_of(memo)
    namespace = namespace or ""
    wake = runtime.caches.wakeups[(namespace, name)]
    failures = 0
    while not stopped:
        wake.clear()
        result, failures = await _one_pass(runtime, namespace, name, failures)
        if result.gone:
            break
        await _sleep(wake, _delay(result, failures), stopped)
        if failures and not stopped:  # a failing cache retries at most 6 times a minute, even when woken
            await _sleep(None, min(10.0, 10.0 * failures), stopped)
    log.info("cache %s/%s: loop stopped (%s)", namespace, name, stopped.reason or "gone")


@kopf.on.delete(GROUP, VERSION, PLURAL, id="release")
async def cache_release(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Hold the deletion (kopf keeps our finalizer) while pools reference the cache; keep reconciling."""
    runtime = runtime_of(memo)
    state = runtime.caches
    namespace = namespace or ""
    wake = state.wakeups[(namespace, name)]
    failures = 0
    while True:
        wake.clear()
        result, failures = await _one_pass(runtime, namespace, name, failures)
        if result.release or result.gone:
            break
        await _sleep(wake, _delay(result, failures, cap=HELD_DELAY))
    state.wakeups.pop((namespace, name), None)
    state.signatures.pop((namespace, name), None)
