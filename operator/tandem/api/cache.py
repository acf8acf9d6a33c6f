"""The `MooncakeCache` kind (tandem.dev/v1alpha1): the shared KV cache pools fall back to on local misses.

What it owns: spec and status of a Mooncake deployment: master (with HA when asked), metadata service,
store servers and what pools need to connect. Names follow Mooncake's own flags and config keys
(integration.md §3; docs/design/003-mooncake.md cites the version followed). Placement and wiring are
computed by core/ and builders/; this module only declares the shape and the static rules.

Running example: the reference fleet's cache runs one master, P2P handshake metadata, and one store
per GPU node with a 64 GiB segment, over TCP by default (RDMA when the cluster names its devices).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from tandem.api.base import (
    ApiModel,
    LabelKey,
    LabelValue,
    PositiveQuantity,
    Quantity,
    Rule,
    cel,
    image_field,
)
from tandem.api.common import URL_PASSWORD_PATTERN, ConditionList, Resources, Toleration
from tandem.api.pool import RdmaResource


class MasterHa(ApiModel):
    """Primary/standby masters with leader election (Mooncake `--enable_ha`)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "!self.enabled || has(self.connString)",
                "master.ha.connString is required when master.ha.enabled",
                field_path=".connString",
            )
        )
    }

    enabled: bool = False
    """Run several masters with leader election."""
    backend: Literal["etcd", "redis"] = "etcd"
    """Leader-election backend (`--ha_backend_type`). The Kubernetes-lease backend needs a special Mooncake build and
    is not offered."""
    conn_string: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=512,
                json_schema_extra=cel(
                    Rule(
                        f"!self.matches('{URL_PASSWORD_PATTERN.replace(chr(92), chr(92) * 2)}')",
                        "ha.connString may not carry a password (user:password@): the backend must not need one "
                        "in the spec",
                    )
                ),
            ),
        ]
        | None
    ) = None
    """Backend address (`--ha_backend_connstring`), e.g. `etcd-0:2379;etcd-1:2379` or `redis://redis:6379`."""


class MasterSpec(ApiModel):
    """The Mooncake master: allocates segments and tracks where every KV object lives."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "self.replicas == 1 || self.ha.enabled",
                "master.replicas > 1 requires master.ha.enabled",
                field_path=".replicas",
            ),
            Rule(
                "self.rpcPort != self.metricsPort",
                "master.metricsPort must differ from master.rpcPort (both listen in the master pod)",
                field_path=".metricsPort",
            ),
        )
    }

    replicas: Annotated[int, Field(ge=1, le=3)] = 1
    """Master replicas; more than one needs ha.enabled."""
    ha: MasterHa = MasterHa()
    """High availability."""
    rpc_port: Annotated[int, Field(ge=1024, le=65535)] = 50051
    """RPC port (`--rpc_port`)."""
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9003
    """HTTP port for /metrics and /health (`--metrics_port`)."""
    resources: Resources = Resources(cpu="4", memory="8Gi")
    """Master container resources."""


class MetadataSpec(ApiModel):
    """How transfer engines find each other's segments."""

    type: Literal["P2PHandshake", "HTTP"] = "P2PHandshake"
    """P2PHandshake (nothing to run; Mooncake's recommended start) or HTTP (a metadata server Tandem runs)."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 8080
    """Port of the HTTP metadata server."""


class TransportSpec(ApiModel):
    """Network transport for KV objects."""

    protocol: Literal["tcp", "rdma"] = "tcp"
    """`rdma` needs devices and usually an RDMA device resource; `tcp` works everywhere."""
    devices: Annotated[
        list[Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]], Field(max_length=16)
    ] = []
    """RDMA device names (`device_name`), e.g. `ionic_0`; empty lets Mooncake auto-discover."""
    rdma: RdmaResource | None = None
    """RDMA device resource each store requests."""


class StoreSpec(ApiModel):
    """Store servers: the memory pool that holds KV objects."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "quantity(self.segmentSize).isLessThan(quantity(self.memoryLimit))",
                "store.segmentSize must be less than store.memoryLimit",
                field_path=".segmentSize",
            ),
            Rule(
                "!(has(self.stores) && has(self.capacity))",
                "store: set stores or capacity, not both",
                field_path=".capacity",
            ),
        )
    }

    segment_size: PositiveQuantity = "64Gi"
    """Memory each store contributes to the pool (`global_segment_size`)."""
    memory_limit: PositiveQuantity = "80Gi"
    """Store pod memory limit; must exceed segmentSize (buffers and the process itself)."""
    cpu: PositiveQuantity = "8"
    """Store pod CPU."""
    stores: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Exact number of stores. Default: one per eligible node (up to maxPerNode)."""
    capacity: PositiveQuantity | None = None
    """Total capacity wanted; Tandem places ⌈capacity / segmentSize⌉ stores."""
    max_per_node: Annotated[int, Field(ge=1, le=8)] = 1
    """Most stores on one node."""
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] = {}
    """Node labels store nodes must have."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = []
    """Tolerations for store pods."""
    spread_topology_key: LabelKey = "topology.kubernetes.io/zone"
    """Stores are spread evenly across the values of this node label."""
    reserve_for_engines: Quantity = "256Gi"
    """Node memory kept free for engine pods when checking whether a store fits on a node."""
    transport: TransportSpec = TransportSpec()
    """Transport and devices."""


class ClientSpec(ApiModel):
    """How engines connect (the Mooncake config file Tandem generates for vLLM)."""

    local_buffer_size: PositiveQuantity = "4Gi"
    """Engine-side transfer buffer (`local_buffer_size`)."""


class MooncakeCacheSpec(ApiModel):
    """Desired state of a MooncakeCache."""

    image: Annotated[str, Field(max_length=512, json_schema_extra=image_field("image"))]
    """Image with the Mooncake master and store (`mooncake-transfer-engine-rocm` wheel), pinned by digest. Keep it in
    lock-step with the engine's Mooncake version."""
    version: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]
    """Mooncake version label, e.g. `0.3.13`."""
    master: MasterSpec = MasterSpec()
    """The master."""
    metadata_service: MetadataSpec = MetadataSpec()
    """The metadata service."""
    store: StoreSpec = StoreSpec()
    """Store servers."""
    client: ClientSpec = ClientSpec()
    """Engine-side settings."""
    python_hash_seed: Annotated[int, Field(ge=0, le=4_294_967_295)] = 0
    """PYTHONHASHSEED injected into every engine of every pool using this cache: prefix hashes must match across
    instances or cross-instance hits drop to zero."""


class StorePlacement(ApiModel):
    """One placed store."""

    node: Annotated[str, Field(max_length=253)]
    """Node name."""
    domain: Annotated[str, Field(max_length=63)] = ""
    """Value of the spread topology label on that node."""
    segment_bytes: Annotated[int, Field(ge=0)] = 0
    """Segment size in bytes."""
    ready: bool = False
    """Whether the store pod is Ready."""


class CacheEndpoints(ApiModel):
    """Addresses engines use."""

    master: Annotated[str, Field(max_length=512)] = ""
    """master_server_address."""
    metadata: Annotated[str, Field(max_length=512)] = ""
    """metadata_server."""


class MooncakeCacheStatus(ApiModel):
    """Observed state of a MooncakeCache."""

    observed_generation: Annotated[int, Field(ge=0)] = 0
    """The .metadata.generation this status describes."""
    conditions: ConditionList = []
    """Ready, Degraded, Progressing."""
    stores_desired: Annotated[int, Field(ge=0)] = 0
    """Stores placed."""
    stores_ready: Annotated[int, Field(ge=0)] = 0
    """Stores Ready."""
    stores: Annotated[str, Field(max_length=32)] = "0/0"
    """Ready/desired stores, as printed by kubectl."""
    capacity_bytes: Annotated[int, Field(ge=0)] = 0
    """Placed capacity in bytes."""
    ready_capacity_bytes: Annotated[int, Field(ge=0)] = 0
    """Capacity of Ready stores in bytes."""
    capacity: Annotated[str, Field(max_length=32)] = "0"
    """Ready capacity as a quantity, as printed by kubectl."""
    placement: Annotated[list[StorePlacement], Field(max_length=1024)] = []
    """Where each store runs."""
    endpoints: CacheEndpoints = CacheEndpoints()
    """Addresses engines connect to."""
    python_hash_seed: Annotated[int, Field(ge=0, le=4_294_967_295)] = 0
    """The PYTHONHASHSEED pools receive."""
    config_hash: Annotated[str, Field(max_length=16)] = ""
    """Hash of the connection settings; pools pick up a change through their normal rollout."""
    referenced_by: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=256)] = []
    """Pools using this cache."""
    last_placement_change: datetime | None = None
    """When stores last moved."""
