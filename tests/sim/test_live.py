"""Live mode's fleet model (``tandem_lab.sim.live``): routing through published tables, per-pod vLLM metrics.

Workloads are built here (sessions of growing prompts), so the tests do not need the shared traces;
time is a fake clock advanced in steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tandem.routing import Admission, Endpoint, Pair, PairState, Revisions, RoutingTable, compute_pair_weights
from tandem_lab.sim.config import load_params
from tandem_lab.sim.live import (
    E2E,
    PREFIX_HITS,
    PREFIX_QUERIES,
    TPOT,
    TTFT,
    ArrivalSource,
    Behaviour,
    LiveFleet,
    LiveOptions,
    LivePod,
    PodMetrics,
    histogram_quantile,
    live_agentic_workload,
)
from tandem_lab.sim.workload import BLOCK_TOKENS, Workload

NS = "ml"
POOL = "speed"


# --- builders ------------------------------------------------------------------------------------


def sessions_workload(
    sessions: int = 40,
    turns: int = 6,
    blocks_per_turn: int = 8,
    gap_s: float = 3.0,
    spread_s: float = 30.0,
    output_tokens: int = 64,
    shared_prefix: bool = True,
) -> Workload:
    """``sessions`` conversations of ``turns`` requests; turn k's prompt is (k+1)·``blocks_per_turn``
    blocks. With ``shared_prefix`` each turn extends the previous prompt (vLLM-style chained ids);
    without it every request has fresh ids (no possible hit)."""
    arrival: list[float] = []
    inp: list[int] = []
    start: list[int] = []
    count: list[int] = []
    blocks: list[int] = []
    next_id = 0
    for s in range(sessions):
        t0 = spread_s * s / sessions
        run_start = len(blocks)
        if shared_prefix:
            blocks.extend(range(next_id, next_id + turns * blocks_per_turn))
            next_id += turns * blocks_per_turn
        for k in range(turns):
            n = (k + 1) * blocks_per_turn
            if shared_prefix:
                start.append(run_start)
            else:
                start.append(len(blocks))
                blocks.extend(range(next_id, next_id + n))
                next_id += n
            count.append(n)
            arrival.append(t0 + k * gap_s)
            inp.append(n * BLOCK_TOKENS)
    n_req = len(arrival)
    order = np.argsort(np.asarray(arrival), kind="stable")
    return Workload(
        name="sessions",
        arrival_s=np.asarray(arrival, dtype=np.float64)[order],
        input_tokens=np.asarray(inp, dtype=np.int64)[order],
        output_tokens=np.full(n_req, output_tokens, dtype=np.int64),
        block_start=np.asarray(start, dtype=np.int64)[order],
        block_count=np.asarray(count, dtype=np.int64)[order],
        tail_id=np.full(n_req, -1, dtype=np.int64),
        id_offset=np.zeros(n_req, dtype=np.int64),
        blocks=np.asarray(blocks, dtype=np.int64),
        duration_s=spread_s + turns * gap_s,
    )


@dataclass
class Clock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FleetSpec:
    """Pairs ``speed-p<i>`` of 1P+1D; per pair: revision, state, weight, whether its pods exist."""

    revisions: Sequence[str]
    states: Sequence[PairState] = ()
    weights: Sequence[int] = ()
    missing_pods: Sequence[int] = ()
    admission: Admission = field(default_factory=lambda: Admission(max_in_flight=64, max_queued=8))

    def pods(self, uid: str = "u1") -> list[LivePod]:
        out = []
        for i, rev in enumerate(self.revisions):
            if i in self.missing_pods:
                continue
            for role in ("prefill", "decode"):
                out.append(LivePod(NS, pod_name(i, role), POOL, rev, role, f"{POOL}-p{i}", uid))
        return out

    def table(self) -> RoutingTable:
        pairs = []
        for i, rev in enumerate(self.revisions):
            pairs.append(
                Pair(
                    id=f"{POOL}-p{i}",
                    index=i,
                    revision=rev,
                    state=self.states[i] if self.states else PairState.SERVING,
                    weight=self.weights[i] if self.weights else 100,
                    prefill=(Endpoint(pod=pod_name(i, "prefill")),),
                    decode=(Endpoint(pod=pod_name(i, "decode")),),
                )
            )
        return RoutingTable(
            pool=POOL,
            namespace=NS,
            traffic_class=POOL,
            admission=self.admission,
            revisions=Revisions(stable=self.revisions[0]),
            pairs=tuple(pairs),
        )


def pod_name(i: int, role: str) -> str:
    return f"{POOL}-p{i}-{role}-0"


def make_fleet(
    spec: FleetSpec, workload: Workload | None = None, clock: Clock | None = None, **options: object
) -> tuple[LiveFleet, Clock]:
    clock = clock or Clock()
    # capacity_scale 4: a pair absorbs ~10 req/s of these sessions, so only the rejects test overloads.
    opts = {"rate": 10.0, "seed": 7, "key_blocks": 1, "capacity_scale": 4.0, **options}
    fleet = LiveFleet(load_params(), workload or sessions_workload(), LiveOptions(**opts), clock)  # type: ignore[arg-type]
    fleet.sync([spec.table()], spec.pods())
    return fleet, clock


def run(fleet: LiveFleet, clock: Clock, seconds: float, step: float = 0.05) -> None:
    end = clock.t + seconds
    while clock.t < end - 1e-9:
        clock.t = min(end, clock.t + step)
        fleet.advance()


def metrics(fleet: LiveFleet, i: int, role: str) -> PodMetrics:
    m = fleet.pod_metrics(NS, pod_name(i, role))
    assert m is not None
    return m


def requests_on(fleet: LiveFleet, i: int) -> int:
    """Prefills started on pair i (prefix-cache queries are counted when a prefill starts)."""
    return metrics(fleet, i, "prefill").histograms[TTFT].count + fleet._pods[(NS, pod_name(i, "prefill"))].batch


# --- buckets and quantiles -----------------------------------------------------------------------


def test_live_buckets_are_vllms_as_the_exporter_and_offline_metrics_have_them() -> None:
    from tandem_lab.dev import exporter  # noqa: PLC0415
    from tandem_lab.sim import live, metrics  # noqa: PLC0415

    assert live.TTFT_BUCKETS == exporter.TTFT_BUCKETS == metrics.TTFT_BUCKETS
    assert live.TPOT_BUCKETS == exporter.TPOT_BUCKETS == metrics.TPOT_BUCKETS
    assert live.LATENCY_BUCKETS == exporter.LATENCY_BUCKETS
    assert live.FINISHED_REASONS == exporter.FINISHED_REASONS


@pytest.mark.parametrize(
    ("counts", "q", "want"),
    [
        pytest.param((0, 8, 2, 0), 0.9, 0.375, id="docstring example"),
        pytest.param((10, 0, 0, 0), 0.5, 0.05, id="first bucket starts at 0"),
        pytest.param((0, 0, 0, 5), 0.9, 0.5, id="+Inf bucket answers the highest bound"),
    ],
)
def test_histogram_quantile_interpolates_like_prometheus(counts: tuple[int, ...], q: float, want: float) -> None:
    assert histogram_quantile(q, (0.1, 0.25, 0.5), counts) == pytest.approx(want)


def test_histogram_quantile_of_no_observations_is_nan() -> None:
    assert math.isnan(histogram_quantile(0.9, (0.1, 0.25), (0, 0, 0)))


# --- arrivals ------------------------------------------------------------------------------------


def test_arrival_source_offers_the_rate_and_follows_a_change() -> None:
    wl = sessions_workload()
    src = ArrivalSource(wl, rate=10.0, speedup=1.0, seed=3, key_blocks=1, epoch=0.0)
    assert src.copies == pytest.approx(10.0 / (len(wl) / wl.duration_s))

    def count_until(t: float) -> int:
        n = 0
        while src.peek() <= t:
            src.pop()
            n += 1
        return n

    first = count_until(200.0)
    src.set_rate(30.0, 200.0)
    second = count_until(400.0)
    assert first == pytest.approx(2000, rel=0.1)
    assert second == pytest.approx(6000, rel=0.1)


def test_arrival_copies_and_laps_have_disjoint_block_ids() -> None:
    wl = sessions_workload(sessions=4, turns=2)
    src = ArrivalSource(wl, rate=5 * len(wl) / wl.duration_s, speedup=1.0, seed=1, key_blocks=1, epoch=0.0)
    seen: dict[int, int] = {}
    for _ in range(len(wl) * 5 * 3):  # three laps of five copies
        a = src.pop()
        owner = a.blocks[0] >> 40  # copy/lap id space, trace ids < 2**40
        for b in a.blocks:
            assert seen.setdefault(b, owner) == owner
    assert len({b >> 40 for b in seen}) == 15


def test_speedup_compresses_trace_time() -> None:
    wl = sessions_workload()
    slow = ArrivalSource(wl, rate=10.0, speedup=1.0, seed=3, key_blocks=1, epoch=0.0)
    fast = ArrivalSource(wl, rate=10.0, speedup=4.0, seed=3, key_blocks=1, epoch=0.0)
    assert fast.copies == pytest.approx(slow.copies / 4)


# --- routing -------------------------------------------------------------------------------------


def test_routing_sends_nothing_to_draining_warming_zero_weight_or_podless_pairs() -> None:
    spec = FleetSpec(
        revisions=["r1"] * 5,
        states=[PairState.SERVING, PairState.DRAINING, PairState.WARMING, PairState.SERVING, PairState.SERVING],
        weights=[100, 100, 100, 0, 100],
        missing_pods=[4],
    )
    fleet, clock = make_fleet(spec)
    run(fleet, clock, 30)
    assert requests_on(fleet, 0) > 50
    assert [requests_on(fleet, i) for i in (1, 2, 3)] == [0, 0, 0]
    stats = fleet.stats()
    assert stats.pools[0].candidates == 1
    assert stats.arrivals == stats.routed + stats.queued_walks + stats.rejected + stats.unmatched


def test_routing_follows_canary_weights() -> None:
    revisions = ["stable"] * 3 + ["canary"]
    base = [Pair(id=f"{POOL}-p{i}", index=i, revision=r, state=PairState.SERVING) for i, r in enumerate(revisions)]
    weights = compute_pair_weights(base, "canary", 10)
    spec = FleetSpec(revisions=revisions, weights=[weights[p.id] for p in base])
    fleet, clock = make_fleet(spec, sessions_workload(sessions=400, turns=2, spread_s=100.0), rate=20.0)
    run(fleet, clock, 60)
    counts = [requests_on(fleet, i) for i in range(4)]
    share = counts[3] / sum(counts)
    assert 0.04 < share < 0.18, counts


def test_a_mirrored_canary_gets_copies_of_its_pair_count_keys_and_serves_none() -> None:
    """``revisions.canaryMirror``: the canary pair at weight 0 gets copies where the by-count walk takes a key
    (``tandem.routing.mirror_target``, as the router), its pods' metrics count them, and the fleet's counters count
    each client request once."""
    revisions = ["stable"] * 3 + ["canary"]
    spec = FleetSpec(revisions=revisions, weights=[100, 100, 100, 0])
    table = spec.table().model_copy(
        update={"revisions": Revisions(stable="stable", canary="canary", canary_weight_percent=0, canary_mirror=True)}
    )
    fleet, clock = make_fleet(spec, sessions_workload(sessions=400, turns=2, spread_s=100.0), rate=20.0)
    fleet.sync([table], spec.pods())
    run(fleet, clock, 60)
    counts = [requests_on(fleet, i) for i in range(4)]
    assert 0.12 < counts[3] / sum(counts[:3]) < 0.45, counts  # about a third: one pair's keys of four, copied
    stats = fleet.stats()
    assert stats.arrivals == stats.routed + stats.queued_walks + stats.rejected + stats.unmatched
    assert stats.completed <= stats.arrivals


def test_draining_pair_finishes_its_requests_and_takes_no_new_ones() -> None:
    spec = FleetSpec(revisions=["r1", "r1"])
    fleet, clock = make_fleet(spec, rate=20.0)
    run(fleet, clock, 20)
    p0 = fleet._pods[(NS, pod_name(0, "prefill"))]
    held = requests_on(fleet, 0) + len(p0.queue)
    assert held > 0
    draining = FleetSpec(revisions=["r1", "r1"], states=[PairState.DRAINING, PairState.SERVING])
    fleet.sync([draining.table()], draining.pods())
    run(fleet, clock, 20)
    assert requests_on(fleet, 0) == held  # only what it had
    assert fleet.stats().pools[0].in_flight > 0 or requests_on(fleet, 1) > 0
    decode = fleet._pods[(NS, pod_name(0, "decode"))]
    assert decode.batch == 0 and not decode.waiting  # finished
    assert fleet.stats().failed == 0


def test_rejects_are_counted_and_never_reach_an_engine() -> None:
    spec = FleetSpec(revisions=["r1"], admission=Admission(max_in_flight=1, max_queued=1))
    fleet, clock = make_fleet(spec, rate=50.0)
    run(fleet, clock, 10)
    stats = fleet.stats()
    assert stats.rejected > 100
    assert stats.arrivals == stats.routed + stats.queued_walks + stats.rejected + stats.unmatched
    assert stats.completed + stats.pools[0].in_flight + stats.failed == stats.routed + stats.queued_walks
    assert metrics(fleet, 0, "decode").histograms[TTFT].count == stats.completed


def test_requests_no_pool_matches_are_unmatched() -> None:
    spec = FleetSpec(revisions=["r1"])
    table = spec.table().model_copy(update={"match": spec.table().match.model_copy(update={"max_prompt_tokens": 1})})
    fleet, clock = make_fleet(spec)
    fleet.sync([table], spec.pods())
    run(fleet, clock, 5)
    stats = fleet.stats()
    assert stats.unmatched == stats.arrivals > 0


# --- behaviour and metrics -----------------------------------------------------------------------


def test_a_revision_with_ttft_multiplier_shows_a_higher_ttft_quantile() -> None:
    spec = FleetSpec(revisions=["good", "good", "slow", "slow"])
    fleet, clock = make_fleet(spec, sessions_workload(sessions=200, turns=3, spread_s=60.0), rate=8.0)
    fleet.set_behaviour("slow", ttft_multiplier=1.5)
    run(fleet, clock, 120)

    def merged(rev: str) -> tuple[float, float]:
        counts = None
        total = 0.0
        for i, r in enumerate(spec.revisions):
            if r != rev:
                continue
            h = metrics(fleet, i, "decode").histograms[TTFT]
            counts = list(h.counts) if counts is None else [a + b for a, b in zip(counts, h.counts, strict=True)]
            total += h.total
        assert counts is not None and sum(counts) > 100
        return histogram_quantile(0.9, h.bounds, counts), total / sum(counts)

    good_p90, good_mean = merged("good")
    slow_p90, slow_mean = merged("slow")
    assert slow_p90 > good_p90
    assert slow_mean > 1.3 * good_mean


def test_tpot_multiplier_and_error_rate_show_in_decode_metrics() -> None:
    spec = FleetSpec(revisions=["a", "b"])
    fleet, clock = make_fleet(spec, rate=10.0)
    fleet.set_behaviour("b", tpot_multiplier=3.0, error_rate=0.5)
    run(fleet, clock, 60)
    a, b = metrics(fleet, 0, "decode"), metrics(fleet, 1, "decode")
    tpot_a = a.histograms[TPOT].total / a.histograms[TPOT].count
    tpot_b = b.histograms[TPOT].total / b.histograms[TPOT].count
    # ×3 per step, a little more in total: slower sequences stay longer, so b's decode batches are larger
    assert 2.5 * tpot_a < tpot_b < 5 * tpot_a
    assert a.success["error"] == 0 and a.success["stop"] > 0
    assert 0.3 < b.success["error"] / (b.success["error"] + b.success["stop"]) < 0.7
    assert set(a.success) == {"stop", "length", "abort", "error", "repetition"}


def test_behaviour_rejects_unknown_fields_and_bad_values() -> None:
    fleet, _ = make_fleet(FleetSpec(revisions=["r1"]))
    with pytest.raises(ValueError, match="kv_usage"):
        fleet.set_behaviour("r1", kv_usage=0.9)
    with pytest.raises(ValueError, match="error_rate"):
        fleet.set_behaviour("r1", error_rate=2)
    assert fleet.set_behaviour("r1", ttft_multiplier=2) == Behaviour(prefill_multiplier=2)


@pytest.mark.parametrize(
    ("shared_prefix", "want_hits"),
    [pytest.param(True, True, id="repeated sessions hit"), pytest.param(False, False, id="fresh prompts never hit")],
)
def test_prefix_cache_hits_rise_for_repeated_sessions(shared_prefix: bool, want_hits: bool) -> None:
    spec = FleetSpec(revisions=["r1", "r1"])
    fleet, clock = make_fleet(spec, sessions_workload(shared_prefix=shared_prefix), rate=10.0, shared_tier=False)
    run(fleet, clock, 20)
    first = [metrics(fleet, i, "prefill").counters for i in (0, 1)]
    run(fleet, clock, 40)
    later = [metrics(fleet, i, "prefill").counters for i in (0, 1)]
    hits = sum(c[PREFIX_HITS] for c in later)
    queries = sum(c[PREFIX_QUERIES] for c in later)
    assert queries > 0
    if not want_hits:
        assert hits == 0
        return
    # turn k of a 6-turn session finds k of its k+1 prompt chunks: ≈ 0.6 token-weighted at steady state
    assert hits / queries > 0.4
    assert sum(c[PREFIX_HITS] for c in later) > sum(c[PREFIX_HITS] for c in first)
    assert fleet.stats().hit_ratio == pytest.approx(hits / queries)


def test_same_seed_same_metrics_and_another_seed_differs() -> None:
    def once(seed: int) -> list[PodMetrics]:
        spec = FleetSpec(revisions=["r1", "r2"])
        fleet, clock = make_fleet(spec, seed=seed, rate=15.0)
        fleet.set_behaviour("r2", error_rate=0.2)
        run(fleet, clock, 30)
        return [metrics(fleet, i, role) for i in (0, 1) for role in ("prefill", "decode")]

    assert once(11) == once(11)
    assert once(11) != once(12)


# --- fleet changes -------------------------------------------------------------------------------


def test_new_pods_start_cold_and_vanished_pods_drop_state_and_fail_requests() -> None:
    spec = FleetSpec(revisions=["r1", "r1"])
    fleet, clock = make_fleet(spec, rate=30.0, shared_tier=False)
    run(fleet, clock, 20)
    assert metrics(fleet, 1, "prefill").counters[PREFIX_HITS] > 0
    gone = FleetSpec(revisions=["r1", "r1"], missing_pods=[1])
    fleet.sync([spec.table()], gone.pods())  # the table still lists p1; its pods are gone
    assert fleet.pod_metrics(NS, pod_name(1, "prefill")) is None
    assert fleet.stats().failed > 0
    assert fleet.stats().pools[0].candidates == 1
    run(fleet, clock, 5)
    fleet.sync([spec.table()], spec.pods(uid="u2"))  # recreated: same names, new uids
    fresh = metrics(fleet, 1, "prefill")
    assert fresh.counters[PREFIX_QUERIES] == 0 and fresh.histograms[E2E].count == 0
    run(fleet, clock, 1)
    assert fleet._pods[(NS, pod_name(1, "prefill"))].cache is not None
    pair = next(p for p in fleet._routes[(NS, POOL)].pairs.values() if p.id == f"{POOL}-p1")
    assert pair.assigned >= 0 and pair.queued >= 0


def test_pod_relabelled_to_another_revision_restarts_cold() -> None:
    spec = FleetSpec(revisions=["r1"])
    fleet, clock = make_fleet(spec)
    run(fleet, clock, 10)
    assert metrics(fleet, 0, "decode").histograms[TTFT].count > 0
    moved = FleetSpec(revisions=["r2"])
    fleet.sync([moved.table()], moved.pods())
    m = metrics(fleet, 0, "decode")
    assert m.pod.revision == "r2" and m.histograms[TTFT].count == 0


def test_gauges_are_finite_for_every_pod_even_idle() -> None:
    spec = FleetSpec(revisions=["r1"], states=[PairState.WARMING])
    fleet, clock = make_fleet(spec)
    run(fleet, clock, 5)
    for role in ("prefill", "decode"):
        gauges = metrics(fleet, 0, role).gauges
        assert all(math.isfinite(v) for v in gauges.values())
        assert gauges["vllm:num_requests_running"] == 0


def test_rate_change_at_runtime() -> None:
    spec = FleetSpec(revisions=["r1", "r1"])
    fleet, clock = make_fleet(spec, rate=5.0)
    run(fleet, clock, 40)
    before = fleet.stats().arrivals
    fleet.set_rate(20.0)
    run(fleet, clock, 40)
    after = fleet.stats().arrivals - before
    assert before == pytest.approx(200, rel=0.25)
    assert after == pytest.approx(800, rel=0.15)


def test_agentic_workload_replays_with_prefix_keys() -> None:
    params = load_params()
    wl = live_agentic_workload(params, seed=1, duration_s=600.0, rate=2.0)
    assert len(wl) > 100 and wl.prefix_key is not None
    spec = FleetSpec(revisions=["r1", "r1"])
    fleet, clock = make_fleet(spec, wl, rate=2.0, capacity_scale=8.0)
    run(fleet, clock, 30, step=0.25)
    stats = fleet.stats()
    assert stats.arrivals > 20 and stats.completed > 0


# --- exposition and cluster parsing (tandem_lab.dev.simlive, pure helpers) ---------------------------


def test_render_serves_vllm_names_with_cumulative_buckets() -> None:
    from tandem_lab.dev.simlive import render  # noqa: PLC0415

    fleet, clock = make_fleet(FleetSpec(revisions=["r1"]))
    run(fleet, clock, 10)
    text = render(metrics(fleet, 0, "decode"), "m").decode()
    for name in (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.75",model_name="m"}',
        "vllm:inter_token_latency_seconds_count",
        "vllm:request_time_per_output_token_seconds_sum",
        "vllm:e2e_request_latency_seconds_bucket",
        'vllm:request_success_total{engine="0",finished_reason="error",model_name="m"} 0.0',
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert name in text, name
    lines = text.splitlines()
    inf = next(
        line for line in lines if line.startswith("vllm:time_to_first_token_seconds_bucket{") and 'le="+Inf"' in line
    )
    count = next(line for line in lines if line.startswith("vllm:time_to_first_token_seconds_count"))
    assert inf.split()[-1] == count.split()[-1]


def test_parse_objects_keeps_ready_engine_pods_and_routing_tables() -> None:
    from tandem_lab.dev.simlive import parse_objects  # noqa: PLC0415

    table = FleetSpec(revisions=["r1"]).table()

    def pod(name: str, ready: bool, role: str = "prefill", deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, object] = {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                "tandem.dev/component": "engine",
                "tandem.dev/pool": POOL,
                "tandem.dev/revision": "r1",
                "tandem.dev/role": role,
                "tandem.dev/pair": f"{POOL}-p0",
            },
        }
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {
            "kind": "Pod",
            "metadata": meta,
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    items: list[dict[str, Any]] = [
        pod("a", True),
        pod("b", False),
        pod("c", True, deleting=True),
        pod("d", True, role="eval"),
        {
            "kind": "ConfigMap",
            "metadata": {"name": "speed-routing", "labels": {"tandem.dev/component": "routing-table"}},
            "data": {"routing.json": table.to_json()},
        },
        {
            "kind": "ConfigMap",
            "metadata": {"name": "broken-routing", "labels": {"tandem.dev/component": "routing-table"}},
            "data": {"routing.json": "{"},
        },
    ]
    tables, pods = parse_objects(NS, items)
    assert tables == [table]
    assert [p.name for p in pods] == ["a"]
    assert pods[0] == LivePod(NS, "a", POOL, "r1", "prefill", f"{POOL}-p0", "uid-a")


def test_copies_worked_example_of_the_module_docstring() -> None:
    from tandem_lab.sim.traces import CONVERSATION, load_trace, traces_dir  # noqa: PLC0415

    path = traces_dir() / CONVERSATION
    if not path.exists():
        pytest.fail(f"trace not present: {path} (set TANDEM_TRACES_DIR)")
    wl = load_trace(path)
    src = ArrivalSource(wl, rate=50.0, speedup=1.0, seed=1, key_blocks=2, epoch=0.0)
    assert len(wl) == 12031 and src.native_rate == pytest.approx(3.40, abs=0.005)
    assert src.copies == pytest.approx(14.7, abs=0.05)
    assert sorted(s.keep for s in src._streams.values())[0] == pytest.approx(0.72, abs=0.01)
    assert len(src._streams) == 15
    faster = ArrivalSource(wl, rate=50.0, speedup=4.0, seed=1, key_blocks=2, epoch=0.0)
    assert faster.copies == pytest.approx(3.7, abs=0.05)


# --- external routing (a real router chooses the pods; tandem_lab.dev.livefront) -----------------


@dataclass
class Legs:
    """What the model told one request's legs (the callbacks a data plane passes)."""

    prefilled: list[bool] = field(default_factory=list)
    first_at: list[float] = field(default_factory=list)
    done: list[int | None] = field(default_factory=list)


def enter_both(fleet: LiveFleet, serial: int, pair: int, legs: Legs, *, decode_first: bool = False) -> None:
    """Send request ``serial``'s legs to pair ``pair``'s pods (decode while the prefill runs, as Mooncake does)."""
    prefill = (NS, pod_name(pair, "prefill"), legs.prefilled.append)
    decode = (NS, pod_name(pair, "decode"), legs.first_at.append, legs.done.append)
    assert fleet.enter_prefill(serial, *prefill) is None
    assert fleet.enter_decode(serial, *decode) is None


def test_external_routing_holds_arrivals_for_the_client_and_routes_nothing_itself() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1", "r1"]), external_routing=True)
    run(fleet, clock, 5.0)
    arrivals = list(fleet.outbox)
    assert len(arrivals) == fleet.stats().arrivals > 10
    assert [s for s, _ in arrivals] == sorted(s for s, _ in arrivals)
    assert requests_on(fleet, 0) == requests_on(fleet, 1) == 0
    assert fleet.stats().routed == 0


def test_external_legs_follow_the_pods_the_router_chose_and_report_their_times() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1", "r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serials = [s for s, _ in fleet.outbox]
    fleet.outbox.clear()
    legs = {s: Legs() for s in serials}
    for s in serials:
        enter_both(fleet, s, 1, legs[s])  # the router put every request on pair 1
    run(fleet, clock, 60.0)
    assert requests_on(fleet, 1) == len(serials) and requests_on(fleet, 0) == 0
    for s in serials:
        got = legs[s]
        assert got.prefilled == [True]
        assert len(got.first_at) == 1 and got.done == [64]  # the workload's output tokens
    assert metrics(fleet, 1, "decode").histograms[TTFT].count == len(serials)
    assert fleet.stats().completed == len(serials)


def test_external_decode_sent_after_the_prefill_still_joins() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs = Legs()
    assert fleet.enter_prefill(serial, NS, pod_name(0, "prefill"), legs.prefilled.append) is None
    run(fleet, clock, 10.0)
    assert legs.prefilled == [True] and legs.done == []
    assert fleet.enter_decode(serial, NS, pod_name(0, "decode"), legs.first_at.append, legs.done.append) is None
    run(fleet, clock, 10.0)
    assert legs.done == [64]


@pytest.mark.parametrize(
    ("serial_offset", "pod", "want"),
    [
        pytest.param(10_000, pod_name(0, "prefill"), "not waiting", id="unknown serial"),
        pytest.param(0, pod_name(0, "decode"), "not a live prefill pod", id="decode pod for a prefill leg"),
        pytest.param(0, "gone-pod", "not a live prefill pod", id="pod the model does not know"),
    ],
)
def test_external_prefill_leg_the_model_cannot_take_says_why(serial_offset: int, pod: str, want: str) -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0] + serial_offset
    why = fleet.enter_prefill(serial, NS, pod, lambda ok: None)
    assert why is not None and want in why


def test_external_mirror_copy_runs_once_even_after_its_request_and_counts_only_on_its_pods() -> None:
    """The router's copy of request n (``live-n-mirror``) comes in a task of its own, possibly after n ended:
    the model runs it as a copy (its pods count it, the fleet's client counters do not), and only once."""
    fleet, clock = make_fleet(FleetSpec(["r1", "r2"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs, copy = Legs(), Legs()
    assert fleet.enter_prefill(serial, NS, pod_name(0, "prefill"), legs.prefilled.append) is None
    assert fleet.enter_decode(serial, NS, pod_name(0, "decode"), legs.first_at.append, legs.done.append) is None
    run(fleet, clock, 20.0)
    assert legs.done and legs.done[0]
    before = fleet.stats()
    canary = pod_name(1, "prefill"), pod_name(1, "decode")
    assert fleet.enter_prefill(serial, NS, canary[0], copy.prefilled.append, mirror=True) is None
    assert fleet.enter_decode(serial, NS, canary[1], copy.first_at.append, copy.done.append, mirror=True) is None
    run(fleet, clock, 20.0)
    assert copy.prefilled == [True] and copy.done == legs.done  # the same request, run again
    after = fleet.stats()
    assert (after.completed, after.routed, after.failed) == (before.completed, before.routed, before.failed)
    decode = fleet.pod_metrics(NS, canary[1])
    assert decode is not None and decode.histograms[TTFT].count == 1
    why = fleet.enter_prefill(serial, NS, canary[0], lambda ok: None, mirror=True)
    assert why is not None and "(copy) is not waiting" in why


def test_external_decode_leg_before_its_prefill_leg_waits_for_it() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs = Legs()
    assert fleet.enter_decode(serial, NS, pod_name(0, "decode"), legs.first_at.append, legs.done.append) is None
    run(fleet, clock, 5.0)
    assert legs.done == []
    assert fleet.enter_prefill(serial, NS, pod_name(0, "prefill"), legs.prefilled.append) is None
    run(fleet, clock, 20.0)
    assert legs.prefilled == [True] and legs.done == [64]


def test_external_decode_leg_whose_prefill_never_came_ends_failed_on_release() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs = Legs()
    assert fleet.enter_decode(serial, NS, pod_name(0, "decode"), legs.first_at.append, legs.done.append) is None
    fleet.release(serial, rejected=True)
    assert legs.done == [None]
    assert fleet._pods[(NS, pod_name(0, "decode"))].incoming == 0


def test_external_walk_after_a_refused_prefill_moves_the_decode_leg() -> None:
    """A MooncakeConnector router sends the decode leg with the prefill; when pair 0's prefill refuses, it
    aborts that decode and walks to pair 1. The model lets go of pair 0's decode leg (its double is told it
    failed) and serves the request on pair 1 — measured before: 'request N already has a decode leg' 503s."""
    fleet, clock = make_fleet(FleetSpec(["r1", "r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    first, second = Legs(), Legs()
    assert fleet.enter_decode(serial, NS, pod_name(0, "decode"), first.first_at.append, first.done.append) is None
    # pair 0's prefill answered 503 (its admission): the router walks
    assert fleet.enter_decode(serial, NS, pod_name(1, "decode"), second.first_at.append, second.done.append) is None
    assert first.done == [None] and fleet._pods[(NS, pod_name(0, "decode"))].incoming == 0
    assert fleet.enter_prefill(serial, NS, pod_name(1, "prefill"), second.prefilled.append) is None
    # once a prefill was taken, another decode leg is refused
    why = fleet.enter_decode(serial, NS, pod_name(0, "decode"), first.first_at.append, first.done.append)
    assert why is not None and "already has a decode leg" in why
    run(fleet, clock, 20.0)
    assert second.prefilled == [True] and second.done == [64] and first.first_at == []
    assert fleet.c["decode_abandoned"] == 1


def test_external_second_prefill_leg_is_refused_and_the_first_runs_on() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1", "r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs = Legs()
    enter_both(fleet, serial, 0, legs)
    why = fleet.enter_prefill(serial, NS, pod_name(1, "prefill"), lambda ok: None)
    assert why is not None and "already has a prefill leg" in why
    run(fleet, clock, 30.0)
    assert legs.done == [64]


def test_external_pod_that_vanishes_fails_its_legs() -> None:
    spec = FleetSpec(["r1", "r1"])
    fleet, clock = make_fleet(spec, external_routing=True)
    run(fleet, clock, 1.0)
    serials = [s for s, _ in fleet.outbox]
    legs = {s: Legs() for s in serials}
    for s in serials:
        enter_both(fleet, s, 0, legs[s])
    fleet.sync([FleetSpec(["r1", "r1"], missing_pods=[0]).table()], FleetSpec(["r1", "r1"], missing_pods=[0]).pods())
    assert all(legs[s].done == [None] for s in serials)
    assert all(legs[s].prefilled in ([False], [True]) for s in serials)
    assert fleet.stats().failed == len(serials)


@pytest.mark.parametrize(
    ("rejected", "counter"),
    [pytest.param(True, "rejected", id="router refused it"), pytest.param(False, "failed", id="never reached")],
)
def test_external_release_of_a_request_no_engine_saw(rejected: bool, counter: str) -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    fleet.release(serial, rejected=rejected)
    assert getattr(fleet.stats(), counter) == 1
    assert fleet.enter_prefill(serial, NS, pod_name(0, "prefill"), lambda ok: None) is not None


def test_external_release_after_prefill_without_decode_frees_the_pair() -> None:
    fleet, clock = make_fleet(FleetSpec(["r1"]), external_routing=True)
    run(fleet, clock, 1.0)
    serial = fleet.outbox[0][0]
    legs = Legs()
    assert fleet.enter_prefill(serial, NS, pod_name(0, "prefill"), legs.prefilled.append) is None
    run(fleet, clock, 10.0)
    assert fleet.stats().pools[0].in_flight == 1
    fleet.release(serial, rejected=False)
    assert fleet.stats().pools[0].in_flight == 0 and fleet.stats().failed == 1
