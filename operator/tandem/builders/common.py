"""What every child object shares: labels, owner reference, metadata.

What it owns: the metadata stamp every object Tandem creates carries, so garbage collection, RBAC
scoping, `kubectl get -l` and the finalizer's look-alike check all rely on one definition.
Pure: returns dicts, no I/O.
"""

from __future__ import annotations

from typing import Any

from tandem import API_VERSION
from tandem.api.labels import LABEL_MANAGED_BY, LABEL_PART_OF, LABEL_POOL, MANAGED_BY


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    """Controller owner reference to a Tandem object (same namespace; blocks owner deletion, S-DEL-04)."""
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def base_labels(pool: str) -> dict[str, str]:
    return {LABEL_POOL: pool, LABEL_MANAGED_BY: MANAGED_BY, LABEL_PART_OF: "tandem"}


def metadata(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(sorted(labels.items())),
        "ownerReferences": [owner],
    }
    if annotations:
        meta["annotations"] = dict(sorted(annotations.items()))
    return meta


NONROOT_UID = 65532
"""User and group of every container Tandem builds (the distroless `nonroot` id; no image needs a matching
passwd entry: engines get HOME and cache paths through env)."""
SCRATCH_DIR = "/tmp"
"""The one writable path of a read-only root filesystem (an emptyDir): temp files, HOME, caches."""
SCRATCH_VOLUME = "scratch"


def container_security(*, ipc_lock: bool = False) -> dict[str, Any]:
    """A container `securityContext`: read-only root, no privilege escalation, every capability dropped.

    Without ``ipc_lock`` (every pod except the RDMA ones): non-root, a numeric user and group (PSS
    restricted). With it, exactly ``IPC_LOCK`` is added, to pin RDMA memory regions past
    ``RLIMIT_MEMLOCK``, and the container runs as uid 0: Kubernetes sets no ambient capabilities, so a
    capability added to a non-root container stays in its bounding set and never reaches the process.
    The chart's admission backstop allows exactly this shape, only on pods that hold an RDMA resource.
    """
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if ipc_lock:
        security["capabilities"]["add"] = ["IPC_LOCK"]
        security["runAsUser"] = 0
    else:
        security.update(runAsNonRoot=True, runAsUser=NONROOT_UID, runAsGroup=NONROOT_UID)
    return security


def scratch_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the emptyDir at SCRATCH_DIR that a read-only root filesystem needs."""
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}, {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}
