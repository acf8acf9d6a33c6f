"""The API server audit log of a dev cluster: the policy we run with, and a parser for its writes.

What it owns: the audit policy (Metadata level for every request, minus health probes and the node
heartbeat Leases, which would drown everything else) and ``count_writes``, which tells how many
create/update/patch/delete(collection) calls each user made on each resource in a time window. Later
cluster tests use it to bound the operator's API writes (INV-8).

What it must not do: read request or response bodies (Metadata level has none; never raise it: a
Secret's data would land in the file).

Invariants: only ``ResponseComplete`` events are counted (one per request; ``RequestReceived`` is
omitted by the policy and long-running requests also emit ``ResponseStarted``); lines that are not
JSON audit events are skipped, so a log being written concurrently can be read at any time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

WRITE_VERBS: frozenset[str] = frozenset({"create", "update", "patch", "delete", "deletecollection"})
LEASES = "leases.coordination.k8s.io"

AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version", "/metrics", "/openapi*"],
        },
        # KWOK renews every node's Lease every few seconds: pure noise for write budgets.
        {
            "level": "None",
            "namespaces": ["kube-node-lease"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        {"level": "Metadata"},
    ],
}


@dataclass(frozen=True)
class AuditEvent:
    """The fields of one audit event that write accounting needs."""

    timestamp: datetime  # stageTimestamp (when the response completed), timezone-aware
    verb: str
    user: str
    resource: str  # "pods", "pods/status", "inferencepools.tandem.dev" (group appended when set)
    namespace: str
    name: str
    code: int  # HTTP status, 0 when absent

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def parse_event(line: str) -> AuditEvent | None:
    """One JSON line -> AuditEvent, or None for anything that is not a completed request."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("kind") != "Event" or raw.get("stage") != "ResponseComplete":
        return None
    ref = raw.get("objectRef") or {}
    resource = str(ref.get("resource", ""))
    if ref.get("subresource"):
        resource += "/" + str(ref["subresource"])
    if ref.get("apiGroup"):
        base, _, sub = resource.partition("/")
        resource = f"{base}.{ref['apiGroup']}" + (f"/{sub}" if sub else "")
    try:
        timestamp = _parse_time(str(raw.get("stageTimestamp") or raw["requestReceivedTimestamp"]))
    except (KeyError, ValueError):
        return None
    return AuditEvent(
        timestamp=timestamp,
        verb=str(raw.get("verb", "")),
        user=str((raw.get("user") or {}).get("username", "")),
        resource=resource,
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((raw.get("responseStatus") or {}).get("code", 0) or 0),
    )


def iter_events(source: Path | Iterable[str]) -> Iterator[AuditEvent]:
    """Completed-request events from a log file path or from an iterable of lines."""
    if isinstance(source, Path):
        with source.open(encoding="utf-8", errors="replace") as handle:
            yield from iter_events(handle)
        return
    for line in source:
        event = parse_event(line)
        if event is not None:
            yield event


def select_writes(
    events: Iterable[AuditEvent],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    users: Iterable[str] | None = None,
    namespace: str | None = None,
    successful_only: bool = False,
    include_leases: bool = False,
) -> list[AuditEvent]:
    """The write events inside ``[since, until)`` (timezone-aware bounds), optionally filtered.

    Lease writes are left out unless ``include_leases``: the operator's leader election renews its
    Lease every 2 s, a heartbeat like the nodes' (which the policy drops), not a reconcile write; the
    write budgets (INV-8, bench C2) are about the objects Tandem manages.
    """
    wanted_users = set(users) if users is not None else None
    out = []
    for ev in events:
        if not ev.is_write:
            continue
        if not include_leases and ev.resource == LEASES:
            continue
        if since is not None and ev.timestamp < since:
            continue
        if until is not None and ev.timestamp >= until:
            continue
        if wanted_users is not None and ev.user not in wanted_users:
            continue
        if namespace is not None and ev.namespace != namespace:
            continue
        if successful_only and not ev.succeeded:
            continue
        out.append(ev)
    return out


def count_writes(
    events: Iterable[AuditEvent],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    users: Iterable[str] | None = None,
    namespace: str | None = None,
    successful_only: bool = False,
) -> Counter[tuple[str, str, str]]:
    """Count writes by ``(user, verb, resource)``.

    Worked example: an operator that creates two pods and patches a pool's status once gives
    ``{("system:serviceaccount:ns:tandem", "create", "pods"): 2,
    ("system:serviceaccount:ns:tandem", "patch", "inferencepools.tandem.dev/status"): 1}``.
    """
    selected = select_writes(
        events, since=since, until=until, users=users, namespace=namespace, successful_only=successful_only
    )
    return Counter((ev.user, ev.verb, ev.resource) for ev in selected)
