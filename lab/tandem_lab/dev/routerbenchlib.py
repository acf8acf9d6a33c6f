"""Pure parts of ``tandem bench router``: trace prompts, locality replay, statistics, verdicts, Markdown.

What it owns: everything of the router benchmark that is arithmetic on recorded data, so it is unit-tested
without processes or clocks:

- **Trace prompts.** A Mooncake trace row gives its prompt as 512-token block ids. A router sees text, so
  block ``i`` becomes the :data:`BLOCK_CHARS`-character word ``b%07d``; equal blocks give equal text, a
  shared prefix of blocks a shared prefix of characters in the same proportion, and a tag after the blocks
  (``#r<index>``) lets the engine doubles say which request they received without changing any prefix a
  router compares. Tandem's ``prefixChars = key_blocks · BLOCK_CHARS`` then keys exactly the first
  ``key_blocks`` blocks.
- **Locality replay** (:func:`locality`): given which prefill instance served each trace row, replay the
  rows in trace order through one LRU of block ids per instance (:class:`tandem_lab.sim.cache.PrefixCache`, the
  simulator's own cache: longest leading run, tail-first eviction) and count **token-weighted local prefix
  hits** (full blocks count 512 tokens, a hit on the whole prompt counts the prompt) and requests per
  instance (max/mean).
- **Statistics**: nearest-rank percentiles, CPU ticks from ``/proc/<pid>/stat``, the walk-length
  distribution from the router's Prometheus histogram.
- **Verdicts** against the issue's start targets and the Markdown report with its "Where Tandem loses".

Must not: do I/O, read a clock, or redefine a measure: each number is computed one way for every router.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem_lab.sim.cache import PrefixCache

BLOCK_CHARS = 8
"""Characters per trace block in a benchmark prompt (``b`` + 7 digits; the trace's ids stay below 10⁷)."""
BLOCK_TOKENS = 512
TAG_PREFIX = "#r"
_TAG = re.compile(r"#r(\d+)\s*$")
_MAX_BLOCK_ID = 10**7


# --- trace prompts ---------------------------------------------------------------------------------


def trace_prompt(hash_ids: Sequence[int], index: int) -> str:
    """The text a router sees for trace row ``index``: one fixed-width word per block, then the tag.

    >>> trace_prompt([0, 14], 3)
    'b0000000b0000014#r3'
    """
    for block in hash_ids:
        if not 0 <= block < _MAX_BLOCK_ID:
            raise ValueError(f"block id {block} does not fit {BLOCK_CHARS} characters")
    return "".join(f"b{block:07d}" for block in hash_ids) + f"{TAG_PREFIX}{index}"


def prompt_tag(prompt: str) -> int | None:
    """The trace index a benchmark prompt carries at its end (``None`` when it carries none)."""
    found = _TAG.search(prompt)
    return int(found.group(1)) if found else None


def filler_prompt(index: int, size_bytes: int) -> str:
    """A B1 prompt of ``size_bytes`` ASCII bytes whose first characters differ per request (so hash routers
    spread the load) followed by filler words."""
    head = f"{TAG_PREFIX}{index:09d} "
    if size_bytes <= len(head):
        return head[:size_bytes]
    body = ("lorem ipsum dolor sit amet " * (size_bytes // 27 + 1))[: size_bytes - len(head)]
    return head + body


# --- locality --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRow:
    """One trace request as the locality replay needs it."""

    input_length: int
    hash_ids: tuple[int, ...]


def locality(
    rows: Sequence[TraceRow],
    assignment: Mapping[int, str],
    instances: Sequence[str],
    capacity_blocks: int | None,
) -> dict[str, Any]:
    """Token-weighted local prefix hits and load spread of one routing of ``rows``.

    ``assignment`` maps a row index to the prefill instance that served it; rows without one (not served)
    are left out of both the hits and the loads and counted in ``unserved``. Rows are replayed in index
    order (trace order), each instance keeping its own LRU of ``capacity_blocks`` blocks.

    Worked example (infinite caches, two instances): rows ``[0,1]``, ``[0,1,2]``, ``[0,3]`` of 1024, 1536 and
    1024 tokens on ``a, a, b``: row 2 hits 2 blocks (1024 tokens) on ``a``; row 3 is ``b``'s first request
    (0). Hits = 1024 / 3584 = 28.6 %; loads a=2, b=1, max/mean = 2 / 1.5 = 1.33.
    """
    caches = {name: PrefixCache(capacity_blocks) for name in instances}
    loads: Counter[str] = Counter({name: 0 for name in instances})
    hit_tokens = 0
    total_tokens = 0
    unserved = 0
    for index, row in enumerate(rows):
        instance = assignment.get(index)
        if instance is None:
            unserved += 1
            continue
        cache = caches[instance]
        blocks = row.hash_ids
        hit = cache.lookup(blocks)
        hit_tokens += row.input_length if hit >= len(blocks) else hit * BLOCK_TOKENS
        total_tokens += row.input_length
        cache.insert(blocks, present=hit)
        loads[instance] += 1
    counts = [loads[name] for name in instances]
    mean = sum(counts) / len(counts) if counts else 0.0
    return {
        "requests": sum(counts),
        "unserved": unserved,
        "token_hit_ratio": hit_tokens / total_tokens if total_tokens else 0.0,
        "max_over_mean_load": max(counts) / mean if mean else 0.0,
        "loads": counts,
    }


def hit_bound(rows: Sequence[TraceRow]) -> float:
    """Token-weighted hits of one infinite cache that sees every row: the bound no routing can beat."""
    return float(locality(rows, dict.fromkeys(range(len(rows)), "all"), ["all"], None)["token_hit_ratio"])


# --- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, mean, p50, p90, p99 and max of ``values``."""
    return {
        "n": len(values),
        "mean": (sum(values) / len(values)) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": float(max(values)) if values else None,
    }


def cpu_ticks(stat: str) -> int:
    """``utime + stime`` (clock ticks) from the text of ``/proc/<pid>/stat``.

    The command name (field 2) may hold spaces and parentheses, so fields are counted after the last ``)``:
    there ``state`` is the first field and ``utime``/``stime`` are the 12th and 13th.
    """
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


def stat_ppid(stat: str) -> int:
    """The parent pid from the text of ``/proc/<pid>/stat``."""
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def walk_distribution(metrics_text: str, metric: str = "tandem_router_walk_length") -> dict[str, int]:
    """Requests per walk length from a Prometheus histogram's cumulative ``_bucket`` lines (summed over
    label sets): ``{"1": n1, "2": n2, ..., "+Inf": rest}``, each bucket minus the one below it."""
    cumulative: dict[float, float] = {}
    pattern = re.compile(rf'^{re.escape(metric)}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}}\s+([0-9.eE+-]+)', re.M)
    for le, value in pattern.findall(metrics_text):
        bound = math.inf if le == "+Inf" else float(le)
        cumulative[bound] = cumulative.get(bound, 0.0) + float(value)
    out: dict[str, int] = {}
    below = 0.0
    for bound in sorted(cumulative):
        count = round(cumulative[bound] - below)
        below = cumulative[bound]
        out["+Inf" if bound == math.inf else f"{bound:g}"] = count
    return out


def mean_walk(distribution: Mapping[str, int]) -> float | None:
    """Mean walk length of a :func:`walk_distribution` (the ``+Inf`` bucket cannot occur: walks are bounded
    by ``maxWalk``, which the buckets cover)."""
    total = sum(n for le, n in distribution.items() if le != "+Inf")
    if not total:
        return None
    return sum(float(le) * n for le, n in distribution.items() if le != "+Inf") / total


def per_chunk_us(cpu_us_long: float, cpu_us_short: float, chunks_long: int, chunks_short: int) -> float | None:
    """CPU per relayed chunk from two stream lengths at the same prompt and rate: the slope
    ``(cpu_long − cpu_short) / (chunks_long − chunks_short)`` (the per-request part cancels)."""
    if chunks_long == chunks_short:
        return None
    return (cpu_us_long - cpu_us_short) / (chunks_long - chunks_short)


def moved_keys(before: Mapping[str, str], after: Mapping[str, str], stable: Iterable[str]) -> int:
    """Keys served by one stable pair before and by another stable pair after (must stay 0 when only the
    canary weight moves: keys may cross between revisions, never between two stable pairs)."""
    stable_set = set(stable)
    return sum(
        1
        for key, pair in before.items()
        if pair in stable_set and after.get(key) in stable_set and after.get(key) != pair
    )


PARTS = ("b1", "b2", "b3")


def merge_parts(previous: Mapping[str, Any], new: Mapping[str, Any], parts: Iterable[str]) -> dict[str, Any]:
    """``new`` (a run of ``parts`` only) completed with the other parts of ``previous``.

    Each part keeps the ``meta`` of the run that produced it under ``meta.runs[part]``, so a report assembled
    from several runs says which commit, time and machine load each part had.
    """
    ran = set(parts)
    doc = dict(new)
    meta = dict(new.get("meta", {}))
    runs = dict(previous.get("meta", {}).get("runs", {}))
    old_meta = {k: v for k, v in previous.get("meta", {}).items() if k != "runs"}
    own = {k: v for k, v in meta.items() if k != "runs"}
    for part in PARTS:
        if part in ran:
            runs[part] = own
        elif part in previous:
            doc[part] = previous[part]
            runs.setdefault(part, old_meta)
    meta["runs"] = runs
    doc["meta"] = meta
    return doc


# --- verdicts and report ---------------------------------------------------------------------------

TARGET_CPU_RATIO = 2.0
TARGET_ADDED_P50_MS = 2.0
TARGET_RATE = 550.0
TARGET_SERVED = 1.0


def _fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def _pct(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{100.0 * float(value):.{digits}f} %"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def b1_row(doc: Mapping[str, Any], arm: str, rate: float, prompt: str) -> Mapping[str, Any] | None:
    """The B1 run of ``arm`` at offered ``rate`` and ``prompt`` size label, if it ran."""
    for run in doc.get("b1", {}).get("runs", []):
        if run["arm"] == arm and run["offered_rps"] == rate and run["prompt"] == prompt:
            return dict(run)
    return None


def verdicts(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each start target with the measured numbers and whether it is met (``None``: not measurable here).

    - CPU per request ≤ 2× vllm-router's: Tandem's CPU µs/request over vllm-router's (round_robin, the
      cheapest policy), at the B1 grid's reference point (the largest offered rate ≤ 550, 2 KB prompts).
    - added p50 TTFT ≤ 2 ms at 550 req/s: Tandem's p50 TTFT minus direct's at the same offered rate; when
      the grid was scaled down, at the grid's reference point, and the verdict says so.
    - local hits ≥ vllm-router's best policy: per pair count, Tandem's best key depth vs vllm-router's best.
    - 100 % served in B3: every Tandem B3 scenario.
    - 0 stable keys moved: the canary steps.
    """
    out: list[dict[str, Any]] = []
    b1 = doc.get("b1", {})
    ref_rate = b1.get("reference_rps")
    tandem = b1_row(doc, "tandem", ref_rate, "2KB") if ref_rate is not None else None
    vllm = b1_row(doc, "vllm-router-round_robin", ref_rate, "2KB") if ref_rate is not None else None
    direct = b1_row(doc, "direct", ref_rate, "2KB") if ref_rate is not None else None
    if tandem and vllm and tandem.get("cpu_us_per_request") and vllm.get("cpu_us_per_request"):
        ratio = tandem["cpu_us_per_request"] / vllm["cpu_us_per_request"]
        out.append(
            {
                "target": "CPU per request ≤ 2× vllm-router's",
                "measured": f"{tandem['cpu_us_per_request']:,.0f} vs {vllm['cpu_us_per_request']:,.0f} µs/request "
                f"= {ratio:.2f}× (offered {ref_rate:g} req/s, 2 KB, 343-event streams)",
                "met": ratio <= TARGET_CPU_RATIO,
            }
        )
    if tandem and direct and tandem["ttft_ms"]["p50"] is not None and direct["ttft_ms"]["p50"] is not None:
        added = tandem["ttft_ms"]["p50"] - direct["ttft_ms"]["p50"]
        scaled = ref_rate != TARGET_RATE
        out.append(
            {
                "target": "added p50 TTFT ≤ 2 ms at 550 req/s",
                "measured": f"+{added:.2f} ms at {ref_rate:g} req/s offered"
                + (" (the 550 req/s point did not run on this box; see B1)" if scaled else ""),
                "met": (added <= TARGET_ADDED_P50_MS) if not scaled else None,
            }
        )
    b2 = doc.get("b2", {})
    for pairs, block in sorted(b2.get("by_pairs", {}).items(), key=lambda kv: int(kv[0])):
        policies = block["policies"]
        tandem_best = max((p for n, p in policies.items() if n.startswith("tandem")), key=_hits, default=None)
        vllm_best_name = max(
            (n for n in policies if n.startswith("vllm-router")), key=lambda n: _hits(policies[n]), default=None
        )
        if tandem_best is None or vllm_best_name is None:
            continue
        t_hits, v_hits = _hits(tandem_best), _hits(policies[vllm_best_name])
        out.append(
            {
                "target": f"local hits ≥ vllm-router's best policy ({pairs} pairs)",
                "measured": f"{_pct(t_hits)} vs {_pct(v_hits)} ({vllm_best_name})",
                "met": t_hits >= v_hits,
            }
        )
    b3 = doc.get("b3", {})
    served = [(s["scenario"], s["served_share"]) for s in b3.get("scenarios", []) if s["router"] == "tandem"]
    if served:
        worst = min(share for _, share in served)
        out.append(
            {
                "target": "100 % served in B3",
                "measured": ", ".join(f"{name}: {_pct(share, 2)}" for name, share in served),
                "met": worst >= TARGET_SERVED,
            }
        )
    moved = [s for s in b3.get("scenarios", []) if s["router"] == "tandem" and "stable_keys_moved" in s]
    if moved:
        total = sum(int(s["stable_keys_moved"]) for s in moved)
        out.append({"target": "0 stable keys moved", "measured": f"{total} keys moved", "met": total == 0})
    return out


def _hits(policy: Mapping[str, Any]) -> float:
    return float(policy.get("token_hit_ratio", 0.0))


def where_tandem_loses(doc: Mapping[str, Any]) -> list[str]:
    """Bullet lines, computed from the numbers, for every measure on which Tandem is behind a baseline."""
    lines: list[str] = []
    for run in doc.get("b1", {}).get("runs", []):
        if run["arm"] != "tandem":
            continue
        for arm in ("vllm-router-round_robin", "vllm-router-cache_aware"):
            other = b1_row(doc, arm, run["offered_rps"], run["prompt"])
            if not other:
                continue
            mine, theirs = run.get("cpu_us_per_request"), other.get("cpu_us_per_request")
            if mine and theirs and mine > theirs:
                lines.append(
                    f"- B1 CPU: {mine:,.0f} µs/request vs {arm} {theirs:,.0f} ({mine / theirs:.2f}×) at "
                    f"{run['offered_rps']:g} req/s, {run['prompt']} prompts."
                )
            mp50, tp50 = run["ttft_ms"]["p50"], other["ttft_ms"]["p50"]
            if mp50 is not None and tp50 is not None and mp50 > tp50:
                lines.append(
                    f"- B1 TTFT p50: {mp50:.2f} ms vs {arm} {tp50:.2f} ms at {run['offered_rps']:g} req/s, "
                    f"{run['prompt']} prompts."
                )
            if run.get("rss_mib") and other.get("rss_mib") and run["rss_mib"] > other["rss_mib"]:
                lines.append(
                    f"- B1 memory: RSS {run['rss_mib']:.0f} MiB vs {arm} {other['rss_mib']:.0f} MiB "
                    f"({run['offered_rps']:g} req/s, {run['prompt']})."
                )
    for pairs, block in doc.get("b2", {}).get("by_pairs", {}).items():
        policies = block["policies"]
        for name, p in policies.items():
            if not name.startswith("tandem"):
                continue
            for other_name, other in policies.items():
                if other_name.startswith("vllm-router") and _hits(other) > _hits(p):
                    lines.append(
                        f"- B2 {pairs} pairs: {name} hits {_pct(_hits(p))} < {other_name} {_pct(_hits(other))}."
                    )
                if other_name.startswith("vllm-router") and other["max_over_mean_load"] < p["max_over_mean_load"]:
                    lines.append(
                        f"- B2 {pairs} pairs: {name} max/mean load {p['max_over_mean_load']:.2f} > "
                        f"{other_name} {other['max_over_mean_load']:.2f}."
                    )
    for s in doc.get("b3", {}).get("scenarios", []):
        if s["router"] == "tandem" and s["served_share"] < 1.0:
            lines.append(f"- B3 {s['scenario']}: Tandem served {_pct(s['served_share'], 2)}.")
    return lines


def markdown(doc: Mapping[str, Any]) -> str:
    """The report ``router.md``: setup, B1–B3 tables beside vllm-router, verdicts, where Tandem loses."""
    meta = doc.get("meta", {})
    lines = [
        "# Router benchmark: `tandem router` beside vllm-router 0.1.17",
        "",
        "Generated by `tandem bench router` (`make bench`); every number below comes from "
        "`router.json` (which run made each part is listed below). Method: the docstring of "
        "`tandem_lab.dev.routerbench` and dataplane.md §4.4 (the benchmark a peer would accept).",
        "",
        f"- Commit `{meta.get('commit', '?')}`, {meta.get('started', '?')}, profile `{meta.get('profile', '?')}`.",
        f"- Machine: {meta.get('machine', '?')}. **Shared**: other helpers' work (tests, benchmarks, engines) "
        "ran on the same 2 cores during this run; heavy phases held `/tmp/tandem-heavy.lock`, which "
        "serialises only the runs that take it. Treat absolute latencies as upper bounds.",
        *_runs_md(meta),
        f"- vllm-router: {meta.get('vllm_router', '?')}.",
        "- Engine doubles: `tandem_lab.dev.enginedouble` (Python/aiohttp) for both routers and for direct; all on "
        "127.0.0.1.",
        "",
        "## Start targets",
        "",
    ]
    rows = []
    for v in doc.get("verdicts", []):
        met = {True: "met", False: "**not met**", None: "not measurable here"}[v["met"]]
        rows.append([v["target"], v["measured"], met])
    lines += _table(["Target", "Measured", "Verdict"], rows)
    lines += ["", *_b1_md(doc.get("b1", {})), "", *_b2_md(doc.get("b2", {})), "", *_b3_md(doc.get("b3", {}))]
    lines += ["", "## Where Tandem loses", ""]
    loses = where_tandem_loses(doc)
    lines += loses or ["- Nowhere on the measures of this run."]
    notes = doc.get("notes", [])
    if notes:
        lines += ["", "## Notes and limits", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def _load(meta: Mapping[str, Any]) -> str:
    start, end = meta.get("load_average_at_start"), meta.get("load_average_at_end")
    if not start:
        return ""
    text = f"1-min load average {start[0]:.1f} at start"
    return text + (f", {end[0]:.1f} at end" if end else "")


def _runs_md(meta: Mapping[str, Any]) -> list[str]:
    """Which run produced each part (a report assembled with ``--only``), with the machine's load then."""
    runs = meta.get("runs")
    if not runs:
        load = _load(meta)
        return [f"- Machine load during the run: {load}."] if load else []
    lines = ["- Parts came from separate runs (Tandem and vllm-router side by side inside each part):"]
    for part in PARTS:
        if part in runs:
            r = runs[part]
            lines.append(
                f"  - {part.upper()}: profile `{r.get('profile', '?')}`, commit `{r.get('commit', '?')}`, "
                f"{r.get('started', '?')}, "
                f"{r.get('wall_s', '?')} s, {_load(r) or 'load not recorded'}."
            )
    return lines


def _b1_md(b1: Mapping[str, Any]) -> list[str]:
    if not b1:
        return ["## B1 overhead", "", "Not run."]
    lines = [
        "## B1 overhead",
        "",
        f"Open-loop Poisson arrivals for {b1.get('window_s', '?')} s per point; decode streams of "
        f"{b1.get('stream_events', '?')} SSE events {b1.get('token_gap_ms', '?')} ms apart; each arm "
        "against the same doubles (2 pairs). CPU = utime + stime of the router's process tree from /proc ÷ "
        "completed requests. Added TTFT = arm p50/p99 minus direct's at the same point (direct = the load "
        "generator drives both legs itself). Loop lag = an asyncio timer's overshoot inside the Tandem router "
        "process (tokio has no equivalent probe here).",
        "",
    ]
    lines += [f"- {n}" for n in b1.get("notes", [])]
    lines += [""]
    head = [
        "arm",
        "prompt",
        "offered req/s",
        "achieved req/s",
        "ok",
        "CPU µs/req",
        "TTFT p50 / p99 ms",
        "added p50 / p99 ms",
        "e2e p50 ms",
        "RSS MiB",
        "idle CPU %",
        "loop lag p99 ms",
        "gen CPU %",
    ]
    rows = []
    for run in b1.get("runs", []):
        direct = None
        for other in b1.get("runs", []):
            if (
                other["arm"] == "direct"
                and other["offered_rps"] == run["offered_rps"]
                and other["prompt"] == run["prompt"]
            ):
                direct = other
        added = "—"
        if direct is not None and run["arm"] != "direct":
            p50 = _diff(run["ttft_ms"]["p50"], direct["ttft_ms"]["p50"])
            p99 = _diff(run["ttft_ms"]["p99"], direct["ttft_ms"]["p99"])
            added = f"{_fmt(p50, 2)} / {_fmt(p99, 2)}"
        rows.append(
            [
                run["arm"],
                run["prompt"],
                f"{run['offered_rps']:g}",
                _fmt(run.get("achieved_rps"), 1),
                f"{run.get('ok', 0)}/{run.get('sent', 0)}",
                _fmt(run.get("cpu_us_per_request"), 0),
                f"{_fmt(run['ttft_ms']['p50'], 2)} / {_fmt(run['ttft_ms']['p99'], 2)}",
                added,
                _fmt(run["e2e_ms"]["p50"], 0),
                _fmt(run.get("rss_mib"), 0),
                _fmt(run.get("idle_cpu_percent"), 1),
                _fmt((run.get("loop_lag_ms") or {}).get("p99"), 2),
                _fmt(run.get("generator_cpu_percent"), 0),
            ]
        )
    lines += _table(head, rows)
    derived = b1.get("derived", [])
    if derived:
        lines += ["", "Per chunk and per core (derived from the runs above and the short-stream runs):", ""]
        lines += _table(
            [
                "arm",
                "CPU µs/req, 343 events",
                "CPU µs/req, 1 event",
                "CPU µs per chunk",
                "req/s per core (343 ev.)",
                "req/s per core (1 ev.)",
            ],
            [
                [
                    d["arm"],
                    _fmt(d.get("cpu_us_long"), 0),
                    _fmt(d.get("cpu_us_short"), 0),
                    _fmt(d.get("cpu_us_per_chunk"), 2),
                    _fmt(d.get("rps_per_core_long"), 0),
                    _fmt(d.get("rps_per_core_short"), 0),
                ]
                for d in derived
            ],
        )
    return lines


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _b2_md(b2: Mapping[str, Any]) -> list[str]:
    if not b2:
        return ["## B2 locality", "", "Not run."]
    lines = [
        "## B2 locality",
        "",
        f"The Mooncake conversation trace ({b2.get('requests', '?')} requests in trace order) through each real "
        f"router, {b2.get('window', '?')} requests in flight; prompts carry the trace's blocks as text "
        f"({BLOCK_CHARS} characters per block). The doubles record which prefill served each request; the hits "
        f"are then replayed through one LRU per prefill instance of {b2.get('capacity_blocks', '?')} blocks "
        f"(the simulator's HBM KV capacity per instance). Bound with one infinite cache: "
        f"{_pct(b2.get('hit_bound'))}.",
        "",
    ]
    lines += [f"- {n}" for n in b2.get("notes", [])]
    lines += [""]
    rows = []
    for pairs, block in sorted(b2.get("by_pairs", {}).items(), key=lambda kv: int(kv[0])):
        for name, p in block["policies"].items():
            walk = p.get("walk")
            rows.append(
                [
                    str(pairs),
                    name,
                    _pct(p["token_hit_ratio"]),
                    _fmt(p["max_over_mean_load"], 2),
                    _fmt(p.get("mean_walk"), 3) if walk else "1 (no walk)",
                    ", ".join(f"{k}: {v}" for k, v in walk.items() if v) if walk else "—",
                    f"{p['requests']}",
                    str(p.get("errors", 0)),
                ]
            )
    lines += _table(
        [
            "pairs",
            "policy",
            "token-weighted local hits",
            "max/mean load",
            "mean walk",
            "walk lengths",
            "served",
            "errors",
        ],
        rows,
    )
    return lines


def _b3_md(b3: Mapping[str, Any]) -> list[str]:
    if not b3:
        return ["## B3 faults and rollout", "", "Not run."]
    lines = ["## B3 faults and rollout", ""]
    lines += [f"- {n}" for n in b3.get("notes", [])]
    lines += [""]
    rows = []
    for s in b3.get("scenarios", []):
        rows.append(
            [
                s["scenario"],
                s["router"],
                f"{s.get('ok', 0)}/{s.get('sent', 0)}",
                _pct(s["served_share"], 2),
                ", ".join(f"{k}: {v}" for k, v in sorted(s.get("errors", {}).items())) or "none",
                str(s.get("stable_keys_moved", "—")),
                s.get("detail", ""),
            ]
        )
    lines += _table(["scenario", "router", "ok/sent", "served", "client errors", "stable keys moved", "detail"], rows)
    return lines
