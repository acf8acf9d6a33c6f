"""Reports of a scenario run: ``results.json``, ``summary.md`` with gate verdicts, PNG plots.

What it owns: turning a :class:`~tandem_lab.sim.runner.ScenarioRun` into files (benchmarks.md §8).

- ``results.json``: code revision, seed, config hash, scenario config, workload totals, bounds, per
  policy metrics and ratios, gate verdicts. Deterministic: the same code, configuration and seed give
  the same bytes; everything measured with a wall clock (and the machine) sits under ``timing``.
- ``summary.md``: the tables and verdicts, absolute values for information, ratios for gates.
- PNG plots: instances by role over time against the oracle's N*(t), SLO attainment per window, hit
  rates, TTFT/TPOT CDFs.

Gates are the *start* values of benchmarks.md §6; :func:`gates` states each one with its numbers.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np

from tandem_lab.sim.engine import STATUS_OK
from tandem_lab.sim.metrics import DECODE, PREFILL
from tandem_lab.sim.physics import ttft_budgets
from tandem_lab.sim.policies import POLICY_WORDS
from tandem_lab.sim.runner import ScenarioRun, code_revision

RESULTS_VERSION = 1


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, numpy scalars → Python, tuples → lists."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    return value


clean = _clean
"""Public name of :func:`_clean` (used by :mod:`tandem_lab.sim.bench`)."""


def gates(run: ScenarioRun) -> list[dict[str, Any]]:
    """Gate verdicts of benchmarks.md §6 for the policies in ``run`` (start values)."""
    out: list[dict[str, Any]] = []
    sc = run.config.scenario
    by = {r.policy: r.metrics for r in run.runs}
    b = run.bounds
    for r in run.runs:
        m = r.metrics
        if sc == "W2":
            att = min(m["ttft_attainment_feasible"], m["tpot_attainment_feasible"])
            out.append(_gate(r.policy, "attainment ≥ 99 % (TTFT and TPOT, feasible)", att >= 0.99, f"{att:.2%}"))
            ratio = m["gpuh_over_o1"]
            out.append(_gate(r.policy, "GPUh ≤ 1.20 × O1 (oracle of its served work)", ratio <= 1.20, f"{ratio:.3f}"))
            if "B0" in by and r.policy != "B0":
                saved = 1.0 - m["gpuh"]["total"] / by["B0"]["gpuh"]["total"]
                need = 0.6 * (1.0 - b.mean_over_peak)
                out.append(
                    _gate(
                        r.policy,
                        "headroom recovered ≥ 0.6 × (1 − mean/peak) vs B0",
                        saved >= need,
                        f"saved {saved:.1%}, need {need:.1%}",
                    )
                )
        elif sc in ("W3", "W6") and "event_both_attainment" in m:
            v = m["event_both_attainment"]
            out.append(_gate(r.policy, "attainment ≥ 95 % over the event window", v >= 0.95, f"{v:.2%}"))
            if sc == "W6":
                rec = m.get("event_recovery_s")
                limit = b.load_s + 300.0
                ok = rec is not None and rec <= limit
                out.append(
                    _gate(
                        r.policy, "≥ 99 % again within load time + 5 min", ok, f"recovery {rec} s, limit {limit:.0f} s"
                    )
                )
        elif sc == "W4" and "event_both_attainment" in m:
            v = m["event_both_attainment"]
            out.append(_gate(r.policy, "never below 90 % during the storm", v >= 0.90, f"{v:.2%}"))
            rec = m.get("event_recovery_s")
            out.append(
                _gate(r.policy, "back to 99 % within 5 min", rec is not None and rec <= 300.0, f"recovery {rec} s")
            )
    if sc == "W2" and "tandem" in by:
        ours = by["tandem"]
        for base in ("B1", "B2", "B3"):
            if base in by:
                other = by[base]
                cheaper = ours["gpuh"]["total"] < other["gpuh"]["total"]
                as_good = min(ours["ttft_attainment_feasible"], ours["tpot_attainment_feasible"]) >= min(
                    other["ttft_attainment_feasible"], other["tpot_attainment_feasible"]
                )
                out.append(
                    _gate(
                        "tandem",
                        f"beats {base} on GPUh at equal or better attainment",
                        cheaper and as_good,
                        f"{ours['gpuh']['total']:.1f} vs {other['gpuh']['total']:.1f} GPUh",
                    )
                )
    if sc == "W1":
        hit = b.bound_hit_ratio
        out.append(
            _gate(
                "-",
                "one infinite cache: 37.4 % token-weighted (conversation trace, k copies)",
                abs(hit - 0.374) < 0.005,
                f"{hit:.2%}",
            )
        )
    return out


def _gate(policy: str, name: str, ok: bool, value: str) -> dict[str, Any]:
    return {"policy": policy, "gate": name, "pass": bool(ok), "value": value}


def results(run: ScenarioRun) -> dict[str, Any]:
    """The ``results.json`` document (deterministic except ``timing``)."""
    wl = run.workload
    policies: dict[str, Any] = {}
    for r in run.runs:
        policies[r.policy] = {
            "metrics": r.metrics,
            "decisions": len(r.result.decisions),
            **r.extra,
        }
    doc: dict[str, Any] = _clean(
        {
            "version": RESULTS_VERSION,
            "code_revision": code_revision(),
            "seed": run.seed,
            "config_hash": run.config_hash,
            "scenario": run.config.as_dict(),
            "workload": {**run.workload_info, **wl.totals(), "duration_s": wl.duration_s},
            "bounds": run.bounds.as_dict(),
            "context": {
                "initial": list(run.context.initial),
                "max_instances": run.context.max_instances,
                "profile_ratio": run.context.profile_ratio,
                "oracle_peak": list(run.context.oracle_peak),
                "tandem_ttft_p95_target_ms": run.ttft_target_ms,
            },
            "profile": run.profile.as_dict() if run.profile is not None else None,
            "events": run.events,
            "policies": policies,
            "gates": gates(run),
            "timing": {
                **{k: round(v, 3) for k, v in run.timing.items()},
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "numpy": np.__version__,
                },
            },
        }
    )
    return doc


def _miss_split(m: dict[str, Any]) -> str:
    """Feasible TTFT misses by cause (``tandem_lab.sim.oracle.ttft_miss_causes``)."""
    causes = m.get("ttft_miss_causes_feasible")
    if not causes:
        return "–"
    return " / ".join(_fmt(causes[k], pct=True) for k in ("cache", "wait", "unserved"))


def _fmt(v: Any, pct: bool = False, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if pct:
        return f"{100 * v:.2f} %"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def summary_markdown(doc: dict[str, Any]) -> str:
    """``summary.md`` from a ``results.json`` document."""
    sc = doc["scenario"]
    b = doc["bounds"]
    w = doc["workload"]
    bound_head = [
        "oracle O1 (all feasible) GPUh",
        "model O1 GPUh",
        "static peak GPUh",
        "work floor GPUh",
        "peak P+D",
        "mean/peak",
        "1:1 tax",
        "best unit, tax",
        "infinite-cache hits",
        "SLO-feasible share",
    ]
    bound_row = [
        _fmt(b["oracle_full"]["o1_gpuh"], digits=1),
        _fmt(b["model_o1_gpuh"], digits=1),
        _fmt(b["static_peak_gpuh"], digits=1),
        _fmt(b["work_floor_gpuh"], digits=1),
        f"{b['peak_prefill']}+{b['peak_decode']}",
        _fmt(b["mean_over_peak"]),
        _fmt(b["ratio_tax_1to1"], pct=True),
        f"{b['best_unit'][0]}:{b['best_unit'][1]}, {_fmt(b['ratio_tax_best_unit'], pct=True)}",
        _fmt(b["infinite_cache_hit_ratio"], pct=True),
        _fmt(b["slo_feasible_share"], pct=True),
    ]
    policy_head = [
        "policy",
        "GPUh",
        "/O1 (own)",
        "/model O1",
        "prefill / decode / loading / idle",
        "TTFT",
        "TPOT",
        "both (feasible)",
        "worst 5 min",
        "local / shared hits",
        "429s",
        "scale actions/h",
        "TTFT misses: cache / wait / unserved",
    ]
    lines = [
        f"# tandem sim — {sc['scenario']} (seed {doc['seed']}, scale {sc['scale']}, compress {sc['compress']})",
        "",
        f"Code {doc['code_revision']}, config {doc['config_hash']}. Workload: {w['requests']:,} requests, "
        f"{w['input_tokens']:,} input and {w['output_tokens']:,} output tokens over "
        f"{w['duration_s'] / 3600:.1f} h simulated.",
        "",
        "Policies (same scraped metrics, load times, router and bounds for all):",
        "",
        *(f"- {POLICY_WORDS[p]}" for p in doc["policies"] if p in POLICY_WORDS),
        "",
        "## Bounds",
        "",
        _row(bound_head),
        _row(["---"] * len(bound_head)),
        _row(bound_row),
        "",
        "SLO-feasible share: requests whose TTFT budget is met on an *idle* instance under the best hit model; "
        "attainment above it is impossible for any policy. TTFT misses of feasible requests by cause: *cache* "
        "(the request's own prefill with the hits it got is over budget), *wait* (queued or shared an "
        "instance), *unserved* (rejected, failed, timed out); only the last two move with the fleet's size.",
        "",
        "## Policies",
        "",
        _row(policy_head),
        _row(["---"] * len(policy_head)),
    ]
    logs: list[tuple[str, dict[str, Any]]] = []
    for name, p in doc["policies"].items():
        if "decision_log_summary" in p:
            logs.append((name, p["decision_log_summary"]))
        m = p["metrics"]
        g = m["gpuh"]
        split = " / ".join(_fmt(g[k], digits=0) for k in ("prefill", "decode", "loading", "idle"))
        both = f"{_fmt(m['both_attainment'], pct=True)} ({_fmt(m['both_attainment_feasible'], pct=True)})"
        hits = f"{_fmt(m['hit_local'], pct=True)} / {_fmt(m['hit_shared'], pct=True)}"
        cells = [
            name,
            _fmt(g["total"], digits=1),
            _fmt(m["gpuh_over_o1"]),
            _fmt(m["gpuh_over_model_o1"]),
            split,
            _fmt(m["ttft_attainment"], pct=True),
            _fmt(m["tpot_attainment"], pct=True),
            both,
            _fmt(m["worst_window_both"], pct=True),
            hits,
            str(m["rejected_429"]),
            _fmt(m["scale_actions_per_hour"], digits=1),
            _miss_split(m),
        ]
        lines.append(_row(cells))
    lines += [
        "",
        "## Gates (start values, benchmarks.md §6)",
        "",
        "| policy | gate | value | verdict |",
        "|---|---|---|---|",
    ]
    for gt in doc["gates"]:
        lines.append(f"| {gt['policy']} | {gt['gate']} | {gt['value']} | {'PASS' if gt['pass'] else 'FAIL'} |")
    for name, summary in logs:
        lines += [
            "",
            f"## {name} decision log",
            "",
            f"{summary['evaluations']} evaluations; {summary['scale_ups']} scale-ups, {summary['scale_ups_ahead']} of "
            f"them ahead of the load (more pairs than the model needed then), {summary['ahead_confirmed']} of those "
            f"reached by the need within the load time; {summary['at_max_while_model_needs_less']} evaluations at "
            f"maxPairs ({summary['max_pairs']}) while the model needed fewer (longest stay "
            f"{summary['longest_such_stay_s']:.0f} s); {summary['scale_downs']} scale-downs, "
            f"{summary['scale_downs_undone']} of them undone within the load time (more pairs asked again). "
            "The full log is `decision_log` in results.json.",
        ]
    lines += ["", "## Timing (wall clock, informational)", ""]
    for k, v in doc["timing"].items():
        if k != "machine":
            lines.append(f"- {k}: {v}")
    lines.append("")
    return "\n".join(lines)


def write(run: ScenarioRun, out: Path, plots: bool = True) -> dict[str, Any]:
    """Write ``results.json``, ``summary.md`` and (optionally) the PNG plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    doc = results(run)
    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(doc), encoding="utf-8")
    if plots:
        write_plots(run, out)
    return doc


def write_plots(run: ScenarioRun, out: Path) -> list[Path]:
    """Instances vs oracle, attainment per window, hit rates, TTFT/TPOT CDFs."""
    import matplotlib  # noqa: PLC0415 - optional dependency, imported only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    paths: list[Path] = []
    d = run.bounds.demand
    hours = d.t / 3600.0
    slo = run.params.slo
    wl = run.workload
    budget = ttft_budgets(wl.input_tokens, slo.ttft_short_s, slo.ttft_long_s, slo.l_short_tokens, slo.l_long_tokens)

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for ax, role, label in ((axes[0], PREFILL, "prefill"), (axes[1], DECODE, "decode")):
        ax.plot(hours, d.n_prefill if role == PREFILL else d.n_decode, color="black", lw=1, label="O0 N*(t)")
        for r in run.runs:
            res = r.result
            if len(res.samples_t):
                ax.step(
                    res.samples_t / 3600.0, res.samples[:, role, 1:4].sum(axis=1), where="post", lw=1, label=r.policy
                )
        ax.set_ylabel(f"{label} instances")
        ax.legend(fontsize=7, ncol=4)
    axes[1].set_xlabel("simulated hours")
    fig.suptitle(f"{run.config.scenario}: instances (loading + ready + draining) vs the oracle")
    paths.append(_save(fig, out / "instances.png", plt))

    fig, ax = plt.subplots(figsize=(11, 4))
    w = slo.window_s
    for r in run.runs:
        res = r.result
        ok = (res.status == STATUS_OK) & (res.ttft <= budget) & ((wl.output_tokens <= 1) | (res.tpot <= slo.tpot_s))
        n = max(1, math.ceil(run.bounds.horizon_s / w))
        idx = np.clip((wl.arrival_s // w).astype(np.int64), 0, n - 1)
        tot = np.bincount(idx, minlength=n)
        good = np.bincount(idx, weights=ok.astype(np.float64), minlength=n)
        att = np.divide(good, tot, out=np.full(n, np.nan), where=tot > 0)
        ax.plot(np.arange(n) * w / 3600.0, att, lw=1, label=r.policy)
    ax.axhline(0.99, color="grey", ls="--", lw=0.8)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("simulated hours")
    ax.set_ylabel(f"TTFT and TPOT attainment per {w:.0f} s")
    ax.legend(fontsize=7, ncol=4)
    paths.append(_save(fig, out / "attainment.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r.policy for r in run.runs]
    local = [r.metrics["hit_local"] for r in run.runs]
    shared = [r.metrics["hit_shared"] for r in run.runs]
    ax.bar(names, local, label="local")
    ax.bar(names, shared, bottom=local, label="shared tier")
    ax.axhline(run.bounds.bound_hit_ratio, color="black", ls="--", lw=0.8, label="infinite cache")
    ax.set_ylabel("token-weighted hit ratio")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "hit_rates.png", plt))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in run.runs:
        ok = r.result.status == STATUS_OK
        for ax, values in ((axes[0], r.result.ttft[ok]), (axes[1], r.result.tpot[ok])):
            v = np.sort(values[np.isfinite(values)])
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1, label=r.policy)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("TTFT (s)")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("TPOT (s)")
    axes[1].axvline(slo.tpot_s, color="grey", ls="--", lw=0.8)
    for ax in axes:
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)
    paths.append(_save(fig, out / "latency_cdf.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
