"""`tandem get pools|pool NAME` and `tandem version`: the kubectl-style read commands (also `kubectl tandem ...`).

What it owns: the flags every cluster command shares (`-n/--namespace`, `--context`, `--kubeconfig`,
resolved as kubectl does by `adapters.kubecontext`), fetching pools and printing them through the pure
`tandem.poolview`, and the rule that a cluster problem is one line on stderr and exit 1, never a traceback.

`version` never fails: it prints the client version, then what it can learn from the cluster (server
version, whether Tandem's CRDs are served) or one line saying why it could not, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import yaml

from tandem import API_VERSION
from tandem.adapters.kube import KubeError
from tandem.adapters.kubecontext import ClusterClient, ClusterError, Target, resolve_target
from tandem.poolview import EXIT_FAILED, as_document, render_table

DISTRIBUTION = "tandem-operator"
POOL_RESOURCES = ("pools", "pool", "inferencepools", "inferencepool", "inferencepools.tandem.dev", "tpool")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags kubectl users expect on every command that talks to a cluster."""
    parser.add_argument(
        "-n", "--namespace", help="namespace (default: the context's namespace from the kubeconfig, else default)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


def top_prog(parser: argparse.ArgumentParser) -> str:
    """The top-level program name of a sub-command parser: `tandem`, or `kubectl tandem` as a plugin."""
    return parser.prog.rsplit(" ", 1)[0]


def prog_name(args: argparse.Namespace) -> str:
    """`tandem` or `kubectl tandem`, for error lines (set by the top-level parser's prog)."""
    return str(getattr(args, "prog", "tandem"))


def run_with_cluster(args: argparse.Namespace, body: Callable[[ClusterClient, Target], int]) -> int:
    """Resolve the target, connect, run ``body``; a cluster or API problem becomes one line and exit 1."""
    try:
        target = resolve_target(args.kubeconfig, args.context, args.namespace)
        with ClusterClient(target) as cluster:
            return body(cluster, target)
    except (ClusterError, KubeError) as exc:
        print(f"{prog_name(args)}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def register(subparsers: Any) -> None:
    get = subparsers.add_parser(
        "get",
        help="list pools like kubectl get (NAME, VERSION stable→canary, PHASE, STEP, PAIRS, WEIGHT, AGE)",
        description="Print InferencePools as a table (or -o json|yaml). Exit 0, or 1 when the pool does not exist "
        "or the cluster cannot be reached.",
    )
    get.add_argument("resource", choices=POOL_RESOURCES, metavar="pools", help="pools (or pool, tpool, inferencepools)")
    get.add_argument("name", nargs="?", help="one pool")
    add_cluster_flags(get)
    get.add_argument("-A", "--all-namespaces", action="store_true", help="pools of every namespace")
    get.add_argument("-o", "--output", choices=["wide", "json", "yaml"], help="wide table, json or yaml")
    get.set_defaults(func=run_get, prog=top_prog(get))

    version = subparsers.add_parser(
        "version", help="client version; server version and CRDs when a cluster is reachable (always exit 0)"
    )
    add_cluster_flags(version)
    version.set_defaults(func=run_version, prog=top_prog(version))


def run_get(args: argparse.Namespace) -> int:
    def body(cluster: ClusterClient, target: Target) -> int:
        if args.name:
            obj = cluster.get_pool(target.namespace, args.name)
            if obj is None:
                print(
                    f'{prog_name(args)}: inferencepools.tandem.dev "{args.name}" not found in namespace '
                    f"{target.namespace}",
                    file=sys.stderr,
                )
                return EXIT_FAILED
            objs = [obj]
        else:
            objs = cluster.list_pools(None if args.all_namespaces else target.namespace)
        if args.output in ("json", "yaml"):
            doc = as_document(objs, single=bool(args.name))
            print(
                json.dumps(doc, indent=4) if args.output == "json" else yaml.safe_dump(doc, sort_keys=False), end="\n"
            )
            return 0
        if not objs:
            where = "any namespace" if args.all_namespaces else f"{target.namespace} namespace"
            print(f"No resources found in {where}.", file=sys.stderr)
            return 0
        print(render_table(objs, datetime.now(UTC), wide=args.output == "wide", all_namespaces=args.all_namespaces))
        return 0

    return run_with_cluster(args, body)


def client_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def run_version(args: argparse.Namespace) -> int:
    print(f"Client Version: {client_version()} (API {API_VERSION})")
    try:
        target = resolve_target(args.kubeconfig, args.context, args.namespace)
        with ClusterClient(target) as cluster:
            print(f"Server Version: {cluster.server_version()} ({cluster.server}, context {target.context})")
            served = cluster.installed_crds()
    except (ClusterError, KubeError) as exc:
        print(f"Server Version: unavailable: {exc}")
        return 0
    print(f"CRDs: {', '.join(served) + ' installed' if served else 'not installed (helm install or tandem crds)'}")
    return 0
