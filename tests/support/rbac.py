"""A least-privilege identity for the operator in cluster tests: re-exported from ``tandem_lab.dev.identity``.

The content moved to the dev package so the controller benchmark (``tandem bench controller``) can run
the operator under the same identity; tests keep importing it from here.
"""

from __future__ import annotations

from tandem_lab.dev.identity import (
    CLUSTER_ROLE,
    NAMESPACED_RULES,
    NODE_READER,
    SERVICE_ACCOUNT,
    drop_identity,
    ensure_cluster_roles,
    operator_identity,
    serviceaccount_user,
)

__all__ = [
    "CLUSTER_ROLE",
    "NAMESPACED_RULES",
    "NODE_READER",
    "SERVICE_ACCOUNT",
    "drop_identity",
    "ensure_cluster_roles",
    "operator_identity",
    "serviceaccount_user",
]
