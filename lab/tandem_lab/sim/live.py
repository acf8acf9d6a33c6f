"""Live fleet model: trace-driven vLLM metrics for the engine pods of a real (local) cluster.

What it owns: a model of a *changing* fleet that somebody else describes — the routing tables the
operator publishes (pools → pairs in ring order, with state, weight, revision and endpoint pod names)
and the engine pods that exist and are Ready — through which it replays request arrivals in real
time, and the per-pod vLLM metric state (benchmarks.md §9) those requests leave behind. ``tandem sim
live`` (:mod:`tandem_lab.dev.simlive`) feeds it from kubectl and serves the metrics to the real
Prometheus, so the real operator closes its loops (gates, autoscaling) on simulated traffic.

Must not: do I/O, read the clock or the environment (time comes from the injected ``clock``; every
public call first simulates up to ``clock()``), or import Kubernetes/Prometheus clients.

Request path (the offline engine's physics, :mod:`tandem_lab.sim.physics` and :mod:`tandem_lab.sim.cache`):

1. **Arrivals.** :class:`ArrivalSource` replays a :class:`~tandem_lab.sim.workload.Workload` (a Mooncake
   trace or generated agentic sessions) as ``c = rate / (native × speedup)`` interleaved copies
   (prefix-root multiplication: copy ``j`` replays the trace from a seeded phase in its own block-id
   space, and again in a fresh id space each lap); the last copy is thinned to the fractional part of
   ``c`` by a seeded per-request draw. ``speedup`` compresses trace time (session gaps shrink); the
   offered ``rate`` can change at runtime (copies join at the current trace position).
   Worked example: the conversation trace has 12,031 requests over a 3,540 s span (3.40 req/s); at
   ``rate = 50``, ``speedup = 1``: ``c = 50 / 3.40 = 14.7`` → 14 full copies and one kept at 72 %
   (checked by a unit test); at ``speedup = 4``, ``c = 3.7``.
2. **Pool and pair.** :func:`tandem.routing.classify` on prompt tokens picks the table, the key is
   :func:`~tandem.routing.routing_key_from_blocks` over the first ``key_blocks`` block ids (or the
   generator's prefix key), and :func:`tandem.routing.select` walks the table's candidates with the
   pairs' live loads (in flight = requests assigned to the pair and not waiting; queued = waiting
   for prefill or for a decode slot; KV = the fullest decode instance). Candidates are the table's
   serving pairs with a positive weight *that have at least one live prefill and one live decode
   pod* (a router cannot send to an endpoint without a pod). Per-instance admission limits are
   scaled to the pair's shape as the offline engine does (d × ``maxInFlight``, p × ``maxQueued``).
   Each fast reject costs one router RTT; a rejected request never reaches an engine.
3. **Prefill** on the pair's prefill instance (key's rendezvous order over the pair's prefill pods,
   skipping those at the queue limit): up to ``prefill_concurrency`` prefills share the instance's
   compute (processor sharing, as the offline engine; 1 = FCFS), the rest wait FIFO; at start the
   local LRU prefix cache (longest leading run of block ids) and the shared tier are looked up, and
   ``prefill_time(uncached, cached) × prefill_multiplier`` plus the shared fetch is the request's
   work; then every block goes into the local cache (and the shared tier).
4. **P→D** over the intra-node link, then **decode** on the pair's least-loaded decode pod:
   continuous batching as the engine's fluid model (all sequences advance at
   ``1 / (t_step(B, Σc) × tpot_multiplier)``; virtual token clock), admitted while the batch is below
   the pool's ``maxInFlight`` and the sequence's prompt + output fit the free KV, else FIFO waiting.

Metrics per pod (vLLM names; the exposition is :mod:`tandem_lab.dev.simlive`'s job): a prefill pod sees
a one-token request (TTFT = e2e = arrival → prefill done, ``finished_reason="length"``, its local
prefix-cache queries/hits and the shared tier as the external cache); a decode pod sees the user's
request (TTFT = arrival → first token, including walk, prefill and transfer — what the operator's
TTFT gates read; ITL/TPOT; e2e; ``stop`` or, with the revision's ``error_rate``, ``error``; the KV from
the prefill instance as external hits). Gauges: running, waiting, ``kv_cache_usage_perc`` (prompt +
full output of each running sequence, reserved at admission, over the instance's KV capacity).

Fleet changes: a pod that appears starts cold (empty cache, zero counters); a draining pair gets no
new requests but finishes what it has; a pod that vanishes drops its state and fails its requests.
Determinism: every draw is a hash of (seed, stream, lap, request) or (seed, request serial), so the
same workload, options, seed and sequence of calls and clock readings give the same metrics.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, Literal

from tandem import enginemetrics as em
from tandem.routing import (
    Admission,
    CandidateSet,
    Outcome,
    Pair,
    PairLoad,
    PairState,
    RequestFeatures,
    RoutingTable,
    WalkBound,
    classify,
    is_candidate,
    mirror_candidates,
    mirror_target,
    rendezvous_score,
    routing_key_from_blocks,
    select,
)
from tandem_lab.sim.cache import NicModel, PrefixCache, hit_tokens
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.workload import BLOCK_TOKENS, Workload

Role = Literal["prefill", "decode"]

# vLLM's vocabulary (names, buckets, finished reasons) is tandem.enginemetrics's; re-exported for this module's users.
COPYABLE_ARRIVALS: Final = 65_536
"""External routing: arrivals whose mirror copy may still come (a copy's legs come within seconds of its
request; this is minutes of the demo's traffic)."""
TTFT_BUCKETS: Final = em.TTFT_BUCKETS
TPOT_BUCKETS: Final = em.TPOT_BUCKETS
LATENCY_BUCKETS: Final = em.LATENCY_BUCKETS
TOKEN_BUCKETS: Final = em.TOKEN_BUCKETS
FINISHED_REASONS: Final = em.FINISHED_REASONS
TTFT: Final = em.TTFT
ITL: Final = em.ITL
TPOT: Final = em.TPOT
E2E: Final = em.E2E
QUEUE_TIME: Final = em.QUEUE_TIME
PREFILL_TIME: Final = em.PREFILL_TIME
DECODE_TIME: Final = em.DECODE_TIME
PROMPT_TOKENS_HIST: Final = em.PROMPT_TOKENS_HIST
GENERATION_TOKENS_HIST: Final = em.GENERATION_TOKENS_HIST
HISTOGRAMS: Final[Mapping[str, tuple[float, ...]]] = em.HISTOGRAMS
PROMPT_TOKENS: Final = em.PROMPT_TOKENS
GENERATION_TOKENS: Final = em.GENERATION_TOKENS
PREFIX_QUERIES: Final = em.PREFIX_QUERIES
PREFIX_HITS: Final = em.PREFIX_HITS
EXTERNAL_QUERIES: Final = em.EXTERNAL_QUERIES
EXTERNAL_HITS: Final = em.EXTERNAL_HITS
COUNTERS: Final = em.COUNTERS
REQUEST_SUCCESS: Final = em.REQUEST_SUCCESS
RUNNING: Final = em.RUNNING
WAITING: Final = em.WAITING
KV_USAGE: Final = em.KV_USAGE

STREAM_LIMIT: Final = 4096
"""Most interleaved copies of a workload (≈ 13 k req/s of the conversation trace at speedup 1)."""
_ID_SHIFT: Final = 56
"""Block ids of copy ``j`` in lap ``l`` are ``id + ((l · STREAM_LIMIT + j) << 56)``: disjoint from the
trace's (< 2**40) and the generator's (< 2**53) id spaces and from every other copy and lap."""
_M64: Final = (1 << 64) - 1
_KEY_CACHE_LIMIT: Final = 200_000
_MIN_KEEP: Final = 1e-3


# --- deterministic draws -------------------------------------------------------------------------


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection on 64-bit integers with good avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _unit(*parts: int) -> float:
    """A uniform draw in [0, 1) determined by ``parts`` (no RNG state, so no order dependence)."""
    h = 0
    for p in parts:
        h = _mix64(h ^ (p & _M64))
    return (h >> 11) / float(1 << 53)


_DRAW_PHASE, _DRAW_KEEP, _DRAW_ERROR, _DRAW_IMAGES, _DRAW_KEY = 1, 2, 3, 4, 5


# --- inputs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LivePod:
    """An engine pod as live mode sees it: Ready, with Tandem's labels (the series label contract)."""

    namespace: str
    name: str
    pool: str
    revision: str
    role: Role
    pair: str
    uid: str = ""
    """A pod recreated under the same name (new uid) starts cold."""

    def target_labels(self) -> dict[str, str]:
        return {
            "namespace": self.namespace,
            "pool": self.pool,
            "revision": self.revision,
            "role": self.role,
            "pair": self.pair,
            "pod": self.name,
        }


@dataclass(frozen=True)
class Behaviour:
    """A revision's performance relative to the physics (the offline engine's ``Revision``)."""

    prefill_multiplier: float = 1.0
    """Prefill cost × this (TTFT grows by at least this factor on the prefill part, more under load)."""
    tpot_multiplier: float = 1.0
    """Decode step time × this."""
    error_rate: float = 0.0
    """Share of requests that finish with ``finished_reason="error"`` (0-1)."""

    def validated(self) -> Behaviour:
        for name in ("prefill_multiplier", "tpot_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0")
        v = self.error_rate
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            raise ValueError("error_rate must be within 0..1")
        return self


BEHAVIOUR_FIELDS: Final = frozenset(f.name for f in fields(Behaviour))
BEHAVIOUR_ALIASES: Final[Mapping[str, str]] = {"ttft_multiplier": "prefill_multiplier"}
"""The test exporter's name for the same knob (``set_revision(rev, ttft_multiplier=1.5)`` keeps working)."""


def behaviour_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` with aliases resolved; unknown names are an error (never silently ignored)."""
    out: dict[str, Any] = {}
    for name, value in changes.items():
        key = BEHAVIOUR_ALIASES.get(name, name)
        if key not in BEHAVIOUR_FIELDS:
            known = sorted(BEHAVIOUR_FIELDS | set(BEHAVIOUR_ALIASES))
            raise ValueError(f"unknown behaviour field {name!r}; live mode knows {known}")
        out[key] = value
    return out


@dataclass(frozen=True)
class LiveOptions:
    """Knobs of a live run that are not physics parameters."""

    rate: float = 50.0
    """Offered requests per second (wall clock)."""
    speedup: float = 1.0
    """Trace seconds per wall second: compresses session gaps; the copy count makes up the rate."""
    seed: int = 1
    key_blocks: int = 2
    """Routing key = the first ``key_blocks`` block ids when the workload has no prefix key (2 for the
    Mooncake traces: block 0 is shared by most requests, benchmarks.md §3.1)."""
    images_share: float = 0.0
    """Share of requests that carry images (classification only; the traces have none)."""
    kv_capacity_tokens: float | None = None
    """Override the physics' KV capacity per instance (tokens), e.g. to make KV pressure visible."""
    shared_tier: bool = True
    """Model the Mooncake shared tier (one fleet-wide LRU, costed by NIC bandwidth)."""
    capacity_scale: float = 1.0
    """Every instance-side service runs this many times faster — prefill, decode steps, the P→D and
    shared-tier transfers (the router's RTT does not) — so a local cluster of a few pairs absorbs a
    trace at tens of requests per second with TTFT made of the same parts. 1 = the physics of
    ``params.yaml`` (an illustrative 1 T MoE on 4 × MI325X: ~2 conversation-trace prefills/s)."""
    external_routing: bool = False
    """A real router routes the arrivals (``tandem_lab.dev.livefront``): they wait in
    :attr:`LiveFleet.outbox` for a client to send them, and come back as legs on the pods the router chose
    (:meth:`LiveFleet.enter_prefill`, :meth:`LiveFleet.enter_decode`); the model's own step 2 is skipped."""

    def validated(self) -> LiveOptions:
        if not math.isfinite(self.rate) or self.rate < 0:
            raise ValueError("rate must be a finite number >= 0")
        if not math.isfinite(self.speedup) or self.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if self.key_blocks < 1:
            raise ValueError("key_blocks must be >= 1")
        if not 0 <= self.images_share <= 1:
            raise ValueError("images_share must be within 0..1")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens <= 0:
            raise ValueError("kv_capacity_tokens must be > 0")
        if not math.isfinite(self.capacity_scale) or self.capacity_scale <= 0:
            raise ValueError("capacity_scale must be > 0")
        return self


# --- arrivals ------------------------------------------------------------------------------------


@dataclass
class Arrival:
    """One request of the replayed stream."""

    t: float
    input_tokens: int
    output_tokens: int
    blocks: list[int]
    key: int
    has_images: bool = False


class _Stream:
    """Copy ``j`` of the workload: the trace rotated by a seeded phase, lap after lap."""

    __slots__ = ("j", "k", "keep", "lap", "next_t", "p", "phase")

    def __init__(self, j: int, phase: float, p: int, keep: float) -> None:
        self.j = j
        self.phase = phase
        self.p = p  # first trace index at or after the phase
        self.keep = keep
        self.k = 0  # position within the lap (0..n-1)
        self.lap = 0
        self.next_t = math.inf


class ArrivalSource:
    """Arrivals from ``workload`` at ``rate`` req/s, trace time running ``speedup``× (module docstring)."""

    def __init__(
        self, workload: Workload, *, rate: float, speedup: float, seed: int, key_blocks: int, epoch: float
    ) -> None:
        if len(workload) == 0:
            raise ValueError("the workload has no requests")
        self.wl = workload
        self.arr: list[float] = workload.arrival_s.tolist()
        self.inp: list[int] = workload.input_tokens.tolist()
        self.out: list[int] = workload.output_tokens.tolist()
        self.bstart: list[int] = workload.block_start.tolist()
        self.bcount: list[int] = workload.block_count.tolist()
        self.tail: list[int] = workload.tail_id.tolist()
        self.off: list[int] = workload.id_offset.tolist()
        self.pkey: list[int] | None = workload.prefix_key.tolist() if workload.prefix_key is not None else None
        self.n = len(self.arr)
        self.span: float = max(float(workload.duration_s), float(self.arr[-1]) + 1e-3)
        self.native_rate = self.n / self.span
        self.speedup = speedup
        self.seed = seed
        self.key_blocks = key_blocks
        self.epoch = epoch
        self.images_share = 0.0
        self.rate = 0.0
        self.copies = 0.0
        self._streams: dict[int, _Stream] = {}
        self._heap: list[tuple[float, int]] = []
        self._keys: dict[tuple[int, ...], int] = {}
        self.set_rate(rate, epoch)

    # -- rate --

    def set_rate(self, rate: float, now: float) -> None:
        """Offer ``rate`` req/s from ``now`` on: ``rate / (native × speedup)`` copies (module docstring)."""
        if not math.isfinite(rate) or rate < 0:
            raise ValueError("rate must be a finite number >= 0")
        copies = rate / (self.native_rate * self.speedup)
        if copies > STREAM_LIMIT:
            raise ValueError(f"rate {rate} needs {copies:.0f} copies of the workload (limit {STREAM_LIMIT})")
        full = int(copies)
        frac = copies - full
        if frac < _MIN_KEEP:  # a sliver of a copy: thinning it would scan ~1/frac requests per arrival
            frac = 0.0
        want = full + (1 if frac > 0 else 0)
        for j in list(self._streams):
            if j >= want:
                del self._streams[j]
        for j in range(want):
            keep = 1.0 if j < full else frac
            stream = self._streams.get(j)
            if stream is None:
                phase = _unit(self.seed, _DRAW_PHASE, j) * self.span
                stream = _Stream(j, phase, bisect.bisect_left(self.arr, phase), keep)
                self._streams[j] = stream
                self._seek(stream, now)
            elif stream.keep != keep:
                stream.keep = keep
                self._seek(stream, now)
        self.rate = rate
        self.copies = copies
        self._heap = [(s.next_t, s.j) for s in self._streams.values()]
        heapq.heapify(self._heap)

    # -- positions --

    def _rel(self, s: _Stream, k: int) -> float:
        """Trace time of position ``k`` of a lap, relative to the stream's phase (in [0, span))."""
        i = s.p + k
        if i < self.n:
            return self.arr[i] - s.phase
        return self.arr[i - self.n] + self.span - s.phase

    def _index(self, s: _Stream, k: int) -> int:
        i = s.p + k
        return i if i < self.n else i - self.n

    def _seek(self, s: _Stream, now: float) -> None:
        """Position ``s`` at its first kept request at or after wall time ``now``."""
        x = max(0.0, (now - self.epoch) * self.speedup)
        lap = int(x // self.span)
        within = x - lap * self.span
        lo, hi = 0, self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._rel(s, mid) < within:
                lo = mid + 1
            else:
                hi = mid
        s.lap, s.k = (lap + 1, 0) if lo >= self.n else (lap, lo)
        self._settle(s)

    def _settle(self, s: _Stream) -> None:
        """Skip thinned requests; set ``next_t`` to the wall time of the next kept one."""
        if s.keep <= 0.0:
            s.next_t = math.inf
            return
        while s.keep < 1.0 and _unit(self.seed, _DRAW_KEEP, s.j, s.lap, self._index(s, s.k)) >= s.keep:
            s.k += 1
            if s.k >= self.n:
                s.k, s.lap = 0, s.lap + 1
        s.next_t = self.epoch + (s.lap * self.span + self._rel(s, s.k)) / self.speedup

    # -- consuming --

    def peek(self) -> float:
        """Wall time of the next arrival (inf when the rate is 0)."""
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> Arrival:
        """The next arrival (call only when :meth:`peek` is finite)."""
        t, j = self._heap[0]
        s = self._streams[j]
        i = self._index(s, s.k)
        copy = s.lap * STREAM_LIMIT + s.j
        arrival = self._request(i, t, copy)
        s.k += 1
        if s.k >= self.n:
            s.k, s.lap = 0, s.lap + 1
        self._settle(s)
        heapq.heapreplace(self._heap, (s.next_t, j))
        return arrival

    def _request(self, i: int, t: float, copy: int) -> Arrival:
        start, count = self.bstart[i], self.bcount[i]
        base = self.off[i]
        shift = copy << _ID_SHIFT
        add = base + shift
        blocks = self.wl.blocks[start : start + count].tolist()
        if add:
            blocks = [b + add for b in blocks]
        if self.tail[i] >= 0:
            blocks.append(self.tail[i] + add)
        if self.pkey is not None:
            key = _mix64(self.pkey[i] ^ _mix64(copy ^ (self.seed << 32) ^ _DRAW_KEY))
        else:
            head = tuple(blocks[: self.key_blocks])
            cached = self._keys.get(head)
            if cached is None:
                if len(self._keys) >= _KEY_CACHE_LIMIT:
                    self._keys.clear()
                cached = routing_key_from_blocks(head, self.key_blocks)
                self._keys[head] = cached
            key = cached
        images = self.images_share > 0 and _unit(self.seed, _DRAW_IMAGES, copy, i) < self.images_share
        return Arrival(t, self.inp[i], self.out[i], blocks, key, images)


# --- metric state --------------------------------------------------------------------------------


class _Hist:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.total = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight


@dataclass(frozen=True)
class Histogram:
    """A snapshot of one histogram: per-bucket (non-cumulative) counts, the last one for +Inf."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) per bucket, +Inf last (the exposition's ``le`` series)."""
        out, acc = [], 0
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile`` over these counts (linear inside a bucket); NaN when empty."""
        return histogram_quantile(q, self.bounds, self.counts)

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier`` (what ``rate()`` over that window sees)."""
        return Histogram(
            self.bounds,
            tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)),
            self.total - earlier.total,
        )


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float:
    """``histogram_quantile(q, ...)`` as Prometheus computes it from per-bucket counts.

    Example: bounds (0.1, 0.25, 0.5), counts (0, 8, 2, 0): rank 0.9 × 10 = 9 falls in (0.25, 0.5]
    after 8 → 0.25 + 0.25 × (9 − 8)/2 = 0.375.
    """
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    acc = 0
    for i, c in enumerate(counts):
        if acc + c >= rank and c > 0:
            if i >= len(bounds):
                return bounds[-1]  # the +Inf bucket: Prometheus answers the highest finite bound
            lo = bounds[i - 1] if i > 0 else 0.0
            return lo + (bounds[i] - lo) * (rank - acc) / c
        acc += c
    return bounds[-1]


@dataclass(frozen=True)
class PodMetrics:
    """Everything one pod's ``/metrics`` shows, at one instant."""

    pod: LivePod
    histograms: Mapping[str, Histogram]
    counters: Mapping[str, float]
    """Counter values by name without ``_total``."""
    success: Mapping[str, int]
    """``vllm:request_success_total`` by ``finished_reason`` (every reason present, zeros included)."""
    gauges: Mapping[str, float]


# --- fleet state ---------------------------------------------------------------------------------


class _Req:
    __slots__ = (
        "arrival",
        "done",
        "dpod",
        "local_run",
        "local_tokens",
        "mirror",
        "on_done",
        "on_first",
        "on_prefill",
        "pair",
        "ppod",
        "queued",
        "shared_run",
        "shared_tokens",
        "sid",
        "t_admit",
        "t_first",
        "t_join",
        "t_ready",
        "t_start",
        "v_finish",
        "walk_delay",
    )

    def __init__(self, sid: int, arrival: Arrival) -> None:
        self.sid = sid
        self.arrival = arrival
        self.done = False
        self.pair: _Pair | None = None
        self.ppod: _Pod | None = None
        self.dpod: _Pod | None = None
        self.queued = False
        self.walk_delay = 0.0
        self.local_run = 0
        self.shared_run = 0
        self.local_tokens = 0
        self.shared_tokens = 0
        self.t_start = 0.0
        self.t_join = 0.0
        self.t_admit = 0.0
        self.t_first = 0.0
        self.v_finish = 0.0
        self.mirror = False
        """A mirror copy (``revisions.canaryMirror``): its pods' metrics count it, the fleet's counters do not."""
        # External routing (LiveOptions.external_routing): when the KV reaches decode (None: prefill not
        # done) and the legs' callbacks, called under the caller's lock from whichever thread advances.
        self.t_ready: float | None = None
        self.on_prefill: Callable[[bool], None] | None = None
        self.on_first: Callable[[float], None] | None = None
        self.on_done: Callable[[int | None], None] | None = None


class _Pod:
    """One engine pod: physics state and vLLM metric state."""

    __slots__ = (
        "active",
        "alive",
        "batch",
        "cache",
        "counters",
        "ctx_sum",
        "hists",
        "incoming",
        "kv_cap",
        "kv_used",
        "max_queued",
        "max_seqs",
        "nid",
        "queue",
        "rate",
        "ref",
        "step",
        "success",
        "t_v",
        "v",
        "version",
        "waiting",
    )

    def __init__(self, ref: LivePod, nid: int, kv_cap: float, cache_blocks: int) -> None:
        self.ref = ref
        self.nid = nid
        self.alive = True
        self.kv_cap = kv_cap
        self.max_seqs = 1
        self.max_queued = 1
        self.hists = {name: _Hist(bounds) for name, bounds in HISTOGRAMS.items()}
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        # prefill
        self.cache: PrefixCache | None = PrefixCache(cache_blocks) if ref.role == "prefill" else None
        self.queue: deque[_Req] = deque()
        # decode (fluid continuous batching, as tandem_lab.sim.engine)
        self.active: list[tuple[float, int, _Req]] = []
        self.waiting: deque[_Req] = deque()
        self.incoming = 0
        self.batch = 0
        self.ctx_sum = 0.0
        self.kv_used = 0.0
        self.v = 0.0
        self.t_v = 0.0
        self.rate = 0.0
        self.step = 0.0
        self.version = 0


class _Pair:
    __slots__ = ("assigned", "decode", "dirty", "id", "load", "prefill", "queued", "revision", "table")

    def __init__(self, pair_id: str, table: tuple[str, str]) -> None:
        self.id = pair_id
        self.table = table
        self.revision = ""
        self.prefill: list[_Pod] = []
        self.decode: list[_Pod] = []
        self.assigned = 0
        self.queued = 0
        self.dirty = True
        self.load = PairLoad()


@dataclass
class _Route:
    """One table, ready for routing: candidates with live pods, loads, walk bound."""

    table: RoutingTable
    pairs: dict[str, _Pair]
    candidates: tuple[Pair, ...]
    bound: WalkBound
    loads: dict[str, PairLoad] = field(default_factory=dict)
    mirror: CandidateSet | None = None
    """Where copies go when the table mirrors its canary (``tandem.routing.mirror_target``): every serving pair
    with pods, at the default weight."""


@dataclass(frozen=True)
class PoolStats:
    namespace: str
    pool: str
    pairs: int
    candidates: int
    in_flight: int
    """Requests assigned to the pool's pairs (prefill queue + prefill + transfer + decode)."""
    in_prefill: int
    """Waiting for or in prefill."""
    in_decode: int
    """Running or waiting on decode instances."""


@dataclass(frozen=True)
class FleetStats:
    """Cumulative counters since the model started, plus current per-pool occupancy."""

    now: float
    rate: float
    copies: float
    arrivals: int
    routed: int
    queued_walks: int
    """Walks that ended with ``Queued`` (no tried pair under its bound)."""
    rejected: int
    unmatched: int
    """Requests no pool's match took."""
    fast_rejects: int
    failed: int
    """Requests lost with a pod that vanished."""
    completed: int
    errors: int
    prefix_queries: float
    prefix_hits: float
    walk_lengths: Mapping[int, int]
    pools: tuple[PoolStats, ...]

    @property
    def hit_ratio(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else math.nan


_EV_ARRIVAL, _EV_PREFILL_DONE, _EV_DECODE_JOIN, _EV_DECODE_NEXT = range(4)


class LiveFleet:
    """The live fleet model (module docstring). Not thread-safe: callers hold one lock."""

    def __init__(
        self,
        params: SimParams,
        workload: Workload,
        options: LiveOptions,
        clock: Callable[[], float],
        capacity: Roofline | None = None,
    ) -> None:
        self.p = params
        self.opt = options.validated()
        self.cap = capacity or Roofline.from_params(params)
        self._clock = clock
        self.now = clock()
        self.source = ArrivalSource(
            workload,
            rate=options.rate,
            speedup=options.speedup,
            seed=options.seed,
            key_blocks=options.key_blocks,
            epoch=self.now,
        )
        self.source.images_share = options.images_share
        self.block_tokens = params.generator.block_tokens or BLOCK_TOKENS
        self.kv_b = params.model.kv_bytes_per_token
        self.kv_cap = options.kv_capacity_tokens or self.cap.kv_capacity_tokens
        self.cache_blocks = max(1, int(self.kv_cap // self.block_tokens))
        self.prefill_slots = max(1, params.instance.prefill_concurrency)
        self.rtt = params.network.router_rtt_s
        # capacity_scale speeds up every instance-side service: compute and the links it waits on.
        scale = self.opt.capacity_scale
        self.pd_bandwidth = params.network.intra_node_bandwidth * scale
        self.bw = self.cap.bandwidth
        self.comm = self.cap.comm_s
        self.m = self.cap.tokens_per_step
        self.w_table = self.cap.weight_bytes_table(max(1, params.instance.max_num_seqs))
        st = params.shared_tier
        self.shared: PrefixCache | None = None
        if options.shared_tier and st.enabled:
            self.shared = PrefixCache(int(st.stores * st.segment_bytes / (self.block_tokens * self.kv_b)))
        self.nic = NicModel(params.network.nic_bandwidth * scale, st.stores * st.nic_bandwidth * scale)
        self._behaviours: dict[str, Behaviour] = {}
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._pairs: dict[tuple[str, str], _Pair] = {}
        self._routes: dict[tuple[str, str], _Route] = {}
        self._tables: tuple[RoutingTable, ...] = ()
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0
        self._sid = 0
        self._nid = 0
        self.c = dict.fromkeys(
            (
                "arrivals",
                "routed",
                "queued_walks",
                "rejected",
                "unmatched",
                "fast_rejects",
                "failed",
                "completed",
                "errors",
                "prefix_queries",
                "prefix_hits",
                "decode_abandoned",
            ),
            0,
        )
        self.walks: dict[int, int] = {}
        self.external = self.opt.external_routing
        self.outbox: deque[tuple[int, Arrival]] = deque()
        """External routing: arrivals (serial, arrival) for the client to send, oldest first."""
        self._held: dict[int, _Req] = {}
        self._copyable: OrderedDict[int, Arrival] = OrderedDict()
        """External routing: the latest arrivals a router may still copy (``revisions.canaryMirror``); a copy of
        request ``n`` is held as ``-n``. Bounded by :data:`COPYABLE_ARRIVALS`."""
        self._pod_pair: dict[tuple[str, str], _Pair] = {}

    # --- control ---------------------------------------------------------------------------------

    def behaviour(self, revision: str) -> Behaviour:
        return self._behaviours.get(revision, Behaviour())

    def set_behaviour(self, revision: str, **changes: Any) -> Behaviour:
        """Change a revision's behaviour from now on (aliases: ``ttft_multiplier`` → ``prefill_multiplier``)."""
        resolved = behaviour_changes(changes)
        new = replace(self.behaviour(revision), **resolved).validated()
        self.advance()
        self._behaviours[revision] = new
        for pod in self._pods.values():
            if pod.ref.revision == revision and pod.ref.role == "decode" and pod.batch:
                self._advance_clock(pod)
                self._set_rate(pod)
                self._reschedule(pod)
        return new

    def behaviours(self) -> dict[str, Behaviour]:
        return dict(self._behaviours)

    def set_rate(self, rate: float) -> None:
        """Offer ``rate`` requests/s from now on."""
        self.advance()
        self.source.set_rate(rate, self.now)

    # --- fleet changes ---------------------------------------------------------------------------

    def sync(self, tables: Iterable[RoutingTable], pods: Iterable[LivePod]) -> tuple[int, int]:
        """Make the model's fleet equal to ``pods`` (Ready engine pods) routed by ``tables``.

        Returns (pods added, pods removed). A pod whose labels or uid changed is removed and re-added
        (cold). Requests on removed pods fail.
        """
        self.advance()
        wanted = {(p.namespace, p.name): p for p in pods}
        removed = 0
        for key, pod in list(self._pods.items()):
            if wanted.get(key) != pod.ref:
                self._remove_pod(pod)
                del self._pods[key]
                removed += 1
        added = 0
        for key, ref in wanted.items():
            if key not in self._pods:
                self._nid += 1
                pod = _Pod(ref, self._nid, self.kv_cap, self.cache_blocks)
                pod.max_seqs = self.p.instance.max_num_seqs
                pod.max_queued = self.p.admission.max_queued
                self._pods[key] = pod
                added += 1
        self._set_tables(tuple(tables))
        return added, removed

    def _set_tables(self, tables: tuple[RoutingTable, ...]) -> None:
        self._tables = tables
        routes: dict[tuple[str, str], _Route] = {}
        live_pairs: dict[tuple[str, str], _Pair] = {}
        pod_pair: dict[tuple[str, str], _Pair] = {}
        for table in tables:
            tkey = (table.namespace, table.pool)
            ns = table.namespace
            pairs: dict[str, _Pair] = {}
            cands: list[Pair] = []
            shape_p = shape_d = 1
            for pair in table.pairs:
                key = (ns, f"{table.pool}/{pair.id}")
                obj = self._pairs.get(key) or _Pair(pair.id, tkey)
                obj.revision = pair.revision
                obj.prefill = [pod for e in pair.prefill if (pod := self._pods.get((ns, e.pod))) is not None]
                obj.decode = [pod for e in pair.decode if (pod := self._pods.get((ns, e.pod))) is not None]
                obj.dirty = True
                for pod in (*obj.prefill, *obj.decode):
                    pod_pair[(ns, pod.ref.name)] = obj
                    pod.max_seqs = table.admission.max_in_flight
                    pod.max_queued = table.admission.max_queued
                pairs[pair.id] = obj
                live_pairs[key] = obj
                if is_candidate(pair) and obj.prefill and obj.decode:
                    cands.append(pair)
                    shape_p = max(shape_p, len(pair.prefill))
                    shape_d = max(shape_d, len(pair.decode))
            adm = table.admission
            bound = WalkBound(
                load_bound_percent=table.hash.load_bound_percent,
                max_walk=table.hash.max_walk,
                admission=Admission(
                    max_in_flight=adm.max_in_flight * shape_d,
                    max_queued=adm.max_queued * shape_p,
                    max_kv_utilization_percent=adm.max_kv_utilization_percent,
                    reject_status=adm.reject_status,
                ),
            )
            mirror = None
            if table.revisions.canary_mirror:
                mirror = mirror_candidates(
                    p
                    for p in table.pairs
                    if p.state is PairState.SERVING and pairs[p.id].prefill and pairs[p.id].decode
                )
            routes[tkey] = _Route(table, pairs, tuple(cands), bound, mirror=mirror)
        self._pairs = live_pairs
        self._pod_pair = pod_pair
        self._routes = routes
        if len(self.w_table) <= max((p.max_seqs for p in self._pods.values()), default=0) + 1:
            self.w_table = self.cap.weight_bytes_table(max(p.max_seqs for p in self._pods.values()) + 1)

    def _remove_pod(self, pod: _Pod) -> None:
        pod.alive = False
        for req in (*pod.queue, *pod.waiting, *(r for _, _, r in pod.active)):
            self._fail(req)
        pod.version += 1
        pod.queue.clear()
        pod.waiting.clear()
        pod.active.clear()
        pod.batch = 0
        if pod.cache is not None:
            pod.cache.clear()
        self.nic.forget(pod.nid)

    # --- simulation ------------------------------------------------------------------------------

    def push(self, t: float, kind: int, obj: Any, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, version))

    def advance(self) -> int:
        """Simulate up to ``clock()``; returns the number of arrivals processed."""
        target = self._clock()
        heap = self._heap
        source = self.source
        n = 0
        while True:
            t_ev = heap[0][0] if heap else math.inf
            t_arr = source.peek()
            if t_arr <= t_ev:
                if t_arr > target:
                    break
                self.now = t_arr
                if self.external:
                    self._hold(source.pop())
                else:
                    self._arrive(source.pop())
                n += 1
                continue
            if t_ev > target:
                break
            t, _, kind, obj, version = heapq.heappop(heap)
            self.now = t
            if kind == _EV_PREFILL_DONE:
                self._prefill_done(obj, version)
            elif kind == _EV_DECODE_JOIN:
                self._decode_join(obj)
            elif kind == _EV_DECODE_NEXT:
                self._decode_next(obj, version)
        self.now = max(self.now, target)
        return n

    # --- routing ---------------------------------------------------------------------------------

    def _pair_load(self, pair: _Pair) -> PairLoad:
        kv = 0.0
        for d in pair.decode:
            if d.kv_cap > 0:
                kv = max(kv, 100.0 * d.kv_used / d.kv_cap)
        return PairLoad(in_flight=pair.assigned - pair.queued, queued=pair.queued, kv_utilization_percent=kv)

    def _arrive(self, arrival: Arrival) -> None:
        c = self.c
        c["arrivals"] += 1
        self._sid += 1
        features = RequestFeatures(prompt_tokens=arrival.input_tokens, has_images=arrival.has_images)
        table = classify(features, self._tables)
        if table is None:
            c["unmatched"] += 1
            return
        route = self._routes[(table.namespace, table.pool)]
        loads = route.loads
        for cand in route.candidates if route.mirror is None else route.mirror.pairs:
            obj = route.pairs[cand.id]
            if obj.dirty:
                obj.load = self._pair_load(obj)
                obj.dirty = False
            loads[cand.id] = obj.load
        decision = select(arrival.key, route.candidates, loads, route.bound)
        sid = self._sid
        if route.mirror is not None and route.table.revisions.canary is not None:
            copy = mirror_target(route.mirror, route.table.revisions.canary, arrival.key, loads, route.bound).pair
            if copy is not None:
                self._sid += 1
                twin = _Req(self._sid, arrival)
                twin.mirror = True
                self._place(twin, route.pairs[copy.id], 0)
        skips = len(decision.skips)
        c["fast_rejects"] += skips
        if decision.walk_length:
            self.walks[decision.walk_length] = self.walks.get(decision.walk_length, 0) + 1
        if decision.outcome is Outcome.REJECTED or decision.pair is None:
            c["rejected"] += 1
            return
        c["queued_walks" if decision.outcome is Outcome.QUEUED else "routed"] += 1
        self._place(_Req(sid, arrival), route.pairs[decision.pair.id], skips)

    def _place(self, req: _Req, pair: _Pair, skips: int) -> None:
        """Queue ``req`` on ``pair``'s prefill pod for its key (a walk of ``skips`` fast rejects delays it)."""
        key = req.arrival.key
        ppod = self._pick_prefill(pair, key)
        req.pair = pair
        req.ppod = ppod
        req.walk_delay = skips * self.rtt
        pair.assigned += 1
        pair.dirty = True
        ppod.queue.append(req)
        req.queued = True
        pair.queued += 1
        if ppod.batch < self.prefill_slots:
            self._start_prefills(ppod)

    def _pick_prefill(self, pair: _Pair, key: int) -> _Pod:
        """The key's rendezvous order over the pair's prefill pods, skipping those at the queue limit."""
        pods = pair.prefill
        if len(pods) == 1:
            return pods[0]
        ranked = sorted(pods, key=lambda p: -rendezvous_score(key, p.ref.name, 1))
        for pod in ranked:
            if len(pod.queue) < pod.max_queued:
                return pod
        return min(ranked, key=lambda p: len(p.queue) + p.batch)

    # --- external routing (LiveOptions.external_routing) ---------------------------------------

    def _hold(self, arrival: Arrival) -> None:
        self.c["arrivals"] += 1
        self._sid += 1
        self._held[self._sid] = _Req(self._sid, arrival)
        self.outbox.append((self._sid, arrival))
        copyable = self._copyable
        copyable[self._sid] = arrival
        if len(copyable) > COPYABLE_ARRIVALS:
            copyable.popitem(last=False)

    def _copy_of(self, sid: int) -> _Req | None:
        """Request ``sid``'s mirror copy (held as ``-sid``), made when its first leg comes: the router copies a
        request to a canary pair in a task of its own, whose legs may come after the original ended. One copy
        per request: its arrival is taken when the copy is made."""
        copy = self._held.get(-sid)
        if copy is None:
            arrival = self._copyable.pop(sid, None)
            if arrival is None:
                return None
            copy = _Req(-sid, arrival)
            copy.mirror = True
            self._held[-sid] = copy
        return copy

    def _leg_pod(
        self, sid: int, namespace: str, name: str, role: Role, mirror: bool = False
    ) -> tuple[_Req, _Pod] | str:
        pod = self._pods.get((namespace, name))
        if pod is None or not pod.alive or pod.ref.role != role:
            return f"{namespace}/{name} is not a live {role} pod of the model"
        req = self._copy_of(sid) if mirror else self._held.get(sid)
        if req is None or req.done:
            return f"request {sid}{' (copy)' if mirror else ''} is not waiting for a leg"
        return req, pod

    def enter_prefill(
        self, sid: int, namespace: str, name: str, on_done: Callable[[bool], None], *, mirror: bool = False
    ) -> str | None:
        """The router sent request ``sid``'s prefill leg to pod ``name``: queue it there.

        ``on_done(True)`` when its prefill finishes, ``on_done(False)`` when it fails (its pod went away).
        Returns why the leg cannot be taken (the caller answers an error), else None. A second prefill
        leg for one request (a router walking after a timeout) is refused: the first one still runs.
        ``mirror``: the leg is of the request's mirror copy (the router's ``<id>-mirror``), which loads the pod
        and its metrics like any request but none of the fleet's client counters.
        """
        self.advance()
        found = self._leg_pod(sid, namespace, name, "prefill", mirror)
        if isinstance(found, str):
            return found
        req, pod = found
        if req.ppod is not None:
            return f"request {sid} already has a prefill leg on {req.ppod.ref.name}"
        pair = self._pod_pair.get((namespace, name))
        req.pair, req.ppod, req.on_prefill = pair, pod, on_done
        self.c["routed"] += 0 if mirror else 1
        if pair is not None:
            pair.assigned += 1
            pair.queued += 1
            pair.dirty = True
        pod.queue.append(req)
        req.queued = True
        if pod.batch < self.prefill_slots:
            self._start_prefills(pod)
        return None

    def enter_decode(
        self,
        sid: int,
        namespace: str,
        name: str,
        on_first: Callable[[float], None],
        on_done: Callable[[int | None], None],
        *,
        mirror: bool = False,
    ) -> str | None:
        """The router sent request ``sid``'s decode leg to pod ``name``: it joins there once its KV arrived.

        A MooncakeConnector router sends the decode leg while the prefill runs (it may even arrive before
        the prefill leg), so the join waits for the prefill and the P→D transfer. A second decode leg is refused
        once a prefill was taken; before that it replaces the first (the router walked past a pair whose
        prefill refused the request, :meth:`_abandon_decode`). ``on_first(t)``: the
        first token is due at model time ``t``; ``on_done(n)``: finished with ``n`` output tokens, or None
        (failed, or an ``error_rate`` draw).
        """
        self.advance()
        found = self._leg_pod(sid, namespace, name, "decode", mirror)
        if isinstance(found, str):
            return found
        req, d = found
        if req.dpod is not None:
            if req.ppod is not None or req.dpod is d:
                return f"request {sid} already has a decode leg on {req.dpod.ref.name}"
            self._abandon_decode(req)
        req.dpod, req.on_first, req.on_done = d, on_first, on_done
        d.incoming += 1
        if req.t_ready is not None:
            self.push(max(self.now, req.t_ready), _EV_DECODE_JOIN, req)
        return None

    def _abandon_decode(self, req: _Req) -> None:
        """Let go of a decode leg whose pair never took the prefill: a MooncakeConnector router sends the decode
        leg with the prefill, and when that prefill is refused it aborts the decode and walks to the next pair
        (vLLM frees an aborted request when its connection closes). The old leg's double is told it failed, so
        its stream ends; the request's next decode leg takes its place."""
        assert req.dpod is not None
        req.dpod.incoming -= 1
        done = req.on_done
        req.dpod = req.on_first = req.on_done = None
        self.c["decode_abandoned"] += 1
        if done is not None:
            done(None)

    def release(self, sid: int, *, rejected: bool) -> None:
        """The client is done with request ``sid``. One that never reached an engine is forgotten here
        (counted as rejected when the router refused it, else as failed), one whose decode leg never came
        fails; the others finish in the model (an engine keeps working on a request its client left)."""
        req = self._held.get(sid)
        if req is None or req.done:
            return
        if req.ppod is not None:
            if req.dpod is None:  # its decode leg never came (the client or the router gave up): no KV reader
                self.advance()
                self._fail(req)
            return
        del self._held[sid]
        req.done = True
        self.c["rejected" if rejected else "failed"] += 1
        if req.dpod is not None:  # a decode leg that waited for a prefill that never came
            req.dpod.incoming -= 1
            if req.on_done is not None:
                req.on_done(None)
        req.on_prefill = req.on_first = req.on_done = None

    # --- prefill ---------------------------------------------------------------------------------

    def _start_prefills(self, pod: _Pod) -> None:
        """Admit queued requests while fewer than ``prefill_concurrency`` run, then schedule the next
        completion. Running prefills share the instance's compute (processor sharing, as the offline
        engine): each advances at 1/n of the instance's speed on a virtual work clock."""
        queue = pod.queue
        self._advance_clock(pod)
        while queue and pod.batch < self.prefill_slots:
            req = queue.popleft()
            pair = req.pair
            if pair is not None and req.queued:
                pair.queued -= 1
                pair.dirty = True
            req.queued = False
            a = req.arrival
            blocks = a.blocks
            nb = len(blocks)
            bt = self.block_tokens
            assert pod.cache is not None
            run = pod.cache.lookup(blocks)
            local = hit_tokens(run, nb, a.input_tokens, bt)
            srun = shared = 0
            fetch = 0.0
            if self.shared is not None and run < nb:
                srun = self.shared.lookup(blocks, run)
                if srun:
                    shared = hit_tokens(run + srun, nb, a.input_tokens, bt) - local
                    fetch = self.nic.transfer(pod.nid, shared * self.kv_b, self.now)
            req.local_run, req.shared_run = run, srun
            req.local_tokens, req.shared_tokens = local, shared
            uncached = max(1, a.input_tokens - local - shared)
            mult = self.behaviour(pod.ref.revision).prefill_multiplier
            compute = self.cap.prefill_time(uncached, a.input_tokens - uncached) * mult / self.opt.capacity_scale
            service = compute + fetch + req.walk_delay
            req.t_start = self.now
            req.v_finish = pod.v + service
            heapq.heappush(pod.active, (req.v_finish, req.sid, req))
            pod.batch += 1
            counters = pod.counters
            counters[PREFIX_QUERIES] += a.input_tokens
            counters[PREFIX_HITS] += local
            counters[EXTERNAL_QUERIES] += a.input_tokens - local
            counters[EXTERNAL_HITS] += shared
            if not req.mirror:
                self.c["prefix_queries"] += a.input_tokens
                self.c["prefix_hits"] += local
        pod.rate = 1.0 / pod.batch if pod.batch else 0.0
        pod.version += 1
        if pod.active:
            dt = (pod.active[0][0] - pod.v) * pod.batch
            self.push(self.now + max(0.0, dt), _EV_PREFILL_DONE, pod, pod.version)

    def _prefill_done(self, pod: _Pod, version: int) -> None:
        if version != pod.version or not pod.alive:
            return
        self._advance_clock(pod)
        active = pod.active
        while active and active[0][0] <= pod.v + 1e-9:
            _, _, req = heapq.heappop(active)
            pod.batch -= 1
            if not req.done:
                self._prefill_finish(pod, req)
        self._start_prefills(pod)

    def _prefill_finish(self, pod: _Pod, req: _Req) -> None:
        a = req.arrival
        assert pod.cache is not None
        pod.cache.insert(a.blocks, 0, req.local_run)
        if self.shared is not None:
            self.shared.insert(a.blocks, req.local_run, req.shared_run)
        h = pod.hists
        ttft = self.now - a.t
        h[TTFT].observe(ttft)
        h[E2E].observe(ttft)
        h[QUEUE_TIME].observe(req.t_start - a.t)
        h[PREFILL_TIME].observe(self.now - req.t_start)
        h[PROMPT_TOKENS_HIST].observe(a.input_tokens)
        h[GENERATION_TOKENS_HIST].observe(1)
        pod.counters[PROMPT_TOKENS] += a.input_tokens
        pod.counters[GENERATION_TOKENS] += 1
        pod.success["length"] += 1  # the prefill leg is a max_tokens=1 request
        if self.external:
            req.t_ready = self.now + a.input_tokens * self.kv_b / self.pd_bandwidth
            if req.on_prefill is not None:
                req.on_prefill(True)
                req.on_prefill = None
            if req.dpod is not None:
                self.push(req.t_ready, _EV_DECODE_JOIN, req)
            return
        d = self._pick_decode(req)
        if d is None:
            self._fail(req)
            return
        req.dpod = d
        d.incoming += 1
        self.push(self.now + a.input_tokens * self.kv_b / self.pd_bandwidth, _EV_DECODE_JOIN, req)

    # --- decode ----------------------------------------------------------------------------------

    def _pick_decode(self, req: _Req) -> _Pod | None:
        pair = req.pair
        best: _Pod | None = None
        best_load = 0
        for d in pair.decode if pair is not None else ():
            if not d.alive:
                continue
            load = d.batch + len(d.waiting) + d.incoming
            if best is None or load < best_load:
                best, best_load = d, load
        return best

    def _decode_join(self, req: _Req) -> None:
        if req.done:
            return
        d = req.dpod
        if d is not None:
            d.incoming -= 1
        if d is None or not d.alive:
            if self.external:  # the router chose that pod: a real decode leg fails with it
                self._fail(req)
                return
            d = self._pick_decode(req)
            if d is None:
                self._fail(req)
                return
            req.dpod = d
        req.t_join = self.now
        a = req.arrival
        fits = d.kv_used + a.input_tokens + a.output_tokens <= d.kv_cap or d.batch == 0
        if d.batch < d.max_seqs and fits and not d.waiting:
            self._admit(d, req)
            self._reschedule(d)
        else:
            d.waiting.append(req)
            pair = req.pair
            if pair is not None:
                pair.queued += 1
                pair.dirty = True
            req.queued = True

    def _advance_clock(self, d: _Pod) -> None:
        """Move a pod's virtual clock (decode: tokens per sequence; prefill: work seconds per request)."""
        if d.batch > 0:
            d.v += (self.now - d.t_v) * d.rate
        d.t_v = self.now

    def _set_rate(self, d: _Pod) -> None:
        if d.batch <= 0:
            d.rate = d.step = 0.0
            return
        b = d.batch
        w = self.w_table[b] if b < len(self.w_table) else self.cap.weight_bytes_touched(b)
        mult = self.behaviour(d.ref.revision).tpot_multiplier / self.opt.capacity_scale
        step = ((w + d.ctx_sum * self.kv_b) / self.bw + self.comm) * mult
        d.step = step
        d.rate = self.m / step

    def _admit(self, d: _Pod, req: _Req) -> None:
        self._advance_clock(d)
        a = req.arrival
        d.batch += 1
        d.ctx_sum += a.input_tokens + a.output_tokens / 2.0
        d.kv_used += a.input_tokens + a.output_tokens
        self._set_rate(d)
        req.t_admit = self.now
        req.t_first = self.now + d.step
        if req.on_first is not None:
            req.on_first(req.t_first)
            req.on_first = None
        req.v_finish = d.v + a.output_tokens
        heapq.heappush(d.active, (req.v_finish, req.sid, req))
        if req.pair is not None:
            req.pair.dirty = True

    def _reschedule(self, d: _Pod) -> None:
        d.version += 1
        if d.active and d.rate > 0:
            dt = (d.active[0][0] - d.v) / d.rate
            self.push(self.now + max(0.0, dt), _EV_DECODE_NEXT, d, d.version)

    def _decode_next(self, d: _Pod, version: int) -> None:
        if version != d.version or not d.alive:
            return
        self._advance_clock(d)
        active = d.active
        while active and active[0][0] <= d.v + 1e-6:
            _, _, req = heapq.heappop(active)
            a = req.arrival
            d.batch -= 1
            d.ctx_sum -= a.input_tokens + a.output_tokens / 2.0
            d.kv_used -= a.input_tokens + a.output_tokens
            self._complete(req, d)
        if d.batch == 0:
            d.ctx_sum = d.kv_used = 0.0
        waiting = d.waiting
        while waiting and d.batch < d.max_seqs:
            nxt = waiting[0].arrival
            if d.kv_used + nxt.input_tokens + nxt.output_tokens > d.kv_cap and d.batch > 0:
                break
            req = waiting.popleft()
            pair = req.pair
            if pair is not None and req.queued:
                pair.queued -= 1
                pair.dirty = True
            req.queued = False
            self._admit(d, req)
        self._set_rate(d)
        self._reschedule(d)

    def _complete(self, req: _Req, d: _Pod) -> None:
        req.done = True
        a = req.arrival
        now = self.now
        pair = req.pair
        if pair is not None:
            pair.assigned -= 1
            pair.dirty = True
        out = a.output_tokens
        first = min(req.t_first, now)
        h = d.hists
        h[TTFT].observe(first - a.t)
        if out > 1:
            tpot = (now - first) / (out - 1)
            h[TPOT].observe(tpot)
            h[ITL].observe(tpot, out - 1)
        h[E2E].observe(now - a.t)
        h[QUEUE_TIME].observe(req.t_admit - req.t_join)
        h[PREFILL_TIME].observe(first - req.t_admit)
        h[DECODE_TIME].observe(now - first)
        h[PROMPT_TOKENS_HIST].observe(a.input_tokens)
        h[GENERATION_TOKENS_HIST].observe(out)
        counters = d.counters
        counters[PROMPT_TOKENS] += a.input_tokens
        counters[GENERATION_TOKENS] += out
        counters[EXTERNAL_QUERIES] += a.input_tokens
        counters[EXTERNAL_HITS] += a.input_tokens  # the KV arrives from the prefill instance
        if not req.mirror:
            self.c["completed"] += 1
        failed = _unit(self.opt.seed, _DRAW_ERROR, req.sid) < self.behaviour(d.ref.revision).error_rate
        if failed:
            d.success["error"] += 1
            self.c["errors"] += 0 if req.mirror else 1
        else:
            d.success["stop"] += 1
        if self.external:
            self._held.pop(req.sid, None)
            if req.on_done is not None:
                req.on_done(None if failed else out)
                req.on_done = None

    def _fail(self, req: _Req) -> None:
        if req.done:
            return
        req.done = True
        pair = req.pair
        if pair is not None:
            pair.assigned -= 1
            if req.queued:
                pair.queued -= 1
            pair.dirty = True
        req.queued = False
        self.c["failed"] += 0 if req.mirror else 1
        if self.external:  # a copy's legs are answered too (an internal copy has neither an entry nor callbacks)
            self._held.pop(req.sid, None)
            if req.on_prefill is not None:
                req.on_prefill(False)
            if req.on_done is not None:
                req.on_done(None)
            req.on_prefill = req.on_first = req.on_done = None

    # --- reading ---------------------------------------------------------------------------------

    def pods(self) -> list[LivePod]:
        return [p.ref for p in self._pods.values()]

    def pod_metrics(self, namespace: str, name: str) -> PodMetrics | None:
        """A snapshot of one pod's metrics (None for an unknown pod); simulates up to now first."""
        self.advance()
        pod = self._pods.get((namespace, name))
        if pod is None:
            return None
        if pod.ref.role == "prefill":
            running = float(pod.batch)
            waiting = float(len(pod.queue))
            kv = sum(r.arrival.input_tokens for _, _, r in pod.active) / pod.kv_cap
        else:
            running = float(pod.batch)
            waiting = float(len(pod.waiting))
            kv = pod.kv_used / pod.kv_cap
        return PodMetrics(
            pod=pod.ref,
            histograms={n: Histogram(h.bounds, tuple(h.counts), h.total) for n, h in pod.hists.items()},
            counters=dict(pod.counters),
            success=dict(pod.success),
            gauges={RUNNING: running, WAITING: waiting, KV_USAGE: min(1.0, max(0.0, kv))},
        )

    def stats(self) -> FleetStats:
        self.advance()
        pools = []
        for (ns, pool), route in sorted(self._routes.items()):
            pairs = list(route.pairs.values())
            in_prefill = sum(len(p.queue) + p.batch for pr in pairs for p in pr.prefill)
            in_decode = sum(d.batch + len(d.waiting) for pr in pairs for d in pr.decode)
            pools.append(
                PoolStats(
                    namespace=ns,
                    pool=pool,
                    pairs=len(pairs),
                    candidates=len(route.candidates),
                    in_flight=sum(p.assigned for p in pairs),
                    in_prefill=in_prefill,
                    in_decode=in_decode,
                )
            )
        c = self.c
        return FleetStats(
            now=self.now,
            rate=self.source.rate,
            copies=self.source.copies,
            arrivals=int(c["arrivals"]),
            routed=int(c["routed"]),
            queued_walks=int(c["queued_walks"]),
            rejected=int(c["rejected"]),
            unmatched=int(c["unmatched"]),
            fast_rejects=int(c["fast_rejects"]),
            failed=int(c["failed"]),
            completed=int(c["completed"]),
            errors=int(c["errors"]),
            prefix_queries=float(c["prefix_queries"]),
            prefix_hits=float(c["prefix_hits"]),
            walk_lengths=dict(sorted(self.walks.items())),
            pools=tuple(pools),
        )


def live_agentic_workload(
    params: SimParams, seed: int, *, duration_s: float = 3600.0, rate: float = 5.0, max_context_tokens: int = 131072
) -> Workload:
    """A generated agentic workload for live replay: a flat envelope (no diurnal shape) at ``rate``
    req/s over ``duration_s``, contexts capped at ``max_context_tokens`` (the pool API's default;
    longer sessions compact). Pure: the generator with a seeded RNG."""
    import numpy as np  # noqa: PLC0415 - numpy is imported by the generator anyway

    from tandem_lab.sim.generator import GeneratorRun, generate  # noqa: PLC0415

    gen = params.generator.model_copy(update={"floor": 1.0})
    run = GeneratorRun(days=duration_s / 86_400.0, peak_rps=rate, compress=1.0, max_context_tokens=max_context_tokens)
    return generate(gen, run, np.random.default_rng(seed), params.slo.tpot_s, name="agentic-live")


__all__ = [
    "BEHAVIOUR_ALIASES",
    "BEHAVIOUR_FIELDS",
    "COUNTERS",
    "E2E",
    "FINISHED_REASONS",
    "HISTOGRAMS",
    "ITL",
    "KV_USAGE",
    "LATENCY_BUCKETS",
    "PREFIX_HITS",
    "PREFIX_QUERIES",
    "REQUEST_SUCCESS",
    "RUNNING",
    "TPOT",
    "TPOT_BUCKETS",
    "TTFT",
    "TTFT_BUCKETS",
    "WAITING",
    "Arrival",
    "ArrivalSource",
    "Behaviour",
    "FleetStats",
    "Histogram",
    "LiveFleet",
    "LiveOptions",
    "LivePod",
    "PodMetrics",
    "PoolStats",
    "behaviour_changes",
    "histogram_quantile",
    "live_agentic_workload",
]
