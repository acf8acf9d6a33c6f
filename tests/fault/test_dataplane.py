"""Faults of the data plane: nodes, GPUs, quota (testing.md §4: DP-02, DP-05, DP-06)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.nodes import cordon
from tandem_lab.dev.prometheus import PrometheusServer
from tests.fault.faultlib import (
    POOLS,
    ObjectWatch,
    apply,
    condition,
    describe,
    engine_pods,
    floor_breaches,
    now,
    pod_uids,
    pool_manifest,
    routing,
    serving_series,
    status,
    step_sequence,
    step_violations,
    wait_audit_flushed,
    wait_ready,
    writes_by,
)
from tests.support.tandem_cluster import GpuNodes, wait_until


def test_dp02_node_drained_mid_canary_freezes_the_step_below_the_floor(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> None:
    """DP-02: at the analysis step (surge capacity: 3 stable + 1 canary serving, floor 3), two stable pairs'
    nodes are drained (`kubectl drain`: eviction) with no spare GPUs left. The evicted pairs are not counted
    and the step stays frozen while Ready < floor, although the canary's gates keep passing. (Before surge
    canaries the step ran with 2 stable + 1 canary and one drained node was enough to go below the floor.)"""
    gpu_nodes.add(4)
    args = [f"--prometheus-url={prometheus.url}", "--scrape-interval=1"]
    operator_factory([ns], extra_args=args)
    analysis = {"successStreak": 2, "noDataDeadline": "5m"}
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=3, analysis=analysis))
    stable = wait_ready(crds, ns, "speed", 3)["revisions"]["stable"]["name"]
    with (
        ObjectWatch(crds, POOLS, ns, name="speed") as pool,
        ObjectWatch(crds, "configmaps", ns, name="speed-routing") as table,
    ):
        apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=3, version="v2", analysis=analysis))
        wait_until(
            "analysis step with 3 stable + 1 canary serving (surge)",
            lambda: (
                (s := status(crds, ns, "speed"))["rollout"].get("stepIndex") == 1
                and s["pairs"]["ready"] == 4
                and s["pairs"]["draining"] == 0
                and len(engine_pods(crds, ns, "speed")) == 8
            ),
            timeout_s=90,
        )
        used = {p["spec"]["nodeName"]: p["metadata"]["labels"]["tandem.dev/revision"] for p in engine_pods(crds, ns)}
        victims = [n for n, rev in sorted(used.items()) if rev == stable][:2]
        for node in gpu_nodes.names:
            if node not in used:
                cordon(crds, node)  # no spare GPUs: the evicted pairs cannot come back at once
        evicted_at = time.time()
        for victim in victims:
            crds.run(
                "drain",
                victim,
                "--force",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--grace-period=1",
                "--timeout=60s",
            )
        below = wait_until(
            "the evicted pairs no longer counted",
            lambda: (s := status(crds, ns, "speed"))["pairs"]["ready"] == 2 and s,
            timeout_s=30,
        )
        assert condition(below, "Ready")["status"] == "False", below["conditions"]
        assert condition(below, "Ready")["reason"] == "BelowCapacityFloor", below["conditions"]
        assert sum(p["state"] == "serving" for p in routing(crds, ns, "speed")["pairs"]) == 2
        time.sleep(16)  # ≥ 4 analysis intervals with a streak of 2 to reach: it would pass if not frozen
        frozen = status(crds, ns, "speed")
        held_until = time.time()
        for node in gpu_nodes.names:
            cordon(crds, node, unschedulable=False)
        wait_until(
            "step resumes once the floor is back", lambda: status(crds, ns, "speed")["rollout"]["stepIndex"] >= 2, 90
        )
    seq = step_sequence(pool)
    assert not step_violations(seq), seq
    moved = [s for s in seq if evicted_at < s[0] < held_until]
    assert not moved, f"step changed while Ready {frozen['pairs']['ready']} < floor 3: {moved} (full: {seq})"
    assert frozen["pairs"]["ready"] == 2, frozen["pairs"]
    assert frozen["rollout"]["gates"] and all(g["verdict"] == "Success" for g in frozen["rollout"]["gates"]), frozen
    breaches = floor_breaches(serving_series(table, "speed"), 3)
    assert all(evicted_at <= t for t, _ in breaches), f"capacity dropped before the fault: {breaches}"


def test_dp05_gpu_quota_exhausted_backs_off_and_keeps_stable(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """DP-05: a ResourceQuota caps requests.amd.com/gpu at what the stable pair uses; scaling up gets
    403 exceeded quota → Degraded/QuotaExceeded, ≤ 2 pod creates per minute, stable pods untouched."""
    gpu_nodes.add(2)
    kubeconfig, user = operator_identity
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": ns},
        "spec": {"hard": {"requests.amd.com/gpu": "8"}},
    }
    crds.apply(quota)
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=1))
    wait_ready(crds, ns, "speed", 1)
    uids = pod_uids(crds, ns, "speed")
    since = now()
    crds.run("scale", f"{POOLS}/speed", "-n", ns, "--replicas=2")
    degraded = wait_until(
        "Degraded/QuotaExceeded",
        lambda: (s := status(crds, ns, "speed")) and condition(s, "Degraded").get("reason") == "QuotaExceeded" and s,
        timeout_s=30,
    )
    assert condition(degraded, "Degraded")["status"] == "True"
    assert "exceeded quota" in condition(degraded, "Degraded")["message"]
    wait_audit_flushed(audit_log, now())
    denied = [e for e in writes_by(audit_log, user, since, resource="pods", namespace=ns) if e.code == 403]
    first = min(e.timestamp for e in denied)
    window_end = first + timedelta(seconds=60)  # one minute from the first refusal
    time.sleep(max(0.0, (window_end - now()).total_seconds()))
    wait_audit_flushed(audit_log, now())
    creates = writes_by(audit_log, user, first, window_end, resource="pods", verb="create", namespace=ns)
    everything = describe(writes_by(audit_log, user, first, window_end, namespace=ns))
    assert len(creates) <= 2, "\n".join(everything)
    assert all(e.code == 403 for e in creates), describe(creates)
    assert pod_uids(crds, ns, "speed") == uids
    final = status(crds, ns, "speed")
    assert final["pairs"]["ready"] == 1 and condition(final, "Degraded")["reason"] == "QuotaExceeded", final


def test_dp06_half_pair_is_not_capacity_and_is_replaced_within_orphan_timeout(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any
) -> None:
    """DP-06: the decode half of the only pair is lost and its GPUs taken by another workload, so the
    replacement decode stays Pending next to a Ready prefill. The half pair is not capacity, and it is
    replaced as a whole within orphanTimeout (10 s)."""
    names = gpu_nodes.add(2)
    operator_factory([ns])
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=1, orphan="10s"))
    wait_ready(crds, ns, "speed", 1)
    decode = next(p for p in engine_pods(crds, ns, "speed") if p["metadata"]["labels"]["tandem.dev/role"] == "decode")
    node = decode["spec"]["nodeName"]
    thief = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-thief", "namespace": ns},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"amd.com/gpu": "4"}, "requests": {"amd.com/gpu": "4"}},
                }
            ],
        },
    }
    crds.apply(thief)
    crds.run("delete", "pod", decode["metadata"]["name"], "-n", ns, "--wait=false", "--grace-period=0", "--force")
    name = decode["metadata"]["name"]
    pending = wait_until(
        "replacement decode Pending next to the Ready prefill",
        lambda: (
            (p := crds.get("pod", name, namespace=ns))
            and p["metadata"]["uid"] != decode["metadata"]["uid"]
            and not p["spec"].get("nodeName")
            and p
        ),
        timeout_s=30,
    )
    half = wait_until(
        "half pair reported",
        lambda: (s := status(crds, ns, "speed")) and condition(s, "Degraded").get("status") == "True" and s,
        timeout_s=15,
    )
    assert half["pairs"]["ready"] == 0 and condition(half, "Ready")["status"] == "False", half
    assert [p["state"] for p in routing(crds, ns, "speed")["pairs"]] == ["warming"]
    created = datetime.fromisoformat(pending["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    gone = wait_until(
        "half pair deleted as a whole",
        lambda: (
            (
                (p := crds.get("pod", name, namespace=ns)) is None
                or p["metadata"]["uid"] != pending["metadata"]["uid"]
                or p["metadata"].get("deletionTimestamp")
            )
            and time.time()
        ),
        timeout_s=30,
    )
    assert gone - created <= 10 + 6, f"orphan replaced {gone - created:.1f}s after the decode went Pending"
    wait_ready(crds, ns, "speed", 1, timeout_s=45)
    spare = next(n for n in names if n != node)
    nodes = {p["spec"]["nodeName"] for p in engine_pods(crds, ns, "speed")}
    assert nodes == {spare}, f"replacement placed on {nodes}; the GPUs of {node} are taken"
