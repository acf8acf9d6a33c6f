"""`tandem rollout status|promote|abort|pause|resume POOL`: rollout controls people can audit.

What it owns: turning a command into one write on the pool, and printing the rollout status. Every
control is a change to the pool object itself (so the API server's audit log records who did it) and
the operator answers with an Event when it acts on it:

- `promote` sets annotation `tandem.dev/promote=<id>`: the current step is skipped (an indefinite pause
  ends); `--full` (`full-<id>`) skips every remaining step and gate — the audited roll-forward override;
- `abort` sets `tandem.dev/abort=<id>`: capacity-safe rollback to stable (a no-op without a rollout);
- `pause` / `resume` set `spec.rollout.paused`.

Ids are unique per request, and the operator records the last one it carried out in
`status.rollout.handledAction`, so a request is acted on exactly once.

`status --watch [--timeout 10m]` polls the pool every `WATCH_INTERVAL_S`, prints a line each time the
rollout's state changes, and exits with a code a CI job can gate on: 0 done, 1 failed (rolling or rolled
back), 2 usage error, 3 timeout, 4 paused and waiting for a person (the rules: `tandem.poolview`).
Without `--watch`, `status` prints the rollout once and exits 0. Namespace and context come from the
kubeconfig as kubectl resolves them (`-n`, `--context`, `--kubeconfig` override).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any

from tandem.adapters.kube import KubeError
from tandem.adapters.kubecontext import ClusterClient, ClusterError, Target
from tandem.api.labels import ANNOTATION_ABORT, ANNOTATION_PROMOTE
from tandem.api.quantity import parse_duration
from tandem.poolctl import add_cluster_flags, prog_name, run_with_cluster, top_prog
from tandem.poolview import EXIT_FAILED, MIRRORED, TransientError, watch_rollout

WATCH_INTERVAL_S = 2.0  # a rollout step takes tens of seconds; 2 s polls cost the API server nothing

EXIT_CODES_HELP = """exit codes of `status --watch` (for CI jobs):
  0  done: the spec's version is stable, no canary, phase Idle/Promoted, Ready, none draining
  1  failed: rolling back or rolled back; the pool is gone; the cluster cannot be reached
  2  usage error
  3  --timeout passed while the rollout was still progressing
  4  paused: waiting for a person (rollout promote|resume|abort)
without --watch, `status` prints the rollout once and exits 0 (1 if the pool or cluster is missing)."""


def timeout_arg(text: str) -> float:
    """`--timeout` as kubectl takes it: a Go duration (90s, 5m, 1h30m); 0 waits forever."""
    if text.strip() == "0":
        return 0.0
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 5m, 1h)") from None


def register(subparsers: Any) -> None:
    rollout = subparsers.add_parser(
        "rollout",
        help="inspect and control a pool's rollout (status --watch gates a CI job)",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rollout.add_argument("action", choices=["status", "promote", "abort", "pause", "resume"])
    rollout.add_argument("pool", help="InferencePool name")
    add_cluster_flags(rollout)
    rollout.add_argument("--full", action="store_true", help="promote: skip every remaining step and gate")
    rollout.add_argument("-o", "--output", choices=["text", "json"], default="text")
    rollout.add_argument(
        "-w", "--watch", action="store_true", help="status: watch until the rollout is done, failed or paused"
    )
    rollout.add_argument(
        "--timeout", type=timeout_arg, default=0.0, help="status: stop watching after this long (implies --watch)"
    )
    rollout.set_defaults(func=run_rollout, prog=top_prog(rollout))


def request_id(full: bool = False) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{'full-' if full else ''}{stamp}-{secrets.token_hex(3)}"


def control_patch(action: str, full: bool = False) -> dict[str, Any]:
    """The merge patch one control makes (pure)."""
    if action == "promote":
        return {"metadata": {"annotations": {ANNOTATION_PROMOTE: request_id(full)}}}
    if action == "abort":
        return {"metadata": {"annotations": {ANNOTATION_ABORT: request_id()}}}
    if action in ("pause", "resume"):
        return {"spec": {"rollout": {"paused": action == "pause"}}}
    raise ValueError(action)


def describe(obj: dict[str, Any]) -> str:
    """Human summary of a pool's rollout (pure)."""
    status = obj.get("status") or {}
    rollout = status.get("rollout") or {}
    revisions = status.get("revisions") or {}
    lines = [
        f"pool        {obj['metadata']['namespace']}/{obj['metadata']['name']}  spec version "
        f"{obj['spec']['stack']['version']}",
        (
            f"phase       {rollout.get('phase', 'Idle')}  step {rollout.get('step', '-')}  {rollout.get('message', '')}"
        ).rstrip(),
    ]
    for role in ("stable", "canary"):
        rev = revisions.get(role)
        if rev:
            lines.append(
                f"{role:<11} {rev['version']} ({rev['name']}): {rev.get('readyPairs', 0)}/{rev.get('pairs', 0)} pairs "
                f"ready, {rev.get('weightPercent', 0)}% of traffic{MIRRORED if rev.get('mirrored') else ''}"
            )
    analysis = rollout.get("analysis") or {}
    if rollout.get("gates"):
        own = analysis.get("gateFailures") or {}
        apart = "".join(f", {name} {k}" for name, k in sorted(own.items()) if isinstance(k, int) and k)
        lines.append(
            f"analysis    success streak {analysis.get('successStreak', 0)}, failures {analysis.get('failures', 0)}"
            + apart
        )
        for gate in rollout["gates"]:
            baseline = f" (stable {gate['baseline']})" if gate.get("baseline") else ""
            lines.append(
                f"  {gate['name']:<20} {gate['verdict']:<8} {gate.get('reason', '')}: {gate.get('value', '')}"
                f"{baseline}  [{gate.get('condition', '')}]"
            )
    for row in status.get("scorecard") or []:
        numbers = ", ".join(
            f"{k}={v}" for k, v in row.items() if k not in ("version", "revision", "updatedAt") and v is not None
        )
        lines.append(f"scorecard   {row['version']} ({row['revision']}): {numbers}")
    if rollout.get("failedRevision"):
        lines.append(f"failed      {rollout['failedRevision']} is parked until spec.stack changes")
    return "\n".join(lines)


def _run(args: argparse.Namespace, cluster: ClusterClient, target: Target) -> int:
    ns = target.namespace
    if args.action != "status":
        cluster.patch_pool(ns, args.pool, control_patch(args.action, args.full))
        print(f"{args.action} requested for {ns}/{args.pool}")
    obj = cluster.get_pool(ns, args.pool)
    if obj is None:
        print(f"{prog_name(args)}: inferencepools.tandem.dev {ns}/{args.pool} not found", file=sys.stderr)
        return EXIT_FAILED
    if args.action == "status" and (args.watch or args.timeout):
        return watch_rollout(
            lambda: _poll(cluster, ns, args.pool),
            timeout_s=args.timeout,
            interval_s=WATCH_INTERVAL_S,
            clock=time.monotonic,
            sleep=time.sleep,
            emit=lambda line: print(line, flush=True),
        )
    if args.action == "status":
        if args.output == "json":
            print(json.dumps((obj.get("status") or {}).get("rollout") or {}, indent=2))
        else:
            print(describe(obj))
    return 0


def _poll(cluster: ClusterClient, namespace: str, name: str) -> dict[str, Any] | None:
    """One watch poll; an unreachable or erroring API server is retried until the timeout."""
    try:
        return cluster.get_pool(namespace, name)
    except (ClusterError, KubeError) as exc:
        raise TransientError(str(exc)) from None


def run_rollout(args: argparse.Namespace) -> int:
    return run_with_cluster(args, lambda cluster, target: _run(args, cluster, target))
