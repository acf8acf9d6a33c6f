"""``tandem bench fleet``: the fleet benchmark of issue 9 — every policy and the oracle on W1, W2, W3, W5.

What it owns: the benchmark's profiles (which scenarios at which scale), running them through
:mod:`tandem_lab.sim.runner` (scaling policies, W1–W3) and :mod:`tandem_lab.sim.rollout` (rollout policies, W5)
with progress output, and writing ``fleet.json``, ``fleet.md`` and ``fleet-*.png``.

    tandem bench fleet --out bench/results                 # CI profile, seed 1
    tandem bench fleet --out /tmp/full --profile full       # full-scale week (manual / nightly)

- ``fleet.json``: per scenario the ``results.json`` document of :func:`tandem_lab.sim.report.results`
  (workload, bounds, per-policy metrics and the oracle of each policy's served work), the W5 arms and
  their timelines, every gate verdict, and ``timing`` (the only wall-clock data; same code + seed →
  the same bytes elsewhere).
- ``fleet.md``: GPU-hours with ratios against the oracle (O1 of the policy's own served work, O1 of
  every feasible request), the planning model's O1 and every baseline; attainment; W5 detection,
  rollback split and bad-revision requests against the §7 floor; gate verdicts; and a "where Tandem
  loses" section computed from the numbers.
- PNGs: GPU-hours by policy and scenario, W2 instances over time, W2 attainment per window, W5
  timelines.

Must not: tune anything per policy; every policy of a scenario gets the same workload, bounds, warm
start, load times and observation pipeline (the runner enforces it).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tandem_lab.benchcli import bench_subparsers
from tandem_lab.sim import w5seeds
from tandem_lab.sim.config import SimParams, config_hash, load_params
from tandem_lab.sim.policies import POLICIES, POLICY_WORDS
from tandem_lab.sim.report import clean, results
from tandem_lab.sim.rollout import ARMS, W5Run, build_pool, run_w5
from tandem_lab.sim.runner import ScenarioRun, code_revision, run
from tandem_lab.sim.scenarios import GATE_SETS, ScenarioConfig

FLEET_VERSION = 1
BASELINES = ("B0", "B1", "B2", "B3", "B4")
SCALING = (*BASELINES, "tandem")
W5_VARIANTS: tuple[tuple[str, str], ...] = (
    ("good", "example"),
    ("errors", "regression"),
    ("tpot", "regression"),
    ("good", "regression"),
)
"""(canary, gate set): the example's gates on a good canary (the cold-cache confound), then the regression
gates on +1 point of errors, on TPOT × 1.3, and on a good canary (false rollbacks)."""
W5_SEED_GATE_SETS: tuple[str, ...] = ("example", "regression")
"""``--seeds N``: issue 17's Must show names these two gate sets (``--gate-sets`` chooses others)."""
W5_CANARIES: tuple[str, ...] = ("good", "errors", "tpot", "ttft")


def w5_seed_variants(gate_sets: Sequence[str] = W5_SEED_GATE_SETS) -> tuple[tuple[str, str], ...]:
    """``--seeds N``: every canary under every chosen gate set."""
    return tuple((canary, gates) for gates in gate_sets for canary in W5_CANARIES)


PROFILES: dict[str, dict[str, dict[str, float]]] = {
    # CI: W1 at 5 % of the fleet rate (k = 7 copies of the conversation trace); W2 a 1 % sample of the
    # agentic week (5 % of the rate, 5 × time compression); W3 its Monday–Tuesday with the burst; W5 the
    # Tuesday 12:00–18:00 peak window at 5 % of the rate (compressed 5 ×: 72 simulated minutes).
    "ci": {
        "W1": {"scale": 0.05},
        "W2": {"scale": 0.05, "compress": 5.0},
        "W3": {"scale": 0.05, "compress": 5.0},
        "W5": {"scale": 0.1, "compress": 5.0},
    },
    # smoke: a tiny run of every scenario for tests and quick checks (not a benchmark result)
    "smoke": {
        "W1": {"copies": 1},
        "W2": {"scale": 0.004, "compress": 48.0, "days": 2.0},
        "W3": {"scale": 0.004, "compress": 48.0, "days": 2.0},
        "W5": {"scale": 0.01, "compress": 5.0},
    },
    # canary: the CI profile, but W5 at the full request rate (compressed 5 ×: the same 72 simulated minutes,
    # 0.83–0.92 M speed-pool requests): the rate at which issue 17's exposure limit (0.1 % of all requests)
    # leaves a canary on one of ~75 pairs the ≈ 830 requests its tests need; at the CI profile's 10 % rate no
    # test can.
    "canary": {
        "W1": {"scale": 0.05},
        "W2": {"scale": 0.05, "compress": 5.0},
        "W3": {"scale": 0.05, "compress": 5.0},
        "W5": {"scale": 1.0, "compress": 5.0},
    },
    "full": {
        "W1": {"scale": 1.0},
        "W2": {"scale": 1.0, "compress": 1.0},
        "W3": {"scale": 1.0, "compress": 1.0},
        "W5": {"scale": 1.0, "compress": 1.0},
    },
}


@dataclass
class FleetRun:
    """Everything one ``tandem bench fleet`` produced."""

    profile: str
    seed: int
    params: SimParams
    scenarios: dict[str, ScenarioRun] = field(default_factory=dict)
    w5: W5Run | None = None
    timing: dict[str, float] = field(default_factory=dict)
    w5_seeds: dict[str, Any] | None = None
    """``--seeds N`` (any N, 1 too): :func:`tandem_lab.sim.w5seeds.document` (per-seed rows and the Must-show
    summary), which ``tandem bench fleet-merge`` adds up across runs."""


def register(subparsers: Any) -> None:
    """Add ``tandem bench fleet`` (reusing a ``bench`` parser another module registered, if any)."""
    bench_sub = bench_subparsers(subparsers)
    fleet = bench_sub.add_parser(
        "fleet",
        help="fleet benchmark: every scaling policy and the oracle on W1-W3, rollout policies on W5",
        description=(
            "Runs W1 (conversation trace at fleet rate), W2 (agentic week sample), W3 (burst) for B0-B4 and "
            "Tandem's autoscaler, and W5 (bad canary) for Tandem's rollout and a Flagger-like baseline; writes "
            "fleet.json, fleet.md and fleet-*.png to --out. The CI profile takes about 15 minutes on 2 cores."
        ),
    )
    fleet.add_argument("--out", type=Path, required=True, help="output directory (e.g. bench/results)")
    fleet.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    fleet.add_argument("--seed", type=int, default=1)
    fleet.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=(
            "W5 only: run seeds --seed .. --seed+N-1 with every canary under each gate set (issue 17); any N, 1 "
            "too, writes mergeable per-seed rows (without it W5 runs once, each arm's canaries as in fleet.md)"
        ),
    )
    fleet.add_argument(
        "--gate-sets",
        default=",".join(W5_SEED_GATE_SETS),
        help=f"W5 --seeds: comma-separated gate sets of {','.join(GATE_SETS)} (default: example,regression)",
    )
    fleet.add_argument("--arms", default=",".join(ARMS), help="W5 rollout arms (default: tandem,flagger)")
    fleet.add_argument(
        "--scenarios", default="W1,W2,W3,W5", help="comma-separated subset of W1,W2,W3,W5 (default: all)"
    )
    fleet.add_argument(
        "--policies",
        default=",".join(SCALING),
        help="scaling policies for W1-W3 (default: B0-B4 and tandem; C1, the clairvoyant reference, on request)",
    )
    fleet.add_argument("--params", type=Path, help="YAML deep-merged over the shipped params.yaml")
    fleet.add_argument("--no-plots", action="store_true")
    fleet.add_argument("--quiet", action="store_true")
    fleet.set_defaults(func=cmd_fleet)
    merge = bench_sub.add_parser(
        "fleet-merge",
        help="merge the W5 --seeds results of several fleet runs into one fleet.json, fleet.md and plot",
        description=(
            "Reads fleet.json files written by `tandem bench fleet --seeds N` over disjoint seeds (in parallel, or "
            "in later sessions) on the same code, profile and parameters, and writes their rows together with the "
            "issue 17 summary and gates recomputed over every seed."
        ),
    )
    merge.add_argument("--out", type=Path, required=True, help="output directory")
    merge.add_argument("inputs", type=Path, nargs="+", help="fleet.json files")
    merge.add_argument("--no-plots", action="store_true")
    merge.add_argument(
        "--across-code",
        action="store_true",
        help="accept runs of several code revisions when each later one replays a row of the first identically",
    )
    merge.set_defaults(func=cmd_fleet_merge)


def cmd_fleet(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [s for s in scenarios if s not in ("W1", "W2", "W3", "W5")] + [p for p in policies if p not in POLICIES]
    if bad:
        print(f"tandem bench fleet: unknown scenario or policy: {', '.join(bad)}", file=sys.stderr)
        return 2
    overrides = yaml.safe_load(args.params.read_text(encoding="utf-8")) if args.params else None
    try:
        params = load_params(overrides=overrides)
    except ValueError as exc:
        print(f"tandem bench fleet: invalid --params: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:7.1f} s] {message}", flush=True)

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    gate_sets = [g.strip() for g in args.gate_sets.split(",") if g.strip()]
    if (
        (args.seeds is not None and args.seeds < 1)
        or [a for a in arms if a not in ARMS]
        or not gate_sets
        or set(gate_sets) - set(GATE_SETS)
    ):
        print(
            f"tandem bench fleet: --seeds must be ≥ 1, --arms a subset of {','.join(ARMS)} and --gate-sets of "
            f"{','.join(GATE_SETS)}",
            file=sys.stderr,
        )
        return 2
    fleet = run_fleet(
        params, args.profile, args.seed, scenarios, policies, progress, seeds=args.seeds, arms=arms, gate_sets=gate_sets
    )
    doc = write(fleet, args.out, plots=not args.no_plots)
    failed = [g for g in doc["gates"] if not g["pass"]]
    progress(
        f"wrote {args.out}/fleet.json, fleet.md{'' if args.no_plots else ', fleet-*.png'}; "
        f"{len(doc['gates']) - len(failed)}/{len(doc['gates'])} gates pass; total {doc['timing']['total_s']:.0f} s"
    )
    return 0


def run_fleet(
    params: SimParams,
    profile: str,
    seed: int,
    scenarios: Sequence[str] = ("W1", "W2", "W3", "W5"),
    policies: Sequence[str] = SCALING,
    progress: Callable[[str], None] | None = None,
    w5_variants: Sequence[tuple[str, str]] = W5_VARIANTS,
    seeds: int | None = None,
    arms: Sequence[str] = ARMS,
    gate_sets: Sequence[str] = W5_SEED_GATE_SETS,
) -> FleetRun:
    """Run the benchmark (module docstring)."""
    say = progress or (lambda _msg: None)
    knobs = PROFILES[profile]
    fleet = FleetRun(profile, seed, params)
    t0 = time.perf_counter()
    for sc in ("W1", "W2", "W3"):
        if sc not in scenarios:
            continue
        t = time.perf_counter()
        say(f"== {sc} ({_describe(sc)}), policies {', '.join(policies)}")
        fleet.scenarios[sc] = run(ScenarioConfig(sc, **knobs[sc]), list(policies), seed, params, progress=say)  # type: ignore[arg-type]
        fleet.timing[f"{sc}_s"] = time.perf_counter() - t
    if "W5" in scenarios and seeds is not None:
        t = time.perf_counter()
        chosen = list(range(seed, seed + seeds))
        say(f"== W5 ({_describe('W5')}) over seeds {chosen[0]}..{chosen[-1]}, arms {', '.join(arms)}")
        config = ScenarioConfig("W5", **knobs["W5"])  # type: ignore[arg-type]
        rows = w5seeds.run_w5_seeds(config, chosen, params, arms, w5_seed_variants(gate_sets), say)
        fleet.w5_seeds = w5seeds.document(rows, chosen)
        fleet.timing["W5_seeds_s"] = time.perf_counter() - t
    elif "W5" in scenarios:
        t = time.perf_counter()
        say(f"== W5 ({_describe('W5')}), arms {', '.join(arms)}")
        fleet.w5 = run_w5(ScenarioConfig("W5", **knobs["W5"]), seed, params, arms, say, w5_variants)  # type: ignore[arg-type]
        fleet.timing["W5_s"] = time.perf_counter() - t
    fleet.timing["total_s"] = time.perf_counter() - t0
    return fleet


MERGE_SAME: tuple[str, ...] = ("version", "code_revision", "profile", "params_hash")
"""What every merged run must share: seeds of different code or parameters are not samples of one thing."""


def merge_documents(docs: Sequence[dict[str, Any]], *, across_code: bool = False) -> dict[str, Any]:
    """One ``fleet.json`` document from the W5 ``--seeds`` parts of ``docs`` (``tandem bench fleet-merge``).

    ``across_code`` accepts runs of several code revisions (everything else in :data:`MERGE_SAME` still equal)
    only when every later revision *replays* at least one (seed, canary, gate set, arm) of the first one with an
    identical row (:func:`w5seeds.merge`): a change meant to leave W5's decisions alone has to show it on a
    full-rate seed before its seeds count with the old ones. The merged ``code_revision`` names them all.
    """
    if not docs:
        raise ValueError("nothing to merge")
    for key in MERGE_SAME:
        values = sorted({str(d.get(key)) for d in docs})
        if len(values) > 1 and not (across_code and key == "code_revision"):
            raise ValueError(f"the runs differ in {key}: {', '.join(values)}")
    if any(not d.get("w5_seeds") for d in docs):
        raise ValueError("every input must hold W5 --seeds results (w5_seeds)")
    revisions = list(dict.fromkeys(str(d["code_revision"]) for d in docs))
    if len(revisions) > 1:
        _check_replays(docs, revisions)
    merged = w5seeds.merge([d["w5_seeds"] for d in docs], replays=len(revisions) > 1)
    first = docs[0]
    return {
        **{k: first[k] for k in MERGE_SAME},
        "code_revision": "+".join(revisions),
        "seed": min(merged["seeds"]),
        "scenarios": {},
        "w5": None,
        "w5_seeds": merged,
        "gates": w5seeds.gates(merged),
        "timing": {
            "W5_seeds_s": round(sum(float(d.get("timing", {}).get("W5_seeds_s", 0.0)) for d in docs), 3),
            # a merged file may be merged again (later seeds added): count the runs it already holds
            "runs merged": sum(int(d.get("timing", {}).get("runs merged", 1)) for d in docs),
            "machine": first.get("timing", {}).get("machine", {}),
        },
    }


def _check_replays(docs: Sequence[dict[str, Any]], revisions: Sequence[str]) -> None:
    def rows(d: dict[str, Any]) -> set[tuple[Any, ...]]:
        return {w5seeds.row_key(r) for r in d["w5_seeds"]["runs"]}

    def keys(rev: str) -> set[tuple[Any, ...]]:
        return set().union(*(rows(d) for d in docs if str(d["code_revision"]) == rev))

    def holds(d: dict[str, Any]) -> set[str]:
        # a merged file's code_revision names every revision it holds ("a+b"); git's "+dirty" is not one
        return set(str(d["code_revision"]).split("+")) - {"dirty"}

    # a row in two runs that share a revision is the same run passed twice, not a replay
    for i, a in enumerate(docs):
        for b in docs[i + 1 :]:
            if (shared := holds(a) & holds(b)) and (twice := rows(a) & rows(b)):
                name = w5seeds.key_name(min(twice, key=str))
                raise ValueError(f"{name} is in more than one run of {'+'.join(sorted(shared))}")

    first = keys(revisions[0])
    for rev in revisions[1:]:
        if not keys(rev) & first:
            raise ValueError(
                f"runs of {rev} replay no (seed, canary, gates, arm) that the runs of {revisions[0]} ran: replay "
                "one to show both revisions decide alike"
            )


def cmd_fleet_merge(args: argparse.Namespace) -> int:
    try:
        docs = [json.loads(p.read_text(encoding="utf-8")) for p in args.inputs]
        doc = merge_documents(docs, across_code=args.across_code)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"tandem bench fleet-merge: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (args.out / "fleet.md").write_text(markdown(doc), encoding="utf-8")
    if not args.no_plots:
        w5seeds.plot(doc["w5_seeds"], args.out, _pyplot())
    passed = sum(1 for g in doc["gates"] if g["pass"])
    seeds = len(doc["w5_seeds"]["seeds"])
    print(f"wrote {args.out}/fleet.json, fleet.md: {seeds} seeds, {passed}/{len(doc['gates'])} gates pass")
    return 0


def _describe(sc: str) -> str:
    return {
        "W1": "Mooncake conversation trace x k, prefix-root multiplication",
        "W2": "agentic week from the generator, speed pool",
        "W3": "W2 Monday-Tuesday with Gamma arrivals (CV 2) and a 2x step at Tuesday's peak",
        "W5": "bad canary behind a mirror first step, Tuesday peak window",
    }[sc]


# --- fleet.json ------------------------------------------------------------------------------------------


def w5_document(w5: W5Run) -> dict[str, Any]:
    prep = w5.prepared
    arms = []
    for a in w5.arms:
        arms.append({"arm": a.arm, **a.metrics})
    return {
        "scenario": w5.config.as_dict(),
        "workload": {**prep.info, **prep.workload.totals(), "duration_s": prep.workload.duration_s},
        "fleet_pairs": w5.pairs,
        "pair_shape": list(w5.shape),
        "ttft_p95_target_ms": prep.ttft_target_ms,
        "stable_error_prob": prep.params.policies.stable_error_prob,
        "variants": [list(v) for v in w5.variants],
        "gate_sets": {
            gates: [
                m.name
                for m in build_pool(
                    prep.params, w5.pairs, w5.shape, prep.ttft_target_ms / 1000, gates
                ).spec.rollout.analysis.metrics
            ]
            for gates in dict.fromkeys(g for _, g in w5.variants)
        },
        "arms": arms,
        "pipeline_floor_s": {
            "tandem": _pipeline_floor(prep.params, "tandem"),
            "flagger": _pipeline_floor(prep.params, "flagger"),
        },
    }


def _pipeline_floor(params: SimParams, arm: str) -> float:
    """§7: scrape + window + interval × strikes + act (act = one reconcile pass)."""
    scrape = params.observation.scrape_interval_s
    if arm == "flagger":
        fp = params.policies.flagger
        return scrape + fp.interval_s + fp.interval_s * fp.threshold + params.policies.reconcile_s
    analysis = params.policies.tandem_rollout.get("analysis", {})
    from tandem.api.quantity import parse_duration  # noqa: PLC0415

    interval = parse_duration(str(analysis.get("interval", "30s")))
    delay = parse_duration(str(analysis.get("initialDelay", "0s")))
    strikes = int(analysis.get("failureLimit", 1)) + 1
    return scrape + max(delay, 4 * scrape, interval) + interval * (strikes - 1) + params.policies.reconcile_s


def w5_gates(w5: W5Run) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for a in w5.arms:
        m = a.metrics
        label = f"W5 {m['canary']}/{m['gates']}"
        if m["canary"] == "good":
            out.append(
                {
                    "scenario": "W5",
                    "policy": a.arm,
                    "gate": f"{label}: a good canary is not rolled back",
                    "pass": not m["rolled_back"],
                    "value": "rolled back"
                    if m["rolled_back"]
                    else ("promoted" if m["promoted"] else "not rolled back"),
                }
            )
            continue
        rb = m["rollback_s"]
        floor = m["statistical_floor_s"]
        out.append(
            {
                "scenario": "W5",
                "policy": a.arm,
                "gate": f"{label}: rollback ≤ 2 × statistical floor",
                "pass": bool(m.get("gate_rollback_within_2x_floor")),
                "value": f"rollback {_num(rb, 0)} s, floor {_num(floor, 0)} s",
            }
        )
        out.append(
            {
                "scenario": "W5",
                "policy": a.arm,
                "gate": f"{label}: < 0.1 % of all requests on the bad revision",
                "pass": bool(m.get("gate_bad_share_below_0_1_percent")),
                "value": f"{100 * m['canary_share_of_all_requests']:.3f} %",
            }
        )
    return out


def document(fleet: FleetRun) -> dict[str, Any]:
    """The ``fleet.json`` document (deterministic except ``timing``)."""
    scen: dict[str, Any] = {}
    all_gates: list[dict[str, Any]] = []
    timing: dict[str, Any] = {k: round(v, 3) for k, v in fleet.timing.items()}
    for sc, r in fleet.scenarios.items():
        doc = results(r)
        timing[sc + "_detail"] = doc.pop("timing")
        doc.pop("code_revision", None)
        scen[sc] = doc
        all_gates += [{"scenario": sc, **g} for g in doc["gates"]]
    w5 = None
    if fleet.w5 is not None:
        w5 = w5_document(fleet.w5)
        all_gates += w5_gates(fleet.w5)
        timing["W5_detail"] = {k: round(v, 3) for k, v in fleet.w5.timing.items()}
    if fleet.w5_seeds is not None:
        all_gates += w5seeds.gates(fleet.w5_seeds)
    timing["machine"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
    }
    out: dict[str, Any] = clean(
        {
            "version": FLEET_VERSION,
            "code_revision": code_revision(),
            "profile": fleet.profile,
            "seed": fleet.seed,
            "params_hash": config_hash(fleet.params),
            "scenarios": scen,
            "w5": w5,
            "w5_seeds": fleet.w5_seeds,
            "gates": all_gates,
            "timing": timing,
        }
    )
    return out


def write(fleet: FleetRun, out: Path, plots: bool = True) -> dict[str, Any]:
    """Write ``fleet.json``, ``fleet.md`` and (optionally) ``fleet-*.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    doc = document(fleet)
    (out / "fleet.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out / "fleet.md").write_text(markdown(doc), encoding="utf-8")
    if plots:
        write_plots(fleet, doc, out)
    return doc


# --- fleet.md --------------------------------------------------------------------------------------------


def _num(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _pct(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{100 * v:.{digits}f} %"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _miss_causes(m: dict[str, Any]) -> str:
    """The feasible requests' TTFT misses by cause (``tandem_lab.sim.oracle.ttft_miss_causes``); results
    written before the split have none."""
    causes = m.get("ttft_miss_causes_feasible")
    if not causes:
        return "–"
    return " / ".join(_pct(causes[k], 1) for k in ("cache", "wait", "unserved"))


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows)]


def markdown(doc: dict[str, Any]) -> str:
    """``fleet.md`` from a ``fleet.json`` document."""
    lines: list[str] = [
        f"# Fleet benchmark — profile {doc['profile']}, seed {doc['seed']}",
        "",
        f"Code {doc['code_revision']}, parameters {doc['params_hash']}. Produced by `tandem bench fleet` "
        "(docs/design/007-simulator.md; spec ../shared/docs/benchmarks.md). Every policy of a scenario ran on the "
        "same requests, bounds, warm start, load times and scraped metrics; Tandem's autoscaler and rollout "
        "logic are imported from `tandem.core` unchanged.",
        "",
        "How to read it:",
        "",
        "- **Workload = the speed pool's traffic** (`examples/speed-pool.yaml`: prompts ≤ 131,072 tokens, max "
        "context 262,144, 1 prefill + 1 decode instance of 4 MI325X per pair unless the offline P:D says "
        "otherwise). Longer prompts are *routed to the long-context pool*: counted, not scored.",
        "- **Attainment** is on SLO-feasible requests (those that can meet their TTFT budget on an idle "
        "instance with a perfect cache); TTFT budget 1 s up to 8,192 tokens, 3 s at 262,144, linear between; "
        "TPOT ≤ 16.7 ms.",
        "- **O1 (own)** is the oracle of the work the policy delivered (its feasible requests served within both "
        "SLOs): a provable lower bound on its GPU-hours (never above them). **O1 (all)** is the same bound for "
        "serving every feasible request. Neither includes queueing headroom or the TPOT-limited batch, so "
        "realistic ratios are well above 1. **Model O1** is benchmarks.md §4's planning model (M/D/1 headroom, "
        "TPOT-feasible batch, profiled prefill cost): a realistic floor, not a bound.",
        "- `÷ Bx` = this policy's GPU-hours / Bx's GPU-hours (< 1: cheaper than Bx).",
        "- **TTFT misses** split the feasible requests that missed their TTFT, as shares of all feasible ones: "
        "*cache* (its own prefill with the hits it really got is already over budget: only a warmer cache saves "
        "it), *wait* (queued or shared an instance: capacity or a better spread would have saved it), "
        "*unserved* (rejected, failed or timed out). Only *wait* and *unserved* move with the fleet's size.",
        "",
        "The policies (every one sees the same scraped metrics, load times, router and bounds):",
        "",
        *(f"- {text}" for text in POLICY_WORDS.values()),
        "",
    ]
    for sc, sd in doc["scenarios"].items():
        lines += _scenario_md(sc, sd)
    if doc.get("w5"):
        lines += _w5_md(doc["w5"])
    if doc.get("w5_seeds"):
        lines += w5seeds.markdown(doc["w5_seeds"])
    lines += ["## Gates (start values of benchmarks.md §6)", ""]
    lines += _table(
        ["scenario", "policy", "gate", "value", "verdict"],
        [[g["scenario"], g["policy"], g["gate"], g["value"], "PASS" if g["pass"] else "FAIL"] for g in doc["gates"]],
    )
    lines += ["", *where_tandem_loses(doc), ""]
    lines += ["## Timing (wall clock, informational)", ""]
    t = doc["timing"]
    # wall times are the ``*_s`` keys; anything else (the count of runs merged) has no unit
    lines += [
        f"- {k}: {_num(v, 1)} s" if k.endswith("_s") else f"- {k}: {v}" for k, v in t.items() if not isinstance(v, dict)
    ]
    lines.append(f"- machine: {t.get('machine', {})}")
    lines.append("")
    return "\n".join(lines)


def _scenario_md(sc: str, sd: dict[str, Any]) -> list[str]:
    w = sd["workload"]
    b = sd["bounds"]
    pol = sd["policies"]
    routed = w.get("routed_long_context", {})
    lines = [
        f"## {sc} — {_describe(sc)}",
        "",
        f"{w['requests']:,} speed-pool requests ({w['input_tokens']:,} input, {w['output_tokens']:,} output tokens) "
        f"over {w['duration_s'] / 3600:.1f} simulated hours; {routed.get('requests', 0):,} requests "
        f"({_pct(routed.get('share'), 1)}, {_pct(routed.get('input_token_share'), 1)} of input tokens) routed to the "
        f"long-context pool. SLO-feasible: {_pct(b['slo_feasible_share'], 1)}. Infinite-cache hit bound "
        f"{_pct(b['infinite_cache_hit_ratio'], 1)}; profiled prefill work ×{_num(b['model_prefill_factor'])} of the "
        f"ideal. Tandem's TTFT p95 target: {sd['context']['tandem_ttft_p95_target_ms']} ms (the §6 budget at the "
        f"traffic's p95 input); unloaded p95 TTFT (perfect cache, idle): {_num(b['unloaded_ttft_p95_s'])} s.",
        "",
    ]
    lines += _table(
        [
            "O1 (all) GPUh",
            "O0 (all) GPUh",
            "model O1 GPUh",
            "static peak GPUh",
            "model peak P+D",
            "mean/peak",
            "best unit, tax",
        ],
        [
            [
                _num(b["oracle_full"]["o1_gpuh"], 1),
                _num(b["oracle_full"]["o0_gpuh"], 1),
                _num(b["model_o1_gpuh"], 1),
                _num(b["static_peak_gpuh"], 1),
                f"{b['peak_prefill']}+{b['peak_decode']}",
                _num(b["mean_over_peak"], 3),
                f"{b['best_unit'][0]}:{b['best_unit'][1]}, {_pct(b['ratio_tax_best_unit'], 1)}",
            ]
        ],
    )
    lines.append("")
    names = list(pol)
    head = ["policy", "GPUh", "÷ O1 (own)", "÷ O1 (all)", "÷ model O1"] + [f"÷ {x}" for x in names if x != "tandem"]
    head += ["TTFT", "TPOT", "both", "worst 5 min", "429s", "local / shared hits", "max P+D"]
    rows = []
    for n in names:
        m = pol[n]["metrics"]
        g = m["gpuh"]["total"]
        row = [n, _num(g, 1), _num(m["gpuh_over_o1"]), _num(m["gpuh_over_o1_full"]), _num(m["gpuh_over_model_o1"])]
        row += [_num(g / pol[x]["metrics"]["gpuh"]["total"]) for x in names if x != "tandem"]
        row += [
            _pct(m["ttft_attainment_feasible"]),
            _pct(m["tpot_attainment_feasible"]),
            _pct(m["both_attainment_feasible"]),
            _pct(m["worst_window_both"], 1),
            _num(m["rejected_429"]),
            f"{_pct(m['hit_local'], 1)} / {_pct(m['hit_shared'], 1)}",
            f"{m['max_instances'][0]}+{m['max_instances'][1]}",
        ]
        rows.append(row)
    lines += _table(head, rows)
    lines.append("")
    split_rows = []
    for n in names:
        m = pol[n]["metrics"]
        g = m["gpuh"]
        split_rows.append(
            [n]
            + [_num(g[k], 1) for k in ("prefill", "decode", "loading", "idle")]
            + [
                _num(m["oracle"]["o1_gpuh"], 1),
                _num(m["scale_actions_per_hour"], 1),
                _num(m["gpuh_per_million_good_tokens"], 3),
                _miss_causes(m),
            ]
            + [
                ", ".join(
                    f"{k} {v}" for k, v in sorted(pol[n].get("decision_reasons", {}).items(), key=lambda kv: -kv[1])[:4]
                )
                or "–"
            ]
        )
    lines += _table(
        [
            "policy",
            "prefill busy",
            "decode busy",
            "loading",
            "idle",
            "O1 (own)",
            "scale actions/h",
            "GPUh / M good tokens",
            "TTFT misses: cache / wait / unserved",
            "top decisions",
        ],
        split_rows,
    )
    if any("event_both_attainment" in pol[n]["metrics"] for n in names):
        lines += ["", "Event window (burst): attainment of feasible requests in the 10 minutes after the step."]
        lines += _table(
            ["policy", "attainment in window", "recovered to 99 % (1-min windows) after"],
            [
                [
                    n,
                    _pct(pol[n]["metrics"].get("event_both_attainment")),
                    _num(pol[n]["metrics"].get("event_recovery_s"), 0) + " s",
                ]
                for n in names
            ],
        )
    lines.append("")
    return lines


def _w5_md(w5: dict[str, Any]) -> list[str]:
    wl = w5["workload"]
    lines = [
        f"## W5 — {_describe('W5')}",
        "",
        f"{wl['requests']:,} speed-pool requests over {wl['duration_s'] / 3600:.1f} simulated hours; both arms run "
        f"the same fixed fleet ({w5['fleet_pairs']} pairs of {w5['pair_shape'][0]}P:{w5['pair_shape'][1]}D) and read "
        f"the same scraped metrics; the new revision is applied at the peak. Stable revision engine errors "
        f"{_pct(w5['stable_error_prob'], 1)}. Gate sets (the rollout's analysis metrics; *example* = "
        f"speed-pool.yaml's analysis, TTFT target {w5['ttft_p95_target_ms'] / 1000:.3f} s): "
        + "; ".join(f"*{name}* = {', '.join(metrics)}" for name, metrics in w5.get("gate_sets", {}).items())
        + ". Times in seconds from the "
        "canary's first request or mirror copy; observe = first breaching evaluation, decide = rollback decided, "
        "act = routing table stops sending keys to the canary. Pipeline floor (§7: scrape + window + "
        "interval × strikes + act): "
        f"Tandem {_num(w5['pipeline_floor_s']['tandem'], 0)} s, "
        f"Flagger-like {_num(w5['pipeline_floor_s']['flagger'], 0)} s.",
        "",
    ]
    rows = []
    for a in w5["arms"]:
        rows.append(
            [
                f"{a['canary']}/{a['gates']}",
                a["arm"],
                "rolled back" if a["rolled_back"] else ("promoted" if a["promoted"] else "no decision in window"),
                _num(a["detection_s"], 0),
                f"{_num(a['observe_s'], 0)} / {_num(a['decide_s'], 0)} / {_num(a['act_s'], 0)}",
                _num(a["rollback_s"], 0),
                _num(a["statistical_floor_s"], 0),
                _num(a["requests_on_canary"]),
                _pct(a["canary_share_of_all_requests"], 3),
                f"{_num(a['canary_rps_before_decision'])} → {_num(a['canary_rps_after_decision'])}",
            ]
        )
    lines += _table(
        [
            "canary/gates",
            "arm",
            "outcome",
            "detection",
            "observe / decide / act",
            "rollback",
            "stat. floor",
            "requests on canary",
            "share of all",
            "canary req/s before → after decision",
        ],
        rows,
    )
    lines += ["", "First evaluations (gate: verdict:value vs stable):", ""]
    for a in w5["arms"]:
        ev = a.get("evaluation_log", [])[:3]
        text = "; ".join(f"t={e['t']:.0f} {e['outcome']} {dict(sorted(e['gates'].items()))}" for e in ev) or "none"
        lines.append(f"- {a['canary']}/{a['gates']} {a['arm']}: {text}")
    lines.append("")
    return lines


def _rollback_share(arm: Mapping[str, Any]) -> str:
    """What happened to the bad canary's traffic between the rollback decision and stable being back."""
    before, after = arm.get("canary_rps_before_decision"), arm.get("canary_rps_after_decision")
    if not isinstance(before, int | float) or not isinstance(after, int | float) or before <= 0:
        return ""
    change = f"{_num(before)} → {_num(after)} canary req/s before → after the decision"
    if after > 1.2 * before:
        return (
            "Meanwhile the canary's share *rose* (the routing table split keys by pair count while stable was "
            f"short): {change}."
        )
    return f"Meanwhile the canary kept (at most) its step's weight until stable was back: {change}."


def where_tandem_loses(doc: dict[str, Any]) -> list[str]:
    """The honest section: every place a baseline beats Tandem, and why (from the numbers)."""
    out = ["## Where Tandem loses", ""]
    for sc, sd in doc["scenarios"].items():
        pol = sd["policies"]
        if "tandem" not in pol:
            continue
        t = pol["tandem"]["metrics"]
        tg = t["gpuh"]["total"]
        t_att = t["both_attainment_feasible"]
        dominated, close, better = [], [], []
        for n, p in pol.items():
            if n == "tandem":
                continue
            m = p["metrics"]
            g, a = m["gpuh"]["total"], m["both_attainment_feasible"]
            if a >= t_att + 0.01:
                better.append(f"{n} ({_pct(a)} for {_num(g / tg)} × the GPU-hours)")
            if g < tg and a >= t_att:
                dominated.append(f"{n} ({_num(g, 0)} GPUh, {_num(g / tg)} × Tandem's, at {_pct(a)})")
            elif g < tg and a >= t_att - 0.01:
                close.append(f"{n} ({_num(g / tg)} × the GPU-hours at {_pct(a)})")
        reasons = pol["tandem"].get("decision_reasons", {})
        total = sum(reasons.values()) or 1
        at_max = reasons.get("AtMaxPairs", 0) / total
        wants_more = (
            sum(v for k, v in reasons.items() if k in ("AtMaxPairs", "HoldCapacityPending") or k.startswith("ScaleUp"))
            / total
        )
        target = sd["context"]["tandem_ttft_p95_target_ms"] / 1000.0
        unloaded = sd["bounds"]["unloaded_ttft_p95_s"]
        line = f"- **{sc}**: Tandem {_num(tg, 0)} GPUh at {_pct(t_att)} of feasible requests within both SLOs. "
        if dominated:
            line += f"Dominated by {', '.join(dominated)}. "
        if close:
            line += f"Within one point of its attainment for fewer GPU-hours: {', '.join(close)}. "
        if better and not dominated:
            line += f"Higher attainment, by at least one point: {', '.join(better)}. "
        if not dominated and not close:
            line += (
                "No baseline is cheaper at equal or better attainment; the cheaper ones serve far fewer requests "
                "in SLO. "
            )
        line += (
            f"{_pct(wants_more, 0)} of its decisions asked for more capacity than was Ready (scale-up, capacity "
            f"pending or at maxPairs; {_pct(at_max, 0)} at maxPairs). "
        )
        bound = reasons.get("HoldTTFTServiceBound", 0) / total
        if bound:
            line += (
                f"{_pct(bound, 0)} of its decisions held a TTFT breach with no prefill queue as service-time bound "
                f"(target {target:.3f} s vs {_num(unloaded)} s p95 TTFT on idle instances), leaving the pool to its "
                "load metrics. "
            )
        if unloaded > target and wants_more > 0.5:
            line += (
                f"Why: its TTFT p95 target ({target:.3f} s, the §6 budget at the traffic's p95 input) is below the p95 "
                f"TTFT this traffic has on idle instances with a perfect cache ({_num(unloaded)} s): "
                f"{_pct(1 - sd['bounds']['slo_feasible_share'], 1)} of requests cannot meet their budget at any "
                "capacity (long uncached prefills), so the pool-wide p95 never drops below the target and the "
                "latency rule keeps ordering pairs. A single pool-wide TTFT percentile cannot express a "
                "size-dependent budget."
            )
        out.append(line)
    w5 = doc.get("w5")
    if w5:
        arms = {(a["canary"], a["gates"], a["arm"]): a for a in w5["arms"]}
        ta, fa = arms.get(("errors", "regression", "tandem")), arms.get(("errors", "regression", "flagger"))
        if ta and fa:
            out.append(_w5_errors_line(ta, fa))
        tpot_arms = [a for a in w5["arms"] if a["canary"] == "tpot" and not a["rolled_back"]]
        if tpot_arms:
            verdicts = [
                str(e.get("gates", {}).get("tokens-per-user", ""))
                for a in tpot_arms
                for e in a.get("evaluation_log", [])
                if "tokens-per-user" in e.get("gates", {})
            ]
            judged = [v for v in verdicts if not v.startswith("NoData")]
            out.append(
                "- **W5 TPOT × 1.3 not rolled back** by "
                + ", ".join(f"{a['arm']} ({a['gates']} gates)" for a in tpot_arms)
                + f": of {len(verdicts)} logged `tokens-per-user` verdicts {len(judged)} were judged "
                f"({sum(1 for v in judged if v.startswith('Failure'))} Failure) and "
                f"{len(verdicts) - len(judged)} NoData."
            )
        goods = [a for a in w5["arms"] if a["canary"] == "good" and a["rolled_back"]]
        if goods:
            failing: dict[str, int] = {}
            for a in goods:
                for e in a.get("evaluation_log", []):
                    for gate, verdict in e.get("gates", {}).items():
                        if str(verdict).startswith("Failure"):
                            failing[gate] = failing.get(gate, 0) + 1
            out.append(
                "- **W5 false rollbacks**: "
                + ", ".join(f"{a['arm']} ({a['gates']} gates)" for a in goods)
                + " rolled back a canary identical to stable; failing gates in their logged evaluations: "
                + (", ".join(f"`{g}` × {n}" for g, n in sorted(failing.items())) or "none logged")
                + "."
            )
    return out


def _w5_errors_line(ta: dict[str, Any], fa: dict[str, Any]) -> str:
    """The W5 errors canary under the regression gates, Tandem against Flagger-like, said from the run's
    own numbers (which arm decided, detection and act), not from what an earlier run showed."""
    line = (
        f"- **W5 errors (regression gates)**: the bad revision served {_num(ta['requests_on_canary'])} requests "
        f"under Tandem vs {_num(fa['requests_on_canary'])} under Flagger-like. "
    )
    if ta["rolled_back"] and fa["rolled_back"]:
        line += (
            f"Detection {_num(ta['detection_s'], 0)} s vs {_num(fa['detection_s'], 0)} s, act "
            f"{_num(ta['act_s'], 0)} s vs {_num(fa['act_s'], 0)} s. "
        )
    elif ta["rolled_back"] or fa["rolled_back"]:
        who, other, m = ("Tandem", "Flagger-like", ta) if ta["rolled_back"] else ("Flagger-like", "Tandem", fa)
        line += (
            f"Only {who} rolled it back (detection {_num(m['detection_s'], 0)} s, act {_num(m['act_s'], 0)} s); "
            f"{other} made no decision in the window. "
        )
    else:
        line += "Neither arm rolled it back within the window. "
    return line + (_rollback_share(ta) if ta["rolled_back"] else "")


# --- plots ----------------------------------------------------------------------------------------------


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: an optional dependency, imported only when plotting."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def write_plots(fleet: FleetRun, doc: dict[str, Any], out: Path) -> list[Path]:
    plt = _pyplot()
    paths: list[Path] = []
    scen = doc["scenarios"]
    if scen:
        fig, axes = plt.subplots(1, len(scen), figsize=(5 * len(scen), 4.2), squeeze=False)
        for ax, (sc, sd) in zip(axes[0], scen.items(), strict=True):
            names = list(sd["policies"])
            vals = [sd["policies"][n]["metrics"]["gpuh"]["total"] for n in names]
            own = [sd["policies"][n]["metrics"]["oracle"]["o1_gpuh"] for n in names]
            att = [sd["policies"][n]["metrics"]["both_attainment_feasible"] for n in names]
            bars = ax.bar(names, vals, color=["#4c72b0" if n != "tandem" else "#dd8452" for n in names])
            ax.scatter(names, own, color="black", marker="_", s=400, label="O1 (own served work)", zorder=3)
            ax.axhline(sd["bounds"]["model_o1_gpuh"], color="grey", ls="--", lw=0.9, label="model O1 (§4)")
            ax.axhline(sd["bounds"]["oracle_full"]["o1_gpuh"], color="black", ls=":", lw=0.9, label="O1 (all feasible)")
            for bar, a in zip(bars, att, strict=True):
                ax.text(
                    bar.get_x() + bar.get_width() / 2,
                    bar.get_height(),
                    f"{100 * a:.1f}%",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            ax.set_title(f"{sc}: GPU-hours (label: attainment)")
            ax.set_ylabel("GPU-hours")
            ax.legend(fontsize=7)
        paths.append(_save(fig, out / "fleet-gpuh.png", plt))
    w2 = fleet.scenarios.get("W2")
    if w2 is not None:
        d = w2.bounds.demand
        hours = d.t / 3600.0
        fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
        for ax, role, label in ((axes[0], 0, "prefill"), (axes[1], 1, "decode")):
            ax.plot(hours, d.n_prefill if role == 0 else d.n_decode, color="black", lw=0.8, label="model N*(t)")
            for r in w2.runs:
                res = r.result
                if len(res.samples_t):
                    ax.step(
                        res.samples_t / 3600.0,
                        res.samples[:, role, 1:4].sum(axis=1),
                        where="post",
                        lw=0.9,
                        label=r.policy,
                    )
            ax.set_ylabel(f"{label} instances")
            ax.legend(fontsize=7, ncol=4)
        axes[1].set_xlabel("simulated hours")
        fig.suptitle("W2: instances (loading + ready + draining) per policy vs the planning model's need")
        paths.append(_save(fig, out / "fleet-w2-instances.png", plt))
        fig, ax = plt.subplots(figsize=(11, 4))
        wl = w2.workload
        fl = w2.bounds.floors
        win = w2.params.slo.window_s
        n = max(1, math.ceil(w2.bounds.horizon_s / win))
        for r in w2.runs:
            res = r.result
            ok = (
                (res.status == 0)
                & (res.ttft <= fl.budget_s)
                & ((wl.output_tokens <= 1) | (res.tpot <= w2.params.slo.tpot_s))
            )[fl.feasible]
            idx = np.clip((wl.arrival_s[fl.feasible] // win).astype(np.int64), 0, n - 1)
            tot = np.bincount(idx, minlength=n)
            good = np.bincount(idx, weights=ok.astype(np.float64), minlength=n)
            att = np.divide(good, tot, out=np.full(n, np.nan), where=tot > 0)
            ax.plot(np.arange(n) * win / 3600.0, att, lw=0.8, label=r.policy)
        ax.axhline(0.99, color="grey", ls="--", lw=0.8)
        ax.set_ylim(0.5, 1.005)
        ax.set_xlabel("simulated hours")
        ax.set_ylabel(f"attainment per {win:.0f} s (feasible)")
        ax.legend(fontsize=7, ncol=6)
        ax.set_title("W2: TTFT and TPOT attainment per window")
        paths.append(_save(fig, out / "fleet-w2-attainment.png", plt))
    if fleet.w5 is not None:
        w5 = fleet.w5
        fig, ax = plt.subplots(figsize=(11, 0.6 + 0.45 * len(w5.arms)))
        labels = []
        for i, a in enumerate(w5.arms):
            res = a.result
            rev_i = res.revision_names.index("r2") if "r2" in res.revision_names else -1
            on = (res.revision == rev_i) & (res.unit >= 0)
            t = w5.prepared.workload.arrival_s[on] if rev_i >= 0 else np.zeros(0)
            ax.scatter(t / 60.0, np.full(len(t), i), s=2, color="#dd8452" if a.arm == "tandem" else "#4c72b0")
            m = a.metrics
            for key, mark in (("first_breach_s", "|"), ("decision_s", "x"), ("weight_zero_s", "s")):
                if m.get(key) is not None:
                    ax.scatter([m[key] / 60.0], [i], marker=mark, color="black", s=40)
            labels.append(f"{a.canary}/{m['gates']} {a.arm}")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("simulated minutes (dots: requests on the canary; | first breach, x decision, ■ weight 0)")
        ax.set_title("W5: requests served by the new revision")
        paths.append(_save(fig, out / "fleet-w5.png", plt))
    if doc.get("w5_seeds"):
        paths.append(w5seeds.plot(doc["w5_seeds"], out, plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
