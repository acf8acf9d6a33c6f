"""Outages of the control plane and of Prometheus (testing.md §4: API-01, MP-01).

API-01 stops the whole control plane with ``kwokctl stop cluster`` / ``start cluster`` (testing.md §2.4,
the tool for control-plane outages). Stopping only the kube-apiserver process (SIGSTOP, 30 s) is not
usable on kwokctl's binary runtime: kube-controller-manager and kube-scheduler lose their leader lease
after 10 s, exit ("leaderelection lost"), and nothing restarts them, which breaks every later test.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tests.fault.faultlib import (
    POOLS,
    ObjectWatch,
    TcpFault,
    apply,
    describe,
    events,
    now,
    pod_uids,
    pool_manifest,
    revision_of,
    status,
    step_sequence,
    step_violations,
    wait_audit_flushed,
    wait_ready,
    writes_by,
)
from tests.support.tandem_cluster import GpuNodes, OperatorProcess, wait_until

OUTAGE_S = 30


def _kwokctl(dev_cluster: Any, action: str) -> None:
    state = dev_cluster.state
    if not state.kwok_workdir:
        pytest.fail(f"API-01 needs a cluster made by `tandem dev cluster up` (kwokctl state); got {state.name!r}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
    env["KWOK_WORKDIR"] = state.kwok_workdir
    proc = subprocess.run(
        [state.kwokctl, action, "cluster", f"--name={state.name}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"kwokctl {action} cluster failed: {proc.stderr[-2000:]}"


def test_api01_control_plane_down_30s_mid_canary_keeps_progress(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
    dev_cluster: Any,
) -> None:
    """API-01: the control plane is down for 30 s while the canary is in analysis. The operator keeps
    running, resumes the same rollout ≤ 60 s after, repeats nothing, and no pod is replaced."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    args = [f"--prometheus-url={prometheus.url}", "--scrape-interval=1"]
    op: OperatorProcess = operator_factory([ns], kubeconfig=kubeconfig, extra_args=args)
    steps = [{"setCanaryPairs": 1}, {"analysis": {}}, {"pause": {}}]
    analysis = {"successStreak": 3, "noDataDeadline": "5m"}
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, steps=steps, analysis=analysis))
    wait_ready(crds, ns, "speed", 2)
    with ObjectWatch(crds, POOLS, ns, name="speed") as pool:
        apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, version="v2", steps=steps, analysis=analysis))
        before = wait_until(
            "analysis under way",
            lambda: (
                (s := status(crds, ns, "speed"))["rollout"].get("stepIndex") == 1
                and s["rollout"].get("analysis", {}).get("successStreak", 0) >= 1
                and s["pairs"]["draining"] == 0
                and s
            ),
            timeout_s=90,
        )
        uids = pod_uids(crds, ns, "speed")
        stopped = now()
        _kwokctl(dev_cluster, "stop")
        time.sleep(OUTAGE_S)
        _kwokctl(dev_cluster, "start")
        back = time.monotonic()
        wait_until("API server ready", lambda: crds.run("get", "--raw=/readyz", check=False).returncode == 0, 60)
        wait_until(
            "the rollout resumes: analysis passes, next step",
            lambda: status(crds, ns, "speed")["rollout"]["stepIndex"] == 2,
            timeout_s=60,
            interval_s=1,
        )
        resumed_s = time.monotonic() - back
        time.sleep(2)
    after = status(crds, ns, "speed")
    assert after["rollout"]["revision"] == before["rollout"]["revision"], "the rollout restarted"
    assert after["rollout"]["phase"] == "Progressing", after["rollout"]
    assert resumed_s <= 60, resumed_s
    seq = step_sequence(pool)
    assert not step_violations(seq), seq
    assert [s[2] for s in seq if s[1] == before["rollout"]["revision"]] == [0, 1, 2], seq
    assert pod_uids(crds, ns, "speed") == uids, "pods replaced across the outage"
    assert op.proc is not None and op.proc.poll() is None and op.starts == 1, "the operator process died"
    reasons = Counter((e.get("reason", ""), e.get("message", "")) for e in events(crds, ns, "speed"))
    repeated = {
        k: n for k, n in reasons.items() if n > 1 and k[0] in ("StepCompleted", "RolloutStarted", "AnalysisPassed")
    }
    assert not repeated and not any(r == "RolloutRestarted" for r, _ in reasons), reasons
    wait_audit_flushed(audit_log, now())
    pods_written = writes_by(audit_log, user, stopped, resource="pods", namespace=ns)
    assert not pods_written, describe(pods_written)


def test_mp01_prometheus_refused_past_no_data_deadline_rolls_back(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
    tcp_fault: TcpFault,
) -> None:
    """MP-01: Prometheus answers, then refuses connections past noDataDeadline (16 s). Hold with
    Error/MetricsUnavailable within 2 intervals, onNoData (Rollback) at the deadline ± 1 interval, and
    nothing promoted."""
    gpu_nodes.add(3)
    tcp_fault.forward(prometheus.url)
    args = [f"--prometheus-url={tcp_fault.url}", "--scrape-interval=1"]
    operator_factory([ns], extra_args=args)
    analysis = {"successStreak": 20, "noDataDeadline": "16s", "onNoData": "Rollback"}
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, analysis=analysis))
    stable = wait_ready(crds, ns, "speed", 2)["revisions"]["stable"]["name"]
    manifest = pool_manifest("speed", gpu_nodes, replicas=2, version="v2", analysis=analysis)
    canary = revision_of(manifest)
    with ObjectWatch(crds, POOLS, ns, name="speed") as pool:
        apply(crds, ns, manifest)
        wait_until(
            "gates passing through the proxy",
            lambda: status(crds, ns, "speed")["rollout"].get("analysis", {}).get("successStreak", 0) >= 1,
            timeout_s=90,
        )
        refused = time.time()
        tcp_fault.refuse()
        wait_until(
            "rolled back",
            lambda: (s := status(crds, ns, "speed"))["rollout"]["phase"] == "RolledBack" and s,
            timeout_s=60,
        )
    versions = [(s.t, s.obj.get("status") or {}) for s in pool.objects()]
    unavailable = next(
        t
        for t, st in versions
        if t > refused
        and st["rollout"].get("gates")
        and all(g["verdict"] == "Error" and g["reason"] == "MetricsUnavailable" for g in st["rollout"]["gates"])
    )
    assert unavailable - refused <= 2 * 4 + 2, f"MetricsUnavailable {unavailable - refused:.1f}s after the outage"
    held = [st["rollout"] for t, st in versions if refused < t and st["rollout"]["phase"] == "Progressing"]
    assert held and all(r["stepIndex"] == 1 for r in held), held  # hold: same step while there is no data
    no_data_since = max(
        datetime.fromisoformat(r["analysis"]["noDataSince"].replace("Z", "+00:00")).timestamp()
        for r in held
        if r.get("analysis", {}).get("noDataSince")
    )
    applied = next(t for t, st in versions if st["rollout"]["phase"] in ("RollingBack", "RolledBack"))
    assert 16 - 1 <= applied - no_data_since <= 16 + 4 + 2, f"onNoData applied {applied - no_data_since:.1f}s after"
    seq = step_sequence(pool)
    assert not step_violations(seq) and max(s[2] for s in seq if s[1] == canary) == 1, seq
    final = wait_ready(crds, ns, "speed", 2, timeout_s=30)
    assert final["revisions"]["stable"]["name"] == stable and final["rollout"]["failedRevision"] == canary
    reasons = [e.get("reason") for e in events(crds, ns, "speed")]
    assert "AnalysisNoData" in reasons and "Promoted" not in reasons, reasons
