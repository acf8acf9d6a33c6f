"""A least-privilege identity for the operator on a dev cluster (mirrors security.md §1's table).

What it owns: a ClusterRole with exactly the namespaced permissions the operator needs, a node-reader
ClusterRole, and ``operator_identity``, which binds both to a ServiceAccount in one namespace and
returns a kubeconfig that authenticates as it (through the TokenRequest API).

Why: the chart ships the production RBAC; cluster tests and the controller benchmark do not install
the chart but still run the operator under its own ServiceAccount, so its API calls are attributable
in the audit log (INV-8 and benchmarks.md C2 count writes by user) and a missing permission shows up
as a 403 here, not in production.

What it must not do: grant anything the chart does not (no Secrets, no cluster-wide writes), or be
imported by the operator (dev tooling only: it shells out to kubectl).

Invariants: every call is idempotent (apply); ``drop_identity`` removes the one cluster-scoped object
``operator_identity`` made for a namespace (the namespaced ones go with the namespace).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem_lab.dev import cluster as devcluster
from tandem_lab.dev.kube import Kubectl

CLUSTER_ROLE = "tandem-test-operator"
NODE_READER = "tandem-test-node-reader"
SERVICE_ACCOUNT = "tandem-operator"

NAMESPACED_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["tandem.dev"],
        "resources": ["inferencepools", "mooncakecaches"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {
        "apiGroups": ["tandem.dev"],
        "resources": ["inferencepools/status", "mooncakecaches/status"],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": ["tandem.dev"],
        "resources": ["inferencepools/finalizers", "mooncakecaches/finalizers"],
        "verbs": ["update"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {
        "apiGroups": [""],
        "resources": ["services", "configmaps"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # Leader election: the chart grants this in the release namespace only; here the test namespace
    # is both (the operator's Lease defaults to its first --namespace when $POD_NAMESPACE is unset).
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


def serviceaccount_user(namespace: str, serviceaccount: str = SERVICE_ACCOUNT) -> str:
    """The audit-log username of a ServiceAccount (``system:serviceaccount:<ns>:<name>``)."""
    return f"system:serviceaccount:{namespace}:{serviceaccount}"


def ensure_cluster_roles(kube: Kubectl) -> None:
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE},
            "rules": NAMESPACED_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NODE_READER},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        },
    )


def _suffix(serviceaccount: str) -> str:
    return "" if serviceaccount == SERVICE_ACCOUNT else f"-{serviceaccount}"


def operator_identity(
    kube: Kubectl, state: devcluster.ClusterState, namespace: str, serviceaccount: str = SERVICE_ACCOUNT
) -> tuple[Path, str]:
    """(kubeconfig, username) of a ServiceAccount allowed exactly what the operator needs in ``namespace``.

    A second ``serviceaccount`` gives a second operator its own name in the audit log (CC-03 runs two).
    """
    ensure_cluster_roles(kube)
    user = serviceaccount_user(namespace, serviceaccount)
    subject = {"kind": "ServiceAccount", "name": serviceaccount, "namespace": namespace}
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": serviceaccount, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"tandem-operator{_suffix(serviceaccount)}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [subject],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"tandem-node-reader-{namespace}{_suffix(serviceaccount)}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NODE_READER},
            "subjects": [subject],
        },
    )
    path = devcluster.serviceaccount_kubeconfig(state, namespace, serviceaccount)
    return path, user


def drop_identity(kube: Kubectl, namespace: str, serviceaccount: str = SERVICE_ACCOUNT) -> None:
    binding = f"tandem-node-reader-{namespace}{_suffix(serviceaccount)}"
    kube.run("delete", "clusterrolebinding", binding, "--ignore-not-found", check=False)
