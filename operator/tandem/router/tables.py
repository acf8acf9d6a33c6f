"""Routing tables in the router: parsing a published payload, the atomic store, and the sources feeding it.

Owns: what counts as a valid table for this router, which tables are live, and when they changed.

- **Payload**: either the table JSON itself (the ConfigMap's ``routing.json`` value) or a whole ConfigMap
  manifest as ``kubectl get configmap <pool>-routing -o yaml|json`` prints it (the table is read from
  ``data["routing.json"]``). A table whose ``apiVersion`` is not one this router knows is refused with
  reason :data:`REASON_UNKNOWN_VERSION`; any other problem is :data:`REASON_INVALID`.
- **Store**: one live table per source key (a file path, or ``namespace/configmap`` for the watch). An offer whose
  fingerprint equals the live one changes nothing; a valid new one replaces it with one assignment of
  an immutable snapshot (requests in flight keep the snapshot they started with); an invalid one keeps
  the last good table and is counted and logged.
- **Sources** (:class:`TableSource`): :class:`FileSource` polls files; the ConfigMap watch
  (:mod:`tandem.adapters.routerwatch`, where Kubernetes may be imported) calls the same
  :meth:`TableStore.offer` / :meth:`TableStore.remove`, and :meth:`TableStore.source_error` when it must re-list.

Must not: decide routes (that is :mod:`tandem.routing`), or import Kubernetes clients.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import yaml
from pydantic import ValidationError

from tandem.routing import CONFIGMAP_KEY, ROUTING_API_VERSION, RoutingTable

log = logging.getLogger(__name__)

KNOWN_API_VERSIONS: Final = frozenset({ROUTING_API_VERSION})
REASON_INVALID = "Invalid"
REASON_UNKNOWN_VERSION = "UnknownVersion"
REASON_UNREADABLE = "Unreadable"
DEFAULT_POLL_INTERVAL_S = 0.5


class TableError(ValueError):
    """A payload that is not a usable routing table; ``reason`` is one of the ``REASON_*`` constants."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_payload(payload: str | bytes) -> RoutingTable:
    """The routing table in a published payload (table JSON or a ConfigMap manifest); :class:`TableError`."""
    try:
        doc: Any = json.loads(payload)
    except ValueError:
        try:
            doc = yaml.safe_load(payload)
        except yaml.YAMLError as exc:
            raise TableError(REASON_INVALID, f"neither JSON nor YAML: {exc}") from None
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data") or {}
        if not isinstance(data, dict) or not isinstance(data.get(CONFIGMAP_KEY), str):
            raise TableError(REASON_INVALID, f"ConfigMap has no data[{CONFIGMAP_KEY!r}]")
        try:
            doc = json.loads(data[CONFIGMAP_KEY])
        except ValueError as exc:
            raise TableError(REASON_INVALID, f"data[{CONFIGMAP_KEY!r}] is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TableError(REASON_INVALID, "a routing table must be a JSON object")
    version = doc.get("apiVersion", ROUTING_API_VERSION)
    if version not in KNOWN_API_VERSIONS:
        raise TableError(REASON_UNKNOWN_VERSION, f"unknown routing contract version {version!r}")
    try:
        return RoutingTable.model_validate(doc)
    except ValidationError as exc:
        raise TableError(REASON_INVALID, f"invalid routing table: {exc.error_count()} error(s): {exc}") from None


@dataclass(frozen=True)
class LoadedTable:
    """A live table with where it came from and when it last changed."""

    source: str
    table: RoutingTable
    fingerprint: str
    loaded_at: float
    """``time.time()`` when this fingerprint became live (the table-age metric is taken from it)."""


OfferListener = Callable[[str, str | None, "LoadedTable | None"], None]
"""Called after every offer: (source, failure reason or None, live table after the offer)."""
SourceErrorListener = Callable[[str, str], None]
"""Called when a source itself fails (not one table): (origin, reason), e.g. a watch that expired."""


class TableStore:
    """The live tables, keyed by source. Readers take :attr:`snapshot` once per request."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._live: dict[str, LoadedTable] = {}
        self.snapshot: tuple[LoadedTable, ...] = ()
        """Immutable view of the live tables; replaced (never mutated) on every change."""
        self.listeners: list[OfferListener] = []
        self.error_listeners: list[SourceErrorListener] = []

    def tables(self) -> tuple[RoutingTable, ...]:
        return tuple(t.table for t in self.snapshot)

    def get(self, source: str) -> LoadedTable | None:
        return self._live.get(source)

    def offer(self, source: str, payload: str | bytes) -> bool:
        """Parse ``payload`` as the new table of ``source``; True when the live table changed."""
        try:
            table = parse_payload(payload)
        except TableError as exc:
            return self._failed(source, exc.reason, str(exc))
        fingerprint = table.fingerprint()
        current = self._live.get(source)
        if current is not None and current.fingerprint == fingerprint:
            self._notify(source, None)
            return False
        for other in self._live.values():
            if other.source != source and (other.table.namespace, other.table.pool) == (table.namespace, table.pool):
                return self._failed(
                    source, REASON_INVALID, f"pool {table.namespace}/{table.pool} already from {other.source}"
                )
        self._live[source] = LoadedTable(source, table, fingerprint, self._clock())
        self._publish()
        log.info(
            "routing table %s/%s from %s is live (fingerprint %s)",
            table.namespace,
            table.pool,
            source,
            fingerprint[:12],
        )
        self._notify(source, None)
        return True

    def fail(self, source: str, reason: str, message: str) -> None:
        """Record that ``source`` could not be read; the last good table stays live."""
        self._failed(source, reason, message)

    def remove(self, source: str) -> None:
        """Drop ``source``'s table (its ConfigMap was deleted)."""
        if self._live.pop(source, None) is not None:
            self._publish()

    def source_error(self, origin: str, reason: str, message: str) -> None:
        """A source could not read anything (API server unreachable, watch expired); every live table stays."""
        log.warning(
            "routing table source %s: %s: %s; keeping %d live table(s)", origin, reason, message, len(self._live)
        )
        for listener in self.error_listeners:
            listener(origin, reason)

    def _failed(self, source: str, reason: str, message: str) -> bool:
        kept = self._live.get(source)
        log.warning(
            "routing table from %s refused (%s): %s; %s",
            source,
            reason,
            message,
            f"keeping fingerprint {kept.fingerprint[:12]}" if kept else "no table from it is live",
        )
        self._notify(source, reason)
        return False

    def _publish(self) -> None:
        self.snapshot = tuple(sorted(self._live.values(), key=lambda t: t.source))

    def _notify(self, source: str, reason: str | None) -> None:
        for listener in self.listeners:
            listener(source, reason, self._live.get(source))


class TableSource(Protocol):
    """Feeds a :class:`TableStore`. One implementation per way tables are published."""

    def load_once(self, store: TableStore) -> None:
        """Offer the current tables now (startup: the router serves only after this)."""

    async def run(self, store: TableStore) -> None:
        """Keep offering changes until cancelled."""


def _read_file(path: Path) -> tuple[tuple[int, int, str], bytes] | None:
    """((mtime, size, sha256), content) of ``path``, or None if it cannot be read."""
    try:
        stat = path.stat()
        content = path.read_bytes()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, hashlib.sha256(content).hexdigest()), content


class FileSource:
    """Routing tables from files (``--routing-table FILE``), re-read when their content changes.

    Polls every ``interval_s``: a cheap ``stat`` first, the content hash only when mtime or size moved, so
    an editor's atomic rename and an in-place write are both seen, and a touch without change is not a reload.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]], interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.paths = tuple(Path(p) for p in paths)
        self.interval_s = interval_s
        self._seen: dict[Path, tuple[int, int, str] | None] = {}

    def _check(self, store: TableStore, path: Path, *, force: bool) -> None:
        try:
            stat = path.stat()
        except OSError as exc:
            if force or self._seen.get(path) is not None:
                store.fail(str(path), REASON_UNREADABLE, str(exc))
            self._seen[path] = None
            return
        previous = self._seen.get(path)
        if not force and previous is not None and previous[:2] == (stat.st_mtime_ns, stat.st_size):
            return
        read = _read_file(path)
        if read is None:
            store.fail(str(path), REASON_UNREADABLE, "file vanished while reading")
            return
        seen, content = read
        self._seen[path] = seen
        if force or previous is None or previous[2] != seen[2]:
            store.offer(str(path), content)

    def load_once(self, store: TableStore) -> None:
        for path in self.paths:
            self._check(store, path, force=True)

    def poll(self, store: TableStore) -> None:
        """One polling pass (tests call it directly instead of waiting for :meth:`run`)."""
        for path in self.paths:
            self._check(store, path, force=False)

    async def run(self, store: TableStore) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.poll(store)
