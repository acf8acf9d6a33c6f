"""The routing algorithm of the routing-table contract, implemented once.

Owns the pure decisions every router makes with a :class:`~tandem.routing.table.RoutingTable`:
**classify → pool; prefix hash → ordered pair candidates → bounded-load walk with fast rejects**.
The in-cluster router and the fleet simulator (``tandem_lab.sim``) import this module; nothing
re-implements it.

Must not: do I/O, read a clock, keep state that changes a result between calls, or use Python's
``hash()`` (salted per process by ``PYTHONHASHSEED``). Loads are an input (pair id → :class:`PairLoad`
snapshot). The only state is a bounded memo of pure results (:class:`CandidateSet`, see *Decision cost*):
a hit returns exactly what a recomputation would.
Invariants: the same inputs give the same outputs in any process; only ``serving`` pairs with a
positive weight are candidates (a walk pinned to a revision: its ``serving`` pairs, see *Pinning a
revision*); a walk tries at most ``maxWalk`` pairs.

Hashes (byte layouts are part of the contract, so another language can reproduce them)
-------------------------------------------------------------------------------------
``H(x)`` is unkeyed BLAKE2b with an 8-byte digest, read as a big-endian unsigned 64-bit integer.

- prompt key: ``H(b"tandem/key/v1\\0" + utf8(prompt[:prefixChars]))``; ``prefixChars`` counts
  Unicode code points (not bytes, not UTF-16 units).
- block key (traces give prompts as 512-token block ids): ``H(b"tandem/blocks/v1\\0" +
  ascii(",".join(decimal(id) for id in hash_ids[:key_blocks])))``.
- pair draw: ``h = H(b"tandem/hrw/v1\\0" + be64(key) + utf8(pair.id))``,
  ``u = ((h >> 11) + 0.5) / 2**53`` (uniform in the open interval (0, 1)).

Weighted rendezvous (highest random weight) order
-------------------------------------------------
``score(key, pair) = -weight / ln(u)``; candidates are the serving pairs with ``weight > 0`` by
descending score (ties by pair id). ``-1/ln(u)`` of a uniform ``u`` is the reciprocal of an Exp(1)
variable, so ``argmax_i w_i / E_i`` picks pair ``i`` with probability ``w_i / Σw``. Each pair's
score depends only on (key, pair), so adding a pair moves exactly the keys it now wins
(≈ w_new/Σw, i.e. 1/(N+1) of keys for equal weights) and removing one moves only its own keys.

Bounded-load walk (consistent hashing with bounded loads, Mirrokni et al., arXiv 1608.01350)
--------------------------------------------------------------------------------------------
With ``c = loadBoundPercent/100``, ``L`` = total load (in-flight + queued) of the candidate pairs
and ``W`` = their total weight, pair ``i`` has capacity ``cap_i = ceil(c · (L + 1) · w_i / W)``;
with equal weights this is the paper's ``ceil(c · (L + 1) / n)``. A pair accepts the request only
while ``load_i < cap_i`` (so after it, ``load_i ≤ cap_i``). Walk the candidates in order, at most
``maxWalk`` of them; a pair at its capacity (``load_i ≥ cap_i``), or *full* per ``admission`` (in-flight ≥
``maxInFlight``, queued ≥ ``maxQueued`` or KV usage ≥ ``maxKvUtilizationPercent``), is skipped and
counted as a fast reject. If no tried pair accepts: queue at the least-loaded tried pair that is not
full (ties: walk order); if all tried pairs are full, reject with ``admission.rejectStatus``. With no
candidate at all the router answers 503.

Worked example (real numbers from this module, checked by a unit test): four equal-weight serving
pairs ``speed-p0..p3``, ``c = 1.25``, ``maxWalk = 4``, ``maxInFlight = 8``. A trace prompt starting
with blocks ``[0, 1]`` and ``key_blocks = 2`` has key ``0xB2921D9AF23E3CED`` and candidate order
``speed-p1, speed-p0, speed-p3, speed-p2``. With in-flight loads ``p0=1, p1=5, p2=2, p3=0``:
``L = 8``, ``cap = ceil(1.25 · 9 / 4) = ceil(2.81) = 3``; ``p1`` (5 ≥ 3) is skipped, ``p0``
(1 < 3) accepts: routed to ``speed-p0``, walk length 2, one fast reject. With ``p0=8`` instead,
``L = 15`` and ``cap = ceil(1.25 · 16 / 4) = 5``: ``p1`` (5 ≥ 5) is over the bound, ``p0`` is full
(8 ≥ maxInFlight), ``p3`` (0 < 5) accepts: walk length 3, two fast rejects.

Exclusion (the caller's own fast rejects)
----------------------------------------
A router learns that a pair is full only by trying it (a prefill answering 429/503, refusing the
connection, timing out). It then calls :func:`select` again with that pair in ``exclude``: an excluded
pair keeps its place in the walk order and uses one of the ``maxWalk`` tries (it *was* tried), is never
the queueing fallback, and is recorded as a :attr:`SkipReason.EXCLUDED` skip (the caller counts it under
its own reason); its load still counts in ``L`` as it is. Nothing else changes, so the router and the
simulator walk by the same rule.

Pinning a revision
------------------
A caller may restrict one request to the serving pairs of one revision (the router does it for a request
that names a revision, e.g. the canary's eval Job). :func:`select_for_table` with ``revision=R`` walks the
same :func:`select` over :func:`candidate_set_for_revision`: the table's ``serving`` pairs of revision ``R``,
**weighed equally** (:data:`~tandem.routing.table.DEFAULT_PAIR_WEIGHT`), with the table's load bound, walk
limit and admission. Equal weights because a pair's weight is the revision's share of *unpinned* keys: a
canary at 0 % has weight 0 and must still be reachable by its eval, and within one revision the operator's
weights are equal anyway (:func:`compute_pair_weights`), so the pinned walk order is the unpinned order of
those pairs. ``L`` and ``W`` of the load bound are taken over the pinned pairs only. Warming and draining
pairs stay out; a revision without a serving pair gives ``Rejected`` with walk length 0 (the router's
"no serving pair of that revision").

Mirroring the canary
--------------------
A table with ``revisions.canaryMirror`` serves no key from the canary (its weight is 0) but copies requests
to it: :func:`mirror_pair` walks a key over every serving pair of both revisions at the default weight, with
the same loads, load bound and admission as the user's walk, and copies it when that walk is routed to a
canary pair: the requests the canary would get by pair count, and None for the rest.
So a mirrored canary pair sees the same keys it would serve after a ``setCanaryPairs`` step (its prefix
cache warms on them) at a stable pair's load, while the user's request still walks the stable pairs. The
copy is the router's to send or drop; it never takes part in the user's walk.

Decision cost
-------------
Scoring hashes every candidate once per key (one BLAKE2b each: the layout above puts the key before the
pair id, so no per-pair state can be precomputed), which dominated the decision (≈ 0.4-1.2 ms at 100
pairs). :class:`CandidateSet` precomputes the per-table part once (the candidates, their id bytes and
total weight) and memoises, per key, the first ``maxWalk`` pairs of the walk order in a bounded LRU (the
order depends only on the key and the candidate set, never on loads). A request whose key was seen before
(a conversation's next turn, a shared system prompt) costs a dictionary lookup plus the walk; a new key
costs the hashes. :func:`select_for_table` keeps one :class:`CandidateSet` per table object (bounded);
:func:`select` keeps one per tuple of pairs it is given (a list is compiled on every call). Memo entries
hold their table or tuple, so an identity never matches a different object.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Generic, TypeVar

from tandem.routing.table import (
    DEFAULT_PAIR_WEIGHT,
    DEFAULT_PREFIX_CHARS,
    Admission,
    ImagesMatch,
    Match,
    Pair,
    PairState,
    RoutingTable,
)

KEY_DOMAIN = b"tandem/key/v1\x00"
BLOCKS_DOMAIN = b"tandem/blocks/v1\x00"
HRW_DOMAIN = b"tandem/hrw/v1\x00"
DEFAULT_KEY_BLOCKS = 1
# No candidate at all (no serving pair) is an outage of the pool, not overload.
STATUS_NO_CANDIDATES = 503

_U53 = float(1 << 53)
_KEY_MASK = 0xFFFFFFFFFFFFFFFF
ORDER_MEMO_KEYS: Final = 4096
"""Keys whose walk-order prefix one :class:`CandidateSet` remembers (LRU). An entry (key tuple, a 4-tuple of
pairs at ``maxWalk = 4``, the LRU link) is ≈ 300 bytes, so a full memo is ≈ 1.2 MB; 4,096 covers the hot
prefixes of a pool between table changes."""
CANDIDATE_SET_MEMO: Final = 32
"""Tables (and pair tuples) whose :class:`CandidateSet` is kept: more than the pools one router serves; a
table change adds an entry and the old one ages out. Worst case with every memo full: ≈ 40 MB."""


_O = TypeVar("_O")
_V = TypeVar("_V")


class _ByIdentity(Generic[_O, _V]):
    """What the router derives from an immutable object (a table, a tuple of pairs), kept for the last
    :data:`CANDIDATE_SET_MEMO` objects (LRU) so a request does not rebuild it.

    Keyed by ``id(owner)`` (and a ``tag`` when one owner has several values): the entry holds ``owner`` itself,
    so while it lives no other object can have that id, and the ``is`` check makes a stale id harmless anyway.
    One implementation for every per-table memo of this module (candidate sets, walk bounds, pinned and
    mirrored sets).
    """

    __slots__ = ("_store",)

    def __init__(self) -> None:
        self._store: OrderedDict[tuple[int, object], tuple[_O, _V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def get(self, owner: _O, build: Callable[[], _V], tag: object = None) -> _V:
        """``owner``'s value, built by ``build()`` when not kept."""
        key = (id(owner), tag)
        store = self._store
        entry = store.get(key)
        if entry is not None and entry[0] is owner:
            store.move_to_end(key)
            return entry[1]
        value = build()
        store[key] = (owner, value)
        if len(store) > CANDIDATE_SET_MEMO:
            store.popitem(last=False)
        return value


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


# --- keys -----------------------------------------------------------------------------------------


def routing_key(prompt: str, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> int:
    """64-bit routing key of the first ``prefix_chars`` characters (code points) of ``prompt``."""
    if prefix_chars < 1:
        raise ValueError("prefix_chars must be >= 1")
    # surrogatepass: prompts decoded from JSON may hold lone surrogates; they still get a stable key.
    return _h64(KEY_DOMAIN + prompt[:prefix_chars].encode("utf-8", "surrogatepass"))


def routing_key_from_blocks(hash_ids: Sequence[int], key_blocks: int = DEFAULT_KEY_BLOCKS) -> int:
    """64-bit routing key of the first ``key_blocks`` block ids of a trace prompt.

    ~1,000 characters is ≈ 250 tokens, below the 512-token block resolution of traces, so one block
    is the faithful default; traces whose block 0 is shared by every request (a common system
    prompt) need ``key_blocks = 2`` or more, or every request lands on one pair.
    """
    if key_blocks < 1:
        raise ValueError("key_blocks must be >= 1")
    return _h64(BLOCKS_DOMAIN + ",".join(str(int(i)) for i in hash_ids[:key_blocks]).encode("ascii"))


# --- classification ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestFeatures:
    """What the router knows about a request when it picks a pool."""

    prompt_tokens: int
    has_images: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    """Request headers; names are compared case-insensitively, values exactly."""


def matches(match: Match, features: RequestFeatures) -> bool:
    """True when ``features`` satisfy every condition of ``match`` (token bounds are inclusive)."""
    if features.prompt_tokens < match.min_prompt_tokens:
        return False
    if match.max_prompt_tokens is not None and features.prompt_tokens > match.max_prompt_tokens:
        return False
    if match.images is ImagesMatch.REQUIRED and not features.has_images:
        return False
    if match.images is ImagesMatch.FORBIDDEN and features.has_images:
        return False
    if match.headers:
        given = {name.lower(): value for name, value in features.headers.items()}
        return all(given.get(h.name.lower()) == h.value for h in match.headers)
    return True


def match_specificity(match: Match) -> tuple[int, int, int]:
    """(header conditions, images constrained, token bounds set): larger is more specific."""
    bounds = int(match.min_prompt_tokens > 0) + int(match.max_prompt_tokens is not None)
    return (len(match.headers), int(match.images is not ImagesMatch.ANY), bounds)


def classify(features: RequestFeatures, tables: Iterable[RoutingTable]) -> RoutingTable | None:
    """The pool for a request: among matching tables, highest ``priority`` first, then the most
    specific match (:func:`match_specificity`, compared in order), then pool name and namespace
    ascending. ``None`` if no table matches.

    Example: ``speed`` (≤ 32,768 tokens, images Forbidden), ``long-context`` (≥ 32,769 tokens) and
    ``images`` (images Required), all priority 0. A 100k-token prompt with images matches
    ``long-context`` (specificity (0, 0, 1)) and ``images`` ((0, 1, 0)); ``images`` wins.
    """
    best: RoutingTable | None = None
    best_rank: tuple[int, int, int, int] | None = None
    best_name: tuple[str, str] = ("", "")
    for table in tables:
        if not matches(table.match, features):
            continue
        spec = match_specificity(table.match)
        rank = (table.priority, *spec)
        name = (table.pool, table.namespace)
        if best_rank is None or rank > best_rank or (rank == best_rank and name < best_name):
            best, best_rank, best_name = table, rank, name
    return best


# --- candidate order -----------------------------------------------------------------------------


def rendezvous_score(key: int, pair_id: str, weight: int) -> float:
    """Weighted rendezvous score ``-weight / ln(u)`` of ``pair_id`` for ``key`` (higher wins)."""
    h = _h64(HRW_DOMAIN + (key & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + pair_id.encode("utf-8"))
    u = ((h >> 11) + 0.5) / _U53
    return -weight / math.log(u)


def is_candidate(pair: Pair) -> bool:
    """Only serving pairs with a positive weight take new requests (never warming or draining)."""
    return pair.state is PairState.SERVING and pair.weight > 0


def candidates(key: int, pairs: Iterable[Pair]) -> tuple[Pair, ...]:
    """Candidate pairs for ``key`` in walk order: descending weighted rendezvous score, ties by id."""
    return _candidate_set(pairs).order(key)


class CandidateSet:
    """The routing candidates of one collection of pairs, precomputed for many walks (see *Decision cost*).

    ``order(key, limit)`` is ``candidates(key, pairs)[:limit]``: the same scores (the same float
    expression as :func:`rendezvous_score`, a unit test checks them against it), the same tie rule. The
    memo maps ``(key, limit)`` to that prefix; it is bounded by :data:`ORDER_MEMO_KEYS` (least recently
    used out). Used from one thread at a time (a router's event loop, a simulator).
    """

    __slots__ = ("_hashed", "_orders", "id_set", "ids", "pairs", "total_weight")

    def __init__(self, pairs: Iterable[Pair]) -> None:
        cands = tuple(p for p in pairs if is_candidate(p))
        self.pairs: tuple[Pair, ...] = cands
        """Serving pairs with a positive weight, in the given order."""
        self.ids: tuple[str, ...] = tuple(p.id for p in cands)
        self.id_set: frozenset[str] = frozenset(self.ids)
        self.total_weight: int = sum(p.weight for p in cands)
        self._hashed = tuple((p.id.encode("utf-8"), p.weight, p.id, i, p) for i, p in enumerate(cands))
        self._orders: OrderedDict[tuple[int, int], tuple[Pair, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.pairs)

    def order(self, key: int, limit: int | None = None) -> tuple[Pair, ...]:
        """The first ``limit`` candidates for ``key`` in walk order (all of them when ``None``)."""
        n = len(self._hashed)
        k = n if limit is None or limit > n else limit
        memo = self._orders
        found = memo.get((key, k))
        if found is not None:
            memo.move_to_end((key, k))
            return found
        # One hasher fed the domain and key, copied per pair: the same bytes as rendezvous_score hashes.
        base = hashlib.blake2b(HRW_DOMAIN + (key & _KEY_MASK).to_bytes(8, "big"), digest_size=8)
        from_bytes, log, fresh = int.from_bytes, math.log, base.copy
        # (-score, id, position, pair): ascending = descending score, ties by id, then input position
        # (what a stable sort keeps for equal ids); pairs themselves are never compared. -score is written
        # w / ln(u): negating -w / ln(u) is exact, so the floats equal rendezvous_score's negated.
        scored: list[tuple[float, str, int, Pair]] = []
        add = scored.append
        for raw, w, pid, i, p in self._hashed:
            h = fresh()
            h.update(raw)
            add((w / log(((from_bytes(h.digest(), "big") >> 11) + 0.5) / _U53), pid, i, p))
        best = heapq.nsmallest(k, scored) if k < n else sorted(scored)
        found = tuple(item[3] for item in best)
        memo[(key, k)] = found
        if len(memo) > ORDER_MEMO_KEYS:
            memo.popitem(last=False)
        return found


_SETS: _ByIdentity[object, CandidateSet] = _ByIdentity()


def _memo_set(owner: object, pairs: Iterable[Pair]) -> CandidateSet:
    """The :class:`CandidateSet` of ``owner`` (a table or a tuple of pairs), built once while memoised."""
    return _SETS.get(owner, lambda: CandidateSet(pairs))


def _candidate_set(pairs: Iterable[Pair] | CandidateSet) -> CandidateSet:
    if isinstance(pairs, CandidateSet):
        return pairs
    if isinstance(pairs, tuple):  # immutable (and Pair is frozen): safe to memoise by identity
        return _memo_set(pairs, pairs)
    return CandidateSet(pairs)


def candidate_set_for_table(table: RoutingTable) -> CandidateSet:
    """The memoised :class:`CandidateSet` of ``table``'s pairs (tables are immutable)."""
    return _memo_set(table, table.pairs)


def compute_pair_weights(
    pairs: Iterable[Pair], canary_revision: str | None, canary_percent: int | None
) -> dict[str, int]:
    """Pair weights (pair id → weight) that give the canary revision ``canary_percent`` % of keys.

    Rule, with ``n_c`` serving canary pairs, ``n_s`` serving pairs of any other revision and
    ``p = canary_percent``: every canary pair gets ``p · n_s`` and every other pair
    ``(100 − p) · n_c``, both divided by their gcd. The canary share of total serving weight is then
    exactly ``n_c·p·n_s / (n_c·p·n_s + n_s·(100 − p)·n_c) = p / 100``.
    Edge cases: no canary (``None``) → every pair :data:`DEFAULT_PAIR_WEIGHT`; ``p = 0`` → canary
    pairs 0; ``p = 100`` → other pairs 0; only one side serving → every pair the default weight
    (the side that serves takes all keys; the operator recomputes when states change).

    Within each side all pairs share one weight, so changing ``p`` never moves a key between two
    stable pairs or between two canary pairs: keys only cross between the revisions.

    Example: 9 stable + 1 canary serving, ``p = 5``: canary ``5·9 = 45``, stable ``95·1 = 95``,
    gcd 5 → 9 and 19; canary share ``9 / (9 + 9·19) = 5 %``.

    The share is of *keys*; the request share follows it as long as no single key is hot.
    """
    pairs = tuple(pairs)
    if canary_revision is None or canary_percent is None:
        return {p.id: DEFAULT_PAIR_WEIGHT for p in pairs}
    if not 0 <= canary_percent <= 100:
        raise ValueError("canary_percent must be within 0..100")
    serving = [p for p in pairs if p.state is PairState.SERVING]
    n_canary = sum(1 for p in serving if p.revision == canary_revision)
    n_stable = len(serving) - n_canary
    if canary_percent == 0:
        w_canary, w_stable = 0, DEFAULT_PAIR_WEIGHT
    elif canary_percent == 100:
        w_canary, w_stable = DEFAULT_PAIR_WEIGHT, 0
    elif n_canary == 0 or n_stable == 0:
        w_canary = w_stable = DEFAULT_PAIR_WEIGHT
    else:
        w_canary = canary_percent * n_stable
        w_stable = (100 - canary_percent) * n_canary
        g = math.gcd(w_canary, w_stable)
        w_canary, w_stable = w_canary // g, w_stable // g
    return {p.id: (w_canary if p.revision == canary_revision else w_stable) for p in pairs}


# --- bounded-load walk ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PairLoad:
    """Load snapshot of one pair (sums over its instances), as the router last saw it."""

    in_flight: int = 0
    """Requests being served (vLLM ``num_requests_running``)."""
    queued: int = 0
    """Requests waiting (vLLM ``num_requests_waiting``)."""
    kv_utilization_percent: float = 0.0
    """KV-cache usage, 0-100 (vLLM ``kv_cache_usage_perc`` × 100)."""

    @property
    def load(self) -> int:
        """The quantity the load bound is taken over: requests assigned to the pair."""
        return self.in_flight + self.queued


NO_LOAD = PairLoad()


@dataclass(frozen=True)
class WalkBound:
    """Parameters of the bounded-load walk (from a table's ``hash`` and ``admission``)."""

    load_bound_percent: int = 125
    max_walk: int = 4
    admission: Admission | None = None
    """Fast-reject limits; ``None`` means no pair is ever full (the load bound still applies)."""

    def __post_init__(self) -> None:
        if self.load_bound_percent < 100:
            raise ValueError("load_bound_percent must be >= 100")
        if self.max_walk < 1:
            raise ValueError("max_walk must be >= 1")

    @classmethod
    def from_table(cls, table: RoutingTable) -> WalkBound:
        return cls(
            load_bound_percent=table.hash.load_bound_percent,
            max_walk=table.hash.max_walk,
            admission=table.admission,
        )


class Outcome(StrEnum):
    """How a request left the walk."""

    ROUTED = "Routed"
    """A tried pair accepted it."""
    QUEUED = "Queued"
    """No tried pair was under its bound; queued at the least-loaded tried pair that is not full."""
    REJECTED = "Rejected"
    """Every tried pair was full (or there was no candidate): the router answers ``status``."""


class SkipReason(StrEnum):
    """Why a tried pair was skipped (each skip is one fast reject)."""

    LOAD_BOUND = "LoadBound"
    IN_FLIGHT_LIMIT = "InFlightLimit"
    QUEUE_LIMIT = "QueueLimit"
    KV_LIMIT = "KvLimit"
    EXCLUDED = "Excluded"
    """The caller excluded the pair (it already tried it in this request; see *Exclusion*)."""


@dataclass(frozen=True)
class Skip:
    pair_id: str
    reason: SkipReason


@dataclass(frozen=True)
class RouteDecision:
    """Result of :func:`select`."""

    outcome: Outcome
    pair: Pair | None
    """Chosen pair (routed or queued), ``None`` when rejected."""
    walk_length: int
    """Pairs tried, including the one that accepted."""
    skips: tuple[Skip, ...] = ()
    """Fast rejects in walk order."""
    status: int | None = None
    """HTTP status to answer when rejected."""

    @property
    def pair_id(self) -> str | None:
        return None if self.pair is None else self.pair.id

    @property
    def fast_rejects(self) -> int:
        return len(self.skips)


def compute_capacity(weight: int, total_weight: int, total_load: int, load_bound_percent: int) -> int:
    """``ceil(c · (total_load + 1) · weight / total_weight)`` with ``c = load_bound_percent / 100``,
    in exact integer arithmetic (no float rounding differences between routers)."""
    if total_weight <= 0:
        return 0
    num = load_bound_percent * (total_load + 1) * weight
    return -(-num // (100 * total_weight))


def full_reason(load: PairLoad, admission: Admission | None) -> SkipReason | None:
    """Why ``load`` makes the pair full per ``admission``, or ``None`` if it can take more."""
    if admission is None:
        return None
    if load.in_flight >= admission.max_in_flight:
        return SkipReason.IN_FLIGHT_LIMIT
    if load.queued >= admission.max_queued:
        return SkipReason.QUEUE_LIMIT
    if load.kv_utilization_percent >= admission.max_kv_utilization_percent:
        return SkipReason.KV_LIMIT
    return None


def select(
    key: int,
    pairs: Iterable[Pair] | CandidateSet,
    loads: Mapping[str, PairLoad],
    bound: WalkBound,
    *,
    exclude: Collection[str] = (),
) -> RouteDecision:
    """The bounded-load walk over :func:`candidates` (formula and example in the module docstring).

    ``loads`` maps pair id → snapshot; a pair missing from it counts as idle. ``exclude`` names pairs the
    caller already tried in this request (see *Exclusion*). ``pairs`` may be a :class:`CandidateSet` (or
    a tuple, memoised as one) so repeated walks over the same pairs skip the precomputation.
    """
    cset = _candidate_set(pairs)
    if not cset.pairs:
        return RouteDecision(Outcome.REJECTED, None, 0, (), STATUS_NO_CANDIDATES)
    order = cset.order(key, bound.max_walk)
    total_load = 0
    if len(loads) < len(cset.ids):
        ids = cset.id_set
        for pid, pl in loads.items():
            if pid in ids:
                total_load += pl.in_flight + pl.queued
    else:
        get = loads.get
        for pid in cset.ids:
            found = get(pid)
            if found is not None:
                total_load += found.in_flight + found.queued
    total_weight = cset.total_weight
    skips: list[Skip] = []
    fallback: Pair | None = None
    fallback_load = 0
    for tried, pair in enumerate(order, start=1):
        if exclude and pair.id in exclude:
            skips.append(Skip(pair.id, SkipReason.EXCLUDED))
            continue
        load = loads.get(pair.id, NO_LOAD)
        reason = full_reason(load, bound.admission)
        if reason is None:
            cap = compute_capacity(pair.weight, total_weight, total_load, bound.load_bound_percent)
            if load.load < cap:
                return RouteDecision(Outcome.ROUTED, pair, tried, tuple(skips))
            reason = SkipReason.LOAD_BOUND
            if fallback is None or load.load < fallback_load:
                fallback, fallback_load = pair, load.load
        skips.append(Skip(pair.id, reason))
    walked = len(order)
    if fallback is not None:
        return RouteDecision(Outcome.QUEUED, fallback, walked, tuple(skips))
    status = bound.admission.reject_status if bound.admission is not None else STATUS_NO_CANDIDATES
    return RouteDecision(Outcome.REJECTED, None, walked, tuple(skips), status)


_BOUNDS: _ByIdentity[RoutingTable, WalkBound] = _ByIdentity()


def _bound_for_table(table: RoutingTable) -> WalkBound:
    return _BOUNDS.get(table, lambda: WalkBound.from_table(table))


_PINNED: _ByIdentity[RoutingTable, CandidateSet] = _ByIdentity()


def _at_default_weight(pairs: Iterable[Pair]) -> tuple[Pair, ...]:
    """``pairs``' serving ones, each at the default weight: the by-count walk a pinned request and a mirror copy
    take, whatever weights the table gives the revisions."""
    return tuple(
        p if p.weight == DEFAULT_PAIR_WEIGHT else p.model_copy(update={"weight": DEFAULT_PAIR_WEIGHT})
        for p in pairs
        if p.state is PairState.SERVING
    )


def revision_pairs(table: RoutingTable, revision: str) -> tuple[Pair, ...]:
    """The serving pairs of ``revision`` in ``table``, each at the default weight (see *Pinning a revision*)."""
    return _at_default_weight(p for p in table.pairs if p.revision == revision)


def candidate_set_for_revision(table: RoutingTable, revision: str) -> CandidateSet:
    """The memoised :class:`CandidateSet` of ``table``'s serving pairs of ``revision`` (equal weights)."""
    return _PINNED.get(table, lambda: CandidateSet(revision_pairs(table, revision)), revision)


def mirror_candidates(pairs: Iterable[Pair]) -> CandidateSet:
    """The pairs a mirror copy is placed among: every serving pair of both revisions at the default weight
    (*Mirroring the canary*); the router memoises it per table, the simulator per table rebuild."""
    return CandidateSet(_at_default_weight(pairs))


@dataclass(frozen=True)
class MirrorChoice:
    """Where a request's mirror copy goes (:func:`mirror_target`)."""

    pair: Pair | None
    """The canary pair that gets the copy, or None."""
    skipped: Pair | None = None
    """The key's own canary pair by pair count, when the walk did not take the key there (full by admission, or
    over its load bound): no copy, which the router counts (``skipped_full``)."""


NO_MIRROR: Final = MirrorChoice(None)


def mirror_target(
    cset: CandidateSet, canary: str, key: int, loads: Mapping[str, PairLoad], bound: WalkBound
) -> MirrorChoice:
    """Where ``key``'s copy goes: :func:`select`'s bounded-load walk over ``cset`` (:func:`mirror_candidates`,
    every serving pair at the default weight) with the pairs' loads, the walk a ``setCanaryPairs`` step would
    run; a copy when it is *routed* to a pair of revision ``canary``. The load bound matters: without it a
    canary pair whose keys run hot takes all their copies, while a serving pair sheds the excess to the next
    one (W5 measured a good mirrored canary at TPOT × 1.2 and TTFT × 3.8 of stable that way)."""
    decision = select(key, cset, loads, bound)
    pair = decision.pair
    if decision.outcome is Outcome.ROUTED and pair is not None and pair.revision == canary:
        return MirrorChoice(pair)
    own = cset.order(key, 1)
    return MirrorChoice(None, skipped=own[0] if own and own[0].revision == canary else None)


def pick_instance(
    key: int, units: Iterable[Pair] | CandidateSet, loads: Mapping[str, PairLoad], bound: WalkBound
) -> str | None:
    """The instance of a role inside a pair a request with ``key`` enters: :func:`select` over the instances as
    if each were a pair (``units``: one serving :class:`Pair` per instance that can take work, ``id`` its name),
    so a conversation keeps to one instance and its prefix cache, and the bounded-load walk moves a key off an
    instance that carries more than its share. When no tried instance takes it, the least loaded of all (ties:
    ``units`` order): the pair has already admitted the request. None without units.

    Why: a pair group of several prefill instances is one routing unit, but the prefix cache lives in each
    instance. Least-loaded alone sends a conversation's turns to whichever instance is idlest and loses
    its cached prefix; the router and the simulator run this one rule (design note 005, *Instances inside a
    pair*). Example: two idle instances ``a`` and ``b``: every request of a key goes to the same one; with ``a``
    holding 3 in flight and ``b`` none, the load bound (c = 1.25: cap ⌈1.25 · 4 / 2⌉ = 3) moves ``a``'s keys
    to ``b``."""
    cset = _candidate_set(units)
    if not cset.pairs:
        return None
    if len(cset.pairs) == 1:
        return cset.pairs[0].id
    decision = select(key, cset, loads, bound)
    if decision.pair is not None:
        return decision.pair.id
    return min(cset.pairs, key=lambda u: loads.get(u.id, NO_LOAD).load).id


_MIRRORED: _ByIdentity[RoutingTable, CandidateSet] = _ByIdentity()


def mirror_pair(table: RoutingTable, key: int, loads: Mapping[str, PairLoad] | None = None) -> MirrorChoice:
    """Where a request with ``key`` is copied under ``table`` (*Mirroring the canary*, :func:`mirror_target` with
    the table's load bound, walk limit and admission): no copy when the table does not mirror. The pair is
    returned at the default weight (same id, endpoints and revision as the table's); ``loads`` as
    :func:`select` reads them (None: every pair idle).

    Example: 75 idle stable pairs and 1 mirrored canary pair: about 1 key in 76 is copied, the same keys a
    ``setCanaryPairs: 1`` step would send that pair."""
    revisions = table.revisions
    if not revisions.canary_mirror or revisions.canary is None:
        return NO_MIRROR
    cset = _MIRRORED.get(table, lambda: mirror_candidates(table.pairs))
    return mirror_target(cset, revisions.canary, key, loads or {}, _bound_for_table(table))


def select_for_table(
    table: RoutingTable,
    key: int,
    loads: Mapping[str, PairLoad],
    *,
    exclude: Collection[str] = (),
    revision: str | None = None,
) -> RouteDecision:
    """:func:`select` with the table's pairs, load bound, walk limit and admission (memoised per table).

    ``revision`` pins the walk to that revision's serving pairs (*Pinning a revision*); the decision's
    pair is then the table's pair at the default weight (same id, endpoints and revision).
    """
    cset = candidate_set_for_table(table) if revision is None else candidate_set_for_revision(table, revision)
    return select(key, cset, loads, _bound_for_table(table), exclude=exclude)


def plan_route(
    tables: Iterable[RoutingTable],
    features: RequestFeatures,
    prompt: str,
    loads: Mapping[str, PairLoad],
) -> tuple[RoutingTable, RouteDecision] | None:
    """The whole router decision for one request: classify, key by the pool's ``prefixChars``, walk.

    ``None`` when no pool matches (the router answers with its default). ``loads`` is keyed by pair
    id; only the chosen pool's pairs are looked up.
    """
    table = classify(features, tables)
    if table is None:
        return None
    key = routing_key(prompt, table.hash.prefix_chars)
    return table, select_for_table(table, key, loads)
