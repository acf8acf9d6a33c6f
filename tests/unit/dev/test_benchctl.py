"""The controller benchmark's pure parts: statistics, write accounting, metrics parsing, the report."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev import audit, benchctl, benchreport, benchstats
from tandem_lab.dev.nodes import NodeSpec, build_gpu_node

SA = "system:serviceaccount:bench-c2:tandem-operator"
T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
POOLS = "inferencepools.tandem.dev"


def ev(ms: int, verb: str, resource: str, name: str = "speed", code: int = 200, user: str = SA) -> audit.AuditEvent:
    return audit.AuditEvent(
        timestamp=T0 + timedelta(milliseconds=ms),
        verb=verb,
        user=user,
        resource=resource,
        namespace="bench-c2",
        name=name,
        code=code,
    )


# The +1 pair scenario as the audit log recorded it on the bench cluster (operator writes only).
ADD_PAIR = [
    ev(107, "create", "pods", "speed-p2-prefill-0", 201),
    ev(122, "create", "pods", "speed-p2-decode-0", 201),
    ev(138, "patch", "configmaps", "speed-routing"),
    ev(150, "create", "events", "", 201),
    ev(164, "create", "events", "", 201),
    ev(180, "update", f"{POOLS}/status"),
    ev(210, "patch", "configmaps", "speed-routing"),
    ev(218, "create", "events", "", 201),
    ev(227, "update", f"{POOLS}/status"),
]


# --- statistics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "want"),
    [
        pytest.param([8.0, 9.1, 8.5], {"n": 3.0, "median": 8.5, "min": 8.0, "max": 9.1, "spread": 1.1}, id="three"),
        pytest.param([2.0, 4.0], {"n": 2.0, "median": 3.0, "min": 2.0, "max": 4.0, "spread": 2.0}, id="two"),
        pytest.param([5.0], {"n": 1.0, "median": 5.0, "min": 5.0, "max": 5.0, "spread": 0.0}, id="one"),
    ],
)
def test_summarize_gives_median_and_min_max_spread(values: list[float], want: dict[str, float]) -> None:
    assert benchstats.summarize(values) == want


def test_summarize_refuses_no_values() -> None:
    with pytest.raises(ValueError, match="at least one"):
        benchstats.summarize([])


def test_paired_ratios_worked_example() -> None:
    assert benchstats.paired_ratios([8.5, 9.1, 8.0], [5.7, 6.0, 5.5]) == [1.4912, 1.5167, 1.4545]


def test_ratio_summary_is_the_median_of_per_repeat_ratios_with_ratio_of_medians_beside() -> None:
    got = benchstats.ratio_summary([8.5, 9.1, 8.0], [5.7, 6.0, 5.5])
    assert got["median"] == 1.4912
    assert (got["min"], got["max"]) == (1.4545, 1.5167)
    assert got["of_medians"] == 1.4912  # 8.5 / 5.7


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        pytest.param([1.0, 2.0], [1.0], "repeats", id="unequal repeats"),
        pytest.param([1.0], [0.0], "> 0", id="zero duration in arm B"),
    ],
)
def test_paired_ratios_refuses_bad_arms(a: list[float], b: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        benchstats.paired_ratios(a, b)


# --- write accounting ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "resource", "want"),
    [
        pytest.param("create", "pods", "operator", id="pod create"),
        pytest.param("patch", "configmaps", "operator", id="routing table apply"),
        pytest.param("update", f"{POOLS}/status", "operator", id="status"),
        pytest.param("patch", POOLS, "framework", id="kopf finalizer patch"),
        pytest.param("update", f"{POOLS}/finalizers", "framework", id="finalizers subresource"),
        pytest.param("create", "events", "events", id="core Event"),
        pytest.param("create", "events.events.k8s.io", "events", id="events.k8s.io Event"),
        pytest.param("patch", "mooncakecaches.tandem.dev/status", "operator", id="cache status"),
    ],
)
def test_classify_write(verb: str, resource: str, want: str) -> None:
    assert benchstats.classify_write(verb, resource) == want


def test_call_name_drops_the_group_keeps_the_subresource() -> None:
    assert benchstats.call_name("update", f"{POOLS}/status") == "update inferencepools/status"
    assert benchstats.call_name("create", "pods") == "create pods"


def test_tally_writes_splits_categories_and_counts_refused_writes() -> None:
    events = [
        ev(0, "patch", POOLS),
        ev(1, "create", "pods", "a", 201),
        ev(2, "create", "pods", "b", 201),
        ev(3, "update", f"{POOLS}/status", code=409),
        ev(4, "create", "events", "", 201),
        ev(5, "get", "pods"),  # a read is never a write
    ]
    got = benchstats.tally_writes(events)
    assert got["operator"] == {
        "total": 3,
        "failed": 1,
        "by_verb": {"create": 2, "update": 1},
        "by_call": {"create pods": 2, "update inferencepools/status": 1},
    }
    assert got["framework"]["by_call"] == {"patch inferencepools": 1}
    assert got["events"]["total"] == 1
    assert benchstats.total_writes(got) == 5


def test_split_passes_cuts_after_each_status_write() -> None:
    passes = benchstats.split_passes(list(reversed(ADD_PAIR)))  # order comes from the timestamps
    assert [len(p) for p in passes] == [6, 3]
    assert passes[0][-1].resource.endswith("/status") and passes[1][-1].resource.endswith("/status")


def test_split_passes_keeps_an_open_tail() -> None:
    passes = benchstats.split_passes([*ADD_PAIR, ev(400, "delete", "pods", "x")])
    assert [len(p) for p in passes] == [6, 3, 1]


def test_split_create_and_ready_on_the_add_pair_timeline() -> None:
    halves = benchstats.split_create_and_ready(ADD_PAIR)
    create = benchstats.tally_writes(halves["create"])
    ready = benchstats.tally_writes(halves["ready"])
    assert create["operator"]["by_call"] == {
        "create pods": 2,
        "patch configmaps": 1,
        "update inferencepools/status": 1,
    }
    assert create["events"]["total"] == 2
    assert ready["operator"]["by_call"] == {"patch configmaps": 1, "update inferencepools/status": 1}
    assert ready["events"]["total"] == 1


def scenario(name: str, events: list[audit.AuditEvent], split: bool = False) -> dict[str, Any]:
    sc = benchctl._scenario(name, events, T0, T0 + timedelta(seconds=60), 2, {}, "x")
    if split:
        sc["split"] = {k: benchstats.tally_writes(v) for k, v in benchstats.split_create_and_ready(events).items()}
    return benchctl.judge(sc)


@pytest.mark.parametrize(
    ("name", "events", "split", "want_verdict"),
    [
        pytest.param("no-op (120 s)", [], False, "PASS", id="no-op without writes passes"),
        pytest.param("no-op (120 s)", [ev(5, "create", "events", "", 201)], False, "FAIL", id="an Event fails no-op"),
        pytest.param("restart (30 s)", [ev(5, "patch", POOLS)], False, "FAIL", id="a kopf patch fails restart"),
        pytest.param("+1 pair", ADD_PAIR, True, "FAIL", id="routing write in the creating pass is over budget"),
        pytest.param(
            "+1 pair", ADD_PAIR[:2] + ADD_PAIR[3:], True, "PASS", id="2 creates + status, then routing + status"
        ),
        pytest.param("canary step", ADD_PAIR, False, "—", id="report-only scenario"),
    ],
)
def test_judge_applies_the_c2_budgets(
    name: str, events: list[audit.AuditEvent], split: bool, want_verdict: str
) -> None:
    sc = scenario(name, events, split)
    assert sc["verdict"] == want_verdict
    if want_verdict == "FAIL":
        assert sc["verdict_reason"]


def test_scenario_timeline_is_relative_to_the_trigger() -> None:
    sc = scenario("+1 pair", ADD_PAIR[:1])
    assert sc["timeline"] == ["+0.107s create pods speed-p2-prefill-0 201"]
    assert sc["window_s"] == 60.0


def test_median_tally_picks_the_middle_repeat_whole() -> None:
    tallies = [benchstats.tally_writes(ADD_PAIR[:n]) for n in (9, 3, 6)]
    assert benchstats.total_writes(benchctl.median_tally(tallies)) == 6


# --- operator metrics ------------------------------------------------------------------------------

METRICS = """# HELP tandem_api_writes_total API writes by verb and resource
# TYPE tandem_api_writes_total counter
tandem_api_writes_total{resource="Pod",verb="create"} 4.0
tandem_api_writes_total{resource="inferencepools/status",verb="update"} 2.0
tandem_reconcile_total{kind="InferencePool",result="ok"} 7.0
tandem_reconcile_total{kind="InferencePool",result="error"} 1.0
process_resident_memory_bytes 1.2e+08
garbage line
"""


def test_parse_metrics_and_sums() -> None:
    samples = benchstats.parse_metrics(METRICS)
    assert benchstats.metric_sum(samples, "tandem_reconcile_total") == 8.0
    assert benchstats.metric_sum(samples, "tandem_reconcile_total", result="ok") == 7.0
    assert benchstats.metric_sum(samples, "process_resident_memory_bytes") == 1.2e8
    assert benchstats.api_writes(samples) == {"create Pod": 4, "update inferencepools/status": 2}


def test_counter_delta_keeps_only_changes() -> None:
    assert benchstats.counter_delta({"create Pod": 4, "x": 1}, {"create Pod": 6, "x": 1, "y": 2}) == {
        "create Pod": 2,
        "y": 2,
    }


# --- C6 ----------------------------------------------------------------------------------------------


def table(canary: str | None, weight: int | None, pairs: list[tuple[str, str, int]]) -> dict[str, Any]:
    revisions: dict[str, Any] = {"stable": "s1"}
    if canary is not None:
        revisions |= {"canary": canary, "canaryWeightPercent": weight}
    return {"revisions": revisions, "pairs": [{"revision": r, "state": st, "weight": w} for r, st, w in pairs]}


@pytest.mark.parametrize(
    ("tbl", "want"),
    [
        pytest.param(table("c1", 33, [("s1", "serving", 100), ("c1", "serving", 100)]), True, id="canary serving"),
        pytest.param(table("c1", 0, [("s1", "serving", 100), ("c1", "draining", 0)]), False, id="canary draining"),
        pytest.param(table(None, None, [("s1", "serving", 100)]), False, id="no canary"),
        pytest.param(table(None, None, [("c1", "serving", 100)]), True, id="canary pair serving without weight"),
    ],
)
def test_canary_has_traffic(tbl: dict[str, Any], want: bool) -> None:
    assert benchctl.canary_has_traffic(tbl, "c1") is want


def pool_event(phase: str, step: int, gates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rollout = {"revision": "c1", "phase": phase, "stepIndex": step, "stepStartedAt": "2026-11-30T12:00:00Z"}
    return {"metadata": {"name": "speed"}, "status": {"rollout": rollout | {"gates": gates or []}}}


def test_breach_clock_splits_observe_decide_act() -> None:
    flipped: list[bool] = []
    clock = benchctl.BreachClock("c1", on_t0=lambda: flipped.append(True))
    t0 = T0.timestamp() + 0.5
    serving = {"data": {"routing.json": '{"revisions": {"stable": "s1", "canary": "c1", "canaryWeightPercent": 33}}'}}
    clock.on_routing(t0 - 1, "ADDED", serving)  # before t0: ignored
    clock.on_pool(t0, "MODIFIED", pool_event("Progressing", 1))
    failure = {"verdict": "Failure", "evaluatedAt": "2026-11-30T12:00:07Z", "value": "0.71", "baseline": "0.475"}
    clock.on_pool(t0 + 6.52, "MODIFIED", pool_event("RollingBack", 1, [failure]))
    drained = {"data": {"routing.json": '{"revisions": {"stable": "s1"}, "pairs": []}'}}
    clock.on_routing(t0 + 6.6, "MODIFIED", drained)
    got = clock.split()
    assert flipped == [True]
    assert got["observe_s"] == 6.5  # 12:00:07 − 12:00:00.5
    assert got["decide_s"] == 0.02
    assert got["act_s"] == 0.08
    assert got["total_s"] == 6.6
    assert (got["gate_value"], got["gate_baseline"]) == ("0.71", "0.475")
    assert clock.verdicts == ["2026-11-30T12:00:07Z Failure 0.71 vs 0.475"]


def test_breach_clock_is_incomplete_without_act() -> None:
    clock = benchctl.BreachClock("c1", on_t0=lambda: None)
    clock.on_pool(T0.timestamp(), "MODIFIED", pool_event("Progressing", 1))
    assert clock.split() == {}


# --- arm B of C1 ---------------------------------------------------------------------------------------


def test_direct_objects_are_the_builders_pods_unowned_plus_the_service() -> None:
    from tandem.core.observed import parse_node  # noqa: PLC0415

    selector = {benchctl.NODE_LABEL: "g1"}
    nodes = tuple(
        parse_node(build_gpu_node(NodeSpec(name=f"n{i}", extra_labels=((benchctl.NODE_LABEL, "g1"),))))
        for i in range(3)
    )
    objects = benchctl.direct_objects(benchctl.speed_pool(3, selector, namespace="b"), nodes)
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert len(pods) == 6
    assert sorted(o["kind"] for o in objects if o["kind"] != "Pod") == ["Service"]
    assert all("ownerReferences" not in o["metadata"] for o in objects)
    assert {p["metadata"]["labels"]["tandem.dev/role"] for p in pods} == {"prefill", "decode"}
    assert all(p["metadata"]["namespace"] == "b" for p in pods)


def test_speed_pool_is_pinned_and_has_autoscaling_off() -> None:
    obj = benchctl.speed_pool(2, {"k": "v"}, namespace="n", version="v2", rollout=benchctl.C2_ROLLOUT)
    spec = obj["spec"]
    assert spec["pairs"]["replicas"] == 2 and spec["autoscaling"]["enabled"] is False
    assert spec["placement"]["nodeSelector"] == {"k": "v"} and "mooncakeRef" not in spec["kvCache"]
    assert spec["rollout"]["steps"] == [{"setCanaryPairs": 1}, {"pause": {}}]
    assert spec["stack"]["version"] == "v2" and ":v2@sha256:" in spec["stack"]["image"]
    other = benchctl.speed_pool(2, {"k": "v"}, namespace="n", version="v3", rollout=benchctl.C2_ROLLOUT)
    assert benchctl.pool_revision(obj) != benchctl.pool_revision(other)


# --- report ----------------------------------------------------------------------------------------------


def summary(median: float, lo: float, hi: float) -> dict[str, float]:
    return {"n": 3.0, "median": median, "min": lo, "max": hi, "spread": round(hi - lo, 4)}


C6_REPEAT = {"observe_s": 7.4, "decide_s": 0.02, "act_s": 0.1, "total_s": 7.52}
C6_NOTES = {
    "step_started_at_lag_s": 0.6,
    "prior_pass_s": 2.3,
    "timeline": ["+2.300s delete pods speed-p1-decode-0 200"],
}
C6_LOADED = {"observe_s": 7.47, "decide_s": 0.03, "act_s": 5.13, "total_s": 12.62, "gate_value": "0.7172131147540983"}
RESULTS: dict[str, Any] = {
    "profile": "full",
    "code": {"revision": "0123456789abcdef", "dirty": True},
    "machine": {"cores": 2, "ram_gib": 23.5, "cpu_model": "AMD EPYC", "loadavg_start": [1.5, 1.2, 1.0]},
    "versions": {"kubernetes": "v1.34.4", "kwok": "v0.8.0"},
    "timing": {"started_at": "2026-11-30T12:00:00+00:00", "wall_s": 1200.0, "sections_s": {"c1": 600.0}},
    "c1": {
        "sizes": [
            {
                "pairs": 95,
                "repeats": 3,
                "a_status": summary(8.54, 8.1, 9.0),
                "a_pods": summary(8.4, 8.0, 8.9),
                "b_pods": summary(5.68, 5.5, 6.0),
                "ratio": summary(1.52, 1.45, 1.6),
                "ratio_pods": summary(1.48, 1.4, 1.55),
                "overhead_s": summary(2.86, 2.6, 3.0),
                "operator_writes": benchstats.tally_writes(ADD_PAIR),
                "passes_median": 4,
            }
        ]
    },
    "c2": {
        "user": SA,
        "settle_s": 3.0,
        "scenarios": [scenario("+1 pair", ADD_PAIR, split=True), scenario("no-op (120 s)", [])],
    },
    "c4": {
        "pools": 1000,
        "quiet_s": 10.0,
        "baseline": {"vmrss_mib": 112.0, "vmhwm_mib": 112.0},
        "loaded": {"vmrss_mib": 250.0, "vmhwm_mib": 260.0},
        "rss_ratio": 2.23,
        "rss_per_pool_kib": 141.3,
        "observed_all_s": 200.0,
        "create_s": 20.0,
        "writes": benchstats.tally_writes([ev(1, "update", f"{POOLS}/status", code=409)]),
        "samples": [[0.0, 112.0, 0.0], [1.0, 150.0, 10.0]],
    },
    "c6": {
        "config": {"interval": "5s", "initialDelay": "5s", "successStreak": 2, "failureLimit": 0},
        "repeats": [C6_REPEAT | C6_NOTES],
        "summary": {k: summary(v, v, v) for k, v in C6_REPEAT.items()},
        "with_load_delay": {"load_delay_s": 5.0, "repeat": C6_LOADED},
    },
}


def test_render_markdown_from_fixed_results() -> None:
    md = benchreport.render_markdown(RESULTS)
    assert md.startswith("# Controller benchmark")
    assert "revision `0123456789ab` (uncommitted changes in the tree)" in md
    want_row = (
        "| 95 | 3 | 8.54 (8.10–9.00) | 8.40 (8.00–8.90) | 5.68 (5.50–6.00) | **1.52 (1.45–1.60)** "
        "| 1.48 (1.40–1.55) | 2.86 (2.60–3.00) |"
    )
    assert want_row in md
    assert "≤ 1.5 (proposed): **FAIL**" in md
    assert "| +1 pair |" in md and "**FAIL** |" in md and "| no-op (120 s) |" in md
    assert "create pods 2, patch configmaps 1, update inferencepools/status 1" in md
    assert "+0.107s create pods speed-p2-prefill-0 201" in md  # the audit evidence is printed
    assert "| 0 pools, steady | 112.0 | 112.0 |" in md and "**2.23**" in md
    assert "Target ≤ 150 MiB at 1 k (start): **FAIL**" in md
    assert "**7.52**" in md
    assert "| 5 s model load ¹ | 7.47 | 0.03 | 5.13 | **12.62** | 0.717 vs — |" in md
    assert "+2.300s delete pods speed-p1-decode-0 200" in md


def test_findings_say_where_the_operator_loses() -> None:
    notes = benchreport.findings(RESULTS)
    assert any("52 % more time (8.54 s vs 5.68 s)" in n for n in notes)
    assert any(n.startswith("C2 +1 pair: creating pass(es) made 4 operator writes") for n in notes)
    assert any(n.startswith("C4: 250 MiB") for n in notes)
    assert any(n.startswith("C6 repeat 0: the first evaluation ran 3.0 s after initialDelay") for n in notes)
    assert any(n.startswith("C6 with a 5 s model load: act took 5.1 s (vs 0.10 s without)") for n in notes)
    assert any("refused with 409 Conflict (1 of 1000 new pools in C4)" in n for n in notes)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("5s", 5.0, id="seconds"),
        pytest.param("1.5m", 90.0, id="minutes"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param(None, 0.0, id="absent"),
    ],
)
def test_seconds_of_a_duration(text: str | None, want: float) -> None:
    assert benchreport._seconds(text) == want


def test_render_markdown_with_sections_missing_or_failed() -> None:
    partial = {k: v for k, v in RESULTS.items() if k not in ("c1", "c2", "c4", "c6")}
    partial["c4"] = {"error": "timed out after 1800 s"}
    md = benchreport.render_markdown(partial)
    assert "## C1" not in md and "## C2" not in md
    assert "C4 did not finish: timed out after 1800 s" in md


def test_render_markdown_without_findings_says_so() -> None:
    clean = copy.deepcopy(RESULTS)
    for key in ("c1", "c2", "c4"):
        clean.pop(key)
    clean["c6"]["repeats"] = [C6_REPEAT]
    clean["c6"].pop("with_load_delay")
    assert "- Nothing: every measured value met its target." in benchreport.render_markdown(clean)


def test_write_plots_makes_one_png_per_section(tmp_path: Path) -> None:
    written = benchreport.write_plots(RESULTS, tmp_path)
    assert sorted(p.name for p in written) == [
        "controller-c1.png",
        "controller-c2.png",
        "controller-c4.png",
        "controller-c6.png",
    ]
    assert all(p.stat().st_size > 1000 for p in written)


def test_controller_bench_refuses_to_start_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plots come last, after a long run: a missing matplotlib must stop the run before it starts."""
    import importlib.util  # noqa: PLC0415

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    started: list[str] = []
    monkeypatch.setattr(benchctl, "locate", lambda: started.append("locate"))
    assert benchctl.main(["controller", "--quick", "--out", str(tmp_path)]) == 1
    assert "matplotlib is missing" in capsys.readouterr().err
    assert started == []
