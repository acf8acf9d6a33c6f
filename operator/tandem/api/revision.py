"""A stack revision: the part of a pool's spec that shapes its pods, frozen under a short hash.

What it owns: `RevisionSpec` (what a pod is built from) and `revision_id` (its hash). A pool's pods are
always built from a *revision*, never straight from the live spec: during a rollout the stable pairs
must keep their old image and flags (a deleted stable pod comes back on the stable revision), so each
revision is stored as a snapshot (ConfigMap `<pool>-rev-<id>`) and pods carry the id in the
`tandem.dev/revision` label.

Why these fields: everything that changes an instance pod (model, stack, pair shape, placement,
admission flags, KV-cache wiring) is part of the revision; `pairs.replicas`, `routing`, `autoscaling`,
`rollout` and `traffic` are not (they change counts, routing or policy, never a pod), and neither are the
few placement/admission fields in `NOT_IN_POD` (spread key, GPU budget, the router's fast-reject limits).

The id hashes the snapshot with default-valued fields left out, so adding a new optional field with a
default to a later API version does not change existing ids (an operator upgrade rolls nothing).
"""

from __future__ import annotations

import hashlib
import json

from tandem.api.base import ApiModel
from tandem.api.pool import (
    AdmissionSpec,
    InferencePoolSpec,
    KvCacheSpec,
    ModelSpec,
    PlacementSpec,
    RoleShape,
    StackSpec,
)

REVISION_ID_LENGTH = 10


class CacheWiring(ApiModel):
    """What a pool's pods need from its MooncakeCache (empty when the pool has none)."""

    master_address: str = ""
    """Mooncake master_server_address."""
    metadata_server: str = ""
    """Mooncake metadata_server."""
    protocol: str = "tcp"
    """tcp or rdma."""
    device_names: str = ""
    """Comma-separated RDMA device names."""
    global_segment_size: int = 0
    """Bytes each engine contributes (0 = standalone stores)."""
    local_buffer_size: int = 4 * 2**30
    """Engine-side transfer buffer in bytes."""
    python_hash_seed: int = 0
    """Fleet-wide PYTHONHASHSEED."""


class RevisionSpec(ApiModel):
    """Everything an instance pod of one revision is built from."""

    model: ModelSpec
    """Model served."""
    stack: StackSpec
    """Engine image, args, env."""
    prefill: RoleShape
    """Prefill shape."""
    decode: RoleShape
    """Decode shape."""
    placement: PlacementSpec
    """Placement."""
    admission: AdmissionSpec
    """Admission flags."""
    kv_cache: KvCacheSpec
    """KV-cache settings."""
    cache: CacheWiring | None = None
    """Resolved MooncakeCache wiring."""


def revision_spec(spec: InferencePoolSpec, cache: CacheWiring | None = None) -> RevisionSpec:
    """The revision a pool's current spec asks for."""
    return RevisionSpec(
        model=spec.model,
        stack=spec.stack,
        prefill=spec.pairs.prefill,
        decode=spec.pairs.decode,
        placement=spec.placement,
        admission=spec.admission,
        kv_cache=spec.kv_cache,
        cache=cache,
    )


# Fields that ride along in the snapshot but never change a pod: they must not start a rollout.
NOT_IN_POD = {
    "placement": {"gpu_budget", "spread_topology_key"},
    "admission": {"max_queued", "max_kv_cache_utilization_percent", "reject_status"},
}


def revision_id(rev: RevisionSpec) -> str:
    """Short, stable hash of a revision (defaults and non-pod fields excluded; see module docstring)."""
    payload = rev.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True, exclude=NOT_IN_POD)
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return digest[:REVISION_ID_LENGTH]


def pair_shape(rev: RevisionSpec) -> tuple[int, int]:
    """The (prefill, decode) instances per pair group the revision was first built with."""
    return rev.prefill.instances, rev.decode.instances


def same_stack(a: RevisionSpec, b: RevisionSpec) -> bool:
    """Whether two revisions differ at most in their pair shape (instances per role).

    Why: a P:D change alone is not a new stack version. The planner keeps the revision that is running when
    the live spec differs from it only in shape, and new pair groups take the new shape as the fleet cycles
    (design note 012 §5), instead of rolling every group through canary steps. Revision ids still hash the
    shape (ids of existing pools do not change), so this comparison is where the shape is set aside.

    Example: 1P:1D → 2P:1D with the same image and flags → True; a new image → False."""

    def unshaped(rev: RevisionSpec) -> str:
        flat = rev.model_copy(
            update={
                "prefill": rev.prefill.model_copy(update={"instances": 1}),
                "decode": rev.decode.model_copy(update={"instances": 1}),
            }
        )
        return revision_id(flat)

    return unshaped(a) == unshaped(b)
