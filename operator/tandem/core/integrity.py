"""Integrity checks on what the operator reads back: forged or foreign data leads to a hold, never a delete.

What it owns: the pure rules that decide which observed objects the planner may act on, and the
findings it reports (condition ``UntrustedInput`` and a Warning Event, see `tandem.core.plan`):

1. **Pods**: a pod is part of the pool only when its *controller* owner reference names the pool's uid.
   Labels are copied with any manifest; the controller reference is set by the operator at creation and
   is not carried over by copying labels. (Someone who reads the pool's uid and can create pods can
   still forge it: this stops look-alikes, not a namespace admin, who can run any pod anyway.) A
   look-alike is never counted, repaired, drained or deleted; it still holds GPUs, so the placement
   ledger counts it as another workload.
2. **Drain records** live in the published routing table (a ConfigMap anyone with ConfigMap write
   access can edit). The table is the operator's own only when its fingerprint matches the one the
   operator wrote to the pool's status (the status subresource: operator-only). In a table that is not
   the operator's, a drain record on a pair that is not Ready is ignored (the operator never drains a
   not-Ready pair: it deletes excess ones directly), and one on a Ready pair restarts now (it still
   drains for the full ``drainTimeout``). In any table, a start more than ``CLOCK_SKEW`` in the future
   restarts now: it neither deletes at once nor holds GPUs for ever.
3. **Revision snapshots** (ConfigMaps ``<pool>-rev-<id>``): the operator records ``sha256`` of each
   snapshot's canonical JSON in the pool's status next to the revision it describes
   (``status.revisions.{stable,canary}.digest``). A snapshot whose digest differs is not used to build
   pods (``SnapshotTampered``). A revision without a recorded digest (written by an older operator) is
   accepted once when its content still hashes to its revision id (the 10-hex id is a content hash),
   and its digest is recorded from then on. A snapshot image that is not pinned by digest or not under
   the operator's registry allow-list is never run (``ImageNotAllowed``): the admission policy checks
   only the pool's spec, never a ConfigMap.
4. **Per-pool Prometheus addresses** (``analysis.prometheusAddress``) get the operator's credentials
   only when the address is the operator's own Prometheus, or https and under an allow-listed address;
   otherwise queries go without credentials (``PrometheusCredentialsWithheld``).

Invariant: pure (no I/O, no clock); the same inputs give the same findings, so a quiet pass writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final
from urllib.parse import urlsplit

from tandem.api.base import DIGEST_IMAGE_PATTERN
from tandem.api.revision import RevisionSpec, revision_id
from tandem.core import conditions as c
from tandem.core.observed import ObservedPod

CLOCK_SKEW: Final = timedelta(seconds=60)
"""How far in the future a recorded drain start may lie before it is treated as forged."""
MAX_NAMES: Final = 5
"""Names listed in a finding's message (the count is always exact)."""
CONDITION_HOLD: Final = timedelta(minutes=10)
"""How long ``UntrustedInput=True`` stays after its last finding (a republished table clears a forged
drain record in one pass; the condition should outlive it long enough to be seen)."""

_DIGEST_IMAGE = re.compile(DIGEST_IMAGE_PATTERN)


@dataclass(frozen=True)
class Finding:
    """One thing the operator refused to trust this pass."""

    reason: str
    message: str


def name_list(names: Iterable[str]) -> str:
    """``a, b, c (+4 more)``: at most MAX_NAMES names, sorted, so the message is stable between passes."""
    ordered = sorted(set(names))
    shown = ", ".join(ordered[:MAX_NAMES])
    return shown + (f" (+{len(ordered) - MAX_NAMES} more)" if len(ordered) > MAX_NAMES else "")


# --- 1. pods --------------------------------------------------------------------------------------


def split_owned(pods: Iterable[ObservedPod], pool_uid: str) -> tuple[tuple[ObservedPod, ...], tuple[ObservedPod, ...]]:
    """(pods whose controller is the pool, look-alikes). A pool without a uid owns nothing."""
    owned: list[ObservedPod] = []
    foreign: list[ObservedPod] = []
    for pod in pods:
        (owned if pool_uid and pod.controller_uid == pool_uid else foreign).append(pod)
    return tuple(owned), tuple(foreign)


def foreign_pods_finding(foreign: Sequence[ObservedPod]) -> Finding | None:
    if not foreign:
        return None
    return Finding(
        c.REASON_FOREIGN_PODS_IGNORED,
        f"{len(foreign)} pod(s) carry this pool's labels but are not controlled by it (ignored, never deleted): "
        + name_list(p.name for p in foreign),
    )


# --- 2. drain records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DrainRecord:
    """A drain record as read from the routing table, and whether its pair is Ready."""

    pair: str
    since: datetime
    ready: bool


def vet_drain(record: DrainRecord, *, own_table: bool, now: datetime) -> tuple[datetime | None, str]:
    """(the drain start to use, or None to ignore the record; why it was changed, or "").

    See rule 2 of the module docstring. Worked example (now 12:00, drainTimeout 30 s): a foreign table
    says p3 (loading) drains since 11:00 → ignored: p3 stays; it says p2 (Ready) drains since 11:00 →
    drains since 12:00, deleted at 12:00:30 at the earliest; the operator's own table says p1 drains
    since 13:00 → since 12:00.
    """
    if record.since > now + CLOCK_SKEW:
        return (now if own_table or record.ready else None), "starts in the future"
    if own_table:
        return record.since, ""
    if not record.ready:
        return None, "not Ready (the operator never drains a pair that is not Ready)"
    return now, "not in the operator's own table"


def drain_finding(changed: Mapping[str, str]) -> Finding | None:
    if not changed:
        return None
    detail = "; ".join(f"{pair}: {why}" for pair, why in sorted(changed.items())[:MAX_NAMES])
    more = f" (+{len(changed) - MAX_NAMES} more)" if len(changed) > MAX_NAMES else ""
    return Finding(
        c.REASON_DRAIN_RECORD_REJECTED,
        f"{len(changed)} drain record(s) in the routing table not accepted as written (ignored or restarted "
        f"now): {detail}{more}",
    )


def table_is_own(published_fingerprint: str | None, recorded: str) -> bool:
    """True when the published table is the one the operator last recorded in status (16-hex prefix)."""
    return bool(recorded) and published_fingerprint is not None and published_fingerprint[: len(recorded)] == recorded


# --- 3. revision snapshots ------------------------------------------------------------------------


def snapshot_digest(spec: RevisionSpec) -> str:
    """``sha256:<hex>`` of the snapshot's canonical JSON (sorted keys, no spaces, nulls left out)."""
    payload = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def image_allowed(image: str, allowed_registries: Sequence[str]) -> bool:
    """Pinned by digest, and (when a list is configured) under ``<entry>/`` of one entry (chart B-20)."""
    if not _DIGEST_IMAGE.match(image):
        return False
    return not allowed_registries or any(image.startswith(entry.rstrip("/") + "/") for entry in allowed_registries)


@dataclass(frozen=True)
class VettedRevisions:
    """The snapshots the planner may build pods from, and what was refused."""

    trusted: dict[str, RevisionSpec]
    held: frozenset[str]
    """Revisions whose snapshot exists but may not be used: their missing pods are not recreated."""
    findings: tuple[Finding, ...]


def vet_revisions(
    snapshots: Mapping[str, RevisionSpec],
    recorded: Mapping[str, str],
    desired: str,
    desired_spec: RevisionSpec,
    allowed_registries: Sequence[str],
) -> VettedRevisions:
    """Rule 3 of the module docstring. The desired revision is always built from the live spec (admitted
    by the API server), so its snapshot is only compared, never used."""
    trusted: dict[str, RevisionSpec] = {}
    tampered: list[str] = []
    refused: list[str] = []
    for rev, spec in sorted(snapshots.items()):
        digest = snapshot_digest(spec)
        if rev == desired:
            if digest != snapshot_digest(desired_spec):
                tampered.append(rev)
            continue
        want = recorded.get(rev)
        genuine = digest == want if want else revision_id(spec) == rev
        if not genuine:
            tampered.append(rev)
        elif not image_allowed(spec.stack.image, allowed_registries):
            refused.append(f"{rev} ({spec.stack.image[:80]})")
        else:
            trusted[rev] = spec
    findings = []
    if tampered:
        findings.append(
            Finding(
                c.REASON_SNAPSHOT_TAMPERED,
                f"revision snapshot(s) {name_list(tampered)} do not match the digest the operator recorded: "
                "not used to create pods",
            )
        )
    if refused:
        findings.append(
            Finding(
                c.REASON_IMAGE_NOT_ALLOWED,
                f"revision snapshot(s) {name_list(refused)} name an image that is not pinned by digest or not "
                "from an allowed registry: not run",
            )
        )
    held = frozenset(r for r in snapshots if r != desired and r not in trusted)
    return VettedRevisions(trusted, held, tuple(findings))


# --- 4. Prometheus credentials --------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url.strip())
    port = parts.port or (443 if parts.scheme == "https" else 80 if parts.scheme == "http" else 0)
    return parts.scheme.lower(), f"{(parts.hostname or '').lower()}:{port}", parts.path.rstrip("/")


def credentials_problem(address: str, default_url: str, allowed: Sequence[str]) -> str:
    """Why the operator's Prometheus credentials may not go to ``address`` ("" when they may).

    Allowed: the operator's own Prometheus (``--prometheus-url``), or an https address with the same
    host and port as an ``--prometheus-allowed-address`` entry and a path under its path.
    """
    try:
        scheme, host, path = _origin(address)
        if default_url and _origin(default_url) == (scheme, host, path):
            return ""
        if scheme != "https":
            return "not https"
        for entry in allowed:
            e_scheme, e_host, e_path = _origin(entry)
            if e_scheme == "https" and e_host == host and (path == e_path or path.startswith(e_path + "/")):
                return ""
    except ValueError:  # a port that is not a number
        return "not a valid URL"
    return "not on the operator's Prometheus allow-list (--prometheus-allowed-address)"


def prometheus_finding(address: str, problem: str) -> Finding | None:
    if not problem:
        return None
    return Finding(
        c.REASON_PROMETHEUS_CREDENTIALS_WITHHELD,
        f"analysis.prometheusAddress {address[:200]} is {problem}: queried without the operator's credentials",
    )


__all__ = [
    "CLOCK_SKEW",
    "CONDITION_HOLD",
    "MAX_NAMES",
    "DrainRecord",
    "Finding",
    "VettedRevisions",
    "credentials_problem",
    "drain_finding",
    "foreign_pods_finding",
    "image_allowed",
    "name_list",
    "prometheus_finding",
    "snapshot_digest",
    "split_owned",
    "table_is_own",
    "vet_drain",
    "vet_revisions",
]
