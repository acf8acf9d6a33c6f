"""Simulated AMD Instinct GPU nodes for the local (KWOK) cluster.

What it owns: the label keys and values the AMD GPU operator puts on a real node (node labeller, NFD
rule, partition labels; integration.md §1.2), the host shape of an 8-GPU MI300X/MI325X/MI355X server,
``build_gpu_node`` (a pure manifest builder) and a few kubectl helpers that add, delete, cordon a node
or change its ``amd.com/gpu`` allocatable for fault tests.

What it must not do: taint nodes (Tandem pods would need a test-only toleration), or invent label
keys: code and tests share the constants below.

Label rule (ROCm k8s-device-plugin node labeller, homogeneous node): for each enabled property it sets
``amd.com/gpu.<kind>=<value>``, ``beta.amd.com/gpu.<kind>=<value>`` and the per-value counter
``beta.amd.com/gpu.<kind>.<value>=<gpu count>``; ``driver-version`` has no ``beta.`` twin. Worked
example, 8 × MI325X: ``amd.com/gpu.device-id=74a5``, ``beta.amd.com/gpu.device-id=74a5``,
``beta.amd.com/gpu.device-id.74a5=8``.

Values marked UNVERIFIED in integration.md (MI325X/MI355X product-name, vram, cu/simd counts) are the
expected ones; select on ``amd.com/gpu.device-id`` (verified) in product code.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tandem_lab.dev.kube import Kubectl

# Extended resource (device plugin, `single` naming strategy).
RESOURCE_GPU = "amd.com/gpu"

# Node labeller (amd.com/gpu.*) — homogeneous-node form.
LABEL_GPU_DEVICE_ID = "amd.com/gpu.device-id"
LABEL_GPU_PRODUCT_NAME = "amd.com/gpu.product-name"
LABEL_GPU_FAMILY = "amd.com/gpu.family"
LABEL_GPU_VRAM = "amd.com/gpu.vram"
LABEL_GPU_CU_COUNT = "amd.com/gpu.cu-count"
LABEL_GPU_SIMD_COUNT = "amd.com/gpu.simd-count"
LABEL_GPU_DRIVER_VERSION = "amd.com/gpu.driver-version"
LABEL_GPU_COMPUTE_MEMORY_PARTITION = "amd.com/gpu.compute-memory-partition"
LABEL_GPU_COMPUTE_PARTITIONING_SUPPORTED = "amd.com/gpu.compute-partitioning-supported"
LABEL_GPU_MEMORY_PARTITIONING_SUPPORTED = "amd.com/gpu.memory-partitioning-supported"
BETA_PREFIX = "beta."
# Properties the labeller also publishes under beta.amd.com/gpu.* (value + per-value count).
BETA_TWINNED: tuple[str, ...] = (
    LABEL_GPU_DEVICE_ID,
    LABEL_GPU_PRODUCT_NAME,
    LABEL_GPU_FAMILY,
    LABEL_GPU_VRAM,
    LABEL_GPU_CU_COUNT,
    LABEL_GPU_SIMD_COUNT,
)
# Node Feature Discovery rule shipped with the AMD GPU operator.
LABEL_NFD_AMD_GPU = "feature.node.kubernetes.io/amd-gpu"

# Kubernetes well-known labels.
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
# No well-known rack label exists; this is ours (placement tests spread over it).
LABEL_RACK = "tandem.dev/rack"
# Marks nodes made by this module, so helpers and cleanup never touch anything else.
LABEL_SIM_NODE = "tandem.dev/sim-node"

# KWOK manages nodes carrying this annotation; ttl 0 disables the node TTL controller's guessing.
ANNOTATION_KWOK_NODE = "kwok.x-k8s.io/node"
ANNOTATION_NODE_TTL = "node.alpha.kubernetes.io/ttl"

DEFAULT_DRIVER_VERSION = "6.12.12"
DEFAULT_PARTITION = "spx_nps1"
DEFAULT_REGION = "local"
DEFAULT_ZONES: tuple[str, ...] = ("zone-a", "zone-b")
DEFAULT_NODES_PER_RACK = 2
DEFAULT_KUBELET_VERSION = "v1.34.4"
CONTAINER_RUNTIME_VERSION = "containerd://1.7.27"
KERNEL_VERSION = "6.8.0-60-generic"
OS_IMAGE = "Ubuntu 22.04.5 LTS"


@dataclass(frozen=True)
class GpuProduct:
    """One Instinct model: what the labeller reports and the host it ships in."""

    name: str  # CLI name, e.g. "MI325X"
    device_id: str  # lower-case hex, no 0x
    product_name: str  # sysfs name, spaces -> "_"
    vram: str  # rounded GiB + "G"
    cu_count: int
    simd_count: int
    family: str
    host_cpu: str  # capacity, logical CPUs
    host_memory: str  # capacity
    host_ephemeral_storage: str


PRODUCTS: dict[str, GpuProduct] = {
    p.name: p
    for p in (
        GpuProduct(
            name="MI300X",
            device_id="74a1",
            product_name="AMD_Instinct_MI300X_OAM",
            vram="192G",
            cu_count=304,
            simd_count=1216,
            family="AI",
            host_cpu="192",
            host_memory="2Ti",
            host_ephemeral_storage="7Ti",
        ),
        GpuProduct(
            name="MI325X",
            device_id="74a5",
            product_name="AMD_Instinct_MI325_OAM",  # UNVERIFIED (integration.md §1.2)
            vram="256G",  # UNVERIFIED
            cu_count=304,  # UNVERIFIED
            simd_count=1216,  # UNVERIFIED
            family="AI",  # UNVERIFIED for gfx942 beyond MI300X
            host_cpu="192",
            host_memory="2Ti",
            host_ephemeral_storage="7Ti",
        ),
        GpuProduct(
            name="MI355X",
            device_id="75a3",
            product_name="AMD_Instinct_MI355_OAM",  # UNVERIFIED
            vram="288G",  # UNVERIFIED
            cu_count=256,  # UNVERIFIED
            simd_count=1024,  # UNVERIFIED
            family="AI",  # UNVERIFIED
            host_cpu="256",
            host_memory="3Ti",
            host_ephemeral_storage="14Ti",
        ),
    )
}

# What the kubelet keeps back on such a host (system-reserved + kube-reserved + eviction threshold).
RESERVED_CPU_MILLI = 2000
RESERVED_MEMORY_GI = 16
PODS_PER_NODE = "110"


@dataclass(frozen=True)
class NodeSpec:
    """Everything that makes one simulated GPU node."""

    name: str
    product: str = "MI325X"
    gpus: int = 8
    zone: str = DEFAULT_ZONES[0]
    region: str = DEFAULT_REGION
    rack: str = "zone-a-rack-0"
    partition: str = DEFAULT_PARTITION
    driver_version: str = DEFAULT_DRIVER_VERSION
    kubelet_version: str = DEFAULT_KUBELET_VERSION
    internal_ip: str = ""  # fake, never dialled; pods' hostIP comes from it
    extra_labels: tuple[tuple[str, str], ...] = ()
    pod_cidr: str = ""
    """``spec.podCIDR``: KWOK gives the node's pods addresses from it (empty: kwok-controller's default CIDR).
    A range inside 127.0.0.0/8 makes every pod address a loopback address a local process can listen on."""


def product(name: str) -> GpuProduct:
    """Look a product up by CLI name (case-insensitive); ValueError lists the known ones."""
    try:
        return PRODUCTS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown GPU product {name!r}; known: {', '.join(PRODUCTS)}") from None


def gpu_labels(prod: GpuProduct, gpus: int, partition: str, driver_version: str) -> dict[str, str]:
    """The node labeller + NFD labels of a homogeneous node with ``gpus`` GPUs of ``prod``."""
    labels = {
        LABEL_GPU_DEVICE_ID: prod.device_id,
        LABEL_GPU_PRODUCT_NAME: prod.product_name,
        LABEL_GPU_FAMILY: prod.family,
        LABEL_GPU_VRAM: prod.vram,
        LABEL_GPU_CU_COUNT: str(prod.cu_count),
        LABEL_GPU_SIMD_COUNT: str(prod.simd_count),
        LABEL_GPU_DRIVER_VERSION: driver_version,
        LABEL_GPU_COMPUTE_MEMORY_PARTITION: partition,
        LABEL_GPU_COMPUTE_PARTITIONING_SUPPORTED: "true",
        LABEL_GPU_MEMORY_PARTITIONING_SUPPORTED: "true",
        LABEL_NFD_AMD_GPU: "true",
    }
    for key in BETA_TWINNED:
        value = labels[key]
        labels[BETA_PREFIX + key] = value
        labels[f"{BETA_PREFIX}{key}.{value}"] = str(gpus)
    return labels


def _allocatable_cpu(capacity: str) -> str:
    return f"{int(capacity) * 1000 - RESERVED_CPU_MILLI}m"


def _allocatable_memory(capacity: str) -> str:
    units = {"Ti": 1024, "Gi": 1}
    for suffix, factor in units.items():
        if capacity.endswith(suffix):
            return f"{int(capacity[: -len(suffix)]) * factor - RESERVED_MEMORY_GI}Gi"
    raise ValueError(f"unsupported memory quantity {capacity!r} (use Ti or Gi)")


def build_gpu_node(spec: NodeSpec) -> dict[str, Any]:
    """A v1 Node manifest for KWOK: labels, annotations, capacity and allocatable (pure).

    The status is part of the manifest because the API server keeps a Node's status on create, and
    our KWOK ``node-initialize`` stage preserves capacity/allocatable when it marks the node Ready.
    """
    prod = product(spec.product)
    if spec.gpus < 0:
        raise ValueError("gpus must be >= 0")
    labels = {
        LABEL_HOSTNAME: spec.name,
        LABEL_OS: "linux",
        LABEL_ARCH: "amd64",
        LABEL_INSTANCE_TYPE: f"{prod.name.lower()}-{spec.gpus}gpu",
        LABEL_ZONE: spec.zone,
        LABEL_REGION: spec.region,
        LABEL_RACK: spec.rack,
        LABEL_SIM_NODE: "true",
        **gpu_labels(prod, spec.gpus, spec.partition, spec.driver_version),
        **dict(spec.extra_labels),
    }
    capacity = {
        "cpu": prod.host_cpu,
        "memory": prod.host_memory,
        "ephemeral-storage": prod.host_ephemeral_storage,
        "pods": PODS_PER_NODE,
        RESOURCE_GPU: str(spec.gpus),
    }
    addresses = [{"type": "Hostname", "address": spec.name}]
    if spec.internal_ip:
        addresses.insert(0, {"type": "InternalIP", "address": spec.internal_ip})
    node_uuid = uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec.name}.nodes.tandem.dev")
    allocatable = {
        **capacity,
        "cpu": _allocatable_cpu(prod.host_cpu),
        "memory": _allocatable_memory(prod.host_memory),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {ANNOTATION_KWOK_NODE: "fake", ANNOTATION_NODE_TTL: "0"},
        },
        "spec": {"podCIDR": spec.pod_cidr, "podCIDRs": [spec.pod_cidr]} if spec.pod_cidr else {},
        "status": {
            "addresses": addresses,
            "capacity": capacity,
            "allocatable": allocatable,
            # All fields are required by the API schema; ids are stable per node name.
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": OS_IMAGE,
                "kernelVersion": KERNEL_VERSION,
                "containerRuntimeVersion": CONTAINER_RUNTIME_VERSION,
                "kubeletVersion": spec.kubelet_version,
                "kubeProxyVersion": spec.kubelet_version,
                "machineID": node_uuid.hex,
                "systemUUID": str(node_uuid),
                "bootID": str(uuid.uuid5(node_uuid, "boot")),
            },
        },
    }


def plan_fleet(
    count: int,
    *,
    product_name: str = "MI325X",
    gpus: int = 8,
    zones: Sequence[str] = DEFAULT_ZONES,
    region: str = DEFAULT_REGION,
    nodes_per_rack: int = DEFAULT_NODES_PER_RACK,
    start: int = 0,
    kubelet_version: str = DEFAULT_KUBELET_VERSION,
) -> list[NodeSpec]:
    """``count`` node specs spread round-robin over ``zones``, ``nodes_per_rack`` per rack.

    Worked example: 6 nodes, zones (zone-a, zone-b), 2 per rack -> mi325x-0 zone-a-rack-0,
    mi325x-1 zone-b-rack-0, mi325x-2 zone-a-rack-0, mi325x-3 zone-b-rack-0, mi325x-4 zone-a-rack-1,
    mi325x-5 zone-b-rack-1 (the k-th node of a zone goes to rack k // nodes_per_rack).
    """
    if not zones:
        raise ValueError("at least one zone is needed")
    if nodes_per_rack < 1:
        raise ValueError("nodes_per_rack must be >= 1")
    prod = product(product_name)
    specs = []
    for i in range(start, start + count):
        zone = zones[i % len(zones)]
        in_zone = i // len(zones)
        specs.append(
            NodeSpec(
                name=f"{prod.name.lower()}-{i}",
                product=prod.name,
                gpus=gpus,
                zone=zone,
                region=region,
                rack=f"{zone}-rack-{in_zone // nodes_per_rack}",
                kubelet_version=kubelet_version,
                internal_ip=node_ip(i),
            )
        )
    return specs


def node_ip(index: int) -> str:
    """The fake InternalIP of the index-th simulated node: 10.250.0.1, ..., 10.250.0.250, 10.250.1.1."""
    if not 0 <= index < 250 * 256:
        raise ValueError("node index out of range")
    return f"10.250.{index // 250}.{index % 250 + 1}"


# --- kubectl helpers (I/O) -------------------------------------------------------------------------


def add_nodes(kubectl: Kubectl, specs: Sequence[NodeSpec]) -> None:
    """Create the nodes (fails if one exists)."""
    if specs:
        kubectl.create(*(build_gpu_node(s) for s in specs))


def delete_node(kubectl: Kubectl, name: str, wait: bool = True) -> None:
    """Delete one node; pods bound to it are garbage-collected by the controller manager."""
    kubectl.run("delete", "node", name, "--ignore-not-found", f"--wait={str(wait).lower()}")


def set_gpu_allocatable(kubectl: Kubectl, name: str, gpus: int) -> None:
    """Change ``status.allocatable["amd.com/gpu"]`` (e.g. 0 = device plugin down) for fault tests.

    Capacity is left alone, like a real device plugin reporting unhealthy devices.
    """
    patch = {"status": {"allocatable": {RESOURCE_GPU: str(gpus)}}}
    kubectl.run("patch", "node", name, "--subresource=status", "--type=merge", "-p", _json(patch))


def cordon(kubectl: Kubectl, name: str, unschedulable: bool = True) -> None:
    """Cordon (or uncordon) a node."""
    kubectl.run("cordon" if unschedulable else "uncordon", name)


def node_is_ready(node: dict[str, Any]) -> bool:
    """True when the node's Ready condition is True."""
    for cond in node.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def wait_nodes_ready(kubectl: Kubectl, names: Sequence[str], timeout_s: float = 60.0) -> None:
    """Block until every named node is Ready (KWOK's node-initialize stage ran)."""
    wanted = set(names)

    def ready() -> bool:
        items = kubectl.json("get", "nodes")["items"]
        done = {n["metadata"]["name"] for n in items if node_is_ready(n)}
        return wanted <= done

    kubectl.wait_for(f"nodes {sorted(wanted)} Ready", ready, timeout_s=timeout_s)


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
