"""The two top-level kinds and everything the CRD needs beyond their schema.

What it owns: `InferencePool` and `MooncakeCache` as whole objects (apiVersion, kind, metadata, spec,
status), and a `KindInfo` per kind with names, short names, category, printer columns, subresources
and root-level rules. `tandem.api.crdgen` turns these into CRD manifests; nothing else defines them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tandem import API_VERSION, GROUP, VERSION
from tandem.api.base import Rule
from tandem.api.cache import MooncakeCacheSpec, MooncakeCacheStatus
from tandem.api.pool import InferencePoolSpec
from tandem.api.pool_status import InferencePoolStatus

MAX_NAME = 40  # derived names (<pool>-p12-decode-3, <pool>-routing) must stay within 63 characters


class ObjectMeta(BaseModel):
    """The parts of metadata Tandem reads. Unknown metadata fields are ignored, never rejected."""

    model_config = ConfigDict(alias_generator=None, populate_by_name=True, extra="ignore", frozen=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    resourceVersion: str = ""  # noqa: N815 - wire name kept: metadata is not ours to rename
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    finalizers: list[str] = []
    creationTimestamp: datetime | None = None  # noqa: N815
    deletionTimestamp: datetime | None = None  # noqa: N815


SpecT = TypeVar("SpecT", bound=BaseModel)
StatusT = TypeVar("StatusT", bound=BaseModel)


class Resource(BaseModel, Generic[SpecT, StatusT]):
    """A whole custom object as read from the API server or a manifest."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    apiVersion: Annotated[str, Field(pattern=f"^{GROUP}/{VERSION}$")] = API_VERSION  # noqa: N815
    kind: str
    metadata: ObjectMeta
    spec: SpecT
    status: StatusT | None = None


class InferencePool(Resource[InferencePoolSpec, InferencePoolStatus]):
    """One model, one traffic class, N prefill/decode pair groups on AMD GPU nodes."""

    kind: str = "InferencePool"


class MooncakeCache(Resource[MooncakeCacheSpec, MooncakeCacheStatus]):
    """A shared Mooncake KV cache that pools fall back to on local misses."""

    kind: str = "MooncakeCache"


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class KindInfo:
    """Everything about a kind that is not its spec/status schema."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    resource_model: type[BaseModel]
    printer_columns: tuple[PrinterColumn, ...]
    scale: dict[str, str] | None = None
    root_rules: tuple[Rule, ...] = field(default_factory=tuple)
    categories: tuple[str, ...] = ("tandem",)

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


_NAME_RULE = Rule(
    f"self.metadata.name.size() <= {MAX_NAME}",
    f"metadata.name must be at most {MAX_NAME} characters (Tandem derives pod and ConfigMap names from it)",
)
_DNS1035_RULE = Rule(
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter): "
    "Tandem derives Service names from it",
)
_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")
_READY = PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status', description="Ready condition")

INFERENCE_POOL = KindInfo(
    kind="InferencePool",
    plural="inferencepools",
    singular="inferencepool",
    short_names=("tpool",),
    description=(
        "InferencePool declares one model pool served by prefill/decode pair groups on AMD GPU nodes: "
        "Tandem keeps the pairs at the declared size, publishes a routing table, wires the shared "
        "Mooncake cache and rolls out new stack versions through metric-gated canaries. Not the Gateway "
        "API Inference Extension kind of the same name: always write inferencepools.tandem.dev."
    ),
    spec_model=InferencePoolSpec,
    status_model=InferencePoolStatus,
    resource_model=InferencePool,
    printer_columns=(
        PrinterColumn("Model", ".spec.model.servedName", description="Served model name"),
        PrinterColumn("Version", ".spec.stack.version", description="Stack version in the spec"),
        PrinterColumn("Pairs", ".status.pairs.summary", description="Ready/desired pair groups"),
        PrinterColumn("Step", ".status.rollout.step", description="Rollout step (index/count)"),
        _READY,
        _AGE,
        PrinterColumn("Class", ".spec.traffic.class", priority=1, description="Traffic class"),
        PrinterColumn("Stable", ".status.revisions.stable.version", priority=1, description="Stable version"),
        PrinterColumn("Canary", ".status.revisions.canary.version", priority=1, description="Canary version"),
        PrinterColumn("Phase", ".status.rollout.phase", priority=1, description="Rollout phase"),
    ),
    scale={
        "specReplicasPath": ".spec.pairs.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    },
    root_rules=(_NAME_RULE, _DNS1035_RULE),
)

MOONCAKE_CACHE = KindInfo(
    kind="MooncakeCache",
    plural="mooncakecaches",
    singular="mooncakecache",
    short_names=("mcache",),
    description=(
        "MooncakeCache declares a shared Mooncake KV cache (master, metadata service, store servers). "
        "Tandem places the stores across GPU nodes, reports capacity, and injects the connection into "
        "every InferencePool that references it."
    ),
    spec_model=MooncakeCacheSpec,
    status_model=MooncakeCacheStatus,
    resource_model=MooncakeCache,
    printer_columns=(
        PrinterColumn("Version", ".spec.version", description="Mooncake version"),
        PrinterColumn("Stores", ".status.stores", description="Ready/desired stores"),
        PrinterColumn("Capacity", ".status.capacity", description="Ready capacity"),
        _READY,
        _AGE,
        PrinterColumn("Master", ".status.endpoints.master", priority=1, description="Master address"),
    ),
    root_rules=(_NAME_RULE, _DNS1035_RULE),
)

KINDS: tuple[KindInfo, ...] = (INFERENCE_POOL, MOONCAKE_CACHE)
KIND_BY_NAME = {k.kind: k for k in KINDS}
