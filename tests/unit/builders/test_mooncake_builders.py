"""MooncakeCache manifests: master, store, metadata server, Services and the client ConfigMap (pure, golden-ish).

The exact argument lists below are the contract with Mooncake (kvcache-ai/Mooncake@3b5a5941) and vLLM 0.33;
change them only together with docs/design/003-mooncake.md.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.api.cache import MooncakeCacheSpec
from tandem.api.labels import cache_client_configmap_name
from tandem.builders import mooncake as b

IMAGE = "ghcr.io/example/mooncake@sha256:" + "a" * 64


def spec(**changes: Any) -> MooncakeCacheSpec:
    return MooncakeCacheSpec.model_validate({"image": IMAGE, "version": "0.3.13", **changes})


def ref(**changes: Any) -> b.CacheRef:
    return b.CacheRef(name="fleet-cache", namespace="llm", uid="uid-1", spec=spec(**changes))


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][0])


def test_master_pod_golden() -> None:
    pod = b.build_master_pod(ref(), 0, {"tandem.dev/template-hash": "h"})
    assert pod["metadata"]["name"] == "fleet-cache-master-0"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/instance": "fleet-cache",
        "app.kubernetes.io/managed-by": "tandem",
        "app.kubernetes.io/name": "mooncake-master",
        "app.kubernetes.io/part-of": "tandem",
        "app.kubernetes.io/version": "0.3.13",
        "tandem.dev/cache": "fleet-cache",
        "tandem.dev/component": "mooncake-master",
        "tandem.dev/instance": "0",
    }
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "MooncakeCache",
            "name": "fleet-cache",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    main = container(pod)
    assert main["command"] == ["mooncake_master"]
    assert main["args"] == ["--rpc_port=50051", "--rpc_address=$(POD_IP)", "--metrics_port=9003"]
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert [p["containerPort"] for p in main["ports"]] == [50051, 9003]
    assert main["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
    }
    assert main["volumeMounts"] == [{"name": "scratch", "mountPath": "/tmp"}]
    assert pod["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "hostNetwork" not in pod["spec"] and "affinity" not in pod["spec"]


@pytest.mark.parametrize(
    ("backend", "conn", "want_address"),
    [
        pytest.param("etcd", "etcd-0:2379;etcd-1:2379", "etcd://etcd-0:2379;etcd-1:2379", id="etcd"),
        pytest.param("redis", "redis://redis:6379", "redis://redis:6379", id="redis keeps its scheme"),
        pytest.param("redis", "redis:6379", "redis://redis:6379", id="redis without scheme"),
    ],
)
def test_master_ha_flags_and_client_address(backend: str, conn: str, want_address: str) -> None:
    r = ref(master={"replicas": 2, "ha": {"enabled": True, "backend": backend, "connString": conn}})
    args = container(b.build_master_pod(r, 1, {}))["args"]
    assert args[3:] == [
        "--enable_ha=true",
        f"--ha_backend_type={backend}",
        f"--ha_backend_connstring={conn}",
        "--cluster_id=llm_fleet-cache",
    ]
    assert b.cache_endpoints(r.name, r.namespace, r.spec).master == want_address
    pod = b.build_master_pod(r, 1, {})
    assert pod["metadata"]["name"] == "fleet-cache-master-1"
    assert "podAntiAffinity" in pod["spec"]["affinity"]


def test_store_pod_tcp_golden() -> None:
    r = ref(
        store={
            "segmentSize": "64Gi",
            "memoryLimit": "80Gi",
            "cpu": "8",
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        }
    )
    endpoints = b.cache_endpoints(r.name, r.namespace, r.spec)
    pod = b.build_store_pod(b.StoreParams(r, 3, "node-7", 0, {"tandem.dev/store-slot": "0"}), endpoints)
    assert pod["metadata"]["name"] == "fleet-cache-store-3"
    assert pod["metadata"]["labels"]["tandem.dev/component"] == "mooncake-store"
    assert pod["metadata"]["labels"]["tandem.dev/instance"] == "3"
    main = container(pod)
    assert main["command"] == ["mooncake_client"]
    assert main["args"] == [
        "--host=$(POD_IP)",
        "--port=50052",
        "--global_segment_size=68719476736",
        "--master_server_address=fleet-cache-master.llm.svc:50051",
        "--metadata_server=P2PHANDSHAKE",
        "--protocol=tcp",
        "--device_names=",
        "--enable_http_server=true",
        "--http_port=9300",
    ]
    assert main["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert main["resources"] == {
        "requests": {"cpu": "8", "memory": "80Gi"},
        "limits": {"cpu": "8", "memory": "80Gi"},
    }
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "tcpSocket" in main["livenessProbe"]  # /health is 503 while the master is away: not a liveness signal
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-7"]}
    ]
    assert pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "hostNetwork" not in pod["spec"]


def test_store_pod_rdma_gets_host_network_ipc_lock_and_devices_only_from_the_protocol() -> None:
    rdma = {"protocol": "rdma", "devices": ["ionic_0", "ionic_1"], "rdma": {"name": "amd.com/vnic", "perInstance": 1}}
    r = ref(store={"transport": rdma, "maxPerNode": 2})
    endpoints = b.cache_endpoints(r.name, r.namespace, r.spec)
    pod = b.build_store_pod(b.StoreParams(r, 0, "n1", 1), endpoints)
    main = container(pod)
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Exactly IPC_LOCK, as uid 0: an added capability never reaches a non-root process (no ambient caps).
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        "runAsUser": 0,
    }
    assert main["resources"]["limits"]["amd.com/vnic"] == "1"
    assert "--device_names=ionic_0,ionic_1" in main["args"] and "--protocol=rdma" in main["args"]
    assert "--port=50053" in main["args"] and "--http_port=9301" in main["args"]  # slot 1 on the host network
    assert not any("hostPath" in v for v in pod["spec"].get("volumes", []))
    # the same devices and resource with tcp: nothing privileged reaches the pod (S-WL-04)
    tcp = ref(store={"transport": {**rdma, "protocol": "tcp"}})
    plain = b.build_store_pod(b.StoreParams(tcp, 0, "n1", 1), b.cache_endpoints(tcp.name, tcp.namespace, tcp.spec))
    assert "hostNetwork" not in plain["spec"]
    assert "add" not in container(plain)["securityContext"]["capabilities"]
    assert "amd.com/vnic" not in container(plain)["resources"]["limits"]


def test_metadata_server_pod_and_endpoint() -> None:
    r = ref(metadataService={"type": "HTTP", "port": 8080})
    pod = b.build_metadata_pod(r, {})
    assert pod["metadata"]["name"] == "fleet-cache-metadata-0"
    assert container(pod)["command"] == ["mooncake_http_metadata_server"]
    assert container(pod)["args"] == ["--host=0.0.0.0", "--port=8080"]
    assert (
        b.cache_endpoints(r.name, r.namespace, r.spec).metadata == "http://fleet-cache-metadata.llm.svc:8080/metadata"
    )
    svc = b.build_metadata_service(r)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]


def test_master_service() -> None:
    svc = b.build_master_service(ref())
    assert svc["metadata"]["name"] == "fleet-cache-master"
    assert svc["spec"]["selector"] == {"tandem.dev/cache": "fleet-cache", "tandem.dev/component": "mooncake-master"}
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("rpc", 50051), ("metrics", 9003)]
    assert b.service_matches(svc, svc)


def test_client_configmap_is_what_engines_mount() -> None:
    r = ref(client={"localBufferSize": "4Gi"})
    cm = b.build_client_configmap(r, b.cache_endpoints(r.name, r.namespace, r.spec))
    assert cm["metadata"]["name"] == cache_client_configmap_name("fleet-cache")  # the name builders/pods.py mounts
    assert cm["metadata"]["labels"]["tandem.dev/component"] == "mooncake-client"
    config = json.loads(cm["data"]["mooncake.json"])
    assert config == {
        "device_name": "",
        "enable_offload": False,
        "global_segment_size": 0,
        "local_buffer_size": 4 * 2**30,
        "master_server_address": "fleet-cache-master.llm.svc:50051",
        "metadata_server": "P2PHANDSHAKE",
        "mode": "standalone-store",
        "protocol": "tcp",
    }
    assert b.configmap_matches(cm, cm)
    changed = {**cm, "data": {"mooncake.json": "{}"}}
    assert not b.configmap_matches(changed, cm)


def test_names_are_checked_against_the_limit() -> None:
    longest = "c" * 40
    assert len(b.store_pod_name(longest, 1023)) <= 63
    assert len(b.master_pod_name(longest, 2)) <= 63
    with pytest.raises(ValueError, match="longer than 63"):
        b.store_pod_name("c" * 60, 1)
