"""Tampering paths of issue 19 class 6 (design note 010), with the real operator on the local cluster.

Each test forges one object a namespace user can write and checks the three promises of the design:
the operator deletes no pair because of it (counted from the API server's audit log by the operator's
own least-privilege identity), runs no image it would not have built (every version of every engine pod
is watched), and says what it refused (the ``UntrustedInput`` condition and a Warning Event with the
same reason). Paths:

- an edited revision snapshot ConfigMap, then a stable pod deleted so that it must be recreated;
- a look-alike pod carrying a pool's labels (another revision) but no owner reference;
- a forged ``drainingSince`` long ago on a pair that is not Ready, and one far in the future on an
  excess pair (it must still be removed after its drain, not hold its GPUs for ever);
- ``analysis.prometheusAddress`` pointing at another server over http: the operator's Prometheus token
  must never reach it.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.kube import Kubectl
from tests.fault.faultlib import (
    IMAGE,
    POOLS,
    ObjectWatch,
    apply,
    condition,
    data_patch,
    describe,
    engine_pods,
    events,
    now,
    pod_uids,
    pool_manifest,
    routing,
    status,
    wait_audit_flushed,
    wait_ready,
    writes_by,
)
from tests.support.tandem_cluster import GpuNodes, wait_until

FOREIGN_IMAGE = "registry.example.com/evil/engine:1@sha256:" + "ee" * 32
TOKEN = "tandem-test-token-0123456789abcdef"
OWN_PROMETHEUS = "https://prometheus.monitoring.svc:9090"
"""The operator's own Prometheus: never queried here (the pool names another address)."""
PAUSED_CANARY: list[dict[str, Any]] = [{"setCanaryPairs": 1}, {"pause": {}}]


def _images(watch: ObjectWatch) -> set[str]:
    """Every image any engine pod version carried while the watch ran."""
    return {
        c["image"]
        for seen in watch.objects()
        for c in (seen.obj.get("spec") or {}).get("containers") or []
        if (seen.obj.get("metadata", {}).get("labels") or {}).get("tandem.dev/component") == "engine"
    }


def _found(crds: Kubectl, ns: str, pool: str, reason: str) -> dict[str, Any] | None:
    """``UntrustedInput=True`` naming ``reason`` in status, once a Warning Event with that reason exists too."""
    cond = condition(status(crds, ns, pool), "UntrustedInput")
    if cond.get("status") != "True" or reason not in (cond.get("reason", "") + cond.get("message", "")):
        return None
    warned = [e for e in events(crds, ns, pool) if e.get("type") == "Warning" and e.get("reason") == reason]
    return cond if warned else None


def _reported(crds: Kubectl, ns: str, pool: str, reason: str) -> dict[str, Any]:
    """Wait for ``UntrustedInput=True`` naming ``reason`` in status and a Warning Event with that reason."""
    return wait_until(
        f"{pool}: UntrustedInput {reason} and its Event", lambda: _found(crds, ns, pool, reason), timeout_s=30
    )


def _forge_drain_record(
    crds: Kubectl, ns: str, pool: str, table: dict[str, Any], pair: str, reason: str, attempts: int = 3
) -> dict[str, Any]:
    """Publish ``table`` (with a forged drain record for ``pair``) and wait until the operator reports ``reason``.

    A reconcile that was already writing the routing table when the patch landed can replace the forgery before any
    pass reads it: nothing is deleted and nothing is reported, the forgery is simply gone. Then it is forged again,
    up to ``attempts`` times; what the test asserts is what the operator does once it has *read* a forged record."""
    for _ in range(attempts):
        crds.run(
            "patch", "configmap", f"{pool}-routing", "-n", ns, "--type=merge", "-p", data_patch("routing.json", table)
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (cond := _found(crds, ns, pool, reason)) is not None:
                return cond
            published = {p["id"]: p for p in routing(crds, ns, pool)["pairs"]}
            if not published.get(pair, {}).get("drainingSince"):
                time.sleep(2.0)  # overwritten: give a pass that did read it the time to report, then forge again
                if (cond := _found(crds, ns, pool, reason)) is not None:
                    return cond
                break
            time.sleep(0.5)
    pytest.fail(f"{pool}: UntrustedInput {reason} and its Event not reported after {attempts} forged tables")


def _operator_deletes(audit_log: Path, user: str, ns: str, since: Any) -> list[str]:
    wait_audit_flushed(audit_log, now())
    return describe(writes_by(audit_log, user, since, verb="delete", namespace=ns, resource="pods"))


def _stamp(delta: timedelta) -> str:
    return (now() + delta).isoformat().replace("+00:00", "Z")


# --- snapshot ---------------------------------------------------------------------------------------


def test_edited_revision_snapshot_is_never_used_to_recreate_stable_pods(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """Mid-rollout (canary paused), the stable revision's snapshot gets a foreign image and a stable pod
    is deleted. The operator holds the revision: the pod is not recreated from the edited snapshot, no
    pod ever runs the foreign image, no pair is deleted; SnapshotTampered in status and an Event."""
    gpu_nodes.add(4)
    kubeconfig, user = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, steps=PAUSED_CANARY))
    wait_ready(crds, ns, "speed", 2)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, version="v2", steps=PAUSED_CANARY))
    st = wait_until(
        "canary paused with the stable digest recorded",
        lambda: (
            (s := status(crds, ns, "speed")).get("rollout", {}).get("stepIndex") == 1
            and ((s.get("revisions") or {}).get("stable") or {}).get("digest")
            # surge capacity: 2 stable + 1 canary (capacity-first would be 1 + 1); every pair Ready, none draining
            and s.get("pairs", {}).get("ready") == s["pairs"].get("current", -1) >= 2
            and s["pairs"].get("draining", 0) == 0
            and s
        ),
        timeout_s=90,
    )
    stable = st["revisions"]["stable"]["name"]
    snapshot = f"speed-rev-{stable}"
    body = json.loads(crds.get("configmap", snapshot, namespace=ns)["data"]["revision.json"])
    body["stack"]["image"] = FOREIGN_IMAGE
    stable_pods = [
        p for p in engine_pods(crds, ns, "speed") if p["metadata"]["labels"]["tandem.dev/revision"] == stable
    ]
    assert stable_pods, "no stable pod to recreate"
    victim = sorted(p["metadata"]["name"] for p in stable_pods)[0]

    with ObjectWatch(crds, "pods", ns, selector="tandem.dev/pool=speed") as pods:
        since = now()
        patch = data_patch("revision.json", json.dumps(body, sort_keys=True))
        crds.run("patch", "configmap", snapshot, "-n", ns, "--type=merge", "-p", patch)
        crds.run("delete", "pod", victim, "-n", ns, "--wait=true")
        cond = _reported(crds, ns, "speed", "SnapshotTampered")
        time.sleep(6)  # a few more passes: a recreate would happen now
    assert FOREIGN_IMAGE not in _images(pods), sorted(_images(pods))
    assert _images(pods) <= {IMAGE.format(tag="v1"), IMAGE.format(tag="v2")}, sorted(_images(pods))
    assert crds.get("pod", victim, namespace=ns) is None, "a stable pod was recreated from the edited snapshot"
    assert stable in cond["message"], cond
    assert _operator_deletes(audit_log, user, ns, since) == []


# --- look-alike pod -----------------------------------------------------------------------------------


def test_look_alike_pod_without_owner_reference_deletes_no_real_pair(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """A pod with a real pod's labels but another revision and no owner reference (once: a pair "mixing
    revisions" deleted the real pair). Ignored, never deleted; the real pods stay; ForeignPodsIgnored."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2))
    wait_ready(crds, ns, "speed", 2)
    uids = pod_uids(crds, ns, "speed")
    real = engine_pods(crds, ns, "speed")[0]
    labels = dict(real["metadata"]["labels"]) | {"tandem.dev/revision": "0000000000"}
    look_alike = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "speed-look-alike", "labels": labels},
        "spec": {
            "containers": [{"name": "engine", "image": FOREIGN_IMAGE}],
            "nodeSelector": gpu_nodes.selector,
            "tolerations": [{"operator": "Exists"}],
        },
    }
    with ObjectWatch(crds, "pods", ns, selector="tandem.dev/pool=speed") as pods:
        since = now()
        apply(crds, ns, look_alike)
        cond = _reported(crds, ns, "speed", "ForeignPodsIgnored")
        time.sleep(6)  # drainTimeout (2 s) and a few passes
    assert "speed-look-alike" in cond["message"], cond
    assert pod_uids(crds, ns, "speed") == {**uids, "speed-look-alike": pod_uids(crds, ns)["speed-look-alike"]}
    assert _operator_deletes(audit_log, user, ns, since) == []
    operator_images = {
        c["image"]
        for s in pods.objects()
        if s.obj["metadata"]["name"] != "speed-look-alike"
        for c in s.obj["spec"]["containers"]
    }
    assert operator_images == {IMAGE.format(tag="v1")}, operator_images
    assert status(crds, ns, "speed")["pairs"]["ready"] == 2


# --- drain records ----------------------------------------------------------------------------------


def test_forged_drain_start_long_ago_on_a_pair_that_is_not_ready_deletes_nothing(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    """A pair that is not Ready (its decode pod crash-loops, as a loading pair looks to the planner) is
    marked draining since an hour ago in the routing table (once: deleted at once). Not deleted: the
    record is ignored (DrainRecordRejected) and the table republished without it."""
    gpu_nodes.add(3)
    kubeconfig, user = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, drain="2s", orphan="600s"))
    wait_ready(crds, ns, "speed", 2)
    uids = pod_uids(crds, ns, "speed")
    pod = sorted(engine_pods(crds, ns, "speed"), key=lambda p: p["metadata"]["name"])[-1]
    pair = pod["metadata"]["labels"]["tandem.dev/pair"]
    serving_entry = next(p for p in routing(crds, ns, "speed")["pairs"] if p["id"] == pair)
    crds.run("annotate", "pod", pod["metadata"]["name"], "-n", ns, "tandem.dev/sim-fail=crashloop")
    wait_until(
        f"{pair} no longer serving in the published table",
        lambda: all(p["id"] != pair or p.get("state") != "serving" for p in routing(crds, ns, "speed")["pairs"]),
        timeout_s=30,
    )
    table = routing(crds, ns, "speed")
    forged = {**serving_entry, "state": "draining", "drainingSince": _stamp(-timedelta(hours=1))}
    table["pairs"] = sorted([p for p in table["pairs"] if p["id"] != pair] + [forged], key=lambda p: p["index"])
    since = now()
    cond = _forge_drain_record(crds, ns, "speed", table, pair, "DrainRecordRejected")
    time.sleep(8)  # 4 × drainTimeout
    assert pair in cond["message"], cond
    assert pod_uids(crds, ns, "speed") == uids
    assert _operator_deletes(audit_log, user, ns, since) == []
    republished = {p["id"]: p for p in routing(crds, ns, "speed")["pairs"]}
    assert not republished[pair].get("drainingSince"), republished[pair]


def test_forged_drain_start_far_in_the_future_does_not_hold_gpus_for_ever(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
) -> None:
    """Scale 2 → 1 with a 10 s drain; while the excess pair drains, its start is forged to 2100 (once:
    the pair and its GPUs stayed for ever). The drain restarts now and the pair goes within one drain
    timeout of the forgery; the pair that stays keeps its pods; DrainRecordRejected in status and Event."""
    gpu_nodes.add(3)
    kubeconfig, _ = operator_identity
    operator_factory([ns], kubeconfig=kubeconfig)
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, drain="10s"))
    wait_ready(crds, ns, "speed", 2)
    crds.run("scale", f"{POOLS}/speed", "-n", ns, "--replicas=1")
    table = wait_until(
        "one pair draining",
        lambda: (t := routing(crds, ns, "speed")) and any(p.get("state") == "draining" for p in t["pairs"]) and t,
        timeout_s=30,
    )
    draining = next(p["id"] for p in table["pairs"] if p.get("state") == "draining")
    keep = {n: u for n, u in pod_uids(crds, ns, "speed").items() if not n.startswith(draining + "-")}
    assert keep and len(keep) < len(pod_uids(crds, ns, "speed")), (draining, keep)
    for entry in table["pairs"]:
        if entry["id"] == draining:
            entry["drainingSince"] = "2100-01-01T00:00:00Z"
    forged = time.monotonic()
    crds.run("patch", "configmap", "speed-routing", "-n", ns, "--type=merge", "-p", data_patch("routing.json", table))
    cond = _reported(crds, ns, "speed", "DrainRecordRejected")
    wait_ready(crds, ns, "speed", 1, timeout_s=40)
    gone_after = time.monotonic() - forged
    assert draining in cond["message"], cond
    assert not any(n.startswith(draining + "-") for n in pod_uids(crds, ns, "speed")), "the excess pair stayed"
    assert {n: u for n, u in pod_uids(crds, ns, "speed").items()} == keep
    assert gone_after < 10 + 20, gone_after  # drainTimeout from the forgery, plus passes on 2 loaded cores


# --- Prometheus address -----------------------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A Prometheus look-alike that answers every query with an empty vector and records the headers."""

    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()} | {":path": self.path})
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def foreign_prometheus() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(http URL, recorded request headers) of a loopback server posing as a pool's Prometheus."""
    seen: list[dict[str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_address_elsewhere_over_http_never_gets_the_credentials(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    operator_identity: tuple[Path, str],
    audit_log: Path,
    tmp_path: Path,
    foreign_prometheus: tuple[str, list[dict[str, str]]],
) -> None:
    """The operator has a bearer token for its own Prometheus; a pool's analysis names another address
    over http. That address is queried (gates still work for the pool owner) but never with the token;
    PrometheusCredentialsWithheld in status and an Event; no pair deleted while the gates wait for data."""
    url, seen = foreign_prometheus
    auth = tmp_path / "prometheus-auth"
    auth.mkdir()
    (auth / "token").write_text(TOKEN)
    gpu_nodes.add(4)
    kubeconfig, user = operator_identity
    args = [f"--prometheus-url={OWN_PROMETHEUS}", f"--prometheus-auth-dir={auth}", "--scrape-interval=1"]
    operator_factory([ns], kubeconfig=kubeconfig, extra_args=args)
    analysis = {"prometheusAddress": url, "noDataDeadline": "5m", "onNoData": "Pause"}
    apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, analysis=analysis))
    wait_ready(crds, ns, "speed", 2)
    with ObjectWatch(crds, "pods", ns, selector="tandem.dev/pool=speed") as pods:
        apply(crds, ns, pool_manifest("speed", gpu_nodes, replicas=2, version="v2", analysis=analysis))
        cond = _reported(crds, ns, "speed", "PrometheusCredentialsWithheld")
        wait_until(
            "canary at its analysis step, nothing draining",
            lambda: (
                (s := status(crds, ns, "speed")).get("rollout", {}).get("stepIndex") == 1
                and s.get("pairs", {}).get("current", 0) >= 2  # 2 + 1 canary under surge capacity
                and s["pairs"].get("draining", 0) == 0
            ),
            timeout_s=60,
        )
        since = now()
        wait_until("the foreign address queried", lambda: len(seen) >= 2, timeout_s=60)
        time.sleep(6)  # more analysis intervals (4 s)
    assert url in cond["message"] and "not https" in cond["message"], cond
    leaked = [h for h in seen if "authorization" in h or any(TOKEN in v for v in h.values())]
    assert not leaked, leaked
    assert _operator_deletes(audit_log, user, ns, since) == []
    assert _images(pods) <= {IMAGE.format(tag="v1"), IMAGE.format(tag="v2")}, sorted(_images(pods))
