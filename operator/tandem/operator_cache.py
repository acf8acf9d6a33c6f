"""kopf wiring for `mooncakecaches`: one level-based loop per cache, and the wake-ups around it.

What it owns: kopf handlers only (no decisions). Imported by `tandem.operator_main` for its side
effect of registering these handlers; it reads `operator_main.RUNTIME` (client, pool wake-ups,
liveness) at call time, never at import time, so the import may sit anywhere in operator_main.

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
import contextlib
import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import Gauge

from tandem import GROUP, VERSION
from tandem import operator_main as om
from tandem.api.labels import LABEL_CACHE
from tandem.reconcile.cache import CachePassResult, reconcile_cache

log = logging.getLogger("tandem.operator.cache")

KIND = "MooncakeCache"
PLURAL = "mooncakecaches"
DEFAULT_DELAY = 120.0
HELD_DELAY = 15.0

STORES_DESIRED = Gauge("tandem_cache_stores_desired", "Placed Mooncake stores", ["namespace", "cache"])
STORES_READY = Gauge("tandem_cache_stores_ready", "Ready Mooncake stores", ["namespace", "cache"])
CAPACITY_BYTES = Gauge("tandem_cache_ready_capacity_bytes", "Capacity of Ready stores", ["namespace", "cache"])


class CacheState:
    """In-memory bookkeeping of this process (rebuilt from the initial watch listings after a restart)."""

    def __init__(self) -> None:
        self.wakeups: dict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self.pool_refs: dict[tuple[str, str], str] = {}
        self.signatures: dict[tuple[str, str], str] = {}
        self.nodes: dict[str, str] = {}

    def wake(self, namespace: str, cache: str) -> None:
        self.wakeups[(namespace, cache)].set()

    def wake_all(self) -> None:
        for event in self.wakeups.values():
            event.set()

    def pools_of(self, namespace: str, cache: str) -> set[str]:
        return {pool for (ns, pool), ref in self.pool_refs.items() if ns == namespace and ref == cache}


STATE = CacheState()


def _mark_watch_event() -> None:
    with contextlib.suppress(AttributeError):
        om.RUNTIME.wakeups.last_watch_event = time.monotonic()


def _wake_pool(namespace: str, pool: str) -> None:
    om.RUNTIME.wakeups.wake(namespace, pool)


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


@kopf.on.startup(id="mooncake-cache-state")
async def reset_cache_state(**_: Any) -> None:
    global STATE  # noqa: PLW0603 - one state per operator run (KopfRunner may start several in a process)
    STATE = CacheState()


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_cache_event(body: Mapping[str, Any], name: str, namespace: str | None, type: str | None, **_: Any) -> None:
    ns = namespace or ""
    _mark_watch_event()
    STATE.wake(ns, name)
    key = (ns, name)
    referenced = set((body.get("status") or {}).get("referencedBy") or []) | STATE.pools_of(ns, name)
    if type == "DELETED":
        STATE.signatures.pop(key, None)
    else:
        signature = cache_signature(body)
        if STATE.signatures.get(key) == signature:
            return
        STATE.signatures[key] = signature
    for pool in sorted(referenced):
        _wake_pool(ns, pool)


@kopf.on.event("v1", "pods", labels={LABEL_CACHE: kopf.PRESENT})
def on_cache_pod_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    _mark_watch_event()
    STATE.wake(namespace or "", labels[LABEL_CACHE])


@kopf.on.event("v1", "configmaps", labels={LABEL_CACHE: kopf.PRESENT})
def on_cache_configmap_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    _mark_watch_event()
    STATE.wake(namespace or "", labels[LABEL_CACHE])


@kopf.on.event(GROUP, VERSION, "inferencepools")
def on_pool_reference(body: Mapping[str, Any], name: str, namespace: str | None, type: str | None, **_: Any) -> None:
    ns = namespace or ""
    key = (ns, name)
    ref = None
    if type != "DELETED":
        ref = (((body.get("spec") or {}).get("kvCache") or {}).get("mooncakeRef") or {}).get("name")
    old = STATE.pool_refs.get(key)
    if old == ref:
        return
    if ref:
        STATE.pool_refs[key] = ref
        STATE.wake(ns, ref)
    else:
        STATE.pool_refs.pop(key, None)
    if old:
        STATE.wake(ns, old)


@kopf.on.event("v1", "nodes")
def on_node_for_caches(body: Mapping[str, Any], name: str, type: str | None, **_: Any) -> None:
    signature = None if type == "DELETED" else node_signature(body)
    if STATE.nodes.get(name) == signature:
        return
    if signature is None:
        STATE.nodes.pop(name, None)
    else:
        STATE.nodes[name] = signature
    STATE.wake_all()


def _record(namespace: str, name: str, result: CachePassResult) -> None:
    om.RUNTIME.last_pass = time.monotonic()
    om.LAST_PASS.set(time.time())
    om.RECONCILE_SECONDS.labels(KIND).observe(result.duration)
    om.RECONCILE_TOTAL.labels(KIND, "error" if result.error else "ok").inc()
    for event in result.events:
        om.DECISIONS.labels(KIND, event.reason).inc()
    if result.plan is not None:
        status = result.plan.status
        STORES_DESIRED.labels(namespace, name).set(status.stores_desired)
        STORES_READY.labels(namespace, name).set(status.stores_ready)
        CAPACITY_BYTES.labels(namespace, name).set(status.ready_capacity_bytes)


async def _one_pass(namespace: str, name: str, failures: int) -> tuple[CachePassResult, int]:
    assert om.RUNTIME.kube is not None
    if not om.RUNTIME.is_leader():  # standing by after a lost Lease (tandem.leader_election)
        return CachePassResult(requeue_after=2.0), failures
    try:
        result = await reconcile_cache(om.RUNTIME.kube, namespace, name)
        failures = 0 if not result.error else failures + 1
    except Exception:  # a bug in one cache must not take down the operator
        log.exception("reconcile of MooncakeCache %s/%s failed", namespace, name)
        failures += 1
        result = CachePassResult(requeue_after=min(60.0, 10.0 * failures), error="exception")
    _record(namespace, name, result)
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
async def cache_daemon(name: str, namespace: str | None, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The level-based loop of one cache: reconcile, then sleep until woken, requeued or stopped."""
    namespace = namespace or ""
    wake = STATE.wakeups[(namespace, name)]
    failures = 0
    while not stopped:
        wake.clear()
        result, failures = await _one_pass(namespace, name, failures)
        if result.gone:
            break
        await _sleep(wake, _delay(result, failures), stopped)
        if failures and not stopped:  # a failing cache retries at most 6 times a minute, even when woken
            await _sleep(None, min(10.0, 10.0 * failures), stopped)
    log.info("cache %s/%s: loop stopped (%s)", namespace, name, stopped.reason or "gone")


@kopf.on.delete(GROUP, VERSION, PLURAL, id="release")
async def cache_release(name: str, namespace: str | None, **_: Any) -> None:
    """Hold the deletion (kopf keeps our finalizer) while pools reference the cache; keep reconciling."""
    namespace = namespace or ""
    wake = STATE.wakeups[(namespace, name)]
    failures = 0
    while True:
        wake.clear()
        result, failures = await _one_pass(namespace, name, failures)
        if result.release or result.gone:
            break
        await _sleep(wake, _delay(result, failures, cap=HELD_DELAY))
    STATE.wakeups.pop((namespace, name), None)
    STATE.signatures.pop((namespace, name), None)
