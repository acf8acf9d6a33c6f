"""Faults of the operator process itself (testing.md §4: OP-02, OP-03/GC-02, OP-04, OP-06, OP-07, UP-01).

The operator runs as a subprocess (``operator_factory``) under the least-privilege test identity, so
its writes are counted from the API server's audit log by user. Crash points come from
``tests/fault/inject/sitecustomize.py`` (a wrapper of the adapter), never from product code.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tests.fault.faultlib import (
    POOLS,
    ObjectWatch,
    TcpFault,
    apply,
    condition,
    data_patch,
    describe,
    engine_pods,
    injected_env,
    live_pair_slots,
    now,
    pod_uids,
    pool_manifest,
    pool_obj,
    routing,
    status,
    step_sequence,
    step_violations,
    wait_audit_flushed,
    wait_ready,
    writes_by,
)
from tests.support.tandem_cluster import GpuNodes, OperatorProcess, wait_until

FINALIZER = "tandem.dev/finalizer"


def test_op02_sigkill_between_pod_create_and_publish_adopts_on_restart(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """OP-02: the process dies right after its 3rd pod create (pair p1 has its prefill, not its decode,
    and nothing was published); the restarted operator adopts what exists and completes the rest."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    op: OperatorProcess = operator_factory([ns], kubeconfig=kubeconfig, env=injected_env(kill_after_pod_creates=3))
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=3))
    wait_until("operator SIGKILLed by the crash point", lambda: op.proc is not None and op.proc.poll() is not None)
    assert "TANDEM_FAULT: SIGKILL after pod create 3" in op.logs()
    survivors = pod_uids(crds, ns, "speed")
    assert len(survivors) == 3, survivors
    assert crds.get("configmap", "speed-routing", namespace=ns) is None  # nothing recorded before the kill

    restarted = now()
    op.env = {}  # the same operator without the crash point
    op.start()
    wait_ready(crds, ns, "speed", 3)
    items = engine_pods(crds, ns, "speed")
    names = [p["metadata"]["name"] for p in items]
    assert len(names) == len(set(names)) == 6, names
    slots = live_pair_slots(items)
    assert sorted(slots) == ["speed-p0", "speed-p1", "speed-p2"], slots  # pairs == desired, no extra index
    for pair, members in slots.items():
        roles = sorted(n.rsplit("-", 2)[1] for n in members)
        assert roles == ["decode", "prefill"], (pair, members)
        nodes = {p["spec"].get("nodeName") for p in items if p["metadata"]["labels"]["tandem.dev/pair"] == pair}
        assert len(nodes) == 1, f"{pair} split across {nodes}"
    current = pod_uids(crds, ns, "speed")
    assert all(current[n] == uid for n, uid in survivors.items()), "a pod created before the kill was replaced"

    time.sleep(2)
    wait_audit_flushed(audit_log, now())
    creates = writes_by(audit_log, user, restarted, resource="pods", verb="create", namespace=ns)
    deletes = writes_by(audit_log, user, restarted, resource="pods", verb="delete", namespace=ns)
    # Only the three missing pods are created (a 409 on a survivor would be adopted, but is not needed:
    # every pass lists pods first); nothing is deleted.
    assert sorted(e.name for e in creates if e.succeeded) == sorted(set(names) - set(survivors)), describe(creates)
    assert len(creates) <= 3 + 1, describe(creates)
    assert not deletes, describe(deletes)


def test_op03_gc02_pool_deleted_while_operator_down_completes_after_restart(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any
) -> None:
    """OP-03 / GC-02: deleted while the operator is down → Terminating with our finalizer; finished, with
    every child gone, once the operator is back."""
    gpu_nodes.add(2)
    op: OperatorProcess = operator_factory([ns])
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2))
    wait_ready(crds, ns, "speed", 2)
    obj = pool_obj(crds, ns, "speed")
    assert obj is not None and FINALIZER in obj["metadata"].get("finalizers", []), obj and obj["metadata"]
    op.kill()

    crds.run("delete", POOLS, "speed", "-n", ns, "--wait=false")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # held: no controller removes our finalizer
        held = pool_obj(crds, ns, "speed")
        assert held is not None and held["metadata"].get("deletionTimestamp"), "pool went away without the operator"
        assert held["metadata"]["finalizers"] == [FINALIZER]
        assert len(engine_pods(crds, ns, "speed")) == 4  # children wait for their owner
        time.sleep(1)

    op.start()
    wait_until(
        "pool and every child gone",
        lambda: (
            pool_obj(crds, ns, "speed") is None
            and not engine_pods(crds, ns, "speed")
            and not crds.json("get", "configmaps", "-n", ns, "-l", "tandem.dev/pool=speed")["items"]
            and crds.get("service", "speed-engines", namespace=ns) is None
        ),
        timeout_s=90,
    )
    assert op.proc is not None and op.proc.poll() is None, "operator exited"


def test_op04_operator_down_longer_than_the_window_restarts_the_streak(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> None:
    """OP-04: killed mid-analysis with the streak one or two short of passing, down for more than
    2 × interval: no advance while down, and after the restart the step needs a whole fresh streak."""
    gpu_nodes.add(3)
    args = [f"--prometheus-url={prometheus.url}", "--scrape-interval=1"]
    op: OperatorProcess = operator_factory([ns], extra_args=args)
    steps = [{"setCanaryPairs": 1}, {"analysis": {}}, {"pause": {}}]  # the step after analysis touches no pod
    analysis = {"successStreak": 4, "noDataDeadline": "5m"}
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, steps=steps, analysis=analysis))
    wait_ready(crds, ns, "speed", 2)
    with ObjectWatch(crds, POOLS, ns, name="speed") as watch:
        apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, version="v2", steps=steps, analysis=analysis))
        wait_until(
            "two Successes in a row at the analysis step",
            lambda: (
                (ro := status(crds, ns, "speed").get("rollout") or {}).get("stepIndex") == 1
                and (ro.get("analysis") or {}).get("successStreak", 0) >= 2
            ),
            timeout_s=90,
            interval_s=0.2,
        )
        op.kill()
        killed = time.time()
        before = status(crds, ns, "speed")["rollout"]  # what the killed operator last wrote
        uids = pod_uids(crds, ns, "speed")
        assert before["stepIndex"] == 1 and 2 <= before["analysis"]["successStreak"] < 4, before
        time.sleep(11)  # > 2 × interval (4 s) since the last evaluation
        down = status(crds, ns, "speed")["rollout"]
        assert down["stepIndex"] == 1 and down["analysis"] == before["analysis"], "status changed while down"

        restarted = time.time()
        op.start()
        wait_until("next step after the analysis", lambda: status(crds, ns, "speed")["rollout"]["stepIndex"] == 2, 90)
        advanced = time.time()

    after = [
        s.obj["status"]["rollout"]
        for s in watch.objects()
        if s.t > restarted and ((s.obj.get("status") or {}).get("rollout") or {}).get("stepIndex") == 1
    ]
    evaluations: dict[str, int] = {}
    for ro in after:
        progress = ro.get("analysis") or {}
        if progress.get("lastEvaluatedAt") and progress["lastEvaluatedAt"] != before["analysis"]["lastEvaluatedAt"]:
            evaluations[progress["lastEvaluatedAt"]] = progress.get("successStreak", 0)
    streaks = [evaluations[k] for k in sorted(evaluations)]
    first_gates = next((ro.get("gates") or [] for ro in after if ro.get("gates")), [])
    stamps = [datetime.fromisoformat(g["evaluatedAt"].replace("Z", "+00:00")).timestamp() for g in first_gates]
    assert stamps and min(stamps) >= restarted - 1, f"a verdict older than the restart: {first_gates}"
    # A fresh window: the first evaluation after the restart starts at 1, the older Successes count for nothing,
    # so the step needs 4 new evaluations (≈ 3 intervals) instead of the 1–2 the old streak lacked.
    assert streaks and streaks[0] <= 1, f"streak carried over the outage: before={before['analysis']}, after={streaks}"
    assert len(streaks) >= 3, streaks  # the passing (4th) evaluation is written together with the step advance
    assert advanced - restarted >= 2 * 4, (advanced - restarted, streaks)
    seq = step_sequence(watch)
    assert not step_violations(seq), seq
    assert not [x for x in seq if killed < x[0] < restarted], "a step changed while the operator was down"
    assert pod_uids(crds, ns, "speed") == uids, "pods changed across the restart"


def test_op06_poisoned_data_in_one_pool_is_contained_while_others_converge(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """OP-06 with realistic poisons written by a foreign writer: ``poison``'s routing table marks its pair
    draining since ``not-a-time`` (once an exception on every pass; now not a drain record at all: the
    table is republished and the pair keeps serving), ``stale``'s revision snapshot is ``{`` (skipped
    with a warning). ``healthy`` must keep converging, each poisoned pool ≤ 6 writes/min, no pod of a
    poisoned pool replaced, the process never restarted."""
    gpu_nodes.add(4)
    kubeconfig, user = operator_identity
    op: OperatorProcess = operator_factory([ns], kubeconfig=kubeconfig)
    for name in ("poison", "stale", "healthy"):
        apply(crds, ns, pool_manifest(name, gpu_nodes, replicas=1))
    for name in ("poison", "stale", "healthy"):
        wait_ready(crds, ns, name, 1)
    uids = {name: pod_uids(crds, ns, name) for name in ("poison", "stale")}

    baseline = routing(crds, ns, "poison")
    table = routing(crds, ns, "poison")
    table["pairs"][0].update(state="draining", drainingSince="not-a-time")
    poisoned = now()
    crds.run("patch", "configmap", "poison-routing", "-n", ns, "--type=merge", "-p", data_patch("routing.json", table))
    snapshot = next(
        c["metadata"]["name"]
        for c in crds.json("get", "configmaps", "-n", ns, "-l", "tandem.dev/pool=stale,tandem.dev/component=revision")[
            "items"
        ]
    )
    crds.run("patch", "configmap", snapshot, "-n", ns, "--type=merge", "-p", '{"data":{"revision.json":"{"}}')
    wait_until("the poisoned table republished", lambda: routing(crds, ns, "poison") == baseline, timeout_s=30)

    crds.run("scale", f"{POOLS}/healthy", "-n", ns, "--replicas=2")
    started = time.monotonic()
    wait_ready(crds, ns, "healthy", 2, timeout_s=60)
    converge_s = time.monotonic() - started
    time.sleep(max(0.0, 40 - (time.monotonic() - started)))  # a 40 s window of the poisoned pools' writes
    window = now()
    wait_audit_flushed(audit_log, window)
    elapsed_min = (window - poisoned).total_seconds() / 60
    for name in ("poison", "stale"):
        mine = [e for e in writes_by(audit_log, user, poisoned, window, namespace=ns) if e.name.startswith(name)]
        assert len(mine) <= max(1, 6 * elapsed_min), (name, describe(mine))
        assert pod_uids(crds, ns, name) == uids[name], name
    assert routing(crds, ns, "poison") == baseline
    assert op.proc is not None and op.proc.poll() is None and op.starts == 1, "the operator process restarted"
    logs = op.logs()
    assert f"reconcile of {ns}/poison failed" not in logs and "Invalid isoformat string" not in logs
    assert "revision snapshot" in logs and f"of {ns}/stale is not valid" in logs
    assert converge_s < 45, converge_s


def test_op07_prometheus_blackhole_bounds_passes_and_holds_the_canary(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any, tcp_fault: TcpFault
) -> None:
    """OP-07: Prometheus accepts TCP and never answers. Analysis passes stay bounded by the query timeout
    (Error / MetricsUnavailable), the canary holds its step, and another pool still scales. Five nodes: the
    canary surges (2 stable + 1 canary), the other pool grows 1 → 2."""
    gpu_nodes.add(5)
    tcp_fault.blackhole()
    args = [f"--prometheus-url={tcp_fault.url}", "--scrape-interval=1"]
    op: OperatorProcess = operator_factory([ns], extra_args=args)
    analysis = {"noDataDeadline": "5m"}
    apply(crds, ns, pool_manifest("canary", gpu_nodes, replicas=2, analysis=analysis))
    apply(crds, ns, pool_manifest("other", gpu_nodes, replicas=1))
    wait_ready(crds, ns, "canary", 2)
    wait_ready(crds, ns, "other", 1)
    with ObjectWatch(crds, POOLS, ns, name="canary") as watch:
        apply(crds, ns, pool_manifest("canary", gpu_nodes, replicas=2, version="v2", analysis=analysis))
        held = wait_until(
            "every gate Error / MetricsUnavailable",
            lambda: (
                (ro := status(crds, ns, "canary").get("rollout") or {}).get("gates")
                and all(g["verdict"] == "Error" and g["reason"] == "MetricsUnavailable" for g in ro["gates"])
                and ro
            ),
            timeout_s=60,
        )
        assert held["stepIndex"] == 1 and held["phase"] == "Progressing", held
        crds.run("scale", f"{POOLS}/other", "-n", ns, "--replicas=2")
        wait_ready(crds, ns, "other", 2, timeout_s=60)
        time.sleep(8)  # two more intervals of blackholed analysis
    final = status(crds, ns, "canary")["rollout"]
    assert final["stepIndex"] == 1 and final["phase"] == "Progressing", final  # held, not promoted, not paused
    assert final["analysis"]["successStreak"] == 0 and final["analysis"].get("noDataSince"), final["analysis"]
    seq = step_sequence(watch)
    assert not step_violations(seq) and max(s[2] for s in seq) == 1, seq
    assert tcp_fault.accepted > 0, "the operator never connected to the blackhole"
    # Every pass (both pools) is bounded: query timeout 2 s + 5 s; the histogram's next bucket is 10 s.
    buckets = _histogram(op.metrics(), "tandem_reconcile_duration_seconds")
    assert buckets["10.0"] == buckets["+Inf"] > 0, buckets
    # Analysis keeps evaluating: one evaluation per interval, counted from the end of a pass that waited
    # for its timeout (4 s + 2 s + 1 s slack here), never stalled by the hung connections.
    evaluated = sorted({(_rollout(s.obj).get("analysis") or {}).get("lastEvaluatedAt") or "" for s in watch.objects()})
    times = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in evaluated if t]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert len(times) >= 2 and max(gaps) <= 4 + 2 + 1 + 3, (evaluated, gaps)


def _rollout(obj: dict[str, Any]) -> dict[str, Any]:
    return dict((obj.get("status") or {}).get("rollout") or {})


def _versions(kube: Kubectl, ns: str, kind: str) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in kube.json("get", kind, "-n", ns)["items"]}


def _histogram(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_up01_lite_restart_at_steady_state_writes_nothing(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """UP-01 (restart half): stop the operator, upgrade nothing, start it → 0 pod recreations, 0 writes."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    op: OperatorProcess = operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2))
    apply(crds, ns, pool_manifest("small", gpu_nodes, replicas=1))
    wait_ready(crds, ns, "speed", 2)
    wait_ready(crds, ns, "small", 1)
    time.sleep(3)  # the last status write of the converging passes lands
    uids = pod_uids(crds, ns)
    versions = {kind: _versions(crds, ns, kind) for kind in (POOLS, "configmaps", "services")}
    op.stop()
    since = now()
    op.start()
    time.sleep(15)  # startup, the initial list of every watch, one pass per pool
    until = now()
    wait_audit_flushed(audit_log, until)
    mine = writes_by(audit_log, user, since, until)
    assert not mine, describe(mine)
    assert pod_uids(crds, ns) == uids
    for kind, before in versions.items():
        assert _versions(crds, ns, kind) == before, kind
    assert all(condition(status(crds, ns, p), "Ready").get("status") == "True" for p in ("speed", "small"))
