"""``tandem dev cluster up|down|status``: the local KWOK cluster from the command line.

What it owns: argument parsing, progress lines and the human-readable status; all work is done by
``tandem_lab.dev.cluster``. Exit codes follow ``tandem.cli``: 0 ok, 1 the command ran and failed (missing
binaries, a control plane that did not start, a cluster that is not up), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tandem_lab.dev import cluster as devcluster
from tandem_lab.dev.nodes import DEFAULT_REGION, DEFAULT_ZONES, PRODUCTS
from tandem_lab.dev.prometheus import DEFAULT_LOOKBACK_DELTA, DEFAULT_SCRAPE_INTERVAL_S
from tandem_lab.dev.testenv import TestenvError


def register(subparsers: Any) -> None:
    """Add ``tandem dev ...`` to the top-level parser."""
    dev = subparsers.add_parser("dev", help="developer tooling: the local KWOK cluster")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="COMMAND")
    dev.set_defaults(func=lambda args: _help(dev))
    cl = dev_sub.add_parser(
        "cluster",
        help="start/stop/inspect a local control plane with simulated AMD GPU nodes",
        description=(
            "A real kube-apiserver/etcd/controller-manager/scheduler on 127.0.0.1 (kwokctl, binary "
            "runtime), KWOK nodes with amd.com/gpu and the AMD node-labeller labels, and a Prometheus "
            "on loopback. State and kubeconfig live under $TANDEM_CLUSTERS_DIR (default "
            "~/.tandem/clusters/<name>/)."
        ),
    )
    cl_sub = cl.add_subparsers(dest="cluster_command", metavar="ACTION")
    cl.set_defaults(func=lambda args: _help(cl))

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", default="tandem", help="cluster name (default: tandem)")
        p.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="state root (default: $TANDEM_CLUSTERS_DIR or ~/.tandem/clusters)",
        )

    up = cl_sub.add_parser("up", help="start a cluster (no-op if it is already up)")
    common(up)
    up.add_argument("--nodes", type=int, default=4, help="number of GPU nodes (default: 4)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="amd.com/gpu per node (default: 8)")
    up.add_argument(
        "--product", default="MI325X", choices=sorted(PRODUCTS), type=str.upper, help="GPU model (default: MI325X)"
    )
    up.add_argument(
        "--zones",
        default=",".join(DEFAULT_ZONES),
        help=f"comma-separated zones, nodes spread round-robin (default: {','.join(DEFAULT_ZONES)})",
    )
    up.add_argument("--region", default=DEFAULT_REGION, help=f"region label (default: {DEFAULT_REGION})")
    up.add_argument(
        "--load-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="default model-load delay before a pod turns Ready; a pod overrides it with the "
        "annotation tandem.dev/sim-load-seconds (default: 0)",
    )
    up.add_argument(
        "--load-jitter",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="extra uniform random load delay, up to this (default: 0)",
    )
    up.add_argument(
        "--scrape-interval",
        type=float,
        default=DEFAULT_SCRAPE_INTERVAL_S,
        metavar="SECONDS",
        help=f"Prometheus scrape interval (default: {DEFAULT_SCRAPE_INTERVAL_S:g})",
    )
    up.add_argument(
        "--lookback-delta",
        default=DEFAULT_LOOKBACK_DELTA,
        help=f"Prometheus --query.lookback-delta (default: {DEFAULT_LOOKBACK_DELTA})",
    )
    up.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus")
    up.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="where to write the admin kubeconfig (default: <state-dir>/<name>/kubeconfig)",
    )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.set_defaults(func=cmd_up)

    down = cl_sub.add_parser("down", help="stop a cluster and remove its state")
    common(down)
    down.set_defaults(func=cmd_down)

    st = cl_sub.add_parser("status", help="show components, nodes, GPUs, kubeconfig and Prometheus URL")
    common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _printer() -> devcluster.Progress:
    start = time.monotonic()

    def emit(message: str) -> None:
        print(f"[tandem dev {time.monotonic() - start:6.1f}s] {message}", flush=True)

    return emit


def cmd_up(args: argparse.Namespace) -> int:
    zones = tuple(z.strip() for z in args.zones.split(",") if z.strip())
    options = devcluster.ClusterOptions(
        name=args.name,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        product=args.product,
        zones=zones,
        region=args.region,
        load_delay_s=args.load_delay,
        load_jitter_s=args.load_jitter,
        prometheus=not args.no_prometheus,
        scrape_interval_s=args.scrape_interval,
        lookback_delta=args.lookback_delta,
        kubeconfig=args.kubeconfig,
        wait_s=args.timeout,
    )
    try:
        options.validate()
    except ValueError as exc:
        print(f"tandem dev cluster up: {exc}", file=sys.stderr)
        return 2
    try:
        state = devcluster.up(options, root=args.state_dir, progress=_printer())
    except (TestenvError, devcluster.ClusterError) as exc:
        print(f"tandem dev cluster up: {exc}", file=sys.stderr)
        return 1
    print(f"\nexport KUBECONFIG={state.kubeconfig}")
    if state.prometheus_url:
        print(
            f"Prometheus: {state.prometheus_url}  (add scrape targets as JSON files in "
            f"{Path(state.state_dir) / 'prometheus' / 'targets'})"
        )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    try:
        killed = devcluster.down(args.name, root=args.state_dir, progress=_printer())
    except devcluster.ClusterError as exc:
        print(f"tandem dev cluster down: {exc}", file=sys.stderr)
        return 1
    if killed:
        print(f"({len(killed)} process(es) outlived kwokctl delete and were terminated)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = devcluster.status(args.name, root=args.state_dir)
    if args.json:
        print(json.dumps(_status_dict(st), indent=2, sort_keys=True))
        return 0 if st.api_ready else 1
    if st.state is None:
        print(f"cluster {args.name!r}: not found under {devcluster.state_root(args.state_dir)}")
        return 1
    s = st.state
    print(
        f"cluster      {s.name}  ({'up' if st.api_ready else 'DOWN'}; started {s.created_at} in "
        f"{s.startup_seconds:.1f} s)"
    )
    print(f"api server   {st.server or '-'}")
    print(f"kubeconfig   {s.kubeconfig}")
    print(f"audit log    {s.audit_log}")
    print("components   " + "  ".join(f"{c}={'running' if ok else 'STOPPED'}" for c, ok in st.components.items()))
    prom = s.prometheus_url or "-"
    print(f"prometheus   {prom}  ({'ready' if st.prometheus_ready else 'not ready' if s.prometheus_url else 'off'})")
    ready = sum(1 for n in st.nodes if n["ready"])
    print(f"nodes        {ready}/{len(st.nodes)} Ready, amd.com/gpu allocatable {st.gpus_allocatable}")
    for n in st.nodes:
        flags = ("Ready" if n["ready"] else "NotReady") + (",SchedulingDisabled" if n["unschedulable"] else "")
        print(
            f"  {n['name']:<16} {flags:<28} {n['zone']:<8} {n['rack']:<16} {n['product']:<24} "
            f"gpu {n['gpus_allocatable']}/{n['gpus_capacity']}"
        )
    return 0 if st.api_ready else 1


def _status_dict(st: devcluster.ClusterStatus) -> dict[str, Any]:
    s = st.state
    return {
        "name": st.name,
        "found": s is not None,
        "apiReady": st.api_ready,
        "server": st.server,
        "kubeconfig": s.kubeconfig if s else None,
        "auditLog": s.audit_log if s else None,
        "components": st.components,
        "prometheusUrl": s.prometheus_url if s else None,
        "prometheusReady": st.prometheus_ready,
        "nodes": st.nodes,
        "gpusAllocatable": st.gpus_allocatable,
    }


def build_parser() -> argparse.ArgumentParser:
    """``tandem`` with only ``dev`` registered: what ``main`` parses."""
    parser = argparse.ArgumentParser(prog="tandem")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tandem_lab.dev.cli dev cluster down --name N``: these commands without the ``tandem``
    console script and the lab's entry point, so a cluster's guard (``lifetime.start_guard``) tears down
    with nothing but the interpreter that started it."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
