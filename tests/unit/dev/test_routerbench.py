"""The router benchmark's pure parts: trace prompts, the locality replay, statistics, verdicts, the report."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.routing import RoutingTable, routing_key, select_for_table
from tandem_lab.dev import routerbench
from tandem_lab.dev import routerbenchlib as lib


def row(length: int, *blocks: int) -> lib.TraceRow:
    return lib.TraceRow(length, tuple(blocks))


# --- trace prompts ---------------------------------------------------------------------------------


def test_trace_prompt_round_trips_the_tag_and_keeps_block_prefixes() -> None:
    a = lib.trace_prompt([0, 14, 15], 7)
    b = lib.trace_prompt([0, 14, 99], 12)
    assert lib.prompt_tag(a) == 7
    assert lib.prompt_tag(b) == 12
    # equal leading blocks give an equal leading text of BLOCK_CHARS per block, and no more
    assert a[: 2 * lib.BLOCK_CHARS] == b[: 2 * lib.BLOCK_CHARS]
    assert a[: 3 * lib.BLOCK_CHARS] != b[: 3 * lib.BLOCK_CHARS]


def test_trace_prompt_keys_like_the_block_key_depth() -> None:
    """prefixChars = k · BLOCK_CHARS keys the first k blocks: rows sharing them share a key."""
    k = 2
    same = [lib.trace_prompt([0, 5, i], i) for i in range(10, 20)]
    keys = {routing_key(p, k * lib.BLOCK_CHARS) for p in same}
    assert len(keys) == 1
    other = routing_key(lib.trace_prompt([0, 6, 10], 1), k * lib.BLOCK_CHARS)
    assert other not in keys


def test_trace_prompt_refuses_a_block_id_wider_than_its_field() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        lib.trace_prompt([10**7], 0)


@pytest.mark.parametrize(
    "size", [pytest.param(2048, id="2KB"), pytest.param(200 * 1024, id="200KB"), pytest.param(5, id="tiny")]
)
def test_filler_prompt_has_the_requested_size(size: int) -> None:
    assert len(lib.filler_prompt(3, size).encode()) == size


def test_filler_prompts_differ_at_the_start() -> None:
    assert lib.filler_prompt(1, 2048)[:12] != lib.filler_prompt(2, 2048)[:12]


def test_prompt_tag_is_none_without_a_tag() -> None:
    assert lib.prompt_tag("hello") is None


# --- locality --------------------------------------------------------------------------------------


def test_locality_worked_example_of_the_docstring() -> None:
    rows = [row(1024, 0, 1), row(1536, 0, 1, 2), row(1024, 0, 3)]
    got = lib.locality(rows, {0: "a", 1: "a", 2: "b"}, ["a", "b"], None)
    assert got["token_hit_ratio"] == pytest.approx(1024 / 3584)
    assert got["loads"] == [2, 1]
    assert got["max_over_mean_load"] == pytest.approx(2 / 1.5)
    assert got["unserved"] == 0


def test_locality_counts_a_whole_prompt_hit_as_the_prompt_not_whole_blocks() -> None:
    rows = [row(700, 0, 1), row(700, 0, 1)]
    got = lib.locality(rows, {0: "a", 1: "a"}, ["a"], None)
    assert got["token_hit_ratio"] == pytest.approx(700 / 1400)


def test_locality_leaves_unserved_rows_out_of_hits_and_loads() -> None:
    rows = [row(512, 0), row(512, 0), row(512, 0)]
    got = lib.locality(rows, {0: "a", 2: "a"}, ["a", "b"], None)
    assert got["unserved"] == 1
    assert got["requests"] == 2
    assert got["token_hit_ratio"] == pytest.approx(0.5)
    assert got["loads"] == [2, 0]


def test_locality_lru_evicts_with_a_bounded_cache() -> None:
    """Capacity 2 blocks: after [0,1] then [2,3] the first prompt is gone, so its repeat misses."""
    rows = [row(1024, 0, 1), row(1024, 2, 3), row(1024, 0, 1)]
    bounded = lib.locality(rows, dict.fromkeys(range(3), "a"), ["a"], 2)
    infinite = lib.locality(rows, dict.fromkeys(range(3), "a"), ["a"], None)
    assert bounded["token_hit_ratio"] == 0.0
    assert infinite["token_hit_ratio"] == pytest.approx(1024 / 3072)


def test_hit_bound_is_one_infinite_cache_over_all_rows() -> None:
    rows = [row(1024, 0, 1), row(1024, 0, 1)]
    assert lib.hit_bound(rows) == pytest.approx(0.5)


# --- statistics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        pytest.param([], 50, None, id="empty"),
        pytest.param([3.0], 99, 3.0, id="one value"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.0, id="nearest rank p50"),
        pytest.param([float(i) for i in range(1, 101)], 99, 99.0, id="p99 of 1..100"),
        pytest.param([5.0, 1.0, 3.0], 100, 5.0, id="unsorted max"),
    ],
)
def test_percentile_nearest_rank(values: list[float], q: float, want: float | None) -> None:
    assert lib.percentile(values, q) == want


def test_summarize_empty_has_no_numbers() -> None:
    assert lib.summarize([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}


def test_cpu_ticks_reads_utime_and_stime_after_a_command_with_spaces() -> None:
    stat = "1234 (tandem (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1000 0 0"
    assert lib.cpu_ticks(stat) == 325
    assert lib.stat_ppid(stat) == 1


METRICS = """# HELP tandem_router_walk_length Pairs tried
# TYPE tandem_router_walk_length histogram
tandem_router_walk_length_bucket{le="1.0",pool="a"} 10.0
tandem_router_walk_length_bucket{le="2.0",pool="a"} 14.0
tandem_router_walk_length_bucket{le="3.0",pool="a"} 15.0
tandem_router_walk_length_bucket{le="+Inf",pool="a"} 15.0
tandem_router_walk_length_bucket{le="1.0",pool="b"} 5.0
tandem_router_walk_length_bucket{le="2.0",pool="b"} 5.0
tandem_router_walk_length_bucket{le="3.0",pool="b"} 5.0
tandem_router_walk_length_bucket{le="+Inf",pool="b"} 5.0
tandem_router_walk_length_count{pool="a"} 15.0
"""


def test_walk_distribution_de_accumulates_buckets_over_label_sets() -> None:
    dist = lib.walk_distribution(METRICS)
    assert dist == {"1": 15, "2": 4, "3": 1, "+Inf": 0}
    assert lib.mean_walk(dist) == pytest.approx((15 + 8 + 3) / 20)


def test_mean_walk_of_nothing_is_none() -> None:
    assert lib.mean_walk({}) is None


@pytest.mark.parametrize(
    ("long", "short", "n_long", "n_short", "want"),
    [
        pytest.param(4000.0, 580.0, 343, 1, 10.0, id="slope"),
        pytest.param(1.0, 1.0, 5, 5, None, id="same length"),
    ],
)
def test_per_chunk_us(long: float, short: float, n_long: int, n_short: int, want: float | None) -> None:
    assert lib.per_chunk_us(long, short, n_long, n_short) == want


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        pytest.param({"k1": "s0", "k2": "s1"}, {"k1": "s0", "k2": "s1"}, 0, id="unchanged"),
        pytest.param({"k1": "s0", "k2": "s1"}, {"k1": "c", "k2": "s1"}, 0, id="stable to canary is not a move"),
        pytest.param({"k1": "c"}, {"k1": "s0"}, 0, id="canary back to stable is not a move"),
        pytest.param({"k1": "s0", "k2": "s1"}, {"k1": "s1", "k2": "s1"}, 1, id="stable to stable moves"),
        pytest.param({"k1": "s0"}, {}, 0, id="key not seen after"),
    ],
)
def test_moved_keys(before: dict[str, str], after: dict[str, str], want: int) -> None:
    assert lib.moved_keys(before, after, ["s0", "s1"]) == want


# --- verdicts and the report -----------------------------------------------------------------------


def b1run(
    arm: str, cpu: float | None, p50: float, rate: float = 55.0, prompt: str = "2KB", rss: float = 50.0
) -> dict[str, Any]:
    return {
        "arm": arm,
        "prompt": prompt,
        "offered_rps": rate,
        "achieved_rps": rate,
        "sent": 100,
        "ok": 100,
        "cpu_us_per_request": cpu,
        "ttft_ms": {"p50": p50, "p99": p50 * 3},
        "e2e_ms": {"p50": 5000.0},
        "rss_mib": rss,
    }


def make_doc(tandem_cpu: float, tandem_hits: float, moved: int, served: float) -> dict[str, Any]:
    return {
        "meta": {"commit": "abc", "profile": "quick"},
        "b1": {
            "reference_rps": 55.0,
            "runs": [
                b1run("direct", None, 10.0),
                b1run("tandem", tandem_cpu, 11.5, rss=90.0),
                b1run("vllm-router-round_robin", 1000.0, 10.5, rss=80.0),
            ],
            "derived": [{"arm": "tandem", "cpu_us_long": tandem_cpu, "cpu_us_short": 500.0, "cpu_us_per_chunk": 9.0}],
        },
        "b2": {
            "hit_bound": 0.37,
            "by_pairs": {
                "8": {
                    "policies": {
                        "tandem (key_blocks=2)": {
                            "token_hit_ratio": tandem_hits,
                            "max_over_mean_load": 1.2,
                            "requests": 10,
                            "walk": {"1": 9, "2": 1},
                            "mean_walk": 1.1,
                        },
                        "vllm-router cache_aware": {
                            "token_hit_ratio": 0.30,
                            "max_over_mean_load": 1.1,
                            "requests": 10,
                            "walk": None,
                        },
                        "vllm-router round_robin": {
                            "token_hit_ratio": 0.14,
                            "max_over_mean_load": 1.0,
                            "requests": 10,
                            "walk": None,
                        },
                    }
                }
            },
        },
        "b3": {
            "scenarios": [
                {
                    "scenario": "reject",
                    "router": "tandem",
                    "sent": 10,
                    "ok": int(10 * served),
                    "served_share": served,
                    "errors": {},
                },
                {
                    "scenario": "reject",
                    "router": "vllm-router-round_robin",
                    "sent": 10,
                    "ok": 5,
                    "served_share": 0.5,
                    "errors": {"429": 5},
                },
                {
                    "scenario": "canary",
                    "router": "tandem",
                    "sent": 10,
                    "ok": 10,
                    "served_share": 1.0,
                    "errors": {},
                    "stable_keys_moved": moved,
                },
            ]
        },
    }


def _met(doc: dict[str, Any]) -> dict[str, bool | None]:
    return {v["target"].split(" (")[0]: v["met"] for v in lib.verdicts(doc)}


def test_verdicts_all_met() -> None:
    met = _met(make_doc(tandem_cpu=1900.0, tandem_hits=0.35, moved=0, served=1.0))
    assert met == {
        "CPU per request ≤ 2× vllm-router's": True,
        "added p50 TTFT ≤ 2 ms at 550 req/s": None,  # the grid was scaled down: not claimed
        "local hits ≥ vllm-router's best policy": True,
        "100 % served in B3": True,
        "0 stable keys moved": True,
    }


def test_verdicts_none_met() -> None:
    met = _met(make_doc(tandem_cpu=2500.0, tandem_hits=0.2, moved=3, served=0.9))
    assert met["CPU per request ≤ 2× vllm-router's"] is False
    assert met["local hits ≥ vllm-router's best policy"] is False
    assert met["100 % served in B3"] is False
    assert met["0 stable keys moved"] is False


def test_added_ttft_verdict_is_judged_at_550() -> None:
    doc = make_doc(1000.0, 0.3, 0, 1.0)
    for run in doc["b1"]["runs"]:
        run["offered_rps"] = 550.0
    doc["b1"]["reference_rps"] = 550.0
    verdict = next(v for v in lib.verdicts(doc) if v["target"].startswith("added p50"))
    assert verdict["met"] is True
    assert verdict["measured"].startswith("+1.50 ms")


def test_markdown_has_every_section_and_the_losses() -> None:
    doc = make_doc(tandem_cpu=2500.0, tandem_hits=0.2, moved=0, served=1.0)
    doc["verdicts"] = lib.verdicts(doc)
    text = lib.markdown(doc)
    for heading in (
        "## Start targets",
        "## B1 overhead",
        "## B2 locality",
        "## B3 faults and rollout",
        "## Where Tandem loses",
    ):
        assert heading in text
    assert "**not met**" in text
    assert "B1 CPU: 2,500 µs/request vs vllm-router-round_robin 1,000 (2.50×)" in text
    assert "B2 8 pairs: tandem (key_blocks=2) hits 20.0 % < vllm-router cache_aware 30.0 %" in text
    assert "B1 memory: RSS 90 MiB vs vllm-router-round_robin 80 MiB" in text
    assert "other helpers' work" in text


def test_where_tandem_loses_is_empty_when_tandem_leads() -> None:
    doc = make_doc(tandem_cpu=900.0, tandem_hits=0.36, moved=0, served=1.0)
    doc["b1"]["runs"][1]["ttft_ms"]["p50"] = 10.0
    doc["b1"]["runs"][1]["rss_mib"] = 10.0
    doc["b2"]["by_pairs"]["8"]["policies"]["tandem (key_blocks=2)"]["max_over_mean_load"] = 1.0
    assert lib.where_tandem_loses(doc) == []


# --- the benchmark's routing tables ----------------------------------------------------------------

ADDRESSES = {
    "prefill": [f"127.0.0.1:{8100 + i}" for i in range(8)],
    "decode": [f"127.0.0.1:{8200 + i}" for i in range(8)],
}


def test_routing_table_canary_weights_follow_the_operator_rule() -> None:
    table = RoutingTable.model_validate(routerbench.routing_table(ADDRESSES, revisions={7: "v2"}, canary_percent=5))
    weights = {p.id: p.weight for p in table.pairs}
    canary = weights["bench-p7"]
    stable = weights["bench-p0"]
    assert canary / (canary + 7 * stable) == pytest.approx(0.05)
    assert table.revisions.canary == "v2"


def test_routing_table_draining_pair_gets_no_new_keys() -> None:
    table = RoutingTable.model_validate(routerbench.routing_table(ADDRESSES, states={0: "draining"}))
    chosen = {select_for_table(table, routing_key(f"key{i}", 1000), {}).pair_id for i in range(200)}
    assert "bench-p0" not in chosen
    assert len(chosen) == 7


def test_routing_table_prefill_override_replaces_one_address() -> None:
    table = RoutingTable.model_validate(routerbench.routing_table(ADDRESSES, prefill_override={2: "127.0.0.1:1"}))
    assert table.pairs[2].prefill[0].address == "127.0.0.1:1"
    assert table.pairs[3].prefill[0].address == "127.0.0.1:8103"


def test_merge_parts_keeps_the_parts_that_did_not_run_with_their_own_meta() -> None:
    previous = {"meta": {"commit": "old", "started": "t0"}, "b1": {"runs": [1]}, "b2": {"old": True}}
    new = {"meta": {"commit": "new", "started": "t1"}, "b2": {"new": True}, "b3": {"scenarios": []}}
    doc = lib.merge_parts(previous, new, ["b2", "b3"])
    assert doc["b1"] == {"runs": [1]}
    assert doc["b2"] == {"new": True}
    assert doc["meta"]["runs"]["b1"]["commit"] == "old"
    assert doc["meta"]["runs"]["b2"]["commit"] == "new"
    assert doc["meta"]["runs"]["b3"]["commit"] == "new"
    assert doc["meta"]["commit"] == "new"
