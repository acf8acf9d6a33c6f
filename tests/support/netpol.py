"""NetworkPolicy semantics, evaluated in Python over real objects (the local cluster has no enforcing CNI).

What it owns: ``allowed(policies, namespaces, src, dst, port)``: would a CNI that implements
networking.k8s.io/v1 NetworkPolicy let ``src`` open a TCP connection to ``dst`` on ``port``? The rules
(Kubernetes API reference, "NetworkPolicy"): a pod is isolated for a direction when some policy in its
namespace selects it and lists that direction in ``policyTypes``; an isolated pod admits a connection
when some rule of such a policy matches both the peer and the port; a connection needs the source's
egress and the destination's ingress. Peers: ``podSelector`` alone means the policy's namespace,
``namespaceSelector`` alone every pod of the matching namespaces, both together their intersection;
an empty or absent ``from``/``to`` matches every peer, an absent ``ports`` every port. A named port is
resolved on the destination pod's container ports. ``hostNetwork`` pods are outside NetworkPolicy
(most CNIs): they are never isolated, and this helper says so rather than guessing.

What it must not do: claim ipBlock matches (pod IPs are not modelled: an ipBlock peer never matches a
pod here), or be used as proof of enforcement: the real-cluster release smoke checks traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """A pod as NetworkPolicy sees it: namespace, labels and named container ports."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)
    host_network: bool = False

    @classmethod
    def of_pod(cls, pod: Obj, namespace: str | None = None) -> Endpoint:
        """From a Pod (or a pod template with ``namespace`` given)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        ports = {
            p["name"]: int(p["containerPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("name")
        }
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(namespace or meta.get("namespace", "")),
            labels=dict(meta.get("labels") or {}),
            ports=ports,
            host_network=bool(spec.get("hostNetwork")),
        )


def selects(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector selects everything, a null one nothing."""
    if selector is None:
        return False
    if not dict(selector.get("matchLabels") or {}).items() <= dict(labels).items():
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _policy_types(policy: Obj) -> list[str]:
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def isolating(policies: Sequence[Obj], pod: Endpoint, direction: str) -> list[Obj]:
    """The policies that select ``pod`` for ``direction`` ("Ingress" or "Egress")."""
    if pod.host_network:
        return []
    return [
        p
        for p in policies
        if p["metadata"].get("namespace") == pod.namespace
        and direction in _policy_types(p)
        and selects(p["spec"].get("podSelector") or {}, pod.labels)
    ]


def _peer_matches(peer: Obj, policy_ns: str, other: Endpoint, namespaces: Mapping[str, Mapping[str, str]]) -> bool:
    if "ipBlock" in peer:
        return False
    ns_selector = peer.get("namespaceSelector")
    pod_selector = peer.get("podSelector")
    if ns_selector is None:
        in_ns = other.namespace == policy_ns
    else:
        in_ns = selects(ns_selector, namespaces.get(other.namespace, {}))
    return in_ns and (pod_selector is None or selects(pod_selector, other.labels))


def _port_matches(rule: Obj, dst: Endpoint, port: int, protocol: str) -> bool:
    if not rule.get("ports"):
        return True
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != protocol:
            continue
        want = entry.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            if dst.ports.get(want) == port:
                return True
            continue
        if int(want) <= port <= int(entry.get("endPort", want)):
            return True
    return False


def _side_allows(
    policies: Sequence[Obj],
    namespaces: Mapping[str, Mapping[str, str]],
    subject: Endpoint,
    peer: Endpoint,
    dst: Endpoint,
    direction: str,
    port: int,
    protocol: str,
) -> bool:
    applicable = isolating(policies, subject, direction)
    if not applicable:
        return True
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in applicable:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key) or []
            peer_ok = not peers or any(
                _peer_matches(p, policy["metadata"]["namespace"], peer, namespaces) for p in peers
            )
            if peer_ok and _port_matches(rule, dst, port, protocol):
                return True
    return False


def allowed(
    policies: Sequence[Obj],
    namespaces: Mapping[str, Mapping[str, str]],
    src: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether ``src`` may connect to ``dst`` on ``port`` (egress of src and ingress of dst).

    ``namespaces`` maps a namespace name to its labels (``kubernetes.io/metadata.name`` included, as the
    API server sets it)."""
    return _side_allows(policies, namespaces, src, dst, dst, "Egress", port, protocol) and _side_allows(
        policies, namespaces, dst, src, dst, "Ingress", port, protocol
    )


__all__ = ["Endpoint", "allowed", "isolating", "selects"]
