"""Instance pods: one Pod per prefill or decode instance of a pair, built from a revision snapshot.

What it owns: `build_instance_pod(params) -> dict`, the whole pod manifest. Pure and deterministic:
no environment reads, no clock, no test-only branches. Pods are built from a `RevisionSpec` (never
from the live spec), so a stable pod recreated mid-rollout keeps the stable image and flags.

What goes in (integration.md names, vLLM 0.33):
- `vllm serve <model>` with `--served-model-name`, `--tensor-parallel-size`, `--pipeline-parallel-size`,
  `--max-model-len`, `--max-num-seqs` (admission.maxInFlight), prefix caching on/off and
  `--kv-transfer-config` (prefill = `kv_producer`, decode = `kv_consumer` for every P->D connector;
  MooncakeConnector with an explicit `mooncake_protocol`; MoRIIOConnector with its `http_port`, handshake and
  notify ports and `read_mode`; with a MooncakeCache a MultiConnector adds
  `MooncakeStoreConnector`: `kv_both` on prefill, `kv_consumer` on decode), then the stack's and
  the role's extra args.
- env: one fleet-wide `PYTHONHASHSEED`, the pod IP as `VLLM_HOST_IP` (also the address MoRIIOConnector
  advertises to its peer) and
  `MOONCAKE_REQUESTER_LOCAL_HOSTNAME` (or `VLLM_NIXL_SIDE_CHANNEL_HOST`), the Mooncake bootstrap port on
  prefill, `MOONCAKE_CONFIG_PATH` when a cache is wired, the weights token as a file.
- termination grace: `drainTimeout` + a margin (`termination_grace_s`).
- GPUs as `limits` (= requests) of the pool's GPU resource; probes on vLLM's `/health`; PSS restricted
  (non-root uid 65532, read-only root with a scratch emptyDir at /tmp for HOME, TMPDIR and caches, no
  privilege escalation, every capability dropped, RuntimeDefault seccomp), except with an RDMA resource:
  then exactly `IPC_LOCK` as uid 0 (see `tandem.builders.common.container_security`).
- Placement: a required node affinity on the node the planner chose; without one, a required pod
  affinity keeps the pair's instances together (same node, or same pair topology domain).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tandem.api.labels import (
    COMPONENT_ENGINE,
    GPU_DEVICE_IDS,
    LABEL_COMPONENT,
    LABEL_GPU_DEVICE_ID,
    LABEL_INSTANCE,
    LABEL_INSTANCE_NAME,
    LABEL_NAME,
    LABEL_PAIR,
    LABEL_REVISION,
    LABEL_ROLE,
    LABEL_SHAPE,
    LABEL_VERSION,
    Role,
    cache_client_configmap_name,
    pair_id,
    pod_name,
    shape_text,
)
from tandem.api.quantity import parse_quantity
from tandem.api.revision import RevisionSpec, pair_shape
from tandem.builders.common import (
    SCRATCH_DIR,
    base_labels,
    container_security,
    metadata,
    owner_reference,
    scratch_volume,
)
from tandem.routing.table import DEFAULT_MORIIO_HANDSHAKE_PORT, DEFAULT_MORIIO_NOTIFY_PORT

ENGINE_PORT = 8000
MOONCAKE_BOOTSTRAP_PORT = 8998
NIXL_SIDE_CHANNEL_PORT = 5600
MOONCAKE_CONFIG_DIR = "/etc/mooncake"
TOKEN_DIR = "/var/run/secrets/tandem/model-token"
MODEL_CACHE_DIR = "/models-cache"
DEFAULT_CPU_PER_GPU = 8
DEFAULT_MEMORY_GI_PER_GPU = 64
LABEL_HOSTNAME = "kubernetes.io/hostname"
DEFAULT_DRAIN_TIMEOUT_S = 120.0
"""The API's default ``spec.pairs.drainTimeout`` (for callers that build a pod without a pool)."""
TERMINATION_MARGIN_S = 15
"""Seconds beyond ``drainTimeout`` an engine gets after SIGTERM: vLLM stops accepting, lets open requests
finish, then frees the GPU and its KV-transfer agent; the margin covers that last part."""
SCRATCH_ENV: tuple[dict[str, str], ...] = (
    {"name": "HOME", "value": SCRATCH_DIR},
    {"name": "TMPDIR", "value": SCRATCH_DIR},
    {"name": "XDG_CACHE_HOME", "value": f"{SCRATCH_DIR}/.cache"},
    {"name": "XDG_CONFIG_HOME", "value": f"{SCRATCH_DIR}/.config"},
    {"name": "VLLM_CACHE_ROOT", "value": f"{SCRATCH_DIR}/vllm"},
    {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{SCRATCH_DIR}/torchinductor"},
)
"""Where vLLM and its libraries write, on the scratch emptyDir (the root filesystem is read-only):
HOME (Triton, MIOpen, usage stats), TMPDIR (ZMQ sockets, vllm_dist_*), the compile caches. The inductor
path is explicit because its default embeds `getpass.getuser()`, which fails for a uid without a passwd
entry (docs real-engine.md)."""
ENGINE_SUPPLEMENTAL_GROUPS = (44,)
"""`video`, the usual group of the AMD GPU device nodes (/dev/kfd, /dev/dri) on ROCm hosts, so the
non-root engine can open them. Hosts whose `render` group owns them need that gid too (host-specific)."""


@dataclass(frozen=True)
class InstanceParams:
    """Everything one instance pod is built from."""

    pool: str
    namespace: str
    pool_uid: str
    pair: int
    role: Role
    instance: int
    revision: str
    spec: RevisionSpec
    node: str | None = None
    cache_name: str | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    """The pool's ``spec.pairs.drainTimeout`` when the pod is built (sets its termination grace)."""
    shape: tuple[int, int] | None = None
    """The pair group's (prefill, decode) instances; None: the revision's. A group keeps the shape it was built
    with when the pool's P:D changes (design note 012 §5), so it is not always the revision's."""

    @property
    def group_shape(self) -> tuple[int, int]:
        return self.shape or pair_shape(self.spec)


def termination_grace_s(drain_timeout_s: float) -> int:
    """``terminationGracePeriodSeconds`` of an engine pod: ``drainTimeout`` plus :data:`TERMINATION_MARGIN_S`.

    Why tied to drainTimeout: the operator itself deletes a serving pair only after draining it, so its pods
    get SIGTERM with no stream open; a pod stopped by anything else (an eviction, a node drain, a
    ``kubectl delete``) gets as long as a drain would have given its open streams before SIGKILL. No preStop
    hook: a terminating pod makes its pair not Ready, the operator takes it out of the table at once, and a
    router that still sends a prefill there gets a refused connection and walks on (no client error).
    """
    return math.ceil(max(0.0, drain_timeout_s)) + TERMINATION_MARGIN_S


def model_location(source: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(model argument for vllm serve, volumes, volume mounts) for a weights source URI."""
    scheme, _, rest = source.partition("://")
    if scheme == "hf":
        return rest, [], []
    if scheme == "file":
        return rest if rest.startswith("/") else "/" + rest, [], []
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": "model", "mountPath": f"/models/{claim}", "readOnly": True}
        return f"/models/{claim}/{path}".rstrip("/"), [volume], [mount]
    if scheme == "oci":
        volume = {"name": "model", "image": {"reference": rest, "pullPolicy": "IfNotPresent"}}
        return "/models/oci", [volume], [{"name": "model", "mountPath": "/models/oci", "readOnly": True}]
    return source, [], []  # s3:// and gs:// are read by the engine's model streamer


def mooncake_protocol(spec: RevisionSpec) -> str:
    """The transport of the P->D MooncakeConnector. vLLM defaults it to `rdma`, which fails on a node
    without an RDMA device, so Tandem always says which: `rdma` exactly when the pool asks for an RDMA
    device resource (the pod then holds one), `tcp` otherwise (works on any network)."""
    return "rdma" if spec.placement.rdma is not None else "tcp"


def _p2p_connector(spec: RevisionSpec, role: Role) -> dict[str, Any]:
    """The P->D connector's own config. Every connector gets a per-role `kv_role` (NixlConnector's
    `kv_both` is deprecated in vLLM 0.32/0.33); its extra config lives in this dict, because a
    MultiConnector hands each child only the child's own dict."""
    connector = spec.stack.kv_transfer.connector
    config: dict[str, Any] = {
        "kv_connector": connector,
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
    }
    if connector == "MooncakeConnector":
        config["kv_connector_extra_config"] = {"mooncake_protocol": mooncake_protocol(spec)}
    if connector == "MoRIIOConnector":
        config["kv_connector_extra_config"] = moriio_extra_config(spec)
    return config


def moriio_extra_config(spec: RevisionSpec) -> dict[str, Any]:
    """MoRIIOConnector's extra config (keys as vLLM's `MoRIIOConfig.from_vllm_config` reads them). `http_port`
    has no default there (a missing key fails the engine's start); the handshake and notify ports are written
    out although they equal vLLM's defaults, because the router hands them to the other leg from the routing
    table (`tandem.routing.table`), so both must name the same ports. No `proxy_ip`: the router learns
    instances from the routing table, not from MoRIIO's ZMQ heartbeats. `read_mode` is set on both roles,
    because the two sides of a transfer must agree on it."""
    return {
        "http_port": ENGINE_PORT,
        "handshake_port": DEFAULT_MORIIO_HANDSHAKE_PORT,
        "notify_port": DEFAULT_MORIIO_NOTIFY_PORT,
        "read_mode": spec.stack.kv_transfer.moriio_mode == "Read",
    }


def kv_transfer_config(spec: RevisionSpec, role: Role) -> dict[str, Any]:
    """The `--kv-transfer-config` of one role (vLLM 0.33 connector names)."""
    producer = role == "prefill"
    config = _p2p_connector(spec, role)
    if spec.cache is not None:
        # The shared tier rides along any P->D connector through a MultiConnector. Decoders only read
        # from the store (they write only with save_decode_cache), so their store child is a consumer.
        # The store child reads its transport from the cache's mooncake.json (MOONCAKE_CONFIG_PATH).
        config = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_producer" if producer else "kv_consumer",
            "kv_connector_extra_config": {
                "connectors": [
                    config,
                    {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both" if producer else "kv_consumer"},
                ]
            },
        }
    if spec.stack.kv_transfer.load_failure_policy != "fail":
        # Read by the scheduler from the top-level config, so it stays there even with a MultiConnector.
        config["kv_load_failure_policy"] = spec.stack.kv_transfer.load_failure_policy
    return config


def engine_args(spec: RevisionSpec, role: Role, model_arg: str) -> list[str]:
    shape = spec.prefill if role == "prefill" else spec.decode
    tp = shape.tensor_parallel or shape.gpus_per_instance // shape.pipeline_parallel
    args = [
        model_arg,
        f"--served-model-name={spec.model.served_name}",
        "--host=0.0.0.0",
        f"--port={ENGINE_PORT}",
        f"--tensor-parallel-size={tp}",
        f"--pipeline-parallel-size={shape.pipeline_parallel}",
        f"--max-model-len={spec.model.max_context_tokens}",
        f"--max-num-seqs={spec.admission.max_in_flight}",
        "--enable-prefix-caching" if spec.kv_cache.local_prefix_caching else "--no-enable-prefix-caching",
        "--kv-transfer-config=" + json.dumps(kv_transfer_config(spec, role), sort_keys=True, separators=(",", ":")),
    ]
    if spec.model.revision:
        args.append(f"--revision={spec.model.revision}")
    override = spec.stack.prefill if role == "prefill" else spec.stack.decode
    return [*args, *spec.stack.args, *override.args]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def engine_env(
    spec: RevisionSpec, role: Role, pool: str, pair: str, revision: str = "", shape: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """The engine's environment. ``TANDEM_REVISION`` is the pod's revision where nobody can edit it (a
    container's env is immutable, labels are not): the planner trusts it over the label and restores
    a label a foreign writer changed, instead of seeing a pair that mixes revisions. ``TANDEM_PAIR_SHAPE`` is
    the group's shape, immutable for the same reason: a group's expected instances come from it."""
    seed = spec.cache.python_hash_seed if spec.cache is not None else 0
    env: list[dict[str, Any]] = [
        {"name": "PYTHONHASHSEED", "value": str(seed)},
        _field_env("VLLM_HOST_IP", "status.podIP"),
        {"name": "TANDEM_POOL", "value": pool},
        {"name": "TANDEM_PAIR", "value": pair},
        {"name": "TANDEM_ROLE", "value": role},
        *([{"name": "TANDEM_REVISION", "value": revision}] if revision else []),
        *([{"name": "TANDEM_PAIR_SHAPE", "value": shape_text(shape)}] if shape else []),
        {"name": "HF_HOME", "value": MODEL_CACHE_DIR},
        *SCRATCH_ENV,
    ]
    connector = spec.stack.kv_transfer.connector
    if connector == "MooncakeConnector" or spec.cache is not None:
        env.append(_field_env("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", "status.podIP"))
    if connector == "MooncakeConnector" and role == "prefill":
        env.append({"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(MOONCAKE_BOOTSTRAP_PORT)})
    if connector == "NixlConnector":
        env.append(_field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP"))
    if spec.cache is not None:
        env.append({"name": "MOONCAKE_CONFIG_PATH", "value": f"{MOONCAKE_CONFIG_DIR}/mooncake.json"})
    if spec.model.token_secret_ref is not None:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{TOKEN_DIR}/token"})
    override = spec.stack.prefill if role == "prefill" else spec.stack.decode
    for var in [*spec.stack.env, *override.env]:
        env.append(var.wire())
    return env


def _resources(spec: RevisionSpec, role: Role) -> dict[str, Any]:
    shape = spec.prefill if role == "prefill" else spec.decode
    override = (spec.stack.prefill if role == "prefill" else spec.stack.decode).resources
    gpus = shape.gpus_per_instance
    cpu = override.cpu if override and override.cpu else str(DEFAULT_CPU_PER_GPU * gpus)
    memory = override.memory if override and override.memory else f"{DEFAULT_MEMORY_GI_PER_GPU * gpus}Gi"
    amounts: dict[str, Any] = {"cpu": cpu, "memory": memory, spec.placement.gpu_resource: str(gpus)}
    if spec.placement.rdma is not None:
        amounts[spec.placement.rdma.name] = str(spec.placement.rdma.per_instance)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _affinity(params: InstanceParams) -> dict[str, Any]:
    spec = params.spec
    terms: list[dict[str, Any]] = []
    if params.node is not None:
        terms.append({"key": LABEL_HOSTNAME, "operator": "In", "values": [params.node]})
    if spec.placement.gpu_product is not None:
        terms.append(
            {"key": LABEL_GPU_DEVICE_ID, "operator": "In", "values": [GPU_DEVICE_IDS[spec.placement.gpu_product]]}
        )
    affinity: dict[str, Any] = {}
    if terms:
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": terms}]}
        }
    if params.node is None and spec.placement.pair_colocation != "None":
        key = (
            LABEL_HOSTNAME if spec.placement.pair_colocation == "SameNodeWhenFits" else spec.placement.pair_topology_key
        )
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {LABEL_PAIR: pair_id(params.pool, params.pair)}},
                    "topologyKey": key,
                }
            ]
        }
    return affinity


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def instance_labels(params: InstanceParams) -> dict[str, str]:
    labels = base_labels(params.pool)
    labels.update(
        {
            LABEL_PAIR: pair_id(params.pool, params.pair),
            LABEL_ROLE: params.role,
            LABEL_INSTANCE: str(params.instance),
            LABEL_REVISION: params.revision,
            LABEL_SHAPE: shape_text(params.group_shape),
            LABEL_COMPONENT: COMPONENT_ENGINE,
            LABEL_NAME: "tandem-engine",
            LABEL_VERSION: params.spec.stack.version,
            LABEL_INSTANCE_NAME: params.pool,
        }
    )
    return labels


def build_instance_pod(params: InstanceParams) -> dict[str, Any]:
    """The Pod of one prefill or decode instance (see module docstring)."""
    spec = params.spec
    name = pod_name(params.pool, params.pair, params.role, params.instance)
    model_arg, volumes, mounts = model_location(spec.model.source)
    gpus = (spec.prefill if params.role == "prefill" else spec.decode).gpus_per_instance
    shm = f"{min(64, 8 * gpus)}Gi"
    scratch, scratch_mount = scratch_volume()
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "model-cache", "emptyDir": {}},
        scratch,
        *volumes,
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
        scratch_mount,
        *mounts,
    ]
    if spec.model.token_secret_ref is not None:
        ref = spec.model.token_secret_ref
        volumes.append(
            {"name": "model-token", "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": "token"}]}}
        )
        mounts.append({"name": "model-token", "mountPath": TOKEN_DIR, "readOnly": True})
    if spec.cache is not None and params.cache_name:
        volumes.append({"name": "mooncake", "configMap": {"name": cache_client_configmap_name(params.cache_name)}})
        mounts.append({"name": "mooncake", "mountPath": MOONCAKE_CONFIG_DIR, "readOnly": True})
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if params.role == "prefill" and spec.stack.kv_transfer.connector == "MooncakeConnector":
        ports.append({"name": "kv-bootstrap", "containerPort": MOONCAKE_BOOTSTRAP_PORT, "protocol": "TCP"})
    if spec.stack.kv_transfer.connector == "NixlConnector":
        ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    if spec.stack.kv_transfer.connector == "MoRIIOConnector":
        ports.append({"name": "moriio-hs", "containerPort": DEFAULT_MORIIO_HANDSHAKE_PORT, "protocol": "TCP"})
        ports.append({"name": "moriio-notify", "containerPort": DEFAULT_MORIIO_NOTIFY_PORT, "protocol": "TCP"})
    container = {
        "name": "engine",
        "image": spec.stack.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm", "serve"],
        "args": engine_args(spec, params.role, model_arg),
        "env": engine_env(
            spec, params.role, params.pool, pair_id(params.pool, params.pair), params.revision, params.group_shape
        ),
        "ports": ports,
        "resources": _resources(spec, params.role),
        "volumeMounts": mounts,
        "startupProbe": _probe(10, 360),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(15, 4),
        "securityContext": container_security(ipc_lock=spec.placement.rdma is not None),
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": termination_grace_s(params.drain_timeout_s),
        "securityContext": {
            "seccompProfile": {"type": "RuntimeDefault"},
            "supplementalGroups": list(ENGINE_SUPPLEMENTAL_GROUPS),
        },
        "tolerations": [t.wire() for t in spec.placement.tolerations],
    }
    if spec.placement.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.placement.node_selector.items()))
    affinity = _affinity(params)
    if affinity:
        pod_spec["affinity"] = affinity
    if spec.placement.priority_class_name:
        pod_spec["priorityClassName"] = spec.placement.priority_class_name
    owner = owner_reference("InferencePool", params.pool, params.pool_uid)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, params.namespace, instance_labels(params), owner),
        "spec": pod_spec,
    }


def gpus_of(spec: RevisionSpec, role: Role) -> int:
    return (spec.prefill if role == "prefill" else spec.decode).gpus_per_instance


def memory_bytes(quantity: str) -> int:
    return int(parse_quantity(quantity))
