"""W5 over many seeds (issue 17 item 7): per-seed verdicts, detection/act times and exposure, and the
issue's Must show checked over all of them.

What it owns: running :func:`tandem_lab.sim.rollout.run_w5` once per seed (each seed its own workload,
errors and lifecycle streams), keeping only each arm's metrics (the per-request arrays of 20 seeds do not
fit in memory), and the ``w5_seeds`` part of ``fleet.json`` / ``fleet.md`` / ``fleet-w5-seeds.png``.

The Must show of issue 17, per (gate set, arm), over every seed:
- a good canary is never rolled back (0 false rollbacks);
- every bad canary (errors, TPOT × 1.3, TTFT × 1.5) is rolled back;
- rollback act (decision → the routing table sends the canary no keys) ≤ ``ACT_LIMIT_S``;
- the bad revision served < ``EXPOSURE_LIMIT`` of all requests.
The measures are the single-seed ones of :func:`tandem_lab.sim.rollout.w5_metrics`, unchanged. Each seed
simulates the window up to the new revision once and forks it per variant and arm, and a run ends once its
outcome is settled (``settle``: rolled back with the canary's weight at 0, or promoted; ``ended_s``), since
the exposure is counted over all the window's requests whether simulated or not: 20 seeds × 8 variants
must fit in a working session.

Must not: change a measure, or decide anything the rollout arms decide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from tandem_lab.sim.config import SimParams
from tandem_lab.sim.rollout import run_w5
from tandem_lab.sim.scenarios import ScenarioConfig

ACT_LIMIT_S: Final = 30.0
"""Issue 17: a rollback takes effect within 30 s of the decision."""
EXPOSURE_LIMIT: Final = 0.001
"""Issue 17 / benchmarks.md §6: the bad revision serves < 0.1 % of all requests."""
ROW_KEYS: Final = (
    "canary",
    "gates",
    "rolled_back",
    "promoted",
    "detection_s",
    "observe_s",
    "decide_s",
    "act_s",
    "rollback_s",
    "requests_on_canary",
    "copies_on_canary",
    "canary_share_of_all_requests",
    "statistical_floor_s",
    "evaluations",
    "gate_looks",
    "gate_failures",
    "ended_s",
)


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What one row is a sample of: (seed, canary, gate set, arm). Two rows with one key are one sample run twice
    (refused by :func:`merge`, or a replay under ``--across-code``)."""
    return (row["seed"], row["canary"], row["gates"], row["arm"])


def key_name(key: tuple[Any, ...]) -> str:
    """A :func:`row_key` as the merge's messages spell it: ``seed 3 errors/example tandem``."""
    return f"seed {key[0]} {key[1]}/{key[2]} {key[3]}"


def run_w5_seeds(
    config: ScenarioConfig,
    seeds: Sequence[int],
    params: SimParams,
    arms: Sequence[str],
    variants: Sequence[tuple[str, str]],
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (seed, variant, arm): the arm's W5 metrics (``ROW_KEYS``) and its outcome."""
    say = progress or (lambda _msg: None)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        run = run_w5(config, seed, params, arms, say, variants, settle=True)
        for arm in run.arms:
            m = arm.metrics
            row: dict[str, Any] = {"seed": seed, "arm": arm.arm, **{k: m.get(k) for k in ROW_KEYS}}
            row["outcome"] = "rolled back" if m["rolled_back"] else ("promoted" if m["promoted"] else "no decision")
            rows.append(row)
    return rows


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(float(v))]


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (canary, gate set, arm): outcome counts, detection/act/exposure spread and the Must-show checks."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["canary"], r["gates"], r["arm"]), []).append(r)
    out: list[dict[str, Any]] = []
    for (canary, gates, arm), rs in groups.items():
        bad = canary != "good"
        det = _finite([r["detection_s"] for r in rs])
        act = _finite([r["act_s"] for r in rs])
        share = _finite([r["canary_share_of_all_requests"] for r in rs])
        summary: dict[str, Any] = {
            "canary": canary,
            "gates": gates,
            "arm": arm,
            "seeds": len(rs),
            "rolled_back": sum(1 for r in rs if r["rolled_back"]),
            "promoted": sum(1 for r in rs if r["promoted"]),
            "no_decision": sum(1 for r in rs if not r["rolled_back"] and not r["promoted"]),
            "detection_median_s": statistics.median(det) if det else None,
            "detection_max_s": max(det) if det else None,
            "act_max_s": max(act) if act else None,
            "seeds_without_act": sorted(r["seed"] for r in rs if not _finite([r["act_s"]])),
            "share_median": statistics.median(share) if share else None,
            "share_max": max(share) if share else None,
        }
        if bad:
            summary["every_seed_rolled_back"] = summary["rolled_back"] == len(rs)
            summary["act_within_limit"] = bool(act) and len(act) == len(rs) and max(act) <= ACT_LIMIT_S
            summary["exposure_below_limit"] = bool(share) and max(share) < EXPOSURE_LIMIT
        else:
            summary["false_rollbacks"] = summary["rolled_back"]
            summary["false_alarms"] = false_alarms(rs)
        out.append(summary)
    return out


def false_alarms(rows: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Per gate, ``[Failures, looks that reached a verdict]`` summed over good canaries' runs: each Failure is a
    false alarm (the verdicts as the step folded them, after the warm-up's holds). ``failureLimit: 1`` rolls a
    good step back at its second failing evaluation, so with ~15 looks a per-look rate of 1 % costs ~1 % of first
    steps and 3 % ~7 % (docs/design/009); this is the measured rate. Rows from runs that did not record the counts
    are left out."""
    out: dict[str, list[int]] = {}
    for r in rows:
        looks, failures = r.get("gate_looks"), r.get("gate_failures")
        if not isinstance(looks, dict) or not isinstance(failures, dict):
            continue
        for gate, n in looks.items():
            acc = out.setdefault(gate, [0, 0])
            acc[0] += int(failures.get(gate, 0))
            acc[1] += int(n)
    return out


def document(rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """The ``w5_seeds`` part of ``fleet.json``."""
    return {
        "seeds": list(seeds),
        "act_limit_s": ACT_LIMIT_S,
        "exposure_limit": EXPOSURE_LIMIT,
        "runs": list(rows),
        "summary": summarize(rows),
    }


def merge(parts: Sequence[dict[str, Any]], *, replays: bool = False) -> dict[str, Any]:
    """One ``w5_seeds`` document from several runs' (``tandem bench fleet-merge``): their rows together and the
    summary recomputed over all of them.

    Why: 20 full-rate seeds take longer than a session on this machine, and one process uses one core; runs
    over disjoint seeds (in parallel, or in later sessions on the same code) add up to the Must show's count.
    A (seed, canary, gate set, arm) present twice is refused: the same seed run twice is not two samples. With
    ``replays`` (runs of several code revisions, ``--across-code``) a row present twice must be *identical* in
    both runs, is kept once and is listed under ``replayed``: the evidence that the revisions decide alike.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    replayed: list[list[Any]] = []
    for part in parts:
        for row in part["runs"]:
            key = row_key(row)
            name = key_name(key)
            if key in seen:
                if not replays:
                    raise ValueError(f"{name} is in more than one run")
                differ = sorted(k for k in row.keys() | seen[key].keys() if row.get(k) != seen[key].get(k))
                if differ:
                    raise ValueError(f"{name} was replayed with a different result ({', '.join(differ)})")
                replayed.append(list(key))
                continue
            seen[key] = row
            rows.append(row)
    rows.sort(key=lambda r: r["seed"])
    doc = document(rows, sorted({s for part in parts for s in part["seeds"]}))
    if replays:
        doc["replayed"] = replayed
    return doc


def gates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Must-show checks as ``fleet.json`` gates (one per check and (variant, arm))."""
    out: list[dict[str, Any]] = []
    for s in doc["summary"]:  # each variant's own seed count: a merge may hold more seeds of one gate set
        label = f"W5 × {s['seeds']} seeds {s['canary']}/{s['gates']}"
        if s["canary"] == "good":
            out.append(
                {
                    "scenario": "W5",
                    "policy": s["arm"],
                    "gate": f"{label}: 0 false rollbacks",
                    "pass": s["false_rollbacks"] == 0,
                    "value": f"{s['false_rollbacks']}/{s['seeds']} rolled back, {s['promoted']} promoted",
                }
            )
            continue
        checks = (
            ("rolled back in every seed", "every_seed_rolled_back", f"{s['rolled_back']}/{s['seeds']}"),
            (f"act ≤ {ACT_LIMIT_S:.0f} s", "act_within_limit", _act_value(s)),
            (
                f"exposure < {100 * EXPOSURE_LIMIT:.1f} % of all requests",
                "exposure_below_limit",
                f"max {_pct(s['share_max'])}, median {_pct(s['share_median'])}",
            ),
        )
        for text, key, value in checks:
            out.append(
                {"scenario": "W5", "policy": s["arm"], "gate": f"{label}: {text}", "pass": s[key], "value": value}
            )
    return out


def _act_value(summary: dict[str, Any]) -> str:
    """The act check's value: the slowest act, and the seeds that have none (no rollback: nothing took effect,
    so the check cannot pass there even when every act that exists is fast)."""
    value = f"max {_fmt(summary['act_max_s'])} s"
    missing = summary.get("seeds_without_act") or []
    if missing:
        value += f"; no act in seed{'s' if len(missing) > 1 else ''} {', '.join(str(s) for s in missing)}"
    return value


def _replayed_lines(replayed: Sequence[Sequence[Any]] | None) -> list[str]:
    if not replayed:
        return []
    rows = "; ".join(f"seed {seed} {canary}/{gates} {arm}" for seed, canary, gates, arm in replayed)
    return [
        f"Runs of several code revisions (`fleet-merge --across-code`): {len(replayed)} "
        f"row{'s' if len(replayed) != 1 else ''} ran on more than one and were identical in every field, so each "
        f"counts once ({rows}).",
        "",
    ]


def _fmt(v: Any, digits: int = 0) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:,.{digits}f}"


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.3f} %"


def markdown(doc: dict[str, Any]) -> list[str]:
    """The ``fleet.md`` section."""
    seeds = doc["seeds"]
    lines = [
        f"## W5 over {len(seeds)} seeds (seeds {seeds[0]}–{seeds[-1]})",
        "",
        "Each seed draws its own workload, engine errors and load times. Times in seconds from the canary's "
        "first request or mirror copy, whichever came first (detection = rollback decided); act = decision → "
        f"the routing table sends the canary no keys (limit {ACT_LIMIT_S:.0f} s); share = requests the new "
        "revision served / all requests (mirror copies are never served, so they do not count; limit "
        f"{100 * EXPOSURE_LIMIT:.1f} % for a bad canary). A run ends once its outcome is settled (rolled back "
        "and the canary's weight at 0 for a minute, or promoted), so a promoted canary's share counts its "
        "requests up to the promotion.",
        "",
        *_replayed_lines(doc.get("replayed")),
        "| canary/gates | arm | seeds | rolled back | promoted | no decision | detection median / max | act max "
        "| share median / max |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in doc["summary"]:
        lines.append(
            f"| {s['canary']}/{s['gates']} | {s['arm']} | {s['seeds']} | {s['rolled_back']} | {s['promoted']} | "
            f"{s['no_decision']} | {_fmt(s['detection_median_s'])} / {_fmt(s['detection_max_s'])} | "
            f"{_fmt(s['act_max_s'])} | {_pct(s['share_median'])} / {_pct(s['share_max'])} |"
        )
    alarms = [s for s in doc["summary"] if s.get("false_alarms")]
    if alarms:
        lines += [
            "",
            "False alarms of the good canaries per gate (Failures that counted, after the warm-up's holds / looks "
            "that reached a verdict, over every seed): a step is rolled back once its evaluations with a Failure "
            "exceed `analysis.failureLimit`, or one gate's Failures exceed that gate's own `failureLimit`.",
            "",
        ]
        for s in alarms:
            parts = [
                f"{gate} {f}/{n} ({_pct(f / n) if n else '–'})" for gate, (f, n) in sorted(s["false_alarms"].items())
            ]
            lines.append(f"- good/{s['gates']} {s['arm']}: " + "; ".join(parts))
    lines += ["", "Per seed (outcome, detection s, act s, share):", ""]
    by: dict[tuple[str, str, str], list[str]] = {}
    for r in doc["runs"]:
        by.setdefault((r["canary"], r["gates"], r["arm"]), []).append(
            f"{r['seed']}: {r['outcome']}, {_fmt(r['detection_s'])}, {_fmt(r['act_s'])}, "
            f"{_pct(r['canary_share_of_all_requests'])}"
        )
    for (canary, gate_set, arm), items in by.items():
        lines.append(f"- {canary}/{gate_set} {arm}: " + "; ".join(items))
    lines.append("")
    return lines


def plot(doc: dict[str, Any], out: Path, plt: Any) -> Path:
    """``fleet-w5-seeds.png``: each seed's bad-revision share per variant (x = rolled back, o = not)."""
    summary = doc["summary"]
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.5 * len(summary)))
    labels = []
    for i, s in enumerate(summary):
        rs = [r for r in doc["runs"] if (r["canary"], r["gates"], r["arm"]) == (s["canary"], s["gates"], s["arm"])]
        for r in rs:
            share = 100 * float(r["canary_share_of_all_requests"] or 0.0)
            ax.scatter([share], [i], marker="x" if r["rolled_back"] else "o", color="black", s=20)
        labels.append(f"{s['canary']}/{s['gates']} {s['arm']}")
    ax.axvline(100 * EXPOSURE_LIMIT, color="grey", ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("% of all requests served by the new revision (x rolled back, o not); dashed: 0.1 %")
    ax.set_title(f"W5 over {len(doc['seeds'])} seeds")
    fig.tight_layout()
    path = out / "fleet-w5-seeds.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
