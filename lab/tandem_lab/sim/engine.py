"""The discrete-event core: requests through router, prefill, P→D transfer and decode on a changing fleet.

What it owns: simulated time (a heapq of events merged with the sorted arrival stream), instances and
their lifecycle (Pending → Loading → Ready → Draining → gone), pair groups, the router call, caches,
the decode batch model, scrapes, policy ticks and scenario hooks. Physics comes from
:mod:`tandem_lab.sim.physics`, caches from :mod:`tandem_lab.sim.cache`, routing from :mod:`tandem.routing`
(imported, never re-implemented), decisions from a :class:`~tandem_lab.sim.policies.base.ScalingPolicy`
that sees only :func:`~tandem_lab.sim.metrics.observe`.

Request path (TTFT = router walk + queue + shared fetch + prefill + P→D + first decode step):

1. **Route.** ``prefix-hash``: :func:`tandem.routing.select` over the routing units (pair groups, or
   prefill instances in the ``pools`` topology) with exact engine loads; each fast reject costs one
   RTT; a rejected request misses both SLOs. ``round-robin`` / ``least-loaded`` (fewest in-flight
   tokens): simulator baselines.
2. **Lookup** at enqueue: local hit (longest leading run in the instance's LRU), then the shared tier
   for the blocks after it; the shared fetch starts now and is costed by :class:`~tandem_lab.sim.cache.NicModel`.
3. **Prefill**: one request at a time per instance, FIFO (an M/G/1 server; chunked-prefill batching
   has the same FLOP throughput). Service = ``prefill_time(uncached, cached)`` × revision multiplier,
   starting no earlier than the fetch end. Afterwards every block goes into the local cache and the
   computed ones into the shared tier.
4. **P→D**: input × b_kv over the intra-node link (a pair group that fits one node) or the NIC.
5. **Decode**: continuous batching as a fluid model. All sequences of an instance advance together at
   ``m / t_step(B, Σc)`` tokens/s (Σc uses each sequence's mean context, input + output/2); a virtual
   token clock V per instance makes every join/leave O(log B): a sequence joining at V₀ finishes at
   V = V₀ + n_out. First token = join + one step; TPOT = (t_done − t_first)/(n_out − 1). A sequence is
   admitted while the batch is below ``max_num_seqs`` and its input + output fit the free KV; else it
   waits (FIFO).

GPU-hours are charged from binding (Loading) to deletion, clipped to [0, horizon], and split into
prefill busy, decode busy (batch > 0), loading and idle.

Must not: read the clock or the environment, or draw randomness outside the streams it is given.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from tandem.core.capacity import ttft_budget
from tandem.core.converge import Bounds, Moves, highest_first, next_moves
from tandem.core.reshape import ReshapeDecision, drain_order, reshape_surge
from tandem.core.rollout import RevisionCounts
from tandem.routing import (
    Admission,
    CandidateSet,
    Outcome,
    Pair,
    PairLoad,
    PairState,
    WalkBound,
    compute_pair_weights,
    mirror_candidates,
    mirror_target,
    pick_instance,
    select,
)
from tandem_lab.sim.cache import NicModel, PrefixCache, hit_tokens
from tandem_lab.sim.config import SimParams
from tandem_lab.sim.metrics import (
    COUNTERS,
    DECODE,
    PREFILL,
    InstanceGauge,
    Observation,
    RevisionSeries,
    RoleState,
    Scrape,
    ScrapeStore,
    observe,
)
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies.base import FleetTarget, ScalingPolicy, Topology
from tandem_lab.sim.workload import Workload

PENDING, LOADING, READY, DRAINING, GONE = range(5)
STATE_NAMES = ("pending", "loading", "ready", "draining", "gone")

STATUS_PENDING = -1
STATUS_OK = 0
STATUS_REJECTED = 1
STATUS_FAILED = 2
"""Lost with its instance, drain timeout, or no decode instance."""
STATUS_ERROR = 3
"""Engine error (revision error probability)."""
STATUS_TIMEOUT = 4
"""Still running when the simulation stopped."""

EV_PREFILL_DONE = 0
EV_DECODE_JOIN = 1
EV_DECODE_NEXT = 2
EV_BOUND = 3
EV_READY = 4
EV_DRAIN_TIMEOUT = 5
EV_SCRAPE = 6
EV_POLICY = 7
EV_SAMPLE = 8
EV_HOOK = 9

INF = math.inf


@dataclass
class Revision:
    """A stack revision's performance relative to the baseline (benchmarks.md §3.4)."""

    name: str
    prefill_mult: float = 1.0
    tpot_mult: float = 1.0
    error_prob: float = 0.0
    eval_score: float = 1.0


class Req:
    """One request in flight (created at arrival, dropped when it leaves)."""

    __slots__ = (
        "blocks",
        "ctx",
        "dinst",
        "group",
        "i",
        "inp",
        "local_run",
        "local_tokens",
        "mirror",
        "out",
        "pinst",
        "prefilled",
        "queued",
        "service",
        "shared_run",
        "shared_tokens",
        "t_arr",
        "t_first",
        "t_join",
        "t_ready",
        "v_finish",
        "walk",
    )

    def __init__(self, i: int, t_arr: float, inp: int, out: int, blocks: list[int]) -> None:
        self.i = i
        self.t_arr = t_arr
        self.inp = inp
        self.out = out
        self.blocks: list[int] | None = blocks
        self.group: Group | None = None
        self.pinst: Instance | None = None
        self.dinst: Instance | None = None
        self.t_ready = t_arr
        self.local_run = 0
        self.shared_run = 0
        self.local_tokens = 0
        self.shared_tokens = 0
        self.t_join = 0.0
        self.t_first = 0.0
        self.v_finish = 0.0
        self.ctx = inp + out / 2.0
        self.walk = 0
        self.prefilled = False
        self.queued = False
        self.service = 0.0
        self.mirror = False
        """A copy for a mirrored canary pair (``setMirrorPairs``): it loads the pair and feeds its engine metrics
        (``rev_series``) but is no client request: no result, counter or ``outstanding`` of its own."""


class Instance:
    """One engine pod (4 GPUs): prefill or decode."""

    __slots__ = (
        "active",
        "batch",
        "busy_since",
        "busy_time",
        "cache",
        "ctx_sum",
        "group",
        "iid",
        "incoming",
        "kv_cap",
        "kv_used",
        "load_kind",
        "name",
        "node",
        "queue",
        "rate",
        "revision",
        "role",
        "state",
        "step",
        "t_bound",
        "t_created",
        "t_end",
        "t_ready",
        "t_v",
        "v",
        "version",
        "waiting",
    )

    def __init__(self, iid: int, role: int, group: Group | None, revision: Revision, now: float) -> None:
        self.iid = iid
        self.role = role
        self.group = group
        self.revision = revision
        self.name = f"{'p' if role == PREFILL else 'd'}{iid}"
        self.state = PENDING
        self.t_created = now
        self.t_bound = INF
        self.t_ready = INF
        self.t_end = INF
        self.load_kind = ""
        self.node = -1
        """The node slot inside its pair group (instances of one slot share a node's weight cache); -1: none."""
        self.version = 0
        self.busy_time = 0.0
        # prefill
        self.queue: deque[Req] = deque()
        self.cache: PrefixCache | None = None
        # decode
        self.active: list[tuple[float, int, Req]] = []
        self.waiting: deque[Req] = deque()
        self.incoming = 0
        self.batch = 0
        self.ctx_sum = 0.0
        self.kv_used = 0.0
        self.kv_cap = 0.0
        self.v = 0.0
        self.t_v = 0.0
        self.rate = 0.0
        self.step = 0.0
        self.busy_since = 0.0

    def has_work(self) -> bool:
        if self.role == PREFILL:
            return self.batch > 0 or bool(self.queue)
        return self.batch > 0 or bool(self.waiting) or self.incoming > 0


class Group:
    """A routing unit: a pair group (p prefill + d decode) or, in ``pools``, one prefill instance."""

    __slots__ = (
        "assigned",
        "decode",
        "draining",
        "gid",
        "index",
        "name",
        "node_kinds",
        "pair_state",
        "prefill",
        "queued",
        "revision",
        "tokens",
    )

    def __init__(self, gid: int, index: int, name: str, revision: Revision) -> None:
        self.gid = gid
        self.index = index
        self.name = name
        self.revision = revision
        self.prefill: list[Instance] = []
        self.decode: list[Instance] = []
        self.assigned = 0
        self.queued = 0
        self.tokens = 0
        self.draining = False
        self.pair_state = PairState.WARMING
        self.node_kinds: dict[int, str] = {}


def _group_index(g: Group) -> int:
    return g.index


class _GroupView:
    """A pair group as ``tandem.core.reshape`` reads it (its ``GroupState``), taken when a decision is made."""

    __slots__ = ("counts", "draining", "index", "ready", "revision")

    def __init__(self, g: Group) -> None:
        self.index = g.index
        self.revision = g.revision.name
        self.counts = (len(g.prefill), len(g.decode))
        self.ready = g.pair_state == PairState.SERVING
        self.draining = g.draining

    @property
    def live(self) -> bool:
        return not self.draining


@dataclass
class InstanceRecord:
    role: int
    group: str
    revision: str
    t_created: float
    t_bound: float
    t_ready: float
    t_end: float
    busy_s: float
    load_kind: str


@dataclass
class SimOptions:
    """Run-level knobs that are not physics parameters."""

    topology: Topology = "pairs"
    router: str = "prefix-hash"
    routing_keys: Sequence[int] = ()
    horizon_s: float = 0.0
    tail_s: float = 900.0
    """After the horizon, keep serving requests already admitted for at most this long."""
    sample_s: float = 10.0
    rate_scale: float = 1.0
    min_prefill: int = 1
    min_decode: int = 1
    max_instances: int = 1 << 30
    default_shape: tuple[int, int] = (1, 1)
    cluster_gpus: int | None = None
    infinite_local_cache: bool = False
    """Give every prefill instance an infinite prefix cache (the §2.1 golden replays)."""
    progress: Callable[[float, int, int], None] | None = None
    progress_every_s: float = 3600.0


@dataclass
class SimResult:
    """Everything a run produced; reports and tests read only this."""

    horizon_s: float
    ttft: npt.NDArray[np.float64]
    tpot: npt.NDArray[np.float64]
    t_done: npt.NDArray[np.float64]
    status: npt.NDArray[np.int8]
    walk: npt.NDArray[np.int16]
    local_tokens: npt.NDArray[np.int64]
    shared_tokens: npt.NDArray[np.int64]
    prefill_s: npt.NDArray[np.float32]
    revision: npt.NDArray[np.int8]
    revision_names: list[str]
    unit: npt.NDArray[np.int32]
    """Index of the routing unit (pair group or prefill unit) each request went to; -1 if rejected."""
    instances: list[InstanceRecord]
    samples_t: npt.NDArray[np.float64]
    samples: npt.NDArray[np.int32]
    """[sample, role, state] instance counts (states pending, loading, ready, draining)."""
    scale_actions: int
    ratio_changes: int
    fast_rejects: int
    bytes_shared: float
    bytes_pd_network: float
    nic_capacity_bytes: float
    evictions: int
    events: int
    decisions: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)


class Simulation:
    """One run of one policy on one workload (see module docstring)."""

    def __init__(
        self,
        params: SimParams,
        capacity: Roofline,
        workload: Workload,
        policy: ScalingPolicy,
        options: SimOptions,
        lifecycle_rng: np.random.Generator,
        error_draws: npt.NDArray[np.float64],
    ) -> None:
        self.p = params
        self.cap = capacity
        self.wl = workload
        self.policy = policy
        self.opt = options
        self.rng = lifecycle_rng
        self.err = error_draws
        self.now = 0.0
        self.horizon = options.horizon_s or workload.duration_s
        self._seq = 0
        self._heap: list[tuple[float, int, int, Any, int]] = []
        n = len(workload)
        self.res_ttft = np.full(n, np.nan)
        self.res_tpot = np.full(n, np.nan)
        self.res_done = np.full(n, np.nan)
        self.res_status = np.full(n, STATUS_PENDING, dtype=np.int8)
        self.res_walk = np.zeros(n, dtype=np.int16)
        self.res_local = np.zeros(n, dtype=np.int64)
        self.res_shared = np.zeros(n, dtype=np.int64)
        self.res_prefill = np.zeros(n, dtype=np.float32)
        self.res_rev = np.zeros(n, dtype=np.int8)
        self.res_unit = np.full(n, -1, dtype=np.int32)
        self.outstanding = 0
        self.finished = 0
        # fleet
        self.instances: list[Instance] = []
        self.alive: list[Instance] = []
        self.groups: dict[str, Group] = {}
        self._gid = 0
        self._iid = 0
        self.revisions: dict[str, Revision] = {"r1": Revision("r1")}
        self.revision_index: dict[str, int] = {"r1": 0}
        self.stable = self.revisions["r1"]
        self.canary: Revision | None = None
        self.canary_percent: int | None = None
        self.canary_mirror = False
        self._mirror_set: CandidateSet | None = None
        self.copies = 0
        """Mirror copies a canary pair took (``tandem_router_mirror_requests_total``)."""
        self.copies_full = 0
        """Mirror copies not sent: the by-count walk passed the key's canary pair by (the router's ``skipped_full``)."""
        self.first_copy_s: float | None = None
        self._copy_err: npt.NDArray[np.float64] | None = None
        self.shape = options.default_shape
        self.decode_pool: list[Instance] = []
        self.desired = [0, 0]
        self.desired_pairs = 0
        self.gpus_in_use = 0
        self.pending_bind: deque[Instance] = deque()
        # routing
        self.keys = list(options.routing_keys) if options.routing_keys else [0] * n
        self.bound = self._walk_bound([options.default_shape if options.topology == "pairs" else (1, 1)])
        self._pairs: tuple[Pair, ...] = ()
        self._candidates: tuple[Pair, ...] = ()
        self._serving: list[Group] = []
        self._table_dirty = True
        self._loads: dict[str, PairLoad] = {}
        self._dirty_loads: set[Group] = set()
        self._rr = 0
        self.fast_rejects = 0
        self._inner_pairs: dict[int, tuple[tuple[str, ...], tuple[Pair, ...]]] = {}
        adm = params.admission
        self._inner_bound = WalkBound(
            load_bound_percent=params.router.load_bound_percent,
            max_walk=params.router.max_walk,
            admission=Admission(
                max_in_flight=max(1, params.instance.prefill_concurrency),
                max_queued=adm.max_queued,
                max_kv_utilization_percent=100,
                reject_status=adm.reject_status,
            ),
        )
        # caches and network
        bt = params.generator.block_tokens
        self.block_tokens = bt
        self.kv_b = params.model.kv_bytes_per_token
        self.local_blocks = int(capacity.kv_capacity_tokens // bt)
        st = params.shared_tier
        stores = st.stores_at(options.rate_scale)
        self.shared: PrefixCache | None = (
            PrefixCache(int(stores * st.segment_bytes / (bt * self.kv_b))) if st.enabled else None
        )
        self.nic = NicModel(params.network.nic_bandwidth, stores * st.nic_bandwidth)
        self.local_hit_scale = 1.0
        self.bytes_pd_network = 0.0
        # decode physics
        self.max_seqs = params.instance.max_num_seqs
        self.prefill_slots = max(1, params.instance.prefill_concurrency)
        self.w_table = capacity.weight_bytes_table(self.max_seqs + 1)
        self.bw = capacity.bandwidth
        self.comm = capacity.comm_s
        self.m = capacity.tokens_per_step
        self.kv_cap_tokens = capacity.kv_capacity_tokens
        g = capacity.gpus
        self.gpus = g
        # observation
        self.store = ScrapeStore()
        self.c: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.rev_series: dict[str, RevisionSeries] = {"r1": RevisionSeries()}
        # bookkeeping
        self.samples_t: list[float] = []
        self.samples: list[list[list[int]]] = []
        self.scale_actions = 0
        self.ratio_changes = 0
        self._reshape_hold = False
        """Groups off the target P:D remain and are being replaced (the operator holds a new P:D meanwhile)."""
        self.decisions: list[dict[str, Any]] = []
        self.hook_log: list[dict[str, Any]] = []
        self.events = 0
        self._hooks: list[tuple[float, Callable[[Simulation], None], str]] = []
        self._arrivals: list[float] = []
        self._ai = 0
        self._next_progress = options.progress_every_s
        self._halted = False

    def _walk_bound(self, shapes: Iterable[tuple[int, int]]) -> WalkBound:
        """The router's walk parameters for pair groups of these (prefill, decode) shapes. The pool API's
        admission limits are per instance; ``tandem.routing.Admission.for_groups`` turns them into the pair
        limits the table carries, as the operator publishes them (a prefill unit in ``pools`` gets the
        per-instance ones)."""
        adm = self.p.admission
        return WalkBound(
            load_bound_percent=self.p.router.load_bound_percent,
            max_walk=self.p.router.max_walk,
            admission=Admission(
                max_in_flight=adm.max_in_flight,
                max_queued=adm.max_queued,
                max_kv_utilization_percent=adm.max_kv_utilization_percent,
                reject_status=adm.reject_status,
            ).for_groups(shapes),
        )

    # --- scheduling --------------------------------------------------------------------------

    def push(self, t: float, kind: int, obj: Any, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, version))

    def at(self, t: float, hook: Callable[[Simulation], None], label: str) -> None:
        """Run ``hook(sim)`` at simulated time ``t`` (scenario perturbations)."""
        self._hooks.append((t, hook, label))

    def schedule(self, t: float, hook: Callable[[Simulation], None], label: str = "") -> None:
        """During a run: run ``hook(sim)`` at ``t`` ≥ now (a controller's next pass). Logged if ``label``."""
        self.push(max(t, self.now), EV_HOOK, (hook, label))

    # --- revisions and canaries (rollout controllers drive these; see tandem_lab.sim.rollout) -------

    def revision_counts(self) -> dict[str, tuple[int, int]]:
        """Per revision: (live pair groups — not draining —, serving ones), as the operator counts pairs."""
        out: dict[str, tuple[int, int]] = {}
        for g in self.groups.values():
            if g.draining:
                continue
            live, ready = out.get(g.revision.name, (0, 0))
            out[g.revision.name] = (live + 1, ready + (1 if g.pair_state == PairState.SERVING else 0))
        return out

    def serving_by_revision(self) -> dict[str, int]:
        """Serving pair groups per revision (what the routing table's weights are computed over)."""
        out: dict[str, int] = {}
        for g in self.groups.values():
            if g.pair_state == PairState.SERVING:
                out[g.revision.name] = out.get(g.revision.name, 0) + 1
        return out

    def converge_revisions(self, targets: dict[str, int], replicas: int, max_surge: int, max_unavailable: int) -> None:
        """Move pair groups toward per-revision ``targets``: the operator's decision,
        ``tandem.core.converge.next_moves`` over :meth:`revision_counts`, applied by :meth:`apply_moves`."""
        counts = {rev: RevisionCounts(live, ready) for rev, (live, ready) in self.revision_counts().items()}
        self.apply_moves(next_moves(targets, counts, Bounds(replicas, max_surge, max_unavailable)))

    def apply_moves(self, moves: Moves) -> None:
        """Turn count-level moves into pair groups, choosing groups as ``core.plan`` chooses pairs (the
        highest index first): a deleted not-Ready group and a drained Ready one both drain here (the
        simulator's way out of the fleet); creates are always placed (placement is not modelled: the
        simulated cluster has room)."""
        live = [g for g in self.groups.values() if not g.draining]
        for rev, n in moves.delete_unready:
            members = (g for g in live if g.revision.name == rev and g.pair_state != PairState.SERVING)
            for g in highest_first(members, n, _group_index):
                self._drain_group(g)
        for rev, n in moves.creates:
            for _ in range(n):
                self._new_group(self.revisions[rev], self.shape, False)
        for rev, n in moves.drain_ready:
            members = (g for g in live if g.revision.name == rev and g.pair_state == PairState.SERVING)
            for g in highest_first(members, n, _group_index):
                self._drain_group(g)
        if not moves.empty:
            self.scale_actions += 1

    def set_canary(self, revision: str | None, percent: int | None, mirror: bool = False) -> None:
        """Route ``percent`` % of keys to ``revision``'s serving pairs (``tandem.routing.compute_pair_weights``);
        ``percent`` None = by pair count; ``revision`` None = no canary; ``mirror`` (with ``percent`` 0) copies the
        canary's pair-count keys to it as the router does (``tandem.routing.mirror_target``)."""
        canary = self.revisions[revision] if revision is not None else None
        mirror = mirror and canary is not None and percent == 0
        if canary is not self.canary or percent != self.canary_percent or mirror != self.canary_mirror:
            self.canary = canary
            self.canary_percent = percent
            self.canary_mirror = mirror
            self._table_dirty = True

    # --- fleet -------------------------------------------------------------------------------

    def revision(self, name: str) -> Revision:
        return self.revisions[name]

    def add_revision(self, rev: Revision) -> None:
        self.revisions[rev.name] = rev
        self.revision_index.setdefault(rev.name, len(self.revision_index))
        self.rev_series.setdefault(rev.name, RevisionSeries())

    def _new_instance(self, role: int, group: Group | None, revision: Revision, ready_now: bool) -> Instance:
        inst = Instance(self._iid, role, group, revision, self.now)
        self._iid += 1
        if role == PREFILL:
            inst.cache = PrefixCache(None if self.opt.infinite_local_cache else self.local_blocks)
        inst.kv_cap = self.kv_cap_tokens
        self.instances.append(inst)
        self.alive.append(inst)
        if ready_now:
            inst.state = READY
            inst.t_bound = inst.t_ready = self.now
            inst.load_kind = "initial"
            self.gpus_in_use += self.gpus
            self._on_ready(inst)
        else:
            self._try_bind(inst)
        return inst

    def _try_bind(self, inst: Instance) -> None:
        cap = self.opt.cluster_gpus
        if cap is not None and self.gpus_in_use + self.gpus > cap:
            self.pending_bind.append(inst)
            return
        self.gpus_in_use += self.gpus
        self.push(self.now + self.p.lifecycle.schedule_delay_s, EV_BOUND, inst)

    def _bind_pending(self) -> None:
        cap = self.opt.cluster_gpus
        while self.pending_bind and (cap is None or self.gpus_in_use + self.gpus <= cap):
            inst = self.pending_bind.popleft()
            if inst.state == PENDING:
                self.gpus_in_use += self.gpus
                self.push(self.now + self.p.lifecycle.schedule_delay_s, EV_BOUND, inst)

    def _load_kind(self) -> str:
        mix = self.p.lifecycle.load_mix
        names = sorted(mix)
        weights = np.array([mix[k] for k in names], dtype=np.float64)
        return names[int(self.rng.choice(len(names), p=weights / weights.sum()))]

    def _instance_load_kind(self, inst: Instance) -> str:
        """Cold or warm is a property of the node's weight cache, so the instances of one node slot of a pair
        group (placed together, ``gpus_per_node // gpus`` per node) share one draw (``load_kind_scope: node``).
        Instances without a slot (pools, replacements) draw on their own."""
        g = inst.group
        if self.p.lifecycle.load_kind_scope != "node" or g is None or inst.node < 0:
            return self._load_kind()
        kind = g.node_kinds.get(inst.node)
        if kind is None:
            kind = g.node_kinds[inst.node] = self._load_kind()
        return kind

    def _on_bound(self, inst: Instance) -> None:
        if inst.state != PENDING:
            return
        inst.state = LOADING
        inst.t_bound = self.now
        inst.load_kind = self._instance_load_kind(inst)
        self.push(self.now + self.cap.load_time(inst.load_kind), EV_READY, inst)

    def _on_ready(self, inst: Instance) -> None:
        if inst.state == LOADING:
            inst.state = READY
            inst.t_ready = self.now
        if inst.state != READY:
            return
        if inst.role == DECODE and self.opt.topology == "pools":
            self.decode_pool.append(inst)
        if inst.group is not None:
            self._refresh_group(inst.group)

    def _refresh_group(self, g: Group) -> None:
        if g.draining:
            state = PairState.DRAINING
        elif all(i.state == READY for i in g.prefill) and all(i.state == READY for i in g.decode):
            state = PairState.SERVING
        else:
            state = PairState.WARMING
        if state != g.pair_state:
            g.pair_state = state
            self._table_dirty = True

    def _new_group(self, revision: Revision, shape: tuple[int, int], ready_now: bool) -> Group:
        used = {g.index for g in self.groups.values()}
        index = 0
        while index in used:
            index += 1
        g = Group(self._gid, index, f"pair-{index}", revision)
        self._gid += 1
        self.groups[g.name] = g
        for _ in range(shape[0]):
            g.prefill.append(self._new_instance(PREFILL, g, revision, ready_now))
        for _ in range(shape[1]):
            g.decode.append(self._new_instance(DECODE, g, revision, ready_now))
        per_node = max(1, self.p.hardware.gpus_per_node // self.gpus)
        for slot, inst in enumerate(g.prefill + g.decode):
            inst.node = slot // per_node
        self._refresh_group(g)
        self._table_dirty = True
        return g

    def _new_unit(self, revision: Revision, ready_now: bool) -> Group:
        """Pools topology: a prefill instance is its own routing unit."""
        used = {g.index for g in self.groups.values()}
        index = 0
        while index in used:
            index += 1
        g = Group(self._gid, index, f"prefill-{index}", revision)
        self._gid += 1
        self.groups[g.name] = g
        g.prefill.append(self._new_instance(PREFILL, g, revision, ready_now))
        self._refresh_group(g)
        self._table_dirty = True
        return g

    def _finish_instance(self, inst: Instance) -> None:
        """Delete an instance (GPU charge ends now)."""
        if inst.state == GONE:
            return
        was_bound = inst.state != PENDING
        if inst.batch > 0:
            inst.busy_time += max(0.0, min(self.now, self.horizon) - inst.busy_since)
        inst.state = GONE
        inst.t_end = self.now
        inst.version += 1
        if was_bound:
            self.gpus_in_use -= self.gpus
        self.alive.remove(inst)
        if inst in self.decode_pool:
            self.decode_pool.remove(inst)
        self.nic.forget(inst.iid)
        g = inst.group
        if g is not None and all(i.state == GONE for i in g.prefill) and all(i.state == GONE for i in g.decode):
            self.groups.pop(g.name, None)
            self._loads.pop(g.name, None)
            self._dirty_loads.discard(g)
            self._table_dirty = True
        self._bind_pending()

    def _drain_instance(self, inst: Instance) -> None:
        if inst.state in (PENDING, LOADING):
            self._finish_instance(inst)
            return
        if inst.state != READY:
            return
        inst.state = DRAINING
        if inst in self.decode_pool:
            self.decode_pool.remove(inst)
        if not self._busy_for_drain(inst):
            self._finish_instance(inst)
        else:
            self.push(self.now + self.p.lifecycle.drain_timeout_s, EV_DRAIN_TIMEOUT, inst, inst.version)

    def _busy_for_drain(self, inst: Instance) -> bool:
        if inst.has_work():
            return True
        g = inst.group
        if inst.role == DECODE and g is not None and self.opt.topology == "pairs":
            return any(p.has_work() for p in g.prefill if p.state != GONE)
        return False

    def _check_drained(self, inst: Instance) -> None:
        if inst.state == DRAINING and not self._busy_for_drain(inst):
            self._finish_instance(inst)

    def _drain_group(self, g: Group) -> None:
        g.draining = True
        self._refresh_group(g)
        for inst in [*g.prefill, *g.decode]:
            self._drain_instance(inst)

    def kill_instance(self, inst: Instance, replace: bool = True) -> None:
        """Lose an instance at once (failure): its requests fail; the controller replaces the pod."""
        if inst.state == GONE:
            return
        victims: list[Req] = []
        if inst.role == PREFILL:
            victims.extend(r for _, _, r in inst.active)
            inst.active.clear()
            victims.extend(inst.queue)
            inst.queue.clear()
        else:
            victims.extend(r for _, _, r in inst.active)
            victims.extend(inst.waiting)
            inst.active.clear()
            inst.waiting.clear()
        g = inst.group
        for r in victims:
            self._fail(r, STATUS_FAILED)
        if inst.batch > 0:
            inst.busy_time += max(0.0, min(self.now, self.horizon) - inst.busy_since)
        inst.batch = 0
        inst.kv_used = 0.0
        inst.ctx_sum = 0.0
        role, revision = inst.role, inst.revision
        self._finish_instance(inst)
        if not replace:
            return
        if self.opt.topology == "pairs" and g is not None and not g.draining:
            new = self._new_instance(role, g, revision, ready_now=False)
            (g.prefill if role == PREFILL else g.decode).append(new)
            if g.name not in self.groups:
                self.groups[g.name] = g
            self._refresh_group(g)
        elif self.opt.topology == "pools":
            if role == PREFILL:
                self._new_unit(revision, ready_now=False)
            else:
                self._new_instance(DECODE, None, revision, ready_now=False)

    # --- reconcile (policy targets) ---------------------------------------------------------

    def _clamp(self, prefill: int, decode: int) -> tuple[int, int]:
        prefill = max(self.opt.min_prefill, prefill)
        decode = max(self.opt.min_decode, decode)
        total = prefill + decode
        if total > self.opt.max_instances:
            scale = self.opt.max_instances / total
            prefill = max(self.opt.min_prefill, int(prefill * scale))
            decode = max(self.opt.min_decode, self.opt.max_instances - prefill)
        return prefill, decode

    def apply_target(self, target: FleetTarget, initial: bool = False) -> None:
        if self.opt.topology == "pairs":
            self._apply_pairs(target, initial)
        else:
            self._apply_pools(target, initial)

    def _apply_pools(self, target: FleetTarget, initial: bool) -> None:
        want_p, want_d = self._clamp(*target.instances(self.shape))
        self.desired = [want_p, want_d]
        # prefill units
        units = [g for g in self.groups.values() if not g.draining and g.prefill[0].state != GONE]
        self._resize(units, want_p, lambda: self._new_unit(self.stable, initial), self._drain_group)
        decodes = [i for i in self.alive if i.role == DECODE and i.state in (PENDING, LOADING, READY)]
        self._resize(
            decodes, want_d, lambda: self._new_instance(DECODE, None, self.stable, initial), self._drain_instance
        )

    def _resize(self, current: list[Any], want: int, create: Callable[[], Any], remove: Callable[[Any], None]) -> None:
        n = len(current)
        if want > n:
            for _ in range(want - n):
                create()
            self.scale_actions += 1
        elif want < n:

            def order(x: Any) -> tuple[int, int, float]:
                inst = x.prefill[0] if isinstance(x, Group) else x
                if isinstance(x, Group) and self.opt.topology == "pairs":
                    ready = x.pair_state == PairState.SERVING
                    off, index = drain_order(_GroupView(x), self.shape)
                    return (1 if ready else 0, 0 if off else 1, -float(index))
                return ({PENDING: 0, LOADING: 1}.get(inst.state, 2), 0, -inst.t_ready if inst.state == READY else 0.0)

            for victim in sorted(current, key=order)[: n - want]:
                remove(victim)
            self.scale_actions += 1

    def _apply_pairs(self, target: FleetTarget, initial: bool) -> None:
        """Pair groups toward ``target``. A new P:D is the *target shape*, as in the operator (design note 012
        §5): groups keep the shape they were built with, new groups take the target, a scale-down drains
        off-target groups first, and one off-target group at a time is replaced surge first while the mix costs
        more than ``tandem.core.reshape.TAX_BOUND`` over the target shape (``reshape_surge``, the operator's
        decision, with the policy's last work need)."""
        shape = target.shape or self.shape
        if shape != self.shape:
            self.ratio_changes += 1
            self.shape = shape
        if target.pairs is None:
            p, d = target.prefill, target.decode
            pairs = max(math.ceil(p / shape[0]) if p else 0, math.ceil(d / shape[1]) if d else 0)
        else:
            pairs = target.pairs
        max_pairs = max(1, self.opt.max_instances // (shape[0] + shape[1]))
        pairs = max(1, min(pairs, max_pairs))
        self.desired_pairs = pairs
        self.desired = [pairs * shape[0], pairs * shape[1]]
        live = [g for g in self.groups.values() if not g.draining]
        reshape = self._reshape(live, pairs, max_pairs, target.need)
        self._reshape_hold = reshape.off_shape > 0 and not reshape.settled
        self._resize(
            live, pairs + reshape.extra, lambda: self._new_group(self.stable, shape, initial), self._drain_group
        )

    def _reshape(
        self, live: list[Group], replicas: int, max_pairs: int, need: tuple[float, float] | None
    ) -> ReshapeDecision:
        """``tandem.core.reshape.reshape_surge`` over the simulator's groups. Steady: no canary and every live
        group of the stable revision (a rollout replaces groups on its own). Room: one more target-shaped group
        fits in ``max_instances`` beside every group holding GPUs (draining ones too)."""
        views = [_GroupView(g) for g in self.groups.values()]
        steady = self.canary is None and all(g.revision is self.stable for g in live)
        used = sum(len(g.prefill) + len(g.decode) for g in self.groups.values())
        room = 1 if used + self.shape[0] + self.shape[1] <= self.opt.max_instances else 0
        return reshape_surge(
            views,
            revision=self.stable.name,
            target=self.shape,
            replicas=replicas,
            steady=steady,
            room=room,
            need=need,
            at_max_pairs=replicas >= max_pairs,
        )

    def group_shapes(self) -> tuple[tuple[int, int], ...]:
        """The live groups' (prefill, decode) in the order a scale-down keeps them (the reverse of
        ``tandem.core.reshape.drain_order``), or () while every group has the target shape: what work planning
        counts (``ScaleContext.group_shapes``)."""
        live = [_GroupView(g) for g in self.groups.values() if not g.draining]
        if all(v.counts == self.shape for v in live):
            return ()
        return tuple(v.counts for v in sorted(live, key=lambda v: drain_order(v, self.shape)))

    # --- routing -----------------------------------------------------------------------------

    def _rebuild_table(self) -> None:
        groups = sorted(self.groups.values(), key=lambda g: g.index)
        canary = self.canary.name if self.canary is not None else None
        base = [Pair(id=g.name, index=g.index, revision=g.revision.name, state=g.pair_state) for g in groups]
        weights = compute_pair_weights(base, canary, self.canary_percent)
        self._pairs = tuple(
            Pair(id=g.name, index=g.index, revision=g.revision.name, state=g.pair_state, weight=weights[g.name])
            for g in groups
        )
        self._serving = [g for g in groups if g.pair_state == PairState.SERVING and weights[g.name] > 0]
        # select() considers only serving pairs with a positive weight; hand it just those (same result).
        self._candidates = tuple(p for p in self._pairs if p.state is PairState.SERVING and p.weight > 0)
        self._mirror_set = mirror_candidates(self._pairs) if self.canary_mirror else None
        if self.opt.topology == "pairs" and groups:
            # The table's limits follow the groups it lists, as the operator's do (smallest group per role).
            self.bound = self._walk_bound([(len(g.prefill), len(g.decode)) for g in groups])
        self._table_dirty = False

    def _flush_loads(self) -> None:
        """Refresh the router's load view of every group touched since the last request. A deleted group
        can still be marked (a late completion of one of its requests) while a new group already reuses
        its name; only the group registered under the name may write it — otherwise the set's iteration
        order (object addresses) would decide which load the router sees, and runs would differ."""
        loads = self._loads
        groups = self.groups
        for g in self._dirty_loads:
            if groups.get(g.name) is g:
                loads[g.name] = self._pair_load(g)
        self._dirty_loads.clear()

    def _pair_load(self, g: Group) -> PairLoad:
        kv = 0.0
        for d in g.decode:
            if d.kv_cap > 0:
                kv = max(kv, 100.0 * d.kv_used / d.kv_cap)
        return PairLoad(in_flight=g.assigned - g.queued, queued=g.queued, kv_utilization_percent=kv)

    def _route(self, req: Req) -> Group | None:
        if self._table_dirty:
            self._rebuild_table()
        router = self.opt.router
        if router == "prefix-hash":
            if self._dirty_loads:
                self._flush_loads()
            d = select(self.keys[req.i], self._candidates, self._loads, self.bound)
            req.walk = d.walk_length
            skips = len(d.skips)
            self.fast_rejects += skips
            if d.outcome is Outcome.REJECTED or d.pair is None:
                return None
            req.t_ready = self.now + skips * self.p.network.router_rtt_s
            return self.groups[d.pair.id]
        serving = self._serving
        if not serving:
            return None
        req.walk = 1
        if router == "round-robin":
            self._rr += 1
            return serving[self._rr % len(serving)]
        return min(serving, key=lambda g: g.tokens)

    # --- request path ------------------------------------------------------------------------

    def _arrive(self, i: int) -> None:
        wl = self.wl
        req = Req(i, self.now, int(wl.input_tokens[i]), int(wl.output_tokens[i]), wl.hash_ids(i))
        self.outstanding += 1
        self.c["requests"] += 1
        g = self._route(req)
        if self._mirror_set is not None:
            self._copy(i)
        if g is None:
            self._fail(req, STATUS_REJECTED)
            return
        inst = self._prefill_of(g, self.keys[i])
        if inst is None:
            self._fail(req, STATUS_REJECTED)
            return
        self._enter(req, g, inst)

    def _copy(self, i: int) -> None:
        """The router's mirror copy of request ``i`` (``tandem.router.proxy.Router._mirror``): where the by-count
        walk takes its key (``tandem.routing.mirror_target``), if that is a canary pair; never walked further."""
        assert self._mirror_set is not None and self.canary is not None
        if self._dirty_loads:
            self._flush_loads()
        choice = mirror_target(self._mirror_set, self.canary.name, self.keys[i], self._loads, self.bound)
        if choice.pair is None:
            self.copies_full += choice.skipped is not None
            return
        g = self.groups[choice.pair.id]
        inst = self._prefill_of(g, self.keys[i])
        if inst is None:
            self.copies_full += 1
            return
        wl = self.wl
        req = Req(i, self.now, int(wl.input_tokens[i]), int(wl.output_tokens[i]), wl.hash_ids(i))
        req.mirror = True
        self.copies += 1
        if self.first_copy_s is None:
            self.first_copy_s = self.now
        self._enter(req, g, inst)

    def _enter(self, req: Req, g: Group, inst: Instance) -> None:
        """Queue ``req`` on prefill instance ``inst`` of group ``g``: its cache hits, shared-tier fetch and
        service time."""
        i = req.i
        copy = req.mirror
        req.group = g
        req.pinst = inst
        if not copy:
            self.res_rev[i] = self.revision_index[g.revision.name]
            self.res_unit[i] = g.index
        g.assigned += 1
        g.queued += 1
        req.queued = True
        g.tokens += req.inp + req.out
        self._dirty_loads.add(g)
        blocks = req.blocks
        assert blocks is not None and inst.cache is not None
        nb = len(blocks)
        run = inst.cache.lookup(blocks)
        if self.local_hit_scale < 1.0:
            run = int(run * self.local_hit_scale)
        bt = self.block_tokens
        local = hit_tokens(run, nb, req.inp, bt)
        srun = 0
        shared = 0
        if self.shared is not None and run < nb:
            srun = self.shared.lookup(blocks, run)
            if srun:
                shared = hit_tokens(run + srun, nb, req.inp, bt) - local
                req.t_ready = req.t_ready + self.nic.transfer(inst.iid, shared * self.kv_b, req.t_ready)
        req.local_run = run
        req.shared_run = srun
        req.local_tokens = local
        req.shared_tokens = shared
        if not copy:
            c = self.c
            c["local_queries"] += req.inp
            c["local_hits"] += local
            c["external_queries"] += req.inp - local
            c["external_hits"] += shared
        self.rev_series[inst.revision.name].add_prefix(g.name, req.inp, local, shared)
        cached = req.local_tokens + req.shared_tokens
        uncached = max(1, req.inp - cached)
        service = self.cap.prefill_time(uncached, req.inp - uncached) * inst.revision.prefill_mult
        if not copy:
            self.res_prefill[i] = service
        # The walk's fast rejects and the shared-tier fetch delay this request's prefill: counted in its
        # service (a small overestimate of the instance's occupancy, ≪ prefill times).
        req.service = service + (req.t_ready - self.now)
        inst.queue.append(req)
        if inst.batch < self.prefill_slots:
            self._fill_prefill(inst)
            self._reschedule_prefill(inst)

    def _prefill_of(self, g: Group, key: int) -> Instance | None:
        """The prefill instance a request (or its mirror copy) with ``key`` enters in ``g``: the only one, or
        :meth:`_pick_prefill`'s."""
        return g.prefill[0] if len(g.prefill) == 1 else self._pick_prefill(g, key)

    def _pick_prefill(self, g: Group, key: int) -> Instance | None:
        """Prefill instance inside a pair group of several: ``tandem.routing.pick_instance`` (the router's rule)
        over the group's Ready prefill instances — the key's rendezvous order (a conversation sticks to one
        instance and its cache) with the bounded-load walk, here with the per-instance queue limit the router
        applies to units, so a pair's instances are balanced as the pools topology's prefill units are.
        When every instance is full, the least loaded (the pair already admitted the request)."""
        ready = [c for c in g.prefill if c.state == READY]
        if not ready:
            return None
        if len(ready) == 1:
            return ready[0]
        cached = self._inner_pairs.get(g.gid)
        names = tuple(c.name for c in ready)
        if cached is None or cached[0] != names:
            pairs = tuple(
                Pair(id=c.name, index=c.iid, revision=g.revision.name, state=PairState.SERVING) for c in ready
            )
            cached = (names, pairs)
            self._inner_pairs[g.gid] = cached
        loads = {c.name: PairLoad(in_flight=c.batch, queued=len(c.queue)) for c in ready}
        name = pick_instance(key, cached[1], loads, self._inner_bound)
        return next(c for c in ready if c.name == name)

    def _fill_prefill(self, inst: Instance) -> None:
        """Admit queued requests while fewer than ``prefill_slots`` prefills run (processor sharing)."""
        queue = inst.queue
        if not queue or inst.batch >= self.prefill_slots:
            return
        self._advance_prefill(inst)
        while queue and inst.batch < self.prefill_slots:
            req = queue.popleft()
            g = inst.group
            if g is not None and req.queued:
                g.queued -= 1
                req.queued = False
                self._dirty_loads.add(g)
            if inst.batch == 0:
                inst.busy_since = self.now
            inst.batch += 1
            req.v_finish = inst.v + req.service
            heapq.heappush(inst.active, (req.v_finish, req.i, req))
        inst.rate = 1.0 / inst.batch

    def _advance_prefill(self, inst: Instance) -> None:
        if inst.batch > 0:
            inst.v += (self.now - inst.t_v) * inst.rate
        inst.t_v = self.now

    def _reschedule_prefill(self, inst: Instance) -> None:
        inst.version += 1
        if inst.active:
            dt = (inst.active[0][0] - inst.v) * inst.batch
            self.push(self.now + max(0.0, dt), EV_PREFILL_DONE, inst, inst.version)

    def _prefill_done(self, inst: Instance, version: int) -> None:
        if version != inst.version:
            return
        self._advance_prefill(inst)
        active = inst.active
        while active and active[0][0] <= inst.v + 1e-9:
            _, _, req = heapq.heappop(active)
            inst.batch -= 1
            self._prefill_finish(inst, req)
        if inst.batch == 0:
            inst.busy_time += max(0.0, min(self.now, self.horizon) - min(inst.busy_since, self.horizon))
            inst.rate = 0.0
        else:
            inst.rate = 1.0 / inst.batch
        self._fill_prefill(inst)
        self._reschedule_prefill(inst)
        if inst.state == DRAINING:
            self._check_drained(inst)

    def _prefill_finish(self, inst: Instance, req: Req) -> None:
        blocks = req.blocks
        assert blocks is not None and inst.cache is not None
        inst.cache.insert(blocks, 0, req.local_run)
        if self.shared is not None:
            self.shared.insert(blocks, req.local_run, req.shared_run)
        req.blocks = None
        req.prefilled = True
        if not req.mirror:
            self.c["prefill_busy_s"] += req.service
            self.c["prompt_tokens"] += req.inp
        g = req.group
        if self.opt.topology == "pools" and g is not None:
            g.assigned -= 1
            g.tokens -= req.inp + req.out
            self._dirty_loads.add(g)
        d = self._pick_decode(req)
        if d is None:
            self._fail(req, STATUS_FAILED)
            return
        req.dinst = d
        d.incoming += 1
        nbytes = req.inp * self.kv_b
        bw = self._pd_bandwidth(g)
        if bw == self.p.network.nic_bandwidth:
            self.bytes_pd_network += nbytes
        self.push(self.now + nbytes / bw, EV_DECODE_JOIN, req)

    def _pd_bandwidth(self, g: Group | None) -> float:
        """Intra-node link when the pair group fits one node, else the NIC."""
        pairs = self.opt.topology == "pairs" and g is not None
        if pairs and g is not None and (len(g.prefill) + len(g.decode)) * self.gpus <= self.p.hardware.gpus_per_node:
            return self.p.network.intra_node_bandwidth
        return self.p.network.nic_bandwidth

    def _pick_decode(self, req: Req) -> Instance | None:
        g = req.group
        if self.opt.topology == "pairs" and g is not None:
            cands = [d for d in g.decode if d.state in (READY, DRAINING)]
        else:
            cands = [d for d in self.decode_pool if d.revision is req.pinst.revision] if req.pinst else []
            if not cands:
                cands = self.decode_pool
        best: Instance | None = None
        best_load = 0
        for d in cands:
            load = d.batch + len(d.waiting) + d.incoming
            if best is None or load < best_load:
                best, best_load = d, load
        return best

    def _decode_join(self, req: Req) -> None:
        d = req.dinst
        assert d is not None
        d.incoming -= 1
        if d.state == GONE:
            self._fail(req, STATUS_FAILED)
            return
        if d.batch < self.max_seqs and d.kv_used + req.inp + req.out <= d.kv_cap:
            self._admit(d, req)
            self._reschedule(d)
        else:
            d.waiting.append(req)
            g = req.group
            if g is not None and self.opt.topology == "pairs":
                g.queued += 1
                req.queued = True
                self._dirty_loads.add(g)

    def _advance(self, d: Instance) -> None:
        if d.batch > 0:
            d.v += (self.now - d.t_v) * d.rate
        d.t_v = self.now

    def _set_rate(self, d: Instance) -> None:
        if d.batch <= 0:
            d.rate = 0.0
            d.step = 0.0
            return
        step = ((self.w_table[d.batch] + d.ctx_sum * self.kv_b) / self.bw + self.comm) * d.revision.tpot_mult
        d.step = step
        d.rate = self.m / step

    def _admit(self, d: Instance, req: Req) -> None:
        self._advance(d)
        if d.batch == 0:
            d.busy_since = self.now
        d.batch += 1
        d.ctx_sum += req.ctx
        d.kv_used += req.inp + req.out
        self._set_rate(d)
        req.t_join = self.now
        req.t_first = self.now + d.step
        req.v_finish = d.v + req.out
        heapq.heappush(d.active, (req.v_finish, req.i, req))
        g = req.group
        if g is not None:
            self._dirty_loads.add(g)

    def _reschedule(self, d: Instance) -> None:
        d.version += 1
        if d.active:
            dt = (d.active[0][0] - d.v) / d.rate if d.rate > 0 else 0.0
            self.push(self.now + max(0.0, dt), EV_DECODE_NEXT, d, d.version)

    def _decode_next(self, d: Instance, version: int) -> None:
        if version != d.version:
            return
        self._advance(d)
        eps = 1e-6
        active = d.active
        while active and active[0][0] <= d.v + eps:
            _, _, req = heapq.heappop(active)
            d.batch -= 1
            d.ctx_sum -= req.ctx
            d.kv_used -= req.inp + req.out
            self._complete(req, d)
        if d.batch == 0:
            d.ctx_sum = 0.0
            d.kv_used = 0.0
            if self.now > d.busy_since:
                d.busy_time += max(0.0, min(self.now, self.horizon) - min(d.busy_since, self.horizon))
        waiting = d.waiting
        while waiting and d.batch < self.max_seqs and d.kv_used + waiting[0].inp + waiting[0].out <= d.kv_cap:
            req = waiting.popleft()
            g = req.group
            if g is not None and req.queued:
                g.queued -= 1
                req.queued = False
            self._admit(d, req)
        self._set_rate(d)
        self._reschedule(d)
        if d.state == DRAINING:
            self._check_drained(d)

    def _copy_error_draws(self) -> npt.NDArray[np.float64]:
        """Engine-error draws of mirror copies: independent of the originals' (``err``), reproducible per run."""
        if self._copy_err is None:
            seed = int(np.frombuffer(self.err[:4].tobytes(), dtype=np.uint64)[0]) if len(self.err) >= 4 else 0
            self._copy_err = np.random.default_rng(seed).random(len(self.err))
        return self._copy_err

    def _release(self, req: Req) -> None:
        """A finished request leaves its pair group (the router's and the drain's view of its load)."""
        g = req.group
        if g is not None and self.opt.topology == "pairs":
            g.assigned -= 1
            g.tokens -= req.inp + req.out
            self._dirty_loads.add(g)
            if g.draining:
                for p in g.prefill:
                    self._check_drained(p)

    def _complete(self, req: Req, d: Instance) -> None:
        i = req.i
        now = self.now
        g = req.group
        ttft = req.t_first - req.t_arr
        tpot = (now - req.t_first) / (req.out - 1) if req.out > 1 else math.nan
        rev = d.revision
        series = self.rev_series[rev.name]
        if req.mirror:  # the engine counts a copy like any request; nobody receives it
            self._release(req)
            series.requests += 1
            series.finished += 1
            if self._copy_error_draws()[i] < rev.error_prob:
                series.errors += 1
                series.engine_errors += 1
            series.add_latency(g.name if g is not None else d.name, ttft, tpot if req.out > 1 else None)
            return
        self.outstanding -= 1
        self.finished += 1
        self._release(req)
        c = self.c
        c["generation_tokens"] += req.out
        series.requests += 1
        series.finished += 1
        if self.err[i] < rev.error_prob:
            self.res_status[i] = STATUS_ERROR
            c["errors"] += 1
            series.errors += 1
            series.engine_errors += 1
        else:
            self.res_status[i] = STATUS_OK
            c["success"] += 1
            # the router's per-request SLO outcome (budget by prompt size; engine errors are misses)
            slo = self.p.slo
            budget = ttft_budget(req.inp, slo.ttft_short_s, slo.ttft_long_s, slo.l_short_tokens, slo.l_long_tokens)
            c["ttft_met"] += ttft <= budget
            # its own prefill (fetch + compute, no queue) already exceeded the budget: no capacity helps
            c["ttft_service_bound"] += ttft > budget and req.service >= budget
            c["tpot_met"] += req.out <= 1 or tpot <= slo.tpot_s
        c["slo_outcomes"] += 1
        self.res_ttft[i] = ttft
        self.res_tpot[i] = tpot
        self.res_done[i] = now
        self.res_walk[i] = req.walk
        self.res_local[i] = req.local_tokens
        self.res_shared[i] = req.shared_tokens
        c["finished"] += 1
        c["isl_sum"] += req.inp
        c["osl_sum"] += req.out
        c["ttft_sum"] += ttft
        c["ttft_count"] += 1
        if req.out > 1:
            c["tpot_sum"] += tpot
            c["tpot_count"] += 1
        # the pair label of the engine pods that served it (a pools-topology decode instance is its own unit)
        series.add_latency(g.name if g is not None else d.name, ttft, tpot if req.out > 1 else None)

    def _fail(self, req: Req, status: int) -> None:
        i = req.i
        if not req.mirror:
            self.outstanding -= 1
            self.finished += 1
            self.res_status[i] = status
            self.res_done[i] = self.now
            self.res_walk[i] = req.walk
            self.res_local[i] = req.local_tokens
            self.res_shared[i] = req.shared_tokens
            self.c["errors"] += 1
            self.c["slo_outcomes"] += 1  # rejected, failed or timed out: a miss of both SLOs
            if status == STATUS_REJECTED:
                self.c["unserved"] += 1  # no pair had room: demand the engines' queues never show
        g = req.group
        rev = g.revision.name if g is not None else self.stable.name
        series = self.rev_series[rev]
        series.requests += 1
        series.errors += 1
        if g is not None:
            if req.queued:
                g.queued -= 1
                req.queued = False
            if self.opt.topology == "pairs" or not req.prefilled:
                g.assigned -= 1
                g.tokens -= req.inp + req.out
            self._dirty_loads.add(g)
        req.blocks = None

    def _drain_timeout(self, inst: Instance, version: int) -> None:
        if inst.state != DRAINING or version != inst.version:
            return
        self.kill_instance(inst, replace=False)

    # --- observation, policy, samples --------------------------------------------------------

    def _role_state(self, role: int) -> RoleState:
        counts = [0, 0, 0, 0, 0]
        for inst in self.alive:
            if inst.role == role:
                counts[inst.state] += 1
        return RoleState(self.desired[role], counts[PENDING], counts[LOADING], counts[READY], counts[DRAINING])

    def _scrape(self) -> None:
        ready = [0, 0]
        running = [0.0, 0.0]
        waiting = [0.0, 0.0]
        kv_sum = 0.0
        for inst in self.alive:
            if inst.state not in (READY, DRAINING):
                continue
            r = inst.role
            if inst.state == READY:
                ready[r] += 1
            if r == PREFILL:
                running[r] += inst.batch
                waiting[r] += len(inst.queue)
            else:
                running[r] += inst.batch
                waiting[r] += len(inst.waiting)
                if inst.state == READY:
                    kv_sum += inst.kv_used / inst.kv_cap
        self.c["decode_busy_s"] = sum(i.busy_time for i in self.instances if i.role == DECODE)
        gauges: list[InstanceGauge] = []
        serving = 0
        serving_inst = [0, 0]
        if self.opt.topology == "pairs":
            for g in self.groups.values():
                if g.pair_state != PairState.SERVING:
                    continue
                serving += 1
                for inst in (*g.prefill, *g.decode):
                    serving_inst[inst.role] += 1
                    if inst.role == PREFILL:
                        gauges.append(InstanceGauge(g.name, PREFILL, float(inst.batch), float(len(inst.queue)), 0.0))
                    else:
                        gauges.append(
                            InstanceGauge(
                                g.name, DECODE, float(inst.batch), float(len(inst.waiting)), inst.kv_used / inst.kv_cap
                            )
                        )
        self.store.add(
            Scrape(
                t=self.now,
                ready=(ready[0], ready[1]),
                running=(running[0], running[1]),
                waiting=(waiting[0], waiting[1]),
                kv_usage_mean=kv_sum / ready[1] if ready[1] else 0.0,
                counters=dict(self.c),
                revisions={k: v.copy() for k, v in self.rev_series.items()},
                instances=tuple(gauges),
                serving_pairs=serving,
                serving_instances=(serving_inst[0], serving_inst[1]),
            )
        )

    def observation(self) -> Observation:
        obs = self.p.observation
        live = [g for g in self.groups.values() if not g.draining] if self.opt.topology == "pairs" else []
        view = observe(
            self.store,
            self.now,
            obs.lag_s,
            obs.rate_window_s,
            self._role_state(PREFILL),
            self._role_state(DECODE),
            len(live),
        )
        shapes = self.group_shapes() if self.opt.topology == "pairs" else ()
        if not shapes:
            return view
        return replace(view, shape_rollout=self._reshape_hold, group_shapes=shapes)

    def _policy_tick(self) -> None:
        obs = self.observation()
        target = self.policy.decide(obs)
        if target is not None:
            before = (tuple(self.desired), self.shape)
            self.apply_target(target)
            after = (tuple(self.desired), self.shape)
            if before != after:
                self.decisions.append(
                    {
                        "t": round(self.now, 3),
                        "prefill": self.desired[0],
                        "decode": self.desired[1],
                        "shape": list(self.shape),
                    }
                )

    def _sample(self) -> None:
        counts = [[0, 0, 0, 0], [0, 0, 0, 0]]
        for inst in self.alive:
            if inst.state < GONE:
                counts[inst.role][inst.state] += 1
        self.samples_t.append(self.now)
        self.samples.append(counts)

    # --- main loop ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        """The whole run: :meth:`start`, every event up to the horizon (and the tail), :meth:`result`."""
        self.start()
        self.advance()
        return self.result()

    def start(self) -> None:
        """Create the initial fleet and queue the periodic events and the :meth:`at` hooks."""
        self.apply_target(self.policy.initial_target(), initial=True)
        self.push(0.0, EV_SCRAPE, None)
        self.push(self.policy.interval_s, EV_POLICY, None)
        self.push(0.0, EV_SAMPLE, None)
        for t, hook, label in self._hooks:
            self.push(t, EV_HOOK, (hook, label))
        self._arrivals = self.wl.arrival_s.tolist()
        self._ai = 0

    def halt(self) -> None:
        """From a hook: end the run after this hook (requests still in flight stay pending: timeouts).

        For measurements that are settled before the horizon (a W5 rollback has taken effect); never
        for GPU-hour or attainment results, which need the whole horizon."""
        self._halted = True

    def fork(self, *riders: Any) -> tuple[Simulation, tuple[Any, ...]]:
        """A deep copy that continues exactly as this run would (between two :meth:`advance` calls),
        sharing the read-only inputs (workload, capacity model, params, error draws, arrival times,
        routing keys). ``riders`` (objects the queued hooks refer to) are copied with it, so the copy's
        hooks refer to the copied riders."""
        shared = (self.wl, self.cap, self.p, self.err, self._arrivals, self.keys)
        memo: dict[int, Any] = {id(x): x for x in shared}
        sim, copied = copy.deepcopy((self, riders), memo)
        return sim, copied

    @property
    def halted(self) -> bool:
        """:meth:`halt` ended the run before its horizon."""
        return self._halted

    def advance(self, before: float = INF) -> None:
        """Process events and arrivals in time order while their time is < ``before``, or until the run
        is over (horizon and tail reached, or :meth:`halt`). Stopping at ``before`` and going on
        later gives the same run as not stopping: nothing is popped that is not processed, so a copy
        of the simulation taken between two calls (``copy.deepcopy``) continues exactly as the original
        would (W5 shares one warm-up across its canary variants this way)."""
        obs_p = self.p.observation
        arrivals = self._arrivals
        n = len(arrivals)
        ai = self._ai
        heap = self._heap
        horizon = self.horizon
        stop = horizon + self.opt.tail_s
        progress = self.opt.progress
        next_progress = self._next_progress
        pop = heapq.heappop
        while True:
            t_arr = arrivals[ai] if ai < n else INF
            if heap and heap[0][0] <= t_arr:
                if heap[0][0] >= before:
                    break
                t, _, kind, obj, version = pop(heap)
                if t > stop:
                    break
                self.now = t
                self.events += 1
                if kind == EV_DECODE_NEXT:
                    self._decode_next(obj, version)
                elif kind == EV_PREFILL_DONE:
                    self._prefill_done(obj, version)
                elif kind == EV_DECODE_JOIN:
                    self._decode_join(obj)
                elif kind == EV_SCRAPE:
                    self._scrape()
                    if t + obs_p.scrape_interval_s < horizon:
                        self.push(t + obs_p.scrape_interval_s, EV_SCRAPE, None)
                elif kind == EV_POLICY:
                    self._policy_tick()
                    if t + self.policy.interval_s < horizon:
                        self.push(t + self.policy.interval_s, EV_POLICY, None)
                elif kind == EV_SAMPLE:
                    self._sample()
                    if t + self.opt.sample_s < horizon:
                        self.push(t + self.opt.sample_s, EV_SAMPLE, None)
                elif kind == EV_BOUND:
                    self._on_bound(obj)
                elif kind == EV_READY:
                    self._on_ready(obj)
                elif kind == EV_DRAIN_TIMEOUT:
                    self._drain_timeout(obj, version)
                elif kind == EV_HOOK:
                    hook, label = obj
                    hook(self)
                    if label:
                        self.hook_log.append({"t": round(t, 3), "hook": label})
                    if self._halted:
                        break
                if t >= horizon and ai >= n and self.outstanding == 0:
                    break
            elif ai < n:
                if t_arr >= before:
                    break
                self.now = t_arr
                self._arrive(ai)
                ai += 1
                self.events += 1
            else:
                break
            if progress is not None and self.now >= next_progress:
                progress(self.now, self.finished, n)
                next_progress += self.opt.progress_every_s
        self._ai = ai
        self._next_progress = next_progress

    def result(self) -> SimResult:
        """The run's results (after :meth:`advance` ran to the end or a :meth:`halt`)."""
        self.now = max(self.now, self.horizon)
        return self._result()

    def _result(self) -> SimResult:
        h = self.horizon
        pending = self.res_status == STATUS_PENDING
        self.res_status[pending] = STATUS_TIMEOUT
        records: list[InstanceRecord] = []
        for inst in self.instances:
            t_end = min(inst.t_end, h) if inst.t_end < INF else h
            busy = inst.busy_time
            if inst.role == DECODE and inst.state != GONE and inst.batch > 0:
                busy += max(0.0, h - min(inst.busy_since, h))
            records.append(
                InstanceRecord(
                    role=inst.role,
                    group=inst.group.name if inst.group is not None else "",
                    revision=inst.revision.name,
                    t_created=inst.t_created,
                    t_bound=inst.t_bound,
                    t_ready=inst.t_ready,
                    t_end=t_end,
                    busy_s=busy,
                    load_kind=inst.load_kind,
                )
            )
        nic_cap = (
            sum(max(0.0, r.t_end - min(r.t_bound, r.t_end)) for r in records if r.t_bound < INF)
            * self.p.network.nic_bandwidth
        )
        return SimResult(
            horizon_s=h,
            ttft=self.res_ttft,
            tpot=self.res_tpot,
            t_done=self.res_done,
            status=self.res_status,
            walk=self.res_walk,
            local_tokens=self.res_local,
            shared_tokens=self.res_shared,
            prefill_s=self.res_prefill,
            revision=self.res_rev,
            revision_names=sorted(self.revision_index, key=lambda k: self.revision_index[k]),
            unit=self.res_unit,
            instances=records,
            samples_t=np.asarray(self.samples_t, dtype=np.float64),
            samples=np.asarray(self.samples, dtype=np.int32).reshape(len(self.samples_t), 2, 4),
            scale_actions=self.scale_actions,
            ratio_changes=self.ratio_changes,
            fast_rejects=self.fast_rejects,
            bytes_shared=self.nic.bytes_moved,
            bytes_pd_network=self.bytes_pd_network,
            nic_capacity_bytes=nic_cap,
            evictions=sum(i.cache.evictions for i in self.instances if i.cache is not None),
            events=self.events,
            decisions=self.decisions,
            hooks=self.hook_log,
        )
