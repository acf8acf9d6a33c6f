"""The routing-table contract: what the operator publishes and what every router consumes.

Owns the wire format of ConfigMap ``<pool>-routing`` (key :data:`CONFIGMAP_KEY`), version
:data:`ROUTING_API_VERSION`: one JSON document per pool with its traffic class and match rules, the
hash parameters, the admission (fast-reject) limits, the stable and canary revisions, and the pairs in
**stable ring order** with their revision, state, weight and prefill/decode endpoints.

Must not: do I/O, read the clock or the environment, or import Kubernetes clients. The operator
builds a :class:`RoutingTable`, compares :meth:`RoutingTable.fingerprint` with the published one and
writes :meth:`RoutingTable.to_json` only when it changed; a router parses it with
:meth:`RoutingTable.from_json` and hands it to :mod:`tandem.routing.algorithm`.

Invariants (checked on construction, so a bad table never reaches a router):

- camelCase on the wire, snake_case in Python; unknown keys are rejected (``extra="forbid"``), so a
  router never silently ignores a field it does not understand; models are frozen.
- pair ids and pair indexes are unique; ``pairs`` keep the operator's stable ring order (by
  ``index``), which never decides routing (rendezvous hashing is order-free) but keeps diffs and the
  fingerprint stable.
- ``maxPromptTokens >= minPromptTokens``; ``canaryWeightPercent`` is set exactly when ``canary`` is.
- serialisation is canonical: sorted keys, so equal tables give equal bytes and equal fingerprints.
- fields added after v1 was first published (``servedModelName``, ``Pair.kvTransfer``, kvTransfer's
  MoRIIO fields and ``revisions.canaryMirror``) are optional and left out of the JSON while unset (the
  MoRIIO ones while at vLLM's default, ``canaryMirror`` while false): a table published before them
  parses, and keeps its bytes and its fingerprint; a router that does not know them still reads tables
  that do not use them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

ROUTING_API_VERSION: Final = "tandem.dev/routing-v1"
CONFIGMAP_KEY = "routing.json"
CONFIGMAP_NAME_SUFFIX = "-routing"

DEFAULT_PREFIX_CHARS = 1000
DEFAULT_LOAD_BOUND_PERCENT = 125
DEFAULT_MAX_WALK = 4
DEFAULT_PAIR_WEIGHT = 100
Connector = Literal["NixlConnector", "MooncakeConnector", "MoRIIOConnector"]
DEFAULT_CONNECTOR: Final[Connector] = "NixlConnector"
DEFAULT_MOONCAKE_BOOTSTRAP_PORT = 8998
MoriioMode = Literal["Write", "Read"]
DEFAULT_MORIIO_MODE: Final[MoriioMode] = "Write"
"""vLLM's default (``kv_connector_extra_config.read_mode`` false): the prefill writes into the decode's blocks."""
DEFAULT_MORIIO_HANDSHAKE_PORT = 6301
"""vLLM's default ``kv_connector_extra_config.handshake_port`` (``MoRIIOConstants.DEFAULT_HANDSHAKE_PORT``)."""
DEFAULT_MORIIO_NOTIFY_PORT = 61005
"""vLLM's default ``kv_connector_extra_config.notify_port`` (``MoRIIOConstants.DEFAULT_NOTIFY_PORT``)."""

# "host:port" with a DNS name or IPv4 host, or "[v6]:port".
_ADDRESS_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):[0-9]{1,5}$"


def configmap_name(pool: str) -> str:
    """Name of the ConfigMap that carries ``pool``'s routing table."""
    return f"{pool}{CONFIGMAP_NAME_SUFFIX}"


class _Wire(BaseModel):
    """Base for every contract model: camelCase aliases, strict keys, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


class ImagesMatch(StrEnum):
    """How a pool's match rule treats requests that carry images."""

    ANY = "Any"
    REQUIRED = "Required"
    FORBIDDEN = "Forbidden"


class PairState(StrEnum):
    """Lifecycle state of a pair as the router sees it. Only ``serving`` pairs receive requests."""

    WARMING = "warming"
    SERVING = "serving"
    DRAINING = "draining"


class HeaderMatch(_Wire):
    """A request header that must be present with exactly this value (name is case-insensitive)."""

    name: Annotated[str, Field(min_length=1)]
    """Header name, compared case-insensitively."""
    value: str
    """Required header value, compared exactly."""


class Match(_Wire):
    """Which requests belong to this pool. All given conditions must hold."""

    min_prompt_tokens: Annotated[int, Field(ge=0)] = 0
    """Smallest prompt (in tokens) this pool takes, inclusive."""
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    """Largest prompt (in tokens) this pool takes, inclusive; null means unbounded."""
    images: ImagesMatch = ImagesMatch.ANY
    """Any: with or without images; Required: only requests with images; Forbidden: only without."""
    headers: tuple[HeaderMatch, ...] = ()
    """Headers that must all be present with the given values."""

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Self:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < self.min_prompt_tokens:
            raise ValueError("maxPromptTokens must be >= minPromptTokens")
        return self


class HashSpec(_Wire):
    """Hash-bias parameters: what the key covers and how far the bounded-load walk may go."""

    prefix_chars: Annotated[int, Field(ge=1)] = DEFAULT_PREFIX_CHARS
    """Number of leading prompt characters hashed into the routing key."""
    load_bound_percent: Annotated[int, Field(ge=100)] = DEFAULT_LOAD_BOUND_PERCENT
    """c·100 for consistent hashing with bounded loads: a pair takes a request only while its load is
    below ceil(c · (total load + 1) · its weight share)."""
    max_walk: Annotated[int, Field(ge=1)] = DEFAULT_MAX_WALK
    """Most candidates the router tries (fast rejects included) before it queues or rejects."""


class Admission(_Wire):
    """A pair's fast-reject limits: a full pair answers at once and the router walks on. The router compares them
    with the pair's sums over its instances; the operator publishes them for the pool's pair groups
    (:meth:`for_groups`), so a router applies them as they are."""

    max_in_flight: Annotated[int, Field(ge=1)]
    """A pair with this many requests in flight is full."""
    max_queued: Annotated[int, Field(ge=1)]
    """A pair with this many requests waiting is full."""
    max_kv_utilization_percent: Annotated[int, Field(ge=1, le=100)] = 100
    """A pair whose KV-cache usage is at or above this percent is full."""
    reject_status: Literal[429, 503] = 429
    """HTTP status the router returns when every candidate it tried was full."""

    def for_groups(self, shapes: Iterable[tuple[int, int]]) -> Admission:
        """The pair limits of groups of these (prefill, decode) shapes, when ``self`` holds the pool API's
        per-instance limits (``maxInFlight`` is each decode instance's ``--max-num-seqs``, ``maxQueued`` what
        each prefill instance may queue). The router compares limits with the pair's sums, so a group of p
        prefill and d decode instances is full at d × ``maxInFlight`` in flight or p × ``maxQueued`` waiting;
        the KV limit is a percentage of the fullest decode instance and stays as it is.

        One limit serves every pair of a table, so while groups of several shapes coexist (a P:D change
        as groups cycle, ``tandem.core.reshape``) it is the smallest group's, per role: a larger group walks on
        early, but no group is let queue more than its instances can take. No shapes: the per-instance limits.

        Why here: the operator's table and the simulator's router read the same rule; before it, a 2P:1D
        group's pair was full at *one* instance's queue limit (``examples/long-context-pool.yaml``).
        Example: ``maxInFlight`` 48, ``maxQueued`` 4, shapes 4P:1D and 2P:1D → 48 in flight, 8 queued."""
        counts = list(shapes)
        if not counts:
            return self
        prefill = max(1, min(p for p, _ in counts))
        decode = max(1, min(d for _, d in counts))
        if (prefill, decode) == (1, 1):
            return self
        return self.model_copy(
            update={"max_in_flight": self.max_in_flight * decode, "max_queued": self.max_queued * prefill}
        )


def _not_set(value: object) -> bool:
    return value is False


class Revisions(_Wire):
    """The pool's stack revisions: the stable one and, during a rollout, the canary."""

    stable: Annotated[str, Field(min_length=1)]
    """Revision serving most traffic."""
    canary: Annotated[str, Field(min_length=1)] | None = None
    """Revision under test, if a rollout is in progress."""
    canary_weight_percent: Annotated[int, Field(ge=0, le=100)] | None = None
    """Target share of new keys for the canary revision; pair weights implement it."""
    canary_mirror: bool = Field(default=False, exclude_if=_not_set)
    """The canary answers no user but gets a copy of each request whose key its pairs would own by pair count
    (``tandem.routing.mirror_pair``); the router discards the copy's answer. Only with ``canaryWeightPercent: 0``."""

    @model_validator(mode="after")
    def _canary_consistent(self) -> Self:
        if (self.canary is None) != (self.canary_weight_percent is None):
            raise ValueError("canary and canaryWeightPercent must be set together")
        if self.canary is not None and self.canary == self.stable:
            raise ValueError("canary must differ from stable")
        if self.canary_mirror and self.canary_weight_percent != 0:
            raise ValueError("canaryMirror needs a canary at canaryWeightPercent 0 (a mirror serves no key)")
        return self


def _unset(value: object) -> bool:
    """Exclusion rule of the optional v1 additions: an unset field is not written at all."""
    return value is None


def _default_moriio_mode(value: object) -> bool:
    return value == DEFAULT_MORIIO_MODE


def _default_handshake_port(value: object) -> bool:
    return value == DEFAULT_MORIIO_HANDSHAKE_PORT


def _default_notify_port(value: object) -> bool:
    return value == DEFAULT_MORIIO_NOTIFY_PORT


class KvTransfer(_Wire):
    """How the router drives the prefill and decode legs of a pair (the vLLM KV connector's protocol).

    Pair-level, not pool-level: the connector belongs to the stack, a stack change is a new revision, and
    pairs never mix revisions, so during a rollout the stable and canary pairs may speak different protocols.
    """

    connector: Connector = DEFAULT_CONNECTOR
    """vLLM KV connector of the pair's instances (vLLM 0.33 names); it decides the request legs."""
    bootstrap_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_MOONCAKE_BOOTSTRAP_PORT
    """MooncakeConnector: port of the prefill's bootstrap server (`VLLM_MOONCAKE_BOOTSTRAP_PORT`)."""
    data_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    """Data-parallel ranks per prefill instance; above 1 the router picks a rank (`X-data-parallel-rank`)."""
    # The MoRIIOConnector fields came after kvTransfer was first published: each is left out of the JSON
    # while it holds its default, so tables without MoRIIO pairs keep their bytes and fingerprints and a
    # router that predates them still reads them.
    moriio_mode: MoriioMode = Field(default=DEFAULT_MORIIO_MODE, exclude_if=_default_moriio_mode)
    """MoRIIOConnector: Write (the prefill writes the KV into blocks the decode announced; the router sends
    both legs at once) or Read (the decode reads the KV the prefill's answer points to; legs in sequence)."""
    handshake_port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=DEFAULT_MORIIO_HANDSHAKE_PORT, exclude_if=_default_handshake_port
    )
    """MoRIIOConnector: the engines' `kv_connector_extra_config.handshake_port` (the router hands each leg the
    other's)."""
    notify_port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=DEFAULT_MORIIO_NOTIFY_PORT, exclude_if=_default_notify_port
    )
    """MoRIIOConnector: the engines' base `kv_connector_extra_config.notify_port` (vLLM adds the rank offsets)."""


class Endpoint(_Wire):
    """One engine instance of a pair."""

    pod: Annotated[str, Field(min_length=1)]
    """Pod name of the instance."""
    address: Annotated[str, Field(pattern=_ADDRESS_PATTERN)] | None = None
    """Address the router sends to, as host:port; null until the pod has an address."""


_DEFAULT_KV_TRANSFER = KvTransfer()


class Pair(_Wire):
    """A prefill/decode pair group: the unit the router picks."""

    id: Annotated[str, Field(min_length=1)]
    """Stable pair id, e.g. "speed-p3"; the rendezvous hash is taken over this id."""
    index: Annotated[int, Field(ge=0)]
    """Ordinal of the pair in the pool; defines the stable ring order of ``pairs``."""
    revision: Annotated[str, Field(min_length=1)]
    """Stack revision of every instance in the pair (pairs never mix revisions)."""
    state: PairState
    """warming: not yet taking traffic; serving: a routing candidate; draining: finishing streams."""
    weight: Annotated[int, Field(ge=0)] = DEFAULT_PAIR_WEIGHT
    """Relative share of keys (weighted rendezvous hashing); 0 takes no new keys."""
    prefill: tuple[Endpoint, ...] = ()
    """Prefill instances of the pair."""
    decode: tuple[Endpoint, ...] = ()
    """Decode instances of the pair."""
    draining_since: Annotated[str, Field(max_length=40)] | None = None
    """RFC 3339 time the pair was marked draining (set only in state draining). The operator deletes the
    pair when every router replica reports no open stream on it (``tandem.routing.streams``), and at the
    latest when ``drainTimeout`` has passed since this time. Keeping the time here lets a restarted operator
    resume the same drain instead of starting a new one."""
    kv_transfer: KvTransfer | None = Field(default=None, exclude_if=_unset)
    """KV-transfer protocol of the pair; unset (tables published before this field) means NixlConnector
    with the defaults of :class:`KvTransfer`."""

    @property
    def transfer(self) -> KvTransfer:
        """The pair's KV-transfer settings, defaults filled in."""
        return self.kv_transfer if self.kv_transfer is not None else _DEFAULT_KV_TRANSFER


class RoutingTable(_Wire):
    """One pool's routing table: everything a router needs, nothing it does not."""

    api_version: Literal["tandem.dev/routing-v1"] = ROUTING_API_VERSION
    """Contract version; a router refuses tables it does not know."""
    pool: Annotated[str, Field(min_length=1)]
    """InferencePool name."""
    namespace: Annotated[str, Field(min_length=1)]
    """InferencePool namespace."""
    traffic_class: Annotated[str, Field(min_length=1)]
    """The pool's traffic class, e.g. "speed", "long-context", "images"."""
    priority: int = 0
    """Higher wins when several pools match a request (before specificity)."""
    match: Match = Match()
    """Which requests this pool takes."""
    hash: HashSpec = HashSpec()
    """Hash-bias parameters."""
    admission: Admission
    """Fast-reject limits per pair."""
    revisions: Revisions
    """Stable and canary revisions."""
    pairs: tuple[Pair, ...] = ()
    """Pairs in stable ring order (ascending index)."""
    served_model_name: Annotated[str, Field(min_length=1)] | None = Field(default=None, exclude_if=_unset)
    """Model name clients ask for (vLLM `--served-model-name`); unset (tables published before this field)
    means the pool takes any model name."""

    @model_validator(mode="after")
    def _pairs_unique(self) -> Self:
        ids = [p.id for p in self.pairs]
        if len(set(ids)) != len(ids):
            raise ValueError("pair ids must be unique")
        indexes = [p.index for p in self.pairs]
        if len(set(indexes)) != len(indexes):
            raise ValueError("pair indexes must be unique")
        if indexes != sorted(indexes):
            raise ValueError("pairs must be in stable ring order (ascending index)")
        return self

    def canonical_json(self) -> str:
        """Compact JSON with sorted keys and aliases: the bytes the fingerprint is taken over."""
        return json.dumps(
            self.model_dump(mode="json", by_alias=True),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    def fingerprint(self) -> str:
        """sha256 (hex) of :meth:`canonical_json`: equal tables give equal fingerprints in any process.

        The operator stores it next to the published table and skips the write when it is unchanged.
        """
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def to_json(self, *, indent: int | None = 2) -> str:
        """The ConfigMap value: JSON with sorted keys (indented for ``kubectl get -o yaml`` readers)."""
        if indent is None:
            return self.canonical_json()
        return json.dumps(
            self.model_dump(mode="json", by_alias=True),
            sort_keys=True,
            indent=indent,
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> RoutingTable:
        """Parse and validate a published table (camelCase keys; unknown keys are an error)."""
        return cls.model_validate_json(data)

    def serving_pairs(self) -> tuple[Pair, ...]:
        """Pairs in state ``serving``, in ring order."""
        return tuple(p for p in self.pairs if p.state is PairState.SERVING)
