"""`tandem run`: flags, logging, leader election, health, then kopf.

What it owns: turning flags into one ``OperatorConfig`` and one ``Runtime``, electing a leader, and
starting kopf with that runtime in its ``memo``. Importing this module registers the pool and cache
handlers (``pools``, ``caches``); in-process runners use ``kopf run -m tandem.controller.main``, and the
startup handler then builds the runtime from the environment (``config``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from typing import Any

import kopf
from prometheus_client import start_http_server

from tandem.adapters.kube import load_config
from tandem.adapters.lease import KubeLeaseStore
from tandem.controller import caches as _caches  # noqa: F401 - registers the MooncakeCache handlers
from tandem.controller import metrics as m
from tandem.controller import pools as _pools  # noqa: F401 - registers the InferencePool handlers
from tandem.controller.config import OperatorConfig
from tandem.controller.election import HealthServer, LeaderElector
from tandem.controller.runtime import Runtime
from tandem.core.leader import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S, LeaseTimings

log = logging.getLogger("tandem.operator")

DEFAULT_LEASE_NAME = "tandem-operator"


def register(subparsers: Any) -> None:
    env = OperatorConfig.from_env()  # defaults: the config's own, overridden by the environment
    run = subparsers.add_parser("run", help="run the operator (kopf) against the current cluster")
    run.add_argument("--namespace", action="append", default=[], help="namespace to serve (repeatable)")
    run.add_argument("--all-namespaces", action="store_true", help="serve every namespace (not recommended)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    run.add_argument("--liveness-port", type=int, default=8080, help="port of /healthz and /readyz (0 disables)")
    run.add_argument("--metrics-port", type=int, default=9090, help="port of /metrics (0 disables)")
    run.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics server binds")
    run.add_argument("--prometheus-url", default=env.prometheus_url, help="default Prometheus")
    run.add_argument(
        "--prometheus-auth-dir",
        default=env.prometheus_auth_dir,
        help="directory with token or username/password, ca.crt",
    )
    run.add_argument(
        "--scrape-interval",
        type=float,
        default=env.scrape_interval_s,
        help=f"Prometheus scrape interval of engine metrics, seconds (sample freshness and rate windows; "
        f"default {env.scrape_interval_s:g})",
    )
    run.add_argument(
        "--max-concurrent-passes",
        type=int,
        default=env.max_concurrent_passes,
        help=f"pool reconcile passes running at once (bounds memory and API load with many pools; "
        f"default {env.max_concurrent_passes})",
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
    election.add_argument("--leader-election-id", default=DEFAULT_LEASE_NAME, help="name of the Lease")
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
        default=list(env.allowed_registries),
        help="registry or repository prefix images from revision snapshots must come from (repeatable; "
        "none: digest pinning only)",
    )
    run.add_argument(
        "--prometheus-allowed-address",
        action="append",
        default=list(env.prometheus_allowed_addresses),
        help="https Prometheus address a pool's analysis.prometheusAddress may name and still get the "
        "credentials (repeatable; --prometheus-url always may)",
    )
    run.add_argument(
        "--router-service",
        default=env.router_service,
        metavar="NAMESPACE/NAME",
        help="the router Service: its replicas' open-streams reports end drains early, and eval Jobs run "
        "through it (default: none, drains last drainTimeout and evals call decode pods; env TANDEM_ROUTER_SERVICE)",
    )
    run.add_argument(
        "--router-url",
        default=env.router_url,
        metavar="URL",
        help="where eval Jobs reach the router, pinned to the canary with X-Tandem-Revision (the router needs "
        "--allow-revision-header; default: http://NAME.NAMESPACE.svc:8000 from --router-service; env "
        "TANDEM_ROUTER_URL)",
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


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        namespaces=list(args.namespace),
        prometheus_url=args.prometheus_url,
        prometheus_auth_dir=args.prometheus_auth_dir,
        kubeconfig=args.kubeconfig or os.environ.get("KUBECONFIG"),
        scrape_interval_s=args.scrape_interval,
        max_concurrent_passes=args.max_concurrent_passes,
        allowed_registries=list(args.allowed_registry),
        prometheus_allowed_addresses=list(args.prometheus_allowed_address),
        router_service=args.router_service,
        router_url=args.router_url,
    )


def run_operator(args: argparse.Namespace) -> int:
    if not args.namespace and not args.all_namespaces:
        env = OperatorConfig.from_env().namespaces
        if not env:
            print("tandem run: give --namespace (repeatable) or --all-namespaces", flush=True)
            return 2
        args.namespace = env
    _configure_logging(args.log_format, args.log_level)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    runtime = Runtime(config_from_args(args))
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
        store = KubeLeaseStore(load_config(runtime.config.kubeconfig), lease_ns, args.leader_election_id)
        elector = LeaderElector(store, args.leader_election_identity, timings)
    health = _start_health(runtime, args.liveness_port, elector)
    m.ELECTION.set(0 if elector else 1)
    if elector is not None:
        log.info("leader election: lease %s/%s as %s", store.namespace, store.name, elector.identity)
        try:
            if not elector.acquire():
                return 0
        except KeyboardInterrupt:
            return 0
        runtime.is_leader = elector.is_leader
        m.ELECTION.set(1)
        elector.start_campaign(lambda: _led_again(runtime), _lost_leadership)
    try:
        kopf.run(
            standalone=True,
            namespaces=list(args.namespace),
            clusterwide=bool(args.all_namespaces),
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        if elector is not None:
            elector.release()
        if health is not None:
            health.stop()
    return 0


def _lost_leadership(why: str) -> None:
    """No pass starts and no write leaves this process from now on (``runtime.is_leader`` is already
    False: the fence does not wait for this callback); it campaigns on and resumes if it leads again."""
    m.ELECTION.set(0)
    m.LEADERSHIP_LOST.inc()


def _led_again(runtime: Runtime) -> None:
    """Leading again after a loss: every pool gets a pass now (the state may have moved meanwhile)."""
    m.ELECTION.set(1)
    loop = runtime.loop
    if loop is not None:
        loop.call_soon_threadsafe(runtime.wakeups.wake_all)


def _start_health(runtime: Runtime, port: int, elector: LeaderElector | None) -> HealthServer | None:
    """/healthz (alive) and /readyz: the leader is ready once its reconcile loop started; a standby while
    it reaches the API server (within the renew deadline)."""
    if not port:
        return None

    def ready() -> bool:
        if elector is None or elector.is_leader():
            return runtime.started
        return time.monotonic() - elector.last_contact_at < elector.timings.renew_deadline_s

    def details() -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "leader" if elector is None or elector.is_leader() else "standby",
            "lastReconcileAgeSeconds": round(time.monotonic() - runtime.last_pass, 1),
            "lastWatchEventAgeSeconds": round(time.monotonic() - runtime.wakeups.last_watch_event, 1),
        }
        if elector is not None:
            out["identity"] = elector.identity
            out["holder"] = elector.seen.record.holder if elector.seen else ""
        return out

    return HealthServer(port, ready, details).start()
