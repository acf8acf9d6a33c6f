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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from datetime import UTC, datetime
from typing import Any

from tandem.adapters.kube import KubeError, RealKube, load_config
from tandem.api.labels import ANNOTATION_ABORT, ANNOTATION_PROMOTE

PLURAL = "inferencepools"


def register(subparsers: Any) -> None:
    rollout = subparsers.add_parser("rollout", help="inspect and control a pool's rollout")
    rollout.add_argument("action", choices=["status", "promote", "abort", "pause", "resume"])
    rollout.add_argument("pool", help="InferencePool name")
    rollout.add_argument("-n", "--namespace", default="default")
    rollout.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    rollout.add_argument("--full", action="store_true", help="promote: skip every remaining step and gate")
    rollout.add_argument("-o", "--output", choices=["text", "json"], default="text")
    rollout.set_defaults(func=run_rollout)


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
                f"ready, {rev.get('weightPercent', 0)}% of traffic"
            )
    analysis = rollout.get("analysis") or {}
    if rollout.get("gates"):
        lines.append(
            f"analysis    success streak {analysis.get('successStreak', 0)}, failures {analysis.get('failures', 0)}"
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


async def _run(args: argparse.Namespace) -> int:
    kube = RealKube(load_config(args.kubeconfig))
    try:
        if args.action != "status":
            await kube.patch_custom(PLURAL, args.namespace, args.pool, control_patch(args.action, args.full))
            print(f"{args.action} requested for {args.namespace}/{args.pool}")
        obj = await kube.get_custom(PLURAL, args.namespace, args.pool)
    except KubeError as exc:
        print(f"tandem rollout: {exc}", file=sys.stderr)
        return 1
    finally:
        kube.api_client.close()  # type: ignore[no-untyped-call]
    if obj is None:
        print(f"tandem rollout: inferencepools.tandem.dev {args.namespace}/{args.pool} not found", file=sys.stderr)
        return 1
    if args.action == "status":
        if args.output == "json":
            print(json.dumps((obj.get("status") or {}).get("rollout") or {}, indent=2))
        else:
            print(describe(obj))
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
