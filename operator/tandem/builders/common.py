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
