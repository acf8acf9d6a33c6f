"""Seed scale: 95 pairs on 95 simulated MI325X nodes (760 GPUs) converge, measured next to creating
the same pods directly, in the same run (issue 4; benchmarks.md C1 at N = 95)."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime
from typing import Any

import yaml

from tandem.api.resources import InferencePool
from tandem.api.revision import revision_spec
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.observed import ObservedNode, Snapshot, parse_node
from tandem.core.plan import plan_pool
from tandem_lab.dev.kube import Kubectl
from tests.support.tandem_cluster import LOGS, REPO, GpuNodes, wait_until

PAIRS = 95


def pool_manifest(nodes: GpuNodes) -> dict[str, Any]:
    obj = copy.deepcopy(yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text()))
    spec = obj["spec"]
    spec["pairs"]["replicas"] = PAIRS
    spec["autoscaling"]["enabled"] = False
    spec["kvCache"].pop("mooncakeRef", None)
    spec["placement"]["nodeSelector"] = nodes.selector
    return obj


def count_ready(kube: Kubectl, ns: str, selector: str) -> int:
    items = kube.json("get", "pods", "-n", ns, "-l", selector, "-o", "json")["items"]
    return sum(
        1
        for p in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions") or [])
    )


def test_95_pairs_converge_and_compare_with_direct_pod_creation(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any
) -> None:
    direct_nodes = GpuNodes(crds)
    try:
        gpu_nodes.add(PAIRS)
        direct_nodes.add(PAIRS)

        # Arm B first (no operator running yet): the same pods the builders make, created directly.
        obj = pool_manifest(direct_nodes)
        obj["metadata"] = {"name": "direct", "namespace": ns, "uid": "00000000-0000-0000-0000-000000000000"}
        pool = InferencePool.model_validate(obj)
        nodes_raw = crds.json("get", "nodes", "-l", f"tandem.dev/test-nodes={direct_nodes.group}", "-o", "json")[
            "items"
        ]
        nodes: tuple[ObservedNode, ...] = tuple(parse_node(n) for n in nodes_raw)
        plan = plan_pool(Snapshot(pool=pool, pods=(), nodes=nodes, now=datetime.now(UTC)))
        rev = revision_spec(pool.spec)
        pods = []
        for create in plan.creates:
            pod = build_instance_pod(
                InstanceParams(
                    pool="direct",
                    namespace=ns,
                    pool_uid="x",
                    pair=create.pair,
                    role=create.role,
                    instance=create.instance,
                    revision=create.revision,
                    spec=rev,
                    node=create.node,
                )
            )
            pod["metadata"].pop("ownerReferences")
            pods.append(pod)
        assert len(pods) == 2 * PAIRS
        t0 = time.monotonic()
        crds.run(
            "create",
            "-n",
            ns,
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
            timeout_s=300,
        )
        wait_until(
            "direct pods Ready", lambda: count_ready(crds, ns, "tandem.dev/pool=direct") == 2 * PAIRS, timeout_s=600
        )
        direct_s = time.monotonic() - t0

        # Arm A: the operator.
        op = operator_factory([ns])
        t0 = time.monotonic()
        crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes)))
        status = wait_until(
            "95 pairs Ready",
            lambda: (
                (
                    s := crds.json("get", "inferencepools.tandem.dev", "speed", "-n", ns, "-o", "json").get("status")
                    or {}
                )
                and s.get("pairs", {}).get("ready") == PAIRS
                and s
            ),
            timeout_s=900,
            interval_s=1,
        )
        operator_s = time.monotonic() - t0
        assert status["pairs"]["summary"] == f"{PAIRS}/{PAIRS}"
        by_pair: dict[str, set[str]] = {}
        for pod in crds.json("get", "pods", "-n", ns, "-l", "tandem.dev/pool=speed", "-o", "json")["items"]:
            by_pair.setdefault(pod["metadata"]["labels"]["tandem.dev/pair"], set()).add(pod["spec"]["nodeName"])
        assert len(by_pair) == PAIRS and all(len(n) == 1 for n in by_pair.values())
        assert len({next(iter(n)) for n in by_pair.values()}) == PAIRS
        result = {
            "pairs": PAIRS,
            "pods": 2 * PAIRS,
            "gpus": 8 * PAIRS,
            "operator_apply_to_all_ready_s": round(operator_s, 2),
            "direct_create_to_all_ready_s": round(direct_s, 2),
            "ratio_operator_over_direct": round(operator_s / direct_s, 2),
            "reconcile_metrics": [
                line for line in op.metrics().splitlines() if line.startswith("tandem_reconcile_total")
            ],
        }
        LOGS.mkdir(exist_ok=True)
        (LOGS / "scale-95-pairs.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
    finally:
        direct_nodes.cleanup()
