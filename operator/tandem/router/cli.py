"""``tandem router``: run the data plane with routing tables from files or from the cluster.

``--routing-table FILE`` (repeatable) names files that hold a table as the operator publishes it (the
``routing.json`` value, or the ConfigMap as ``kubectl get -o yaml`` prints it); they are re-read when they
change. ``--namespace NS`` (repeatable) watches the ``<pool>-routing`` ConfigMaps of NS instead (in-cluster
credentials by default, or ``--kubeconfig``); both may be combined. Requests on ``--host:--port``;
``/health``, ``/ready`` and ``/metrics`` on ``--metrics-port``.

``--allow-revision-header`` makes the router honour ``X-Tandem-Revision: <namespace>/<pool>/<revision>``
(or ``<revision>``): such a request is served only by that revision's serving pairs, walking on inside
them; the canary's eval Job uses it to run through the real P/D path. Off by default, because any client
that can send it pins its requests to the canary: it then gets the canary's answers on purpose and can
load the canary's few pairs, skewing the gates that judge it. A router without the flag refuses such a
request (403 ``revision_pin_disabled``) rather than ignoring the header. The chart turns it on, next to
its operator, and its NetworkPolicy limits who reaches the router (docs/design/005-routing.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from tandem.router.proxy import RequestIdFilter, RouterConfig
from tandem.router.server import start_router
from tandem.router.tables import DEFAULT_POLL_INTERVAL_S, FileSource, TableSource

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
"""Every line names the request it was logged for (``-`` outside a request): see ``RequestIdFilter``."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "router",
        help="serve OpenAI requests through the pools' prefill/decode pairs (the data plane)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--routing-table", action="append", default=[], metavar="FILE", help="routing table file (repeatable)"
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch the routing-table ConfigMaps of this namespace (repeatable)",
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig for --namespace (default: in-cluster, else $KUBECONFIG)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="request listener address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="request listener port (default 8000)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="health/metrics listener address")
    parser.add_argument("--metrics-port", type=int, default=9090, help="health/metrics listener port (default 9090)")
    parser.add_argument(
        "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL_S, help="seconds between file checks"
    )
    parser.add_argument(
        "--prefill-timeout", type=float, default=RouterConfig.prefill_timeout_s, help="prefill leg timeout (s)"
    )
    parser.add_argument(
        "--connect-timeout", type=float, default=RouterConfig.connect_timeout_s, help="connect timeout (s)"
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=RouterConfig.scrape_interval_s,
        help="seconds between engine /metrics rounds for admission (0: own counts only)",
    )
    parser.add_argument(
        "--scrape-timeout", type=float, default=RouterConfig.scrape_timeout_s, help="engine /metrics read timeout (s)"
    )
    parser.add_argument(
        "--scrape-stale-intervals",
        type=int,
        default=RouterConfig.scrape_stale_intervals,
        help="engine samples older than this many intervals are ignored",
    )
    parser.add_argument(
        "--allow-revision-header",
        action="store_true",
        help="honour X-Tandem-Revision (pin a request to one revision's serving pairs; the canary's eval Job "
        "needs it). Off: such requests get 403. Any client that reaches the router can then pin, so keep "
        "the router's clients restricted",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.set_defaults(func=run)


def _sources(args: argparse.Namespace) -> list[TableSource]:
    sources: list[TableSource] = []
    if args.routing_table:
        sources.append(FileSource(args.routing_table, args.poll_interval))
    if args.namespace:
        # Only here: a router fed from files never loads the Kubernetes client.
        from tandem.adapters.routerwatch import ConfigMapSource, KubeConfigMaps, router_api_client  # noqa: PLC0415

        sources.append(ConfigMapSource(args.namespace, KubeConfigMaps(router_api_client(args.kubeconfig))))
    return sources


async def _serve(args: argparse.Namespace) -> int:
    config = RouterConfig(
        prefill_timeout_s=args.prefill_timeout,
        connect_timeout_s=args.connect_timeout,
        scrape_interval_s=args.scrape_interval,
        scrape_timeout_s=args.scrape_timeout,
        scrape_stale_intervals=args.scrape_stale_intervals,
        allow_revision_pin=args.allow_revision_header,
    )
    running = await start_router(
        _sources(args),
        host=args.host,
        port=args.port,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        config=config,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.routing_table and not args.namespace:
        raise SystemExit("tandem router: give --routing-table FILE or --namespace NS (either may repeat)")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
    return asyncio.run(_serve(args))
