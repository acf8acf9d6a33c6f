"""Concurrent writers (testing.md §4: CC-02, CC-03, CC-04).

Foreign writers are the test's admin kubeconfig; the operator runs under the least-privilege test identity,
so the audit log separates its writes from everybody else's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.kube import Kubectl
from tests.fault.faultlib import (
    POOLS,
    ObjectWatch,
    apply,
    data_patch,
    describe,
    engine_pods,
    events,
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
from tests.support.tandem_cluster import GpuNodes, OperatorProcess, wait_until

# --- CC-02 -----------------------------------------------------------------------------------------


def _restored_quietly(
    crds: Kubectl, ns: str, audit_log: Path, user: str, since: Any, baseline: dict[str, Any], uids: dict[str, str]
) -> list[str]:
    """Wait for the published table to equal ``baseline`` again; return the operator's writes since the edit."""
    wait_until("routing table restored", lambda: routing(crds, ns, "speed") == baseline, timeout_s=20)
    time.sleep(3)  # a restore must not set off further passes that write
    wait_audit_flushed(audit_log, now())
    mine = writes_by(audit_log, user, since, namespace=ns)
    assert pod_uids(crds, ns, "speed") == uids, "pods changed after a routing-table edit"
    return describe(mine)


@pytest.fixture
def steady(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any, operator_identity: tuple[Path, str]
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``speed`` at 2/2 Ready (maxUnavailable 0) under the test identity: (user, routing table, pod uids)."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, drain="3s"))
    wait_ready(crds, ns, "speed", 2)
    time.sleep(2)
    return user, routing(crds, ns, "speed"), pod_uids(crds, ns, "speed")


def test_cc02_foreign_edit_of_the_routing_table_is_restored(
    crds: Kubectl, ns: str, audit_log: Path, steady: tuple[str, dict[str, Any], dict[str, str]]
) -> None:
    """CC-02: a derived field changed, then the whole table replaced by garbage → each restored by one
    server-side apply (≤ 2 writes per conflict), pods untouched."""
    user, baseline, uids = steady
    edited = {**baseline, "admission": {**baseline["admission"], "maxInFlight": 1}}
    since = now()
    crds.run("patch", "configmap", "speed-routing", "-n", ns, "--type=merge", "-p", data_patch("routing.json", edited))
    writes = _restored_quietly(crds, ns, audit_log, user, since, baseline, uids)
    assert 1 <= len(writes) <= 2 and all("patch configmaps speed-routing" in w for w in writes), writes

    since = now()
    crds.run("patch", "configmap", "speed-routing", "-n", ns, "--type=merge", "-p", data_patch("routing.json", "{"))
    writes = _restored_quietly(crds, ns, audit_log, user, since, baseline, uids)
    assert 1 <= len(writes) <= 2 and all("patch configmaps speed-routing" in w for w in writes), writes


@pytest.mark.parametrize(
    "since_text",
    [pytest.param("now", id="pair forged draining"), pytest.param("not-a-time", id="drainingSince not a time")],
)
def test_cc02_forged_drain_state_in_the_routing_table_is_restored(
    crds: Kubectl, ns: str, audit_log: Path, steady: tuple[str, dict[str, Any], dict[str, str]], since_text: str
) -> None:
    """CC-02, expected behaviour: a foreign writer's ``state``/``drainingSince`` on a serving pair are Tandem's
    fields like any other, restored by one apply; the pair keeps serving (INV-1, INV-2)."""
    user, baseline, uids = steady
    edited = {**baseline, "pairs": [dict(p) for p in baseline["pairs"]]}
    stamp = now().isoformat().replace("+00:00", "Z") if since_text == "now" else since_text
    edited["pairs"][0].update(state="draining", drainingSince=stamp)
    with ObjectWatch(crds, "configmaps", ns, name="speed-routing") as table:
        since = now()
        patch = data_patch("routing.json", edited)
        crds.run("patch", "configmap", "speed-routing", "-n", ns, "--type=merge", "-p", patch)
        time.sleep(8)  # > drainTimeout (3 s) + a pass
    mine = writes_by(audit_log, user, since, namespace=ns)
    assert routing(crds, ns, "speed") == baseline, describe(mine)
    assert pod_uids(crds, ns, "speed") == uids, describe(mine)
    # The restore (≤ 2 patches of the table) plus, at most once, the report of the forgery: the
    # UntrustedInput condition in status and its Warning Event (design note 010).
    table_writes = [w for w in mine if w.resource == "configmaps"]
    report = [w for w in mine if w.resource != "configmaps"]
    assert 1 <= len(table_writes) <= 2, describe(mine)
    reporting = {"events", "inferencepools.tandem.dev/status"}
    assert len(report) <= 2 and {w.resource for w in report} <= reporting, describe(mine)
    # the forged version itself is the foreign writer's; the operator must not publish fewer serving pairs
    published = [(t, n) for t, n in serving_series(table, "speed")[1:] if t > since.timestamp()]
    assert not floor_breaches(published[1:], 2), published


def test_cc02_foreign_edit_of_a_pod_label_is_restored(
    crds: Kubectl, ns: str, audit_log: Path, steady: tuple[str, dict[str, Any], dict[str, str]]
) -> None:
    """CC-02, expected behaviour: the label is put back (server-side apply, force), ≤ 2 writes, pods kept."""
    user, _, uids = steady
    victim = sorted(uids)[0]
    revision = engine_pods(crds, ns, "speed")[0]["metadata"]["labels"]["tandem.dev/revision"]
    since = now()
    crds.run("label", "pod", victim, "-n", ns, "tandem.dev/revision=foreign", "--overwrite")
    time.sleep(8)
    wait_audit_flushed(audit_log, now())
    mine = writes_by(audit_log, user, since, namespace=ns)
    pod = crds.get("pod", victim, namespace=ns)
    assert pod is not None and pod["metadata"]["uid"] == uids[victim], describe(mine)
    assert pod["metadata"]["labels"]["tandem.dev/revision"] == revision, describe(mine)
    assert pod_uids(crds, ns, "speed") == uids, describe(mine)
    assert len(mine) <= 2, describe(mine)


# --- CC-03 -----------------------------------------------------------------------------------------


TAKEOVER_BOUND_S = 15 + 2 + 5
"""Lease duration + one retry period (tandem.core.leader) + slack for a loaded 2-core CI machine."""


def _lease_holder(crds: Kubectl, ns: str) -> str:
    lease = crds.get("lease", "tandem-operator", namespace=ns)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _health(op: OperatorProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=5) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def test_cc03_two_operators_one_acts_and_the_standby_takes_over_mid_rollout(
    crds: Kubectl,
    ns: str,
    dev_cluster: Any,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
    request: pytest.FixtureRequest,
) -> None:
    """CC-03: two operators on one namespace, each under its own ServiceAccount. Leader election lets one
    act: the standby makes no write while the leader lives. The leader is SIGKILLed in the middle of a
    rollout; the standby takes the Lease within TAKEOVER_BOUND_S and finishes the rollout from the persisted
    step: stepIndex never skips (INV-3), each step completes once, live pairs never exceed replicas +
    maxSurge, no Ready capacity dropped (INV-1)."""
    from tests.support import rbac  # noqa: PLC0415

    gpu_nodes.add(4)
    kubeconfig, first_user = operator_identity
    second_kubeconfig, second_user = rbac.operator_identity(dev_cluster.kube, dev_cluster.state, ns, "tandem-standby")
    request.addfinalizer(lambda: rbac.drop_identity(dev_cluster.kube, ns, "tandem-standby"))
    first: OperatorProcess = operator_factory([ns], kubeconfig=kubeconfig)
    wait_until("first operator leads", lambda: _lease_holder(crds, ns) == first.name, 30)
    second: OperatorProcess = operator_factory([ns], kubeconfig=second_kubeconfig)
    assert _health(second)["role"] == "standby" and _health(first)["role"] == "leader"
    steps = [{"setCanaryPairs": 1}, {"pause": {"duration": "25s"}}, {"setWeight": 67}, {"pause": {"duration": "2s"}}]
    steps.append({"setWeight": 100})
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=3, steps=steps))
    wait_ready(crds, ns, "speed", 3)
    since = now()
    with (
        ObjectWatch(crds, POOLS, ns, name="speed") as pool,
        ObjectWatch(crds, "pods", ns, selector="tandem.dev/pool=speed") as pods,
        ObjectWatch(crds, "configmaps", ns, name="speed-routing") as table,
    ):
        apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=3, version="v2", steps=steps))
        wait_until(
            "v2 in its pause step", lambda: status(crds, ns, "speed").get("rollout", {}).get("stepIndex") == 1, 90
        )
        wait_audit_flushed(audit_log, now())
        standby_writes = writes_by(audit_log, second_user, since, namespace=ns)
        assert not standby_writes, describe(standby_writes)
        first.kill()
        killed = time.monotonic()
        wait_until("standby takes the Lease", lambda: _lease_holder(crds, ns) == second.name, TAKEOVER_BOUND_S + 10)
        takeover = time.monotonic() - killed
        wait_until("v2 promoted", lambda: status(crds, ns, "speed").get("rollout", {}).get("phase") == "Promoted", 150)
        wait_ready(crds, ns, "speed", 3, timeout_s=60)
    print(f"CC-03 takeover after SIGKILL of the leader: {takeover:.1f} s (bound {TAKEOVER_BOUND_S} s)")
    assert takeover <= TAKEOVER_BOUND_S, f"takeover took {takeover:.1f} s"
    assert _health(second)["role"] == "leader"
    seq = step_sequence(pool)
    assert not step_violations(seq), seq
    v2 = [s for s in seq if s[1] and s[1] != seq[0][1]]
    assert [s[2] for s in v2 if s[3] == "Progressing"] == [0, 1, 2, 3, 4], seq
    completed = Counter(e.get("message", "") for e in events(crds, ns, "speed") if e.get("reason") == "StepCompleted")
    assert all(n == 1 for n in completed.values()) and len(completed) >= 5, completed
    worst = _max_live_pairs(pods, table)
    assert worst <= 3 + 1, f"{worst} live pairs > replicas + maxSurge"
    assert not floor_breaches(serving_series(table, "speed"), 3), serving_series(table, "speed")
    names = [p["metadata"]["name"] for p in engine_pods(crds, ns, "speed")]
    assert len(names) == len(set(names)) == 6, names
    wait_audit_flushed(audit_log, now())
    assert writes_by(audit_log, second_user, since, namespace=ns), "the standby never acted after the takeover"
    assert writes_by(audit_log, first_user, since, namespace=ns), "the first operator never acted"


def _max_live_pairs(pods: ObjectWatch, table: ObjectWatch) -> int:
    """Most pairs at any moment that had a pod not being deleted and were not marked draining."""
    timeline = sorted(
        [(s.t, "pod", s) for s in pods.records] + [(s.t, "cm", s) for s in table.records], key=lambda x: x[0]
    )
    live_pods: dict[str, str] = {}
    draining: set[str] = set()
    worst = 0
    for _, kind, seen in timeline:
        meta = seen.obj.get("metadata") or {}
        if kind == "pod":
            if seen.type == "DELETED" or meta.get("deletionTimestamp"):
                live_pods.pop(meta.get("name", ""), None)
            else:
                live_pods[meta.get("name", "")] = (meta.get("labels") or {}).get("tandem.dev/pair", "")
        elif seen.type != "DELETED":
            data = json.loads((seen.obj.get("data") or {}).get("routing.json") or "{}")
            draining = {p["id"] for p in data.get("pairs") or [] if p.get("state") == "draining"}
        worst = max(worst, len(set(live_pods.values()) - draining))
    return worst


# --- CC-04 -----------------------------------------------------------------------------------------


def test_cc04_ten_spec_updates_in_five_seconds_only_the_last_is_acted_on(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """CC-04: replicas 2 → 3 → 4 → 5 → 6 → 5 → 4 → 5 → 6 → 5 → 4 within 5 s. Only the final spec (4) is
    acted on: pairs converge to 4 and the operator's pod creates + deletes ≤ final diff (4 pods) + 2."""
    gpu_nodes.add(5)
    kubeconfig, user = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2))
    wait_ready(crds, ns, "speed", 2)
    before = pod_uids(crds, ns, "speed")
    since = now()
    started = time.monotonic()
    for i, replicas in enumerate((3, 4, 5, 6, 5, 4, 5, 6, 5, 4)):
        crds.run(
            "patch", POOLS, "speed", "-n", ns, "--type=merge", "-p", f'{{"spec":{{"pairs":{{"replicas":{replicas}}}}}}}'
        )
        time.sleep(max(0.0, started + 0.5 * (i + 1) - time.monotonic()))
    assert time.monotonic() - started <= 6
    wait_ready(crds, ns, "speed", 4, timeout_s=90)
    time.sleep(2)
    wait_audit_flushed(audit_log, now())
    pod_writes = [
        e for e in writes_by(audit_log, user, since, namespace=ns, resource="pods") if e.verb in ("create", "delete")
    ]
    after = pod_uids(crds, ns, "speed")
    assert len(after) == 8 and all(after.get(n) == uid for n, uid in before.items()), after
    assert len(pod_writes) <= 4 + 2, "\n".join(describe(pod_writes))
