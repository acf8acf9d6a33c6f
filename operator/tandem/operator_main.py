"""`tandem run`: the operator process (kopf), its settings, wake-ups, liveness and metrics.

What it owns: kopf wiring only. Handlers are thin: events on pools, their pods and ConfigMaps, and
nodes *wake* a pool's reconcile; one kopf daemon per pool runs the level-based loop
(`tandem.reconcile.pool.reconcile_pool`) one pass at a time, sleeping until woken or until the pass's
requeue time. Handlers return None (kopf would write return values into status, which the strict
schema prunes), never branch on kopf's diff, and kopf persistence uses our own names (testing.md §7):
finalizer `tandem.dev/finalizer`, annotations under `tandem.dev`.

Configuration comes from `tandem run` flags, or for in-process runners (kopf's KopfRunner) from the
environment: TANDEM_NAMESPACES (comma list), TANDEM_PROMETHEUS_URL, TANDEM_PROMETHEUS_AUTH_DIR,
TANDEM_ALLOWED_REGISTRIES and TANDEM_PROMETHEUS_ALLOWED_ADDRESSES (comma lists), KUBECONFIG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily

from tandem import GROUP, VERSION
from tandem.adapters.kube import WRITES, RealKube, load_config
from tandem.adapters.lease import KubeLeaseStore
from tandem.adapters.prometheus import PrometheusProvider
from tandem.adapters.routerstreams import RouterStreamsReader
from tandem.api.labels import COMPONENT_ENGINE, FINALIZER, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_POOL, MANAGED_BY
from tandem.core.leader import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S, LeaseTimings
from tandem.leader_election import HealthServer, LeaderElector
from tandem.reconcile.pool import Metrics, PassResult, PoolMemory, reconcile_pool

log = logging.getLogger("tandem.operator")

RECONCILE_SECONDS = Histogram(
    "tandem_reconcile_duration_seconds",
    "Duration of one reconcile pass",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_TOTAL = Counter("tandem_reconcile_total", "Reconcile passes by result", ["kind", "result"])
DECISIONS = Counter("tandem_decisions_total", "Decisions (Events) by reason", ["kind", "reason"])
PAIRS_DESIRED = Gauge("tandem_pool_pairs_desired", "Desired pair groups", ["namespace", "pool"])
PAIRS_READY = Gauge("tandem_pool_pairs_ready", "Ready pair groups", ["namespace", "pool"])
CONDITION = Gauge(
    "tandem_pool_condition", "Pool conditions (1 for the current status)", ["namespace", "pool", "type", "status"]
)
ROLLOUT_STEP = Gauge("tandem_rollout_step", "Current rollout step index", ["namespace", "pool"])
ELECTION = Gauge("tandem_leader", "1 while this process leads (holds the operator Lease and may act)")
LEADERSHIP_LOST = Counter("tandem_leadership_lost_total", "Times this process stopped leading")
LAST_PASS = Gauge("tandem_last_reconcile_timestamp_seconds", "Unix time of the last finished reconcile pass")


class _WritesCollector:
    """Exposes the adapter's write counter (verb, resource) as tandem_api_writes_total."""

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "tandem_api_writes", "API writes by verb and resource", labels=["verb", "resource"]
        )
        for (verb, resource), value in sorted(WRITES.items()):
            family.add_metric([verb, resource], value)
        yield family


with contextlib.suppress(ValueError):
    REGISTRY.register(_WritesCollector())


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)
    prometheus_url: str = ""
    prometheus_auth_dir: str = ""
    kubeconfig: str | None = None
    scrape_interval_s: float = 15.0
    max_concurrent_passes: int = 8
    allowed_registries: list[str] = field(default_factory=list)
    """Registries snapshot images must come from (the chart passes admissionPolicies.imageRegistries.allowed)."""
    prometheus_allowed_addresses: list[str] = field(default_factory=list)
    """https Prometheus addresses a pool may name and still get the credentials (besides --prometheus-url)."""
    router_service: str = ""
    """``namespace/name`` of the router Service whose replicas report open streams ("" : drains are timers)."""

    @classmethod
    def from_env(cls) -> OperatorConfig:
        namespaces = [n for n in os.environ.get("TANDEM_NAMESPACES", "").split(",") if n]
        return cls(
            namespaces=namespaces,
            prometheus_url=os.environ.get("TANDEM_PROMETHEUS_URL", ""),
            prometheus_auth_dir=os.environ.get("TANDEM_PROMETHEUS_AUTH_DIR", ""),
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            scrape_interval_s=float(os.environ.get("TANDEM_SCRAPE_INTERVAL", "15")),
            max_concurrent_passes=int(os.environ.get("TANDEM_MAX_CONCURRENT_PASSES", "8")),
            allowed_registries=_env_list("TANDEM_ALLOWED_REGISTRIES"),
            prometheus_allowed_addresses=_env_list("TANDEM_PROMETHEUS_ALLOWED_ADDRESSES"),
            router_service=os.environ.get("TANDEM_ROUTER_SERVICE", ""),
        )


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


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


@dataclass
class Runtime:
    config: OperatorConfig
    kube: RealKube | None = None
    wakeups: Wakeups = field(default_factory=Wakeups)
    last_pass: float = field(default_factory=time.monotonic)
    metrics: Metrics | None = None
    router_streams: RouterStreamsReader | None = None
    memory: dict[tuple[str, str], PoolMemory] = field(default_factory=dict)
    placement_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: bool = False
    is_leader: Callable[[], bool] = lambda: True
    """Leader election's verdict, read before every pass and by the adapter before every write."""
    loop: asyncio.AbstractEventLoop | None = None
    """True once kopf's startup ran (the reconcile loop is live): what /readyz reports for the leader."""
    pass_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(8))
    """At most ``--max-concurrent-passes`` pool passes run at once, so 1,000 pools waking together do not
    all list from the API server at the same moment. Passes act one at a time under the placement lock
    anyway. Measured on its own in the controller benchmark (C4) it barely changed memory (226 → 224 MiB);
    the memory gain came from `_one_pass` and the lazy CLI."""


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


RUNTIME = Runtime(OperatorConfig.from_env())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings from testing.md §7, and the Kubernetes client."""
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
    RUNTIME.config = OperatorConfig.from_env() if not RUNTIME.config.namespaces else RUNTIME.config
    RUNTIME.kube = RealKube(load_config(RUNTIME.config.kubeconfig), may_write=lambda: RUNTIME.is_leader())  # noqa: PLW0108 late-bound
    RUNTIME.loop = asyncio.get_running_loop()
    RUNTIME.metrics = build_metrics(RUNTIME.config)
    if RUNTIME.config.router_service:
        RUNTIME.router_streams = RouterStreamsReader(RUNTIME.kube.api_client, RUNTIME.config.router_service)
    RUNTIME.wakeups = Wakeups()
    RUNTIME.placement_lock = asyncio.Lock()
    RUNTIME.pass_slots = asyncio.Semaphore(max(1, RUNTIME.config.max_concurrent_passes))
    RUNTIME.started = True
    log.info("tandem operator starting; namespaces=%s", ",".join(RUNTIME.config.namespaces) or "(cluster-wide)")


@kopf.on.login()
def login(**kwargs: Any) -> Any:
    """Credentials for kopf's own watches: the configured kubeconfig, else the pod's ServiceAccount.

    kopf's default handler goes through the kubernetes client, which fixes its kubeconfig location
    when imported, before `--kubeconfig` is known; reading the file here avoids that trap.
    """
    path = RUNTIME.config.kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        os.environ["KUBECONFIG"] = path
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    if RUNTIME.kube is not None:
        await asyncio.to_thread(RUNTIME.kube.api_client.close)


@kopf.on.probe(id="lastReconcileAgeSeconds")
def probe_reconcile(**_: Any) -> float:
    return round(time.monotonic() - RUNTIME.last_pass, 1)


@kopf.on.probe(id="lastWatchEventAgeSeconds")
def probe_watch(**_: Any) -> float:
    return round(time.monotonic() - RUNTIME.wakeups.last_watch_event, 1)


@kopf.on.event(GROUP, VERSION, "inferencepools")
def on_pool_event(name: str, namespace: str | None, meta: Mapping[str, Any], **_: Any) -> None:
    RUNTIME.wakeups.saw_generation(namespace or "", name, int(meta.get("generation") or 0))
    RUNTIME.wakeups.wake(namespace or "", name)


@kopf.on.event("v1", "pods", labels={LABEL_COMPONENT: COMPONENT_ENGINE})
def on_pod_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    pool = labels.get(LABEL_POOL)
    if pool:
        RUNTIME.wakeups.wake(namespace or "", pool)
    else:
        RUNTIME.wakeups.wake_all()


@kopf.on.event("v1", "configmaps", labels={LABEL_POOL: kopf.PRESENT})
def on_configmap_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    RUNTIME.wakeups.wake(namespace or "", labels[LABEL_POOL])


@kopf.on.event("v1", "nodes")
def on_node_event(type: str, **_: Any) -> None:
    # Node status heartbeats arrive constantly; only membership changes matter to placement. Other
    # changes (allocatable, labels, cordon) are picked up by the next pass of each pool anyway.
    if type in ("ADDED", "DELETED"):
        RUNTIME.wakeups.wake_all()


def _record(namespace: str, name: str, result: PassResult) -> None:
    RUNTIME.last_pass = time.monotonic()
    LAST_PASS.set(time.time())
    RECONCILE_SECONDS.labels("InferencePool").observe(result.duration)
    RECONCILE_TOTAL.labels("InferencePool", "error" if result.error else "ok").inc()
    for event in result.events:
        DECISIONS.labels("InferencePool", event.reason).inc()
    plan = result.plan
    if plan is not None:
        status = plan.status
        PAIRS_DESIRED.labels(namespace, name).set(status.pairs.desired)
        PAIRS_READY.labels(namespace, name).set(status.pairs.ready)
        ROLLOUT_STEP.labels(namespace, name).set(status.rollout.step_index)
        for cond in status.conditions:
            for value in ("True", "False", "Unknown"):
                CONDITION.labels(namespace, name, cond.type, value).set(1 if cond.status == value else 0)


@kopf.daemon(GROUP, VERSION, "inferencepools", cancellation_timeout=10.0, id="reconcile")
async def pool_daemon(name: str, namespace: str | None, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The level-based loop of one pool: reconcile, then sleep until woken or requeued."""
    namespace = namespace or ""
    wake = RUNTIME.wakeups.event(namespace, name)
    failures = 0
    while not stopped:
        while (settle := RUNTIME.wakeups.settle_delay(namespace, name)) > 0:
            await asyncio.sleep(settle)
        wake.clear()
        delay, failures = await _one_pass(namespace, name, failures)
        await _wait(wake, delay, failing=bool(failures), generation=lambda: RUNTIME.wakeups.generation(namespace, name))
    RUNTIME.wakeups.forget(namespace, name)
    RUNTIME.memory.pop((namespace, name), None)


async def _one_pass(namespace: str, name: str, failures: int) -> tuple[float, int]:
    """One pass of a pool; returns (seconds until the next, consecutive failures).

    A function of its own so the pass's snapshot and plan (the pool, its revisions, the routing table,
    the status) are freed when it returns, not kept alive by the daemon's frame while it sleeps: 1,000
    idle pools each held their last plan (controller bench C4).
    """
    assert RUNTIME.kube is not None
    if not RUNTIME.is_leader():
        return 2.0, failures  # standing by after a lost Lease: look again soon, act only when leading
    try:
        memory = RUNTIME.memory.setdefault((namespace, name), PoolMemory())
        async with RUNTIME.pass_slots:
            result = await reconcile_pool(
                RUNTIME.kube,
                namespace,
                name,
                metrics=RUNTIME.metrics,
                memory=memory,
                placement_lock=RUNTIME.placement_lock,
                peer_namespaces=RUNTIME.config.namespaces,
                allowed_registries=RUNTIME.config.allowed_registries,
                router_streams=RUNTIME.router_streams,
            )
        failures = 0 if not result.error or result.conflict else failures + 1
    except Exception:  # a bug in one pool must not take down the others (OP-06)
        log.exception("reconcile of %s/%s failed", namespace, name)
        failures += 1
        result = PassResult(requeue_after=min(60.0, 10.0 * failures), error="exception")
    _record(namespace, name, result)
    if result.error and not result.conflict:
        log.warning("pool %s/%s: %s (retry in %.0fs)", namespace, name, result.error, result.requeue_after or 0)
    delay = result.requeue_after if result.requeue_after is not None else 300.0
    if failures:
        delay = max(delay, min(60.0, 10.0 * failures))
    return delay, failures


async def _wait(wake: asyncio.Event, delay: float, *, failing: bool, generation: Callable[[], int]) -> None:
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


# --- tandem run ------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="run the operator (kopf) against the current cluster")
    run.add_argument("--namespace", action="append", default=[], help="namespace to serve (repeatable)")
    run.add_argument("--all-namespaces", action="store_true", help="serve every namespace (not recommended)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--liveness-port", type=int, default=8080, help="port of /healthz and /readyz (0 disables)")
    run.add_argument("--metrics-port", type=int, default=9090, help="port of /metrics (0 disables)")
    run.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics server binds")
    run.add_argument("--prometheus-url", default=os.environ.get("TANDEM_PROMETHEUS_URL", ""), help="default Prometheus")
    run.add_argument("--prometheus-auth-dir", default="", help="directory with token or username/password, ca.crt")
    run.add_argument(
        "--scrape-interval",
        type=float,
        default=float(os.environ.get("TANDEM_SCRAPE_INTERVAL", "15")),
        help="Prometheus scrape interval of engine metrics, seconds (sample freshness and rate windows)",
    )
    run.add_argument(
        "--max-concurrent-passes",
        type=int,
        default=int(os.environ.get("TANDEM_MAX_CONCURRENT_PASSES", "8")),
        help="pool reconcile passes running at once (bounds memory and API load with many pools)",
    )
    election = run.add_argument_group("leader election (one acting operator; others stand by)")
    election.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("TANDEM_LEADER_ELECTION", "true").lower() not in ("0", "false", "no"),
        help="act only while holding a coordination.k8s.io Lease (default on; env TANDEM_LEADER_ELECTION)",
    )
    election.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="namespace of the Lease (default: $POD_NAMESPACE, else the first --namespace, else default)",
    )
    election.add_argument("--leader-election-id", default="tandem-operator", help="name of the Lease")
    election.add_argument(
        "--leader-election-identity",
        default=os.environ.get("TANDEM_LEADER_IDENTITY") or os.environ.get("POD_NAME") or socket.gethostname(),
        help="this process's name in the Lease (default: $TANDEM_LEADER_IDENTITY, $POD_NAME, the hostname)",
    )
    election.add_argument("--lease-duration", type=float, default=LEASE_DURATION_S, help="seconds a Lease is trusted")
    election.add_argument(
        "--renew-deadline", type=float, default=RENEW_DEADLINE_S, help="seconds a leader may fail to renew"
    )
    election.add_argument("--retry-period", type=float, default=RETRY_PERIOD_S, help="seconds between Lease checks")
    run.add_argument(
        "--allowed-registry",
        action="append",
        default=_env_list("TANDEM_ALLOWED_REGISTRIES"),
        help="registry or repository prefix images from revision snapshots must come from (repeatable; "
        "none: digest pinning only)",
    )
    run.add_argument(
        "--prometheus-allowed-address",
        action="append",
        default=_env_list("TANDEM_PROMETHEUS_ALLOWED_ADDRESSES"),
        help="https Prometheus address a pool's analysis.prometheusAddress may name and still get the "
        "credentials (repeatable; --prometheus-url always may)",
    )
    run.add_argument(
        "--router-service",
        default=os.environ.get("TANDEM_ROUTER_SERVICE", ""),
        metavar="NAMESPACE/NAME",
        help="the router Service: its replicas' open-streams reports end drains early (default: none, "
        "drains last drainTimeout; env TANDEM_ROUTER_SERVICE)",
    )
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("--log-level", default="INFO")
    run.set_defaults(func=run_operator)


def _configure_logging(fmt: str, level: str) -> None:
    if fmt == "json":
        logging.basicConfig(
            level=level,
            format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}',
        )
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handler call otherwise


def run_operator(args: argparse.Namespace) -> int:
    if not args.namespace and not args.all_namespaces:
        env = [n for n in os.environ.get("TANDEM_NAMESPACES", "").split(",") if n]
        if not env:
            print("tandem run: give --namespace (repeatable) or --all-namespaces", flush=True)
            return 2
        args.namespace = env
    _configure_logging(args.log_format, args.log_level)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    RUNTIME.config = OperatorConfig(
        namespaces=list(args.namespace),
        prometheus_url=args.prometheus_url,
        prometheus_auth_dir=args.prometheus_auth_dir,
        kubeconfig=args.kubeconfig or os.environ.get("KUBECONFIG"),
        scrape_interval_s=args.scrape_interval,
        max_concurrent_passes=args.max_concurrent_passes,
        allowed_registries=list(args.allowed_registry),
        prometheus_allowed_addresses=list(args.prometheus_allowed_address),
        router_service=args.router_service,
    )
    try:
        timings = LeaseTimings(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        print(f"tandem run: {exc}", flush=True)
        return 2
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    elector = None
    if args.leader_election:
        lease_ns = args.leader_election_namespace or (args.namespace[0] if args.namespace else "default")
        store = KubeLeaseStore(load_config(RUNTIME.config.kubeconfig), lease_ns, args.leader_election_id)
        elector = LeaderElector(store, args.leader_election_identity, timings)
    health = _start_health(args.liveness_port, elector)
    ELECTION.set(0 if elector else 1)
    if elector is not None:
        log.info("leader election: lease %s/%s as %s", store.namespace, store.name, elector.identity)
        try:
            if not elector.acquire():
                return 0
        except KeyboardInterrupt:
            return 0
        RUNTIME.is_leader = elector.is_leader
        ELECTION.set(1)
        elector.start_campaign(_led_again, _lost_leadership)
    try:
        kopf.run(standalone=True, namespaces=list(args.namespace), clusterwide=bool(args.all_namespaces))
    finally:
        if elector is not None:
            elector.release()
        if health is not None:
            health.stop()
    return 0


def _lost_leadership(why: str) -> None:
    """No pass starts and no write leaves this process from now on (``RUNTIME.is_leader`` is already
    False: the fence does not wait for this callback); it campaigns on and resumes if it leads again."""
    ELECTION.set(0)
    LEADERSHIP_LOST.inc()


def _led_again() -> None:
    """Leading again after a loss: every pool gets a pass now (the state may have moved meanwhile)."""
    ELECTION.set(1)
    loop = RUNTIME.loop
    if loop is not None:
        loop.call_soon_threadsafe(RUNTIME.wakeups.wake_all)


def _start_health(port: int, elector: LeaderElector | None) -> HealthServer | None:
    """/healthz (alive) and /readyz: the leader is ready once its reconcile loop started; a standby while
    it reaches the API server (within the renew deadline)."""
    if not port:
        return None

    def ready() -> bool:
        if elector is None or elector.is_leader():
            return RUNTIME.started
        return time.monotonic() - elector.last_contact_at < elector.timings.renew_deadline_s

    def details() -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "leader" if elector is None or elector.is_leader() else "standby",
            "lastReconcileAgeSeconds": round(time.monotonic() - RUNTIME.last_pass, 1),
            "lastWatchEventAgeSeconds": round(time.monotonic() - RUNTIME.wakeups.last_watch_event, 1),
        }
        if elector is not None:
            out["identity"] = elector.identity
            out["holder"] = elector.seen.record.holder if elector.seen else ""
        return out

    return HealthServer(port, ready, details).start()


# The MooncakeCache handlers live in their own module; importing it registers them with kopf.
from tandem import operator_cache  # noqa: E402, F401
