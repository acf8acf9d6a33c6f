"""`tandem plan FILE`: what the operator would create for a pool, from the same pure planner.

What it owns: turning a manifest plus a synthetic fleet of GPU nodes into a readable preview: pairs
and the node each instance lands on, the pod shape (GPUs, args), the rollout steps with their pair
targets, and the routing table. Nothing is read from or written to a cluster; the planner is the one
the operator runs (`tandem.core.plan.plan_pool`), so the preview is what a fresh cluster would get.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from typing import Any

from tandem.api.commands import load_documents
from tandem.api.resources import InferencePool
from tandem.api.revision import revision_spec
from tandem.api.validate import validate_object
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.observed import ObservedNode, Snapshot
from tandem.core.placement import DEVICE_IDS
from tandem.core.plan import Plan, plan_pool
from tandem.core.rollout import canary_pair_load, canary_target, like_load, mirrors, step_pairs


def register(subparsers: Any) -> None:
    plan = subparsers.add_parser("plan", help="preview the pairs, placement and routing table for a pool manifest")
    plan.add_argument("file", help="manifest with one or more InferencePools")
    plan.add_argument("--nodes", type=int, default=0, help="simulated GPU nodes (default: just enough)")
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--zones", type=int, default=2)
    plan.add_argument("--product", default="MI325X", choices=sorted(DEVICE_IDS))
    plan.add_argument("--output", choices=["text", "json"], default="text")
    plan.add_argument("--show-pod", action="store_true", help="print the first instance pod manifest")
    plan.set_defaults(func=run_plan)


def synthetic_nodes(count: int, gpus: int, zones: int, product: str, selector: dict[str, str]) -> list[ObservedNode]:
    return [
        ObservedNode(
            name=f"{product.lower()}-{i}",
            labels={
                "kubernetes.io/hostname": f"{product.lower()}-{i}",
                "topology.kubernetes.io/zone": f"zone-{chr(ord('a') + i % zones)}",
                "amd.com/gpu.device-id": DEVICE_IDS[product],
                **selector,
            },
            allocatable={"amd.com/gpu": gpus},
        )
        for i in range(count)
    ]


def preview(pool: InferencePool, nodes: list[ObservedNode]) -> tuple[Plan, dict[str, Any]]:
    plan = plan_pool(Snapshot(pool=pool, pods=(), nodes=tuple(nodes), now=datetime.now(UTC).replace(microsecond=0)))
    pairs: dict[int, list[dict[str, Any]]] = {}
    for create in plan.creates:
        pairs.setdefault(create.pair, []).append(
            {"role": create.role, "instance": create.instance, "node": create.node or "(pending: no GPUs free)"}
        )
    spec = pool.spec
    steps = []
    notes = []
    replicas = spec.pairs.replicas
    all_steps = list(spec.rollout.steps)
    for index, step in enumerate(all_steps):
        _, weight = canary_target(all_steps, index, replicas)
        canary, stable = step_pairs(all_steps, index, replicas, spec.rollout.max_surge)
        raw = canary_pair_load(all_steps, index, replicas, spec.rollout.max_surge)
        load = None if raw is None else round(raw, 2)
        action = step.model_dump(by_alias=True, exclude_none=True)
        label = f"{index + 1}/{len(all_steps)}"
        steps.append(
            {
                "step": label,
                "action": action,
                "canaryPairs": canary,
                "stablePairs": stable,
                "canaryTrafficPercent": weight,
                "canaryMirrored": mirrors(all_steps, index),
                "canaryPairLoad": load,
            }
        )
        if step.analysis is not None and load is not None and not like_load(load):
            notes.append(
                f"step {label} analyses canary pairs that carry x{load:.2f} of a stable pair's keys at "
                f"{replicas} replicas: its latency gates compare the canary at another load "
                "(setCanaryPairs gives each canary pair a stable pair's share)"
            )
    summary = {
        "pool": pool.metadata.name,
        "revision": plan.desired_revision,
        "pairs": [{"pair": f"{pool.metadata.name}-p{i}", "instances": members} for i, members in sorted(pairs.items())],
        "gpusPerPair": spec.pairs.prefill.instances * spec.pairs.prefill.gpus_per_instance
        + spec.pairs.decode.instances * spec.pairs.decode.gpus_per_instance,
        "rolloutSteps": steps,
        "rolloutNotes": notes,
        "conditions": {c.type: f"{c.status} ({c.reason})" for c in plan.status.conditions},
        "routingTable": json.loads(plan.routing.to_json()),
    }
    return plan, summary


def run_plan(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    try:
        loaded = load_documents(Path(args.file))
    except (OSError, ValueError) as exc:
        print(f"{args.file}: cannot read: {exc}", file=sys.stderr)
        return 1
    docs = [d for d in loaded if isinstance(d, dict) and d.get("kind") == "InferencePool"]
    if not docs:
        print(f"{args.file}: no InferencePool in it", file=sys.stderr)
        return 1
    status = 0
    outputs = []
    for doc in docs:
        errors = validate_object(doc)
        if errors:
            for error in errors:
                print(f"{args.file}: {doc.get('metadata', {}).get('name')}: {error}", file=sys.stderr)
            status = 1
            continue
        body = dict(doc)
        body.setdefault("metadata", {}).setdefault("namespace", "default")
        pool = InferencePool.model_validate(body)
        per_pair = pool.spec.pairs.prefill.instances * pool.spec.pairs.prefill.gpus_per_instance + (
            pool.spec.pairs.decode.instances * pool.spec.pairs.decode.gpus_per_instance
        )
        count = args.nodes or max(1, math.ceil(pool.spec.pairs.replicas * per_pair / args.gpus_per_node))
        nodes = synthetic_nodes(
            count, args.gpus_per_node, args.zones, args.product, dict(pool.spec.placement.node_selector)
        )
        plan, summary = preview(pool, nodes)
        outputs.append(summary)
        if args.output == "text":
            print_text(summary, count, args)
            if args.show_pod and plan.creates:
                first = plan.creates[0]
                pod = build_instance_pod(
                    InstanceParams(
                        pool=pool.metadata.name,
                        namespace=pool.metadata.namespace,
                        pool_uid="<pool-uid>",
                        pair=first.pair,
                        role=first.role,
                        instance=first.instance,
                        revision=first.revision,
                        spec=revision_spec(pool.spec),
                        node=first.node,
                        shape=first.shape,
                    )
                )
                print(json.dumps(pod, indent=2))
    if args.output == "json":
        print(json.dumps(outputs if len(outputs) != 1 else outputs[0], indent=2))
    return status


def print_text(summary: dict[str, Any], nodes: int, args: argparse.Namespace) -> None:
    print(
        f"pool {summary['pool']}  revision {summary['revision']}  {len(summary['pairs'])} pair(s), "
        f"{summary['gpusPerPair']} GPUs per pair, on {nodes} simulated {args.product} node(s) × "
        f"{args.gpus_per_node} GPUs"
    )
    for pair in summary["pairs"]:
        placed = ", ".join(f"{i['role']}-{i['instance']}@{i['node']}" for i in pair["instances"])
        print(f"  {pair['pair']:<24} {placed}")
    print("rollout steps (for the next stack version):")
    for step in summary["rolloutSteps"]:
        weight = step["canaryTrafficPercent"]
        traffic = f"{weight}%"
        if weight is None:
            serving = step["canaryPairs"] + step["stablePairs"]
            traffic = "by pair count" + (f" ({100 * step['canaryPairs'] / serving:.0f}%)" if serving else "")
        if step.get("canaryMirrored"):
            traffic = "0% (mirrored: copies of its pair-count keys, answers dropped)"
        load = step["canaryPairLoad"]
        per_pair = "" if load is None else f", each canary pair x{load:.2f} of a stable pair's keys"
        print(
            f"  {step['step']:<6} {json.dumps(step['action']):<40} canary {step['canaryPairs']} / stable "
            f"{step['stablePairs']} pairs, canary traffic {traffic}{per_pair}"
        )
    for note in summary["rolloutNotes"]:
        print(f"  note: {note}")
    print("conditions: " + ", ".join(f"{k}={v}" for k, v in summary["conditions"].items()))
    print("routing table (ConfigMap " + summary["pool"] + "-routing, key routing.json):")
    print(json.dumps(summary["routingTable"], indent=2))
