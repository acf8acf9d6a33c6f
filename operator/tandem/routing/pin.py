"""The revision-pin request header: how a client asks `tandem router` for one revision's pairs.

Owns the header's name and value syntax, shared by the router (which honours it), the eval Job builder
(which hands it to the eval container) and ``tandem eval`` (which sends it). Pure: parsing and formatting
only; what the router does with a pin is :func:`tandem.routing.select_for_table` with ``revision=`` and
``docs/design/005-routing.md`` (*Pinning a revision*).

Value: ``<namespace>/<pool>/<revision>`` pins the pool as well (the eval Job's form: a revision id is a
hash of the pod-shaping spec, so two pools with equal stacks share it, and an eval prompt must not be
classified into another pool), or ``<revision>`` alone, which keeps the router's classification and pins
the revision within the chosen pool (handy with ``curl``). Namespace and pool are DNS labels, the revision
1-63 characters of ``[A-Za-z0-9._-]``. Anything else is a :class:`PinError` (the router answers 400).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

HEADER_REVISION: Final = "X-Tandem-Revision"
"""Request header naming the revision (and optionally the pool) a request must be served by."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_REVISION = re.compile(r"[A-Za-z0-9._-]{1,63}")


class PinError(ValueError):
    """A header value that is not a revision pin; the message is shown to the client."""


@dataclass(frozen=True)
class RevisionPin:
    """A parsed ``X-Tandem-Revision`` value."""

    revision: str
    namespace: str | None = None
    """With ``pool``: the pool the request must go to (``None``: the router classifies as usual)."""
    pool: str | None = None

    @property
    def pool_key(self) -> str | None:
        """``namespace/pool`` as the router names pools, or ``None`` when the pin names no pool."""
        return None if self.pool is None else f"{self.namespace}/{self.pool}"

    def header_value(self) -> str:
        return self.revision if self.pool_key is None else f"{self.pool_key}/{self.revision}"


def parse_revision_pin(value: str) -> RevisionPin:
    """The pin in a header value (module docstring for the syntax)."""
    parts = value.strip().split("/")
    if len(parts) == 1 and _REVISION.fullmatch(parts[0]):
        return RevisionPin(parts[0])
    if len(parts) == 3:
        namespace, pool, revision = parts
        if _DNS_LABEL.fullmatch(namespace) and _DNS_LABEL.fullmatch(pool) and _REVISION.fullmatch(revision):
            return RevisionPin(revision, namespace, pool)
    shown = value[:80]
    raise PinError(f"{HEADER_REVISION} must be <revision> or <namespace>/<pool>/<revision>, not {shown!r}")
