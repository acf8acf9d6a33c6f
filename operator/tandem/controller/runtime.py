"""The operator process's state: wake-ups, the Kubernetes client, Prometheus providers, pass slots.

Why not module globals: kopf's KopfRunner may start several operators in one test process, and the
pool and cache handlers used to import each other to reach one global. Now ``main`` (or the startup
handler, for in-process runners) builds one ``Runtime`` per run and hands it to every handler through
kopf's ``memo`` (each object's memo is a shallow copy of the operator's, so all share this one object).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.adapters.kube import RealKube
from tandem.adapters.prometheus import PrometheusProvider
from tandem.adapters.routerstreams import RouterStreamsReader
from tandem.controller.config import OperatorConfig
from tandem.reconcile.pool import Metrics, PoolMemory

SETTLE_SECONDS = 1.5
"""A spec edit is acted on once no newer edit came for this long (a burst of edits is acted on once)."""
SETTLE_MAX_SECONDS = 10.0
"""...but never later than this after the burst's first edit (a stream of edits still converges)."""


class Wakeups:
    """One asyncio.Event per pool: watch events set it, the pool's daemon waits on it.

    It also remembers each pool's metadata.generation and when it last changed, so a burst of spec
    edits (a script scaling 2 → 6 → 4 in a few seconds) is acted on once, on the last one, instead of
    creating and draining pairs for every intermediate value (CC-04).
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self._generations: dict[tuple[str, str], int] = {}
        self._changed_at: dict[tuple[str, str], float] = {}
        self._burst_start: dict[tuple[str, str], float] = {}
        self.last_watch_event = time.monotonic()

    def saw_generation(self, namespace: str, name: str, generation: int, now: float | None = None) -> None:
        key = (namespace, name)
        old = self._generations.get(key)
        self._generations[key] = generation
        if old is None or old == generation:
            return  # first sighting (start-up list) or a status/metadata-only change: nothing to settle
        now = time.monotonic() if now is None else now
        if now - self._changed_at.get(key, -math.inf) > SETTLE_SECONDS:
            self._burst_start[key] = now
        self._changed_at[key] = now

    def settle_delay(self, namespace: str, name: str, now: float | None = None) -> float:
        """Seconds to wait before the next pass so the current burst of spec edits is acted on once."""
        key = (namespace, name)
        changed = self._changed_at.get(key)
        if changed is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(0.0, min(changed + SETTLE_SECONDS, self._burst_start[key] + SETTLE_MAX_SECONDS) - now)

    def generation(self, namespace: str, name: str) -> int:
        """The pool's last seen metadata.generation (bumped by spec changes, never by status writes)."""
        return self._generations.get((namespace, name), 0)

    def event(self, namespace: str, name: str) -> asyncio.Event:
        return self._events[(namespace, name)]

    def wake(self, namespace: str, name: str) -> None:
        self.last_watch_event = time.monotonic()
        self._events[(namespace, name)].set()

    def wake_all(self) -> None:
        self.last_watch_event = time.monotonic()
        for event in self._events.values():
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, name), None)
        self._generations.pop((namespace, name), None)
        self._changed_at.pop((namespace, name), None)
        self._burst_start.pop((namespace, name), None)


class CacheState:
    """The MooncakeCache loops' bookkeeping (rebuilt from the initial watch listings after a restart)."""

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


@dataclass
class Runtime:
    config: OperatorConfig
    kube: RealKube | None = None
    wakeups: Wakeups = field(default_factory=Wakeups)
    caches: CacheState = field(default_factory=CacheState)
    last_pass: float = field(default_factory=time.monotonic)
    metrics: Metrics | None = None
    router_streams: RouterStreamsReader | None = None
    """Reads the routers' open-streams reports while a pair drains (None: drains last drainTimeout)."""
    memory: dict[tuple[str, str], PoolMemory] = field(default_factory=dict)
    placement_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: bool = False
    """True once kopf's startup ran (the reconcile loop is live): what /readyz reports for the leader."""
    is_leader: Callable[[], bool] = lambda: True
    """Leader election's verdict, read before every pass and by the adapter before every write."""
    loop: asyncio.AbstractEventLoop | None = None
    pass_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    """At most ``--max-concurrent-passes`` pool passes run at once (sized at startup from the config), so
    1,000 pools waking together do not all list from the API server at the same moment. Passes act one
    at a time under the placement lock anyway. Measured on its own in the controller benchmark (C4) it
    barely changed memory (226 → 224 MiB); the memory gain came from the one-pass frame and the lazy CLI."""


def runtime_of(memo: Any) -> Runtime:
    """This run's ``Runtime`` from kopf's memo (set by the startup handler before any watch starts)."""
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the operator's startup handler has not run: memo.runtime is missing")
    return runtime


def build_metrics(config: OperatorConfig) -> Metrics:
    """The Prometheus providers of this process (default from --prometheus-url, per-pool overrides)."""
    auth = Path(config.prometheus_auth_dir) if config.prometheus_auth_dir else None

    def factory(url: str) -> PrometheusProvider:
        return PrometheusProvider(url, credentials_dir=auth)

    def anonymous(url: str) -> PrometheusProvider:
        return PrometheusProvider(url, credentials_dir=None)

    default = factory(config.prometheus_url) if config.prometheus_url else None
    return Metrics(
        default=default,
        factory=factory,
        scrape_interval_s=config.scrape_interval_s,
        anonymous=anonymous,
        default_url=config.prometheus_url,
        allowed_addresses=tuple(config.prometheus_allowed_addresses),
    )
