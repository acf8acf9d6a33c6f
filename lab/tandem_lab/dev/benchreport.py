"""The controller benchmark's report: ``controller.md`` (with "where the operator loses") and the plots.

What it owns: rendering ``controller.json`` documents (pure Markdown; matplotlib for the PNGs). It reads
nothing but the document, so ``tandem bench controller --render`` can redo it from a saved run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem_lab.dev.benchstats import (
    CATEGORIES,
    CATEGORY_EVENTS,
    CATEGORY_FRAMEWORK,
    CATEGORY_OPERATOR,
    SECTIONS,
    TARGET_C1_RATIO_AT_95,
    TARGET_C4_RSS_MIB_AT_1K,
    TARGET_C6_TOTAL_S,
    total_writes,
)

# --- pure: report --------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _span(summary: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not summary:
        return "—"
    return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}–{summary['max']:.{digits}f})"


def _verbs(slot: Mapping[str, Any]) -> str:
    if not slot or not slot.get("total"):
        return "0"
    parts = ", ".join(f"{k} {v}" for k, v in slot["by_call"].items())
    return f"{slot['total']} ({parts})"


def _num(value: Any) -> str:
    """A gate value as 3 significant digits (``"0.7071428571428572"`` → ``0.707``)."""
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return "—" if value is None else str(value)


def _refused(count: int) -> str:
    one = count == 1
    return f"{count} of these writes {'was' if one else 'were'} refused (409 Conflict) and retried."


def _c1_repeats(row: Mapping[str, Any]) -> str:
    arms = row.get("arms") or {}
    a_runs, b_runs = arms.get("A") or [], arms.get("B") or []
    parts = []
    for a, b in zip(a_runs, b_runs, strict=False):
        ratio = a["status_s"] / b["pods_s"] if b.get("pods_s") else float("nan")
        parts.append(
            f"{a.get('order', '?')} {a['status_s']:.2f}/{b['pods_s']:.2f} = {ratio:.2f} "
            f"(load {a.get('load1_after', '?')}, {b.get('load1_after', '?')})"
        )
    return "; ".join(parts)


def _own_counter(sc: Mapping[str, Any]) -> str:
    own = sc.get("operator_metric_writes")
    if own is None:
        return "—"
    mine = sum(int(v) for v in own.values())
    writes = sc.get("writes") or {}
    audited = int(writes.get(CATEGORY_OPERATOR, {}).get("total", 0)) + int(
        writes.get(CATEGORY_EVENTS, {}).get("total", 0)
    )
    return f"{mine} {'=' if mine == audited else '≠'} {audited}"


def c1_verdict(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """PASS/FAIL of the proposed target A/B ≤ 1.5 at 95 pairs, or None when N = 95 was not measured."""
    for row in rows:
        if row.get("pairs") == 95 and row.get("ratio"):
            return "PASS" if row["ratio"]["median"] <= TARGET_C1_RATIO_AT_95 else "FAIL"
    return None


def findings(results: Mapping[str, Any]) -> list[str]:
    """Plain sentences on where the operator loses or misses a target (the report's honest note)."""
    out: list[str] = []
    c1 = results.get("c1") or {}
    for row in c1.get("sizes") or []:
        r = row.get("ratio")
        if not r:
            continue
        slower = (r["median"] - 1.0) * 100.0
        if slower > 0:
            out.append(
                f"C1, N = {row['pairs']}: the operator is slower than creating the same pods directly: "
                f"A/B median {r['median']:.2f} (min–max {r['min']:.2f}–{r['max']:.2f}), i.e. "
                f"{slower:.0f} % more time ({row['a_status']['median']:.2f} s vs {row['b_pods']['median']:.2f} s)."
            )
        else:
            out.append(f"C1, N = {row['pairs']}: the operator matched direct creation (A/B {r['median']:.2f}).")
    verdict = c1_verdict(c1.get("sizes") or [])
    if verdict == "FAIL":
        out.append(f"C1 misses the proposed target A/B ≤ {TARGET_C1_RATIO_AT_95} at 95 pairs.")
    c2 = results.get("c2") or {}
    for sc in c2.get("scenarios") or []:
        if sc.get("verdict") == "FAIL":
            out.append(f"C2 {sc['name']}: {sc.get('verdict_reason', '')}")
    c4 = results.get("c4") or {}
    loaded = c4.get("loaded") or {}
    rss = loaded.get("vmrss_mib")
    if rss is not None and c4.get("pools") == 1000 and rss > TARGET_C4_RSS_MIB_AT_1K:
        out.append(f"C4: {rss:.0f} MiB RSS at 1,000 pools is above the {TARGET_C4_RSS_MIB_AT_1K:.0f} MiB start target.")
    c6 = results.get("c6") or {}
    total = (c6.get("summary") or {}).get("total_s")
    if total and total["max"] > TARGET_C6_TOTAL_S:
        out.append(f"C6: breach → rollback took up to {total['max']:.1f} s (target ≤ {TARGET_C6_TOTAL_S:.0f} s).")
    out += _c6_notes(c6)
    out += _conflict_notes(results)
    for name in SECTIONS:
        err = (results.get(name) or {}).get("error")
        if err:
            out.append(f"{name.upper()} did not finish: {err}")
    return out


def _c6_notes(c6: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    delay_s = _seconds((c6.get("config") or {}).get("initialDelay"))
    for i, rep in enumerate(c6.get("repeats") or []):
        lag = rep.get("step_started_at_lag_s") or 0.0
        late = (rep.get("observe_s") or 0.0) + lag - delay_s
        prior = rep.get("prior_pass_s")
        if delay_s and late > 1.0 and prior is not None:
            out.append(
                f"C6 repeat {i}: the first evaluation ran {late:.1f} s after initialDelay had elapsed. The last "
                f"pass before it wrote at +{prior:.1f} s (the drained stable pair's deletion), and a pass in an "
                "analysis step requeues a full interval after itself rather than at the evaluation's due time, "
                "so any pass in between postpones the evaluation."
            )
            break
    loaded = c6.get("with_load_delay") or {}
    rep = loaded.get("repeat") or {}
    if rep.get("act_s") is not None:
        out.append(
            f"C6 with a {loaded.get('load_delay_s', 0):g} s model load: act took {rep['act_s']:.1f} s (vs "
            f"{_fmt(((c6.get('summary') or {}).get('act_s') or {}).get('median'))} s without). The rollback first "
            "recreates the stable pair the canary step had drained and keeps routing to the failing canary until "
            "that pair is Ready (capacity-safe, maxUnavailable 0), so on real GPUs act includes a model load."
        )
    return out


def _seconds(value: Any) -> float:
    text = str(value or "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    if not m:
        return 0.0
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


def _conflict_notes(results: Mapping[str, Any]) -> list[str]:
    c2_create = next(
        (sc for sc in (results.get("c2") or {}).get("scenarios") or [] if sc["name"].startswith("create")), None
    )
    c4 = results.get("c4") or {}
    c4_refused = int((c4.get("writes") or {}).get(CATEGORY_OPERATOR, {}).get("failed", 0))
    c2_refused = int(((c2_create or {}).get("writes") or {}).get(CATEGORY_OPERATOR, {}).get("failed", 0))
    if not (c4_refused or c2_refused):
        return []
    where = []
    if c2_refused:
        where.append("C2 create")
    if c4_refused:
        where.append(f"{c4_refused} of {c4.get('pools', '?')} new pools in C4")
    return [
        "A new pool's first status write is refused with 409 Conflict ("
        + ", ".join(where)
        + "): kopf adds its finalizer (a patch of the pool) while the first pass runs, and the pass's "
        "resourceVersion-guarded status update then loses. The pass rereads the pool and, as only bookkeeping "
        "metadata changed, repeats the write on the fresh resourceVersion (one GET and one PUT more per new pool, "
        "no extra pass)."
    ]


def render_markdown(results: Mapping[str, Any]) -> str:
    """``controller.md`` from the results dict (pure; every section optional)."""
    meta = results.get("machine") or {}
    versions = results.get("versions") or {}
    code = results.get("code") or {}
    timing = results.get("timing") or {}
    lines = [
        "# Controller benchmark (benchmarks.md §7)",
        "",
        f"Profile `{results.get('profile', '?')}` · revision `{str(code.get('revision', '?'))[:12]}`"
        + (" (uncommitted changes in the tree)" if code.get("dirty") else "")
        + f" · {meta.get('cores', '?')} cores, {_fmt(meta.get('ram_gib'), 1)} GiB RAM"
        + f" · Kubernetes {versions.get('kubernetes', '?')}, KWOK {versions.get('kwok', '?')}"
        + f" · started {timing.get('started_at', '?')}, wall {_fmt((timing.get('wall_s') or 0) / 60.0, 1)} min",
        "",
        "Absolute times are noisy on a shared 2-core machine (load average "
        f"{_fmt((meta.get('loadavg_start') or [None])[0])} at the start, "
        f"{meta.get('other_apiservers', 0)} other local control plane(s) running); gates use ratios measured "
        "side by side in one run, absolute values are for information.",
        "",
    ]
    c1 = results.get("c1") or {}
    if c1:
        lines += [
            "## C1 — apply → all pairs Ready: operator (A) vs the same pods created directly (B)",
            "",
            "A: `kubectl apply` of an InferencePool with N pairs (1P:1D, 4 GPUs each, one 8-GPU node per pair) while "
            "the operator runs; done when its status reports N Ready pairs. B: `kubectl create` of the identical pods "
            "(the builders' output, same node pinning) and the headless Service; done when every pod is Ready. "
            "Fresh namespace and fresh KWOK nodes per arm, arms alternating, KWOK Ready delay 0 in both. "
            "Medians with (min–max); the ratio is the median of per-repeat A/B.",
            "",
            "| N pairs | repeats | A: status Ready (s) | A: pods Ready (s) | B: pods Ready (s) "
            "| **A/B** | A(pods)/B | A − B (s) | target |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in c1.get("sizes") or []:
            target = ""
            if row.get("pairs") == 95 and row.get("ratio"):
                ok = row["ratio"]["median"] <= TARGET_C1_RATIO_AT_95
                target = f"≤ {TARGET_C1_RATIO_AT_95} (proposed): **{'PASS' if ok else 'FAIL'}**"
            lines.append(
                f"| {row['pairs']} | {row.get('repeats', '?')} | {_span(row.get('a_status'))} | "
                f"{_span(row.get('a_pods'))} | {_span(row.get('b_pods'))} | **{_span(row.get('ratio'))}** | "
                f"{_span(row.get('ratio_pods'))} | {_span(row.get('overhead_s'))} | {target} |"
            )
        lines.append("")
        for row in c1.get("sizes") or []:
            w = row.get("operator_writes")
            if w:
                lines.append(
                    f"- N = {row['pairs']}, operator writes per arm A (audit, median repeat): "
                    f"operator {_verbs(w.get(CATEGORY_OPERATOR, {}))}; framework "
                    f"{_verbs(w.get(CATEGORY_FRAMEWORK, {}))}; events {_verbs(w.get(CATEGORY_EVENTS, {}))}; "
                    f"reconcile passes {row.get('passes_median', '—')}; operator CPU per arm "
                    f"{_span(row.get('operator_cpu_s'))} s."
                )
            per_repeat = _c1_repeats(row)
            if per_repeat:
                lines.append(
                    f"- N = {row['pairs']}, per repeat (order; A status-Ready s / B s = ratio; 1-min load average "
                    f"after A, after B): {per_repeat}."
                )
        if c1.get("error"):
            lines.append(f"- **did not finish**: {c1['error']}")
        lines.append("")
    c2 = results.get("c2") or {}
    if c2:
        lines += [
            "## C2 — API writes (kube-apiserver audit log)",
            "",
            f"The operator runs as `{c2.get('user', '?')}` (least-privilege ServiceAccount). A 2-pair pool "
            "(1P:1D) with steps `[setCanaryPairs: 1, pause: {}]`, autoscaling off; +1 pair is `kubectl scale` "
            "2 → 3, the canary step a new stack version (P:D unchanged), the rollback `tandem rollout abort`. "
            "Each window runs from the triggering write until the operator has been quiet for "
            f"{_fmt(c2.get('settle_s'), 0)} s. Framework = writes to the pool object itself (kopf finalizer/"
            "annotations); Events are counted apart. Passes = `tandem_reconcile_total` delta.",
            "",
            "| scenario | window (s) | passes | operator writes | framework | Events | own counter | expected "
            "| verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for sc in c2.get("scenarios") or []:
            w = sc.get("writes") or {}
            lines.append(
                f"| {sc['name']} | {_fmt(sc.get('window_s'), 1)} | {_fmt(sc.get('passes'))} | "
                f"{_verbs(w.get(CATEGORY_OPERATOR, {}))} | {_verbs(w.get(CATEGORY_FRAMEWORK, {}))} | "
                f"{_verbs(w.get(CATEGORY_EVENTS, {}))} | {_own_counter(sc)} | {sc.get('expected', '—')} | "
                f"**{sc.get('verdict', '—')}** |"
            )
        lines += [
            "",
            "Own counter = the operator's `tandem_api_writes_total` delta (its adapter's count, which excludes "
            "kopf), next to the audit log's operator + Events writes.",
            "",
        ]
        for sc in c2.get("scenarios") or []:
            split = sc.get("split")
            if split:
                lines.append(
                    f"- {sc['name']}, per pass: the pass(es) creating pods made operator "
                    f"{_verbs(split['create'].get(CATEGORY_OPERATOR, {}))} and "
                    f"{split['create'].get(CATEGORY_EVENTS, {}).get('total', 0)} Event(s); the pass(es) seeing them "
                    f"Ready made operator {_verbs(split['ready'].get(CATEGORY_OPERATOR, {}))} and "
                    f"{split['ready'].get(CATEGORY_EVENTS, {}).get('total', 0)} Event(s)."
                )
            failed = sum(int((sc.get("writes") or {}).get(c, {}).get("failed", 0)) for c in CATEGORIES)
            if failed:
                lines.append(f"- {sc['name']}: {_refused(failed)}")
            if sc.get("note"):
                lines.append(f"- {sc['name']}: {sc['note']}.")
        evidence = [sc for sc in c2.get("scenarios") or [] if sc.get("split") or sc.get("verdict") == "FAIL"]
        for sc in evidence:
            lines += ["", f"Audit evidence, {sc['name']} (time after the trigger, call, object, HTTP code):", "", "```"]
            lines += list(sc.get("timeline") or [])[:40]
            lines.append("```")
        lines.append("")
        if c2.get("error"):
            lines.append(f"- **did not finish**: {c2['error']}")
        lines.append("")
    c4 = results.get("c4") or {}
    if c4:
        base = c4.get("baseline") or {}
        loaded = c4.get("loaded") or {}
        lines += [
            "## C4 — operator memory",
            "",
            f"One operator process (`/proc/<pid>/status`), first idle with 0 pools, then with {c4.get('pools', '?')} "
            "InferencePools (`pairs.replicas: 0`: no pods) created while it runs; steady = no operator write for "
            f"{_fmt(c4.get('quiet_s'), 0)} s.",
            "",
            "| state | VmRSS (MiB) | VmHWM (MiB) |",
            "|---|---|---|",
            f"| 0 pools, steady | {_fmt(base.get('vmrss_mib'), 1)} | {_fmt(base.get('vmhwm_mib'), 1)} |",
            f"| {c4.get('pools', '?')} pools, steady | {_fmt(loaded.get('vmrss_mib'), 1)} | "
            f"{_fmt(loaded.get('vmhwm_mib'), 1)} |",
        ]
        restart = c4.get("restart") or {}
        if restart:
            lines.append(
                f"| restarted against {c4.get('pools', '?')} pools, steady | {_fmt(restart.get('vmrss_mib'), 1)} | "
                f"{_fmt(restart.get('vmhwm_mib'), 1)} |"
            )
        lines += [
            "",
            f"- RSS ratio loaded / empty: **{_fmt(c4.get('rss_ratio'))}**; "
            f"{_fmt(c4.get('rss_per_pool_kib'), 1)} KiB per pool.",
            f"- Time from the first create until every pool's `status.observedGeneration` is set: "
            f"**{_fmt(c4.get('observed_all_s'), 1)} s** (creating them took {_fmt(c4.get('create_s'), 1)} s); "
            f"operator writes meanwhile: {_verbs((c4.get('writes') or {}).get(CATEGORY_OPERATOR, {}))}; framework "
            f"{_verbs((c4.get('writes') or {}).get(CATEGORY_FRAMEWORK, {}))}; reconcile passes "
            f"{_fmt(c4.get('passes'))}.",
        ]
        refused = int((c4.get("writes") or {}).get(CATEGORY_OPERATOR, {}).get("failed", 0))
        if refused:
            lines.append(f"- {_refused(refused)}")
        if restart:
            lines.append(
                f"- Restart: {_fmt(restart.get('all_passed_s'), 1)} s until every pool had a reconcile pass; "
                f"writes in the {_fmt(restart.get('window_s'), 0)} s after the restart: "
                f"{total_writes(restart.get('writes') or {})}."
            )
        if c4.get("pools") == 1000 and loaded.get("vmrss_mib") is not None:
            ok = loaded["vmrss_mib"] <= TARGET_C4_RSS_MIB_AT_1K
            lines.append(
                f"- Target ≤ {TARGET_C4_RSS_MIB_AT_1K:.0f} MiB at 1 k (start): **{'PASS' if ok else 'FAIL'}**."
            )
        if c4.get("error"):
            lines.append(f"- **did not finish**: {c4['error']}")
        lines.append("")
    c6 = results.get("c6") or {}
    if c6:
        cfg = c6.get("config") or {}
        lines += [
            "## C6 — SLO breach → rollback",
            "",
            f"A 2-pair pool; steps `[setCanaryPairs: 1, analysis, setWeight: 100]`; analysis interval "
            f"{cfg.get('interval', '?')}, initialDelay {cfg.get('initialDelay', '?')}, successStreak "
            f"{cfg.get('successStreak', '?')}, failureLimit {cfg.get('failureLimit', '?')}; gate `TTFTP90` with "
            f"`{cfg.get('successCondition', '?')}`; Prometheus scrape {cfg.get('scrape_interval_s', '?')} s. At t0 "
            "(status shows the analysis step started) the exporter makes the canary's TTFT × 1.5. observe = t0 → "
            "the first Failure verdict's `evaluatedAt`; decide → phase `RollingBack` seen; act → the routing table "
            "gives the canary no traffic. `evaluatedAt` is the timestamp of the sample the verdict used "
            "(millisecond resolution); the other marks are watch-event arrival times (a few ms after the write).",
            "",
            "| repeat | observe (s) | decide (s) | act (s) | **total (s)** | gate value vs baseline |",
            "|---|---|---|---|---|---|",
        ]
        for i, rep in enumerate(c6.get("repeats") or []):
            lines.append(
                f"| {i} | {_fmt(rep.get('observe_s'))} | {_fmt(rep.get('decide_s'))} | {_fmt(rep.get('act_s'))} | "
                f"**{_fmt(rep.get('total_s'))}** | {_num(rep.get('gate_value'))} vs {_num(rep.get('gate_baseline'))} |"
            )
        summ = c6.get("summary") or {}
        if summ:
            lines.append(
                f"| median | {_span(summ.get('observe_s'))} | {_span(summ.get('decide_s'))} | "
                f"{_span(summ.get('act_s'))} | **{_span(summ.get('total_s'))}** | |"
            )
        loaded = c6.get("with_load_delay") or {}
        rep = loaded.get("repeat") or {}
        if rep:
            lines.append(
                f"| {loaded.get('load_delay_s', 0):g} s model load ¹ | {_fmt(rep.get('observe_s'))} | "
                f"{_fmt(rep.get('decide_s'))} | {_fmt(rep.get('act_s'))} | **{_fmt(rep.get('total_s'))}** | "
                f"{_num(rep.get('gate_value'))} vs {_num(rep.get('gate_baseline'))} |"
            )
            lines += [
                "",
                f"¹ The same run on a second cluster whose KWOK pods take {loaded.get('load_delay_s', 0):g} s to turn "
                "Ready, as a model load would (the rows above use 0 s, like C1).",
            ]
        first = (c6.get("repeats") or [{}])[0]
        if first.get("timeline"):
            lines += ["", "Operator writes around repeat 0 (seconds after t0):", "", "```"]
            lines += list(first["timeline"])[:40]
            lines.append("```")
        if c6.get("error"):
            lines.append("")
            lines.append(f"- **did not finish**: {c6['error']}")
        lines.append("")
    notes = findings(results)
    lines += ["## Where the operator loses, and other notes", ""]
    lines += [f"- {n}" for n in notes] or ["- Nothing: every measured value met its target."]
    lines += [
        "",
        "## Machine, versions, timing",
        "",
        f"- Machine: {meta.get('cpu_model', '?')}, {meta.get('cores', '?')} cores, "
        f"{_fmt(meta.get('ram_gib'), 1)} GiB RAM, kernel {meta.get('kernel', '?')}; load average at start "
        f"{meta.get('loadavg_start', '?')}, at end {meta.get('loadavg_end', '?')}"
        + "".join(f"; after {k.upper()} {v[0]}" for k, v in (meta.get("loadavg_after_section") or {}).items() if v)
        + ".",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".",
        "- Sections (wall s): "
        + ", ".join(f"{k} {_fmt(v, 0)}" for k, v in (timing.get("sections_s") or {}).items())
        + ".",
        "",
    ]
    return "\n".join(lines)


# --- plots -----------------------------------------------------------------------------------------------


def write_plots(results: Mapping[str, Any], out: Path) -> list[Path]:
    """PNG plots for every section present (matplotlib, Agg backend)."""
    import matplotlib  # noqa: PLC0415 - plotting is optional for the pure parts

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    written: list[Path] = []
    c1 = results.get("c1") or {}
    rows = c1.get("sizes") or []
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        xs = list(range(len(rows)))
        width = 0.38
        for offset, key, label in (
            (-width / 2, "a_status", "A: operator (status Ready)"),
            (width / 2, "b_pods", "B: direct"),
        ):
            med = [r[key]["median"] for r in rows]
            lo = [r[key]["median"] - r[key]["min"] for r in rows]
            hi = [r[key]["max"] - r[key]["median"] for r in rows]
            axes[0].bar([x + offset for x in xs], med, width, yerr=[lo, hi], capsize=4, label=label)
        axes[0].set_xticks(xs, [f"N = {r['pairs']}" for r in rows])
        axes[0].set_ylabel("apply → all pairs Ready (s)")
        axes[0].set_title("C1 medians (min–max)")
        axes[0].legend()
        med = [r["ratio"]["median"] for r in rows]
        lo = [r["ratio"]["median"] - r["ratio"]["min"] for r in rows]
        hi = [r["ratio"]["max"] - r["ratio"]["median"] for r in rows]
        axes[1].bar(xs, med, 0.5, yerr=[lo, hi], capsize=4, color="tab:purple")
        axes[1].axhline(1.0, color="grey", lw=1)
        axes[1].axhline(TARGET_C1_RATIO_AT_95, color="tab:red", lw=1, ls="--", label="proposed target at 95")
        for x, m in zip(xs, med, strict=True):
            axes[1].text(x + 0.27, m, f"{m:.2f}", ha="left", va="center")
        axes[1].set_xticks(xs, [f"N = {r['pairs']}" for r in rows])
        axes[1].set_ylabel("A / B")
        axes[1].set_title("C1 ratio (median of per-repeat A/B)")
        axes[1].legend()
        fig.tight_layout()
        path = out / "controller-c1.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    c2 = results.get("c2") or {}
    scenarios = c2.get("scenarios") or []
    if scenarios:
        verbs = sorted({v for sc in scenarios for cat in CATEGORIES for v in sc["writes"][cat]["by_verb"]})
        fig, ax = plt.subplots(figsize=(11, 4.5))
        names = [sc["name"] for sc in scenarios]
        bottoms = [0.0] * len(scenarios)
        for cat in CATEGORIES:
            for verb in verbs:
                vals = [float(sc["writes"][cat]["by_verb"].get(verb, 0)) for sc in scenarios]
                if not any(vals):
                    continue
                ax.bar(names, vals, bottom=bottoms, label=f"{cat}: {verb}")
                bottoms = [x + y for x, y in zip(bottoms, vals, strict=True)]
        for i, total in enumerate(bottoms):
            ax.text(i, total, f"{total:.0f}", ha="center", va="bottom")
        ax.set_ylabel("API writes (audit log)")
        ax.set_title("C2 writes by scenario, category and verb")
        ax.tick_params(axis="x", labelrotation=20)
        plt.setp(ax.get_xticklabels(), horizontalalignment="right")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "controller-c2.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    c4 = results.get("c4") or {}
    if c4.get("samples"):
        fig, ax = plt.subplots(figsize=(9, 4))
        ts = [s[0] for s in c4["samples"]]
        ax.plot(ts, [s[1] for s in c4["samples"]], color="tab:blue", label="VmRSS (MiB)")
        ax.set_xlabel("seconds since the operator started")
        ax.set_ylabel("VmRSS (MiB)")
        ax2 = ax.twinx()
        ax2.plot(ts, [s[2] for s in c4["samples"]], color="tab:orange", label="pools observed")
        ax2.set_ylabel("pools with observedGeneration")
        ax.set_title(f"C4 operator memory, 0 → {c4.get('pools', '?')} pools")
        fig.legend(loc="lower right", bbox_to_anchor=(0.88, 0.15))
        fig.tight_layout()
        path = out / "controller-c4.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    c6 = results.get("c6") or {}
    reps = list(c6.get("repeats") or [])
    labels = [f"repeat {i}" for i in range(len(reps))]
    loaded = (c6.get("with_load_delay") or {}).get("repeat")
    if loaded:
        reps.append(loaded)
        labels.append(f"{c6['with_load_delay'].get('load_delay_s', 0):g} s model load")
    if reps:
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(reps)))
        left = [0.0] * len(reps)
        for key, color in (("observe_s", "tab:blue"), ("decide_s", "tab:orange"), ("act_s", "tab:green")):
            vals = [float(r.get(key) or 0.0) for r in reps]
            ax.barh(labels, vals, left=left, color=color, label=key.removesuffix("_s"))
            left = [x + y for x, y in zip(left, vals, strict=True)]
        for i, total in enumerate(left):
            ax.text(total, i, f" {total:.1f} s", va="center")
        ax.set_xlabel("seconds from t0 (analysis started, canary TTFT × 1.5)")
        ax.set_title("C6 SLO breach → rollback")
        ax.legend(loc="lower right")
        fig.tight_layout()
        path = out / "controller-c6.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
