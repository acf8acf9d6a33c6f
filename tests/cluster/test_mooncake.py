"""The shared Mooncake KV cache on the real local control plane (issue 5's must-shows, DP-07).

KWOK pods run nothing: "master down" is the master pod crash-looping (the `tandem.dev/sim-fail` stage),
"node lost" is the Node deleted. The operator runs as a process under the least-privilege test identity
where RBAC matters.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem_lab.dev import audit
from tandem_lab.dev.kube import Kubectl
from tests.support.tandem_cluster import REPO, GpuNodes, OperatorProcess, wait_until

CACHE = yaml.safe_load((REPO / "examples" / "mooncake-cache.yaml").read_text())
SPEED = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
GI = 2**30


@pytest.fixture
def start_operator(operator_factory: Any) -> Callable[..., OperatorProcess]:
    """`tandem run` (the MooncakeCache handlers are part of the operator)."""

    def start(namespaces: list[str], kubeconfig: Path | None = None) -> OperatorProcess:
        op: OperatorProcess = operator_factory(namespaces, kubeconfig=kubeconfig)
        return op

    return start


def fleet_cache(nodes: GpuNodes, **store: Any) -> dict[str, Any]:
    """The reference fleet's cache, its stores pinned to the test's own nodes."""
    obj = copy.deepcopy(CACHE)
    obj["spec"]["store"]["nodeSelector"] = {**obj["spec"]["store"]["nodeSelector"], **nodes.selector}
    obj["spec"]["store"].update(store)
    return obj


def speed_pool(nodes: GpuNodes, name: str, cache: str | None) -> dict[str, Any]:
    obj = copy.deepcopy(SPEED)
    obj["metadata"]["name"] = name
    spec = obj["spec"]
    spec["pairs"]["replicas"] = 1
    spec["pairs"]["drainTimeout"] = "5s"
    spec["autoscaling"]["enabled"] = False
    spec["placement"]["nodeSelector"] = nodes.selector
    if cache is None:
        spec["kvCache"].pop("mooncakeRef", None)
    else:
        spec["kvCache"]["mooncakeRef"] = {"name": cache}
    return obj


def apply(kube: Kubectl, ns: str, obj: dict[str, Any]) -> None:
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(obj))


def cache_obj(kube: Kubectl, ns: str, name: str = "fleet-cache") -> dict[str, Any] | None:
    return kube.get("mooncakecaches.tandem.dev", name, namespace=ns)


def cache_status(kube: Kubectl, ns: str, name: str = "fleet-cache") -> dict[str, Any]:
    return (cache_obj(kube, ns, name) or {}).get("status") or {}


def pool_status(kube: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return kube.json("get", "inferencepools.tandem.dev", name, "-n", ns).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def pods(kube: Kubectl, ns: str, selector: str) -> list[dict[str, Any]]:
    return list(kube.json("get", "pods", "-n", ns, "-l", selector)["items"])


def events(kube: Kubectl, ns: str, name: str) -> list[str]:
    items = kube.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [f"{e['reason']}: {e['message']}" for e in items]


def wait_cache_ready(kube: Kubectl, ns: str, stores: str, timeout_s: float = 90) -> dict[str, Any]:
    return wait_until(
        f"cache Ready with {stores} stores",
        lambda: (
            (s := cache_status(kube, ns)).get("stores") == stores
            and condition(s, "Ready").get("status") == "True"
            and s
        ),
        timeout_s=timeout_s,
    )


def wait_pool_ready(kube: Kubectl, ns: str, name: str, timeout_s: float = 120) -> dict[str, Any]:
    return wait_until(
        f"{name}: 1 pair Ready",
        lambda: (
            (s := pool_status(kube, ns, name)).get("pairs", {}).get("ready") == 1
            and condition(s, "Ready").get("status") == "True"
            and s
        ),
        timeout_s=timeout_s,
    )


def test_reference_cache_places_one_store_per_node_with_summed_capacity(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    start_operator: Callable[..., OperatorProcess],
    operator_identity: tuple[Path, str],
    audit_log: Path,
) -> None:
    names = gpu_nodes.add(4)
    kubeconfig, user = operator_identity
    start_operator([ns], kubeconfig=kubeconfig)
    apply(crds, ns, fleet_cache(gpu_nodes))
    status = wait_cache_ready(crds, ns, "4/4")
    assert status["capacity"] == "256Gi" and status["capacityBytes"] == 256 * GI == status["readyCapacityBytes"]
    assert sorted(p["node"] for p in status["placement"]) == sorted(names)
    assert sorted(p["domain"] for p in status["placement"]) == ["zone-a", "zone-a", "zone-b", "zone-b"]
    assert status["endpoints"] == {"master": f"fleet-cache-master.{ns}.svc:50051", "metadata": "P2PHANDSHAKE"}
    assert condition(status, "Degraded")["status"] == "False"
    stores = pods(crds, ns, "tandem.dev/cache=fleet-cache,tandem.dev/component=mooncake-store")
    assert len(stores) == 4
    for pod in stores:
        container = pod["spec"]["containers"][0]
        assert container["command"] == ["mooncake_client"]
        assert "--global_segment_size=68719476736" in container["args"]
        assert container["resources"]["limits"]["memory"] == "80Gi"
        affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [pod["spec"]["nodeName"]]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "MooncakeCache"
        assert not pod["spec"].get("hostNetwork")
    assert len(pods(crds, ns, "tandem.dev/component=mooncake-master")) == 1
    cm = crds.get("configmap", "fleet-cache-client", namespace=ns)
    assert cm is not None
    config = json.loads(cm["data"]["mooncake.json"])
    assert config["mode"] == "standalone-store" and config["global_segment_size"] == 0
    assert config["master_server_address"] == status["endpoints"]["master"]
    assert crds.get("service", "fleet-cache-master", namespace=ns) is not None
    table = crds.run("get", "mooncakecaches.tandem.dev", "-n", ns).stdout
    assert "4/4" in table and "256Gi" in table
    # steady state: no writes at all
    time.sleep(3)
    since = datetime.now(UTC)
    time.sleep(12)
    writes = audit.count_writes(audit.iter_events(audit_log), since=since, users=[user])
    assert sum(writes.values()) == 0, writes


def test_node_loss_re_places_its_store_and_shows_in_status(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, start_operator: Callable[..., OperatorProcess]
) -> None:
    names = gpu_nodes.add(4)
    start_operator([ns])
    apply(crds, ns, fleet_cache(gpu_nodes, stores=3))
    status = wait_cache_ready(crds, ns, "3/3")
    placed = sorted(p["node"] for p in status["placement"])
    spare = (set(names) - set(placed)).pop()
    lost = placed[0]
    first_change = status["lastPlacementChange"]
    gpu_nodes.remove(lost)
    status = wait_until(
        "store re-placed off the lost node",
        lambda: (
            (s := cache_status(crds, ns)).get("stores") == "3/3"
            and lost not in {p["node"] for p in s.get("placement", [])}
            and s
        ),
        timeout_s=90,
    )
    assert sorted(p["node"] for p in status["placement"]) == sorted({*placed, spare} - {lost})
    assert status["capacity"] == "192Gi"
    assert status["lastPlacementChange"] >= first_change
    seen = events(crds, ns, "fleet-cache")
    assert any(e.startswith("StoreRemoved") and lost in e for e in seen), seen
    assert any(e.startswith("StorePlaced") and spare in e for e in seen), seen


def test_pools_get_the_wiring_and_master_down_only_degrades_them(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, start_operator: Callable[..., OperatorProcess]
) -> None:
    gpu_nodes.add(3)
    start_operator([ns])
    cache = fleet_cache(gpu_nodes, stores=2)
    cache["spec"]["pythonHashSeed"] = 4242
    apply(crds, ns, cache)
    wait_cache_ready(crds, ns, "2/2")
    # One pool after the other: two pools planned in the same instant can pick the same free node.
    apply(crds, ns, speed_pool(gpu_nodes, "speed", "fleet-cache"))
    wait_pool_ready(crds, ns, "speed")
    apply(crds, ns, speed_pool(gpu_nodes, "plain", None))
    wait_pool_ready(crds, ns, "plain")
    wait_until(
        "speed: KVCacheDegraded False",
        lambda: condition(pool_status(crds, ns, "speed"), "KVCacheDegraded").get("status") == "False",
        timeout_s=60,
    )
    assert cache_status(crds, ns)["referencedBy"] == ["speed"]

    for pod in pods(crds, ns, "tandem.dev/pool=speed"):
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["MOONCAKE_CONFIG_PATH"] == "/etc/mooncake/mooncake.json"
        assert env["PYTHONHASHSEED"] == "4242"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["mooncake"]["configMap"]["name"] == "fleet-cache-client"
        assert {"name": "mooncake", "mountPath": "/etc/mooncake", "readOnly": True} in container["volumeMounts"]
        kv = json.loads(next(a for a in container["args"] if a.startswith("--kv-transfer-config=")).split("=", 1)[1])
        assert kv["kv_connector"] == "MultiConnector"
        children = [x["kv_connector"] for x in kv["kv_connector_extra_config"]["connectors"]]
        assert children == ["MooncakeConnector", "MooncakeStoreConnector"]
    for pod in pods(crds, ns, "tandem.dev/pool=plain"):
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "MOONCAKE_CONFIG_PATH" not in env and env["PYTHONHASHSEED"] == "0"
        assert all("mooncake" not in v["name"] for v in pod["spec"]["volumes"])
        assert not any("MultiConnector" in a or "MooncakeStoreConnector" in a for a in container["args"])

    # DP-07: the master goes down (crash loop); the pool reports it and keeps its pairs
    serving = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(crds, ns, "tandem.dev/pool=speed")}
    stable = pool_status(crds, ns, "speed")["revisions"]["stable"]["name"]
    crds.run("annotate", "pod", "fleet-cache-master-0", "-n", ns, "tandem.dev/sim-fail=crashloop")
    degraded = wait_until(
        "speed: KVCacheDegraded True",
        lambda: (s := pool_status(crds, ns, "speed")) and condition(s, "KVCacheDegraded").get("status") == "True" and s,
        timeout_s=60,
    )
    assert "fleet-cache" in condition(degraded, "KVCacheDegraded")["message"]
    assert condition(cache_status(crds, ns), "Degraded")["status"] == "True"
    for _ in range(8):  # the pool keeps serving: same pods, same revision, no rollback
        status = pool_status(crds, ns, "speed")
        assert status["pairs"]["ready"] == 1
        assert status["revisions"]["stable"]["name"] == stable
        assert status.get("rollout", {}).get("phase") not in ("RollingBack", "RolledBack")
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(crds, ns, "tandem.dev/pool=speed")} == serving
        time.sleep(1)
    assert condition(pool_status(crds, ns, "plain"), "KVCacheDegraded") == {}
    # recovery: the broken master pod is replaced, the pool's condition clears
    crds.run("delete", "pod", "fleet-cache-master-0", "-n", ns, "--wait=false")
    wait_until(
        "speed: KVCacheDegraded False again",
        lambda: condition(pool_status(crds, ns, "speed"), "KVCacheDegraded").get("status") == "False",
        timeout_s=90,
    )
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(crds, ns, "tandem.dev/pool=speed")} == serving


def test_deleting_a_referenced_cache_is_held_until_no_pool_uses_it(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, start_operator: Callable[..., OperatorProcess]
) -> None:
    gpu_nodes.add(2)
    start_operator([ns])
    apply(crds, ns, fleet_cache(gpu_nodes, stores=1))
    wait_cache_ready(crds, ns, "1/1")
    apply(crds, ns, speed_pool(gpu_nodes, "speed", "fleet-cache"))
    wait_until("referencedBy", lambda: cache_status(crds, ns).get("referencedBy") == ["speed"], timeout_s=60)
    crds.run("delete", "mooncakecaches.tandem.dev", "fleet-cache", "-n", ns, "--wait=false")
    held = wait_until(
        "DeletionBlocked",
        lambda: (s := cache_status(crds, ns)) and condition(s, "DeletionBlocked").get("status") == "True" and s,
        timeout_s=60,
    )
    assert "speed" in condition(held, "DeletionBlocked")["message"]
    assert any(e.startswith("DeletionBlocked") for e in events(crds, ns, "fleet-cache"))
    time.sleep(5)
    obj = cache_obj(crds, ns)
    assert obj is not None and obj["metadata"].get("deletionTimestamp")
    assert len(pods(crds, ns, "tandem.dev/cache=fleet-cache")) == 2  # master and store still serve
    assert crds.get("configmap", "fleet-cache-client", namespace=ns) is not None
    # the pool lets go: the cache goes, its children with it
    crds.run(
        "patch", "inferencepools.tandem.dev", "speed", "-n", ns, "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/kvCache/mooncakeRef"}]',
    )  # fmt: skip
    wait_until("cache deleted", lambda: cache_obj(crds, ns) is None, timeout_s=90)
    wait_until(
        "cache children garbage-collected",
        lambda: (
            not pods(crds, ns, "tandem.dev/cache=fleet-cache")
            and crds.get("configmap", "fleet-cache-client", namespace=ns) is None
        ),
        timeout_s=90,
    )


def test_rdma_stores_are_refused_in_a_baseline_namespace_with_a_condition(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, start_operator: Callable[..., OperatorProcess]
) -> None:
    gpu_nodes.add(1)
    op = start_operator([ns])
    apply(crds, ns, fleet_cache(gpu_nodes, transport={"protocol": "rdma", "devices": ["ionic_0"]}))
    status = wait_until(
        "AdmissionBlocked",
        lambda: (s := cache_status(crds, ns)) and condition(s, "Degraded").get("reason") == "AdmissionBlocked" and s,
        timeout_s=60,
    )
    assert "PodSecurity" in condition(status, "Degraded")["message"]
    since = condition(status, "Degraded")["lastTransitionTime"]

    def failed_passes() -> float:
        line = 'tandem_reconcile_total{kind="MooncakeCache",result="error"}'
        return sum(float(x.split()[-1]) for x in op.metrics().splitlines() if x.startswith(line))

    wait_until("a retry", lambda: failed_passes() >= 3, timeout_s=60)
    assert not pods(crds, ns, "tandem.dev/component=mooncake-store")
    blocked = [e for e in events(crds, ns, "fleet-cache") if e.startswith("AdmissionBlocked")]
    assert len(blocked) <= 2, (
        blocked
    )  # one Event per failure (two if the first status write lost a race), not per retry
    assert condition(cache_status(crds, ns), "Degraded")["lastTransitionTime"] == since
