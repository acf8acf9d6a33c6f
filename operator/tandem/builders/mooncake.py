"""MooncakeCache children: master and store pods, the metadata server, Services and the client ConfigMap.

What it owns: the names, labels and whole manifests of everything a cache runs, and the addresses
engines connect to. Pure and deterministic: no environment reads, no clock, no decisions (how many
pods, where, when to replace them: `tandem.core.mooncake` decides, the reconcile calls these).

Names and flags follow kvcache-ai/Mooncake@3b5a5941 and vLLM 0.33 (docs/design/003-mooncake.md has
the table with sources):

- master: `mooncake_master --rpc_port --rpc_address=$(POD_IP) --metrics_port`, with HA
  `--enable_ha=true --ha_backend_type=etcd|redis --ha_backend_connstring --cluster_id`; readiness is
  `GET /health` on the metrics port. Service `<cache>-master` (rpc 50051, metrics 9003).
- metadata (type HTTP only): `mooncake_http_metadata_server --host 0.0.0.0 --port 8080`, Service
  `<cache>-metadata`, engines use `http://<cache>-metadata.<ns>.svc:8080/metadata`.
- store: `mooncake_client` (the C++ store client vLLM's `standalone-store` mode expects as the owner of
  the memory pool): `--host=$(POD_IP) --port 50052 --global_segment_size=<bytes>
  --master_server_address --metadata_server --protocol --device_names --enable_http_server=true
  --http_port 9300`; readiness `GET /health` on 9300 (503 while the master is unreachable). Memory
  request = limit = `memoryLimit`, required node affinity on the placed node.
- Every container: non-root (uid 65532), read-only root with a scratch emptyDir at /tmp, no privilege
  escalation, every capability dropped. RDMA stores only (never from a user field): `hostNetwork`,
  exactly `IPC_LOCK` (as uid 0: see `container_security`), the RDMA device resource; ports shift by the
  store's slot so two stores on one host do not collide. Nothing is privileged.
- `<cache>-client` ConfigMap, key `mooncake.json`: the file vLLM reads from `MOONCAKE_CONFIG_PATH`
  (`mode: standalone-store`, `global_segment_size: 0`, sizes as integer bytes).

Every child carries `tandem.dev/cache=<cache>`, `tandem.dev/component=mooncake-*`, the managed-by
labels and a controller owner reference to the cache (blockOwnerDeletion, S-DEL-04).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tandem.api.cache import CacheEndpoints, MooncakeCacheSpec
from tandem.api.labels import (
    LABEL_CACHE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_VERSION,
    MANAGED_BY,
    MAX_NAME_LENGTH,
    NameTooLongError,
    selector_string,
)
from tandem.api.quantity import quantity_bytes
from tandem.builders.common import container_security, metadata, owner_reference, scratch_volume

COMPONENT_MASTER: Final = "mooncake-master"
COMPONENT_STORE: Final = "mooncake-store"
COMPONENT_METADATA: Final = "mooncake-metadata"
COMPONENT_CLIENT: Final = "mooncake-client"
COMPONENTS: Final = (COMPONENT_MASTER, COMPONENT_STORE, COMPONENT_METADATA, COMPONENT_CLIENT)

CLIENT_CONFIG_KEY: Final = "mooncake.json"
P2P_HANDSHAKE: Final = "P2PHANDSHAKE"
STORE_RPC_PORT: Final = 50052
STORE_HTTP_PORT: Final = 9300
METADATA_CPU: Final = "500m"
METADATA_MEMORY: Final = "512Mi"
DEFAULT_MASTER_CPU: Final = "4"
DEFAULT_MASTER_MEMORY: Final = "8Gi"
LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
KIND: Final = "MooncakeCache"


def _checked(name: str) -> str:
    if len(name) > MAX_NAME_LENGTH:
        raise NameTooLongError(f"derived name {name!r} is longer than {MAX_NAME_LENGTH} characters")
    return name


def master_service_name(cache: str) -> str:
    return _checked(f"{cache}-master")


def metadata_service_name(cache: str) -> str:
    return _checked(f"{cache}-metadata")


def master_pod_name(cache: str, index: int) -> str:
    return _checked(f"{cache}-master-{index}")


def metadata_pod_name(cache: str) -> str:
    return _checked(f"{cache}-metadata-0")


def store_pod_name(cache: str, store_id: int) -> str:
    return _checked(f"{cache}-store-{store_id}")


def client_configmap_name(cache: str) -> str:
    return _checked(f"{cache}-client")


def cache_selector(cache: str, component: str | None = None) -> dict[str, str]:
    """Labels selecting a cache's children (all of them, or one component)."""
    out = {LABEL_CACHE: cache}
    if component is not None:
        out[LABEL_COMPONENT] = component
    return out


def cache_selector_string(cache: str) -> str:
    return selector_string(cache_selector(cache))


@dataclass(frozen=True)
class CacheRef:
    """The cache a child belongs to."""

    name: str
    namespace: str
    uid: str
    spec: MooncakeCacheSpec


def cache_labels(ref: CacheRef, component: str) -> dict[str, str]:
    return {
        LABEL_CACHE: ref.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: "tandem",
        LABEL_NAME: component,
        LABEL_VERSION: ref.spec.version,
        "app.kubernetes.io/instance": ref.name,
    }


def _owner(ref: CacheRef) -> dict[str, Any]:
    return owner_reference(KIND, ref.name, ref.uid)


# --- what engines connect to -----------------------------------------------------------------------


def master_address(cache: str, namespace: str, spec: MooncakeCacheSpec) -> str:
    """`master_server_address`: the master Service, or with HA the leader-discovery form
    (`etcd://h1:2379;h2:2379`, `redis://host:6379`)."""
    ha = spec.master.ha
    if ha.enabled and ha.conn_string:
        scheme = f"{ha.backend}://"
        return ha.conn_string if ha.conn_string.startswith(scheme) else scheme + ha.conn_string
    return f"{master_service_name(cache)}.{namespace}.svc:{spec.master.rpc_port}"


def metadata_address(cache: str, namespace: str, spec: MooncakeCacheSpec) -> str:
    """`metadata_server`: `P2PHANDSHAKE`, or the HTTP metadata server's `/metadata` URL."""
    if spec.metadata_service.type == "HTTP":
        return f"http://{metadata_service_name(cache)}.{namespace}.svc:{spec.metadata_service.port}/metadata"
    return P2P_HANDSHAKE


def cache_endpoints(cache: str, namespace: str, spec: MooncakeCacheSpec) -> CacheEndpoints:
    return CacheEndpoints(
        master=master_address(cache, namespace, spec), metadata=metadata_address(cache, namespace, spec)
    )


def client_config(spec: MooncakeCacheSpec, endpoints: CacheEndpoints) -> dict[str, Any]:
    """The `mooncake.json` vLLM's MooncakeStoreConnector reads (`MOONCAKE_CONFIG_PATH`). Engines are pure
    requesters (`standalone-store`, segment 0): the store pods own the memory. Sizes are integer bytes,
    the one form every Mooncake and vLLM size parser agrees on."""
    return {
        "mode": "standalone-store",
        "metadata_server": endpoints.metadata,
        "master_server_address": endpoints.master,
        "protocol": spec.store.transport.protocol,
        "device_name": ",".join(spec.store.transport.devices),
        "global_segment_size": 0,
        "local_buffer_size": quantity_bytes(spec.client.local_buffer_size),
        "enable_offload": False,
    }


def client_config_text(spec: MooncakeCacheSpec, endpoints: CacheEndpoints) -> str:
    return json.dumps(client_config(spec, endpoints), indent=2, sort_keys=True) + "\n"


def client_config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- pods ------------------------------------------------------------------------------------------


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _http_probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 3,
    }


def _tcp_probe(port: str, period: int, failures: int) -> dict[str, Any]:
    return {"tcpSocket": {"port": port}, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 3}


def _security(*, ipc_lock: bool = False) -> dict[str, Any]:
    """Non-root, read-only root (glog and temp files go to the scratch emptyDir); RDMA stores add exactly
    IPC_LOCK (see `tandem.builders.common.container_security`)."""
    return container_security(ipc_lock=ipc_lock)


def _amounts(cpu: str, memory: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory, **(extra or {})}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _pod(
    ref: CacheRef,
    name: str,
    component: str,
    index: int,
    container: dict[str, Any],
    annotations: Mapping[str, str],
    extra_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    labels = cache_labels(ref, component) | {LABEL_INSTANCE: str(index)}
    scratch, scratch_mount = scratch_volume()
    container = {**container, "volumeMounts": [scratch_mount]}
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [scratch],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    spec.update(extra_spec or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, ref.namespace, labels, _owner(ref), dict(annotations)),
        "spec": spec,
    }


def master_args(ref: CacheRef) -> list[str]:
    master = ref.spec.master
    args = [
        f"--rpc_port={master.rpc_port}",
        "--rpc_address=$(POD_IP)",
        f"--metrics_port={master.metrics_port}",
    ]
    if master.ha.enabled and master.ha.conn_string:
        args += [
            "--enable_ha=true",
            f"--ha_backend_type={master.ha.backend}",
            f"--ha_backend_connstring={master.ha.conn_string}",
            f"--cluster_id={ref.namespace}_{ref.name}",
        ]
    return args


def build_master_pod(ref: CacheRef, index: int, annotations: Mapping[str, str]) -> dict[str, Any]:
    """One Mooncake master (index 0, or 0..replicas-1 with HA)."""
    master = ref.spec.master
    resources = master.resources
    container = {
        "name": "master",
        "image": ref.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["mooncake_master"],
        "args": master_args(ref),
        "env": [_field_env("POD_IP", "status.podIP")],
        "ports": [
            {"name": "rpc", "containerPort": master.rpc_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": master.metrics_port, "protocol": "TCP"},
        ],
        "resources": _amounts(resources.cpu or DEFAULT_MASTER_CPU, resources.memory or DEFAULT_MASTER_MEMORY),
        "readinessProbe": _http_probe("/health", "metrics", 5, 3),
        "livenessProbe": _http_probe("/health", "metrics", 15, 4),
        "securityContext": _security(),
    }
    extra: dict[str, Any] = {}
    if master.ha.enabled:
        # Primary and standbys on different hosts when the cluster allows it.
        extra["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": cache_selector(ref.name, COMPONENT_MASTER)},
                            "topologyKey": LABEL_HOSTNAME,
                        },
                    }
                ]
            }
        }
    return _pod(ref, master_pod_name(ref.name, index), COMPONENT_MASTER, index, container, annotations, extra)


def build_metadata_pod(ref: CacheRef, annotations: Mapping[str, str]) -> dict[str, Any]:
    """The HTTP metadata server (metadataService.type HTTP)."""
    port = ref.spec.metadata_service.port
    container = {
        "name": "metadata",
        "image": ref.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["mooncake_http_metadata_server"],
        "args": ["--host=0.0.0.0", f"--port={port}"],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": _amounts(METADATA_CPU, METADATA_MEMORY),
        "readinessProbe": _tcp_probe("http", 5, 3),
        "livenessProbe": _tcp_probe("http", 15, 4),
        "securityContext": _security(),
    }
    return _pod(ref, metadata_pod_name(ref.name), COMPONENT_METADATA, 0, container, annotations)


@dataclass(frozen=True)
class StoreParams:
    """One store pod: its id, the node it is placed on and its slot there."""

    ref: CacheRef
    store_id: int
    node: str
    slot: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)


def store_ports(spec: MooncakeCacheSpec, slot: int) -> tuple[int, int]:
    """(rpc, http) ports of a store: fixed in the pod network; shifted by slot on the host network."""
    if spec.store.transport.protocol == "rdma":
        return STORE_RPC_PORT + slot, STORE_HTTP_PORT + slot
    return STORE_RPC_PORT, STORE_HTTP_PORT


def store_args(ref: CacheRef, endpoints: CacheEndpoints, slot: int) -> list[str]:
    store = ref.spec.store
    rpc, http = store_ports(ref.spec, slot)
    return [
        "--host=$(POD_IP)",
        f"--port={rpc}",
        f"--global_segment_size={quantity_bytes(store.segment_size)}",
        f"--master_server_address={endpoints.master}",
        f"--metadata_server={endpoints.metadata}",
        f"--protocol={store.transport.protocol}",
        f"--device_names={','.join(store.transport.devices)}",
        "--enable_http_server=true",
        f"--http_port={http}",
    ]


def build_store_pod(params: StoreParams, endpoints: CacheEndpoints) -> dict[str, Any]:
    """One store server pinned to its placed node. RDMA extras come only from the transport protocol."""
    ref = params.ref
    store = ref.spec.store
    rdma = store.transport.protocol == "rdma"
    rpc, http = store_ports(ref.spec, params.slot)
    extra_resources: dict[str, str] = {}
    if rdma and store.transport.rdma is not None:
        extra_resources[store.transport.rdma.name] = str(store.transport.rdma.per_instance)
    container = {
        "name": "store",
        "image": ref.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["mooncake_client"],
        "args": store_args(ref, endpoints, params.slot),
        "env": [_field_env("POD_IP", "status.podIP")],
        "ports": [
            {"name": "rpc", "containerPort": rpc, "protocol": "TCP"},
            {"name": "http", "containerPort": http, "protocol": "TCP"},
        ],
        "resources": _amounts(store.cpu, store.memory_limit, extra_resources),
        "readinessProbe": _http_probe("/health", "http", 5, 2),
        "livenessProbe": _tcp_probe("http", 20, 6),
        "securityContext": _security(ipc_lock=rdma),
    }
    extra: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": LABEL_HOSTNAME, "operator": "In", "values": [params.node]}]}
                    ]
                }
            }
        },
        "tolerations": [t.wire() for t in store.tolerations],
    }
    if store.node_selector:
        extra["nodeSelector"] = dict(sorted(store.node_selector.items()))
    if rdma:
        extra["hostNetwork"] = True
        extra["dnsPolicy"] = "ClusterFirstWithHostNet"
    return _pod(
        ref,
        store_pod_name(ref.name, params.store_id),
        COMPONENT_STORE,
        params.store_id,
        container,
        params.annotations,
        extra,
    )


# --- Services and the client ConfigMap -------------------------------------------------------------


def build_master_service(ref: CacheRef) -> dict[str, Any]:
    """ClusterIP Service over the master(s): rpc for non-HA clients, metrics for Prometheus."""
    master = ref.spec.master
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            master_service_name(ref.name), ref.namespace, cache_labels(ref, COMPONENT_MASTER), _owner(ref)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": cache_selector(ref.name, COMPONENT_MASTER),
            "ports": [
                {"name": "rpc", "port": master.rpc_port, "targetPort": "rpc", "protocol": "TCP"},
                {"name": "metrics", "port": master.metrics_port, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_metadata_service(ref: CacheRef) -> dict[str, Any]:
    """ClusterIP Service over the HTTP metadata server."""
    port = ref.spec.metadata_service.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            metadata_service_name(ref.name), ref.namespace, cache_labels(ref, COMPONENT_METADATA), _owner(ref)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": cache_selector(ref.name, COMPONENT_METADATA),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_client_configmap(ref: CacheRef, endpoints: CacheEndpoints) -> dict[str, Any]:
    """ConfigMap `<cache>-client` with `mooncake.json`, mounted by every engine of a referencing pool."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            client_configmap_name(ref.name), ref.namespace, cache_labels(ref, COMPONENT_CLIENT), _owner(ref)
        ),
        "data": {CLIENT_CONFIG_KEY: client_config_text(ref.spec, endpoints)},
    }


def service_matches(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an observed Service already has the desired selector, ports and labels."""
    spec = observed.get("spec") or {}
    want = desired["spec"]
    labels = (observed.get("metadata") or {}).get("labels") or {}
    ports = [{k: p.get(k) for k in ("name", "port", "targetPort", "protocol")} for p in spec.get("ports") or []]
    return (
        spec.get("selector") == want["selector"]
        and ports == want["ports"]
        and all(labels.get(k) == v for k, v in desired["metadata"]["labels"].items())
    )


def configmap_matches(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    labels = (observed.get("metadata") or {}).get("labels") or {}
    return (observed.get("data") or {}) == desired["data"] and all(
        labels.get(k) == v for k, v in desired["metadata"]["labels"].items()
    )
