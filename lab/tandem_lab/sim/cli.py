"""``tandem sim``: run the offline fleet simulator from the command line.

What it owns: argument parsing and progress output only; the work is :func:`tandem_lab.sim.runner.run`
and :func:`tandem_lab.sim.report.write` (a library, so ``make bench`` and live mode can call it directly).

    tandem sim run --scenario W2 --policy all --seed 1 --out bench/results/w2 --scale 0.05 --compress 5
    tandem sim run --scenario W1 --policy tandem,B1 --seed 1 --out /tmp/w1 --scale 0.05
    tandem sim run --profile ci --scenario W2 --policy B1 --out /tmp/w2

``--profile ci`` is the CI sample of benchmarks.md §6 (W1 at 5 % of the fleet rate, k = 7 copies; W2–W6:
``--scale 0.05 --compress 5``, a 1 % sample of the week's requests). Exit codes: 0 ran (gate
verdicts are in the summary), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from tandem_lab.sim.config import SimParams, load_params
from tandem_lab.sim.kvsizing import DEFAULT_MULTIPLES
from tandem_lab.sim.policies import POLICIES, canonical
from tandem_lab.sim.scenarios import SCENARIOS, ScenarioConfig

PROFILES: dict[str, dict[str, float]] = {
    "ci": {"scale": 0.05, "compress": 5.0},
    "full": {"scale": 1.0, "compress": 1.0},
}


def register(subparsers: Any) -> None:
    """Add ``tandem sim`` and its ``run`` and ``kv-tier`` sub-commands."""
    sim = subparsers.add_parser("sim", help="offline fleet simulator (benchmarks.md)")
    sub = sim.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    run = sub.add_parser("run", help="simulate one scenario for one or more policies")
    _workload_args(run)
    run.add_argument(
        "--policy",
        default="all",
        help=f"comma-separated policy ids or aliases ({', '.join(POLICIES)}), or 'all'",
    )
    run.add_argument("--out", type=Path, required=True, help="directory for results.json, summary.md, PNGs")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.set_defaults(func=cmd_run)
    tier = sub.add_parser(
        "kv-tier",
        help="size the shared KV tier (Mooncake) for a workload: hits and TTFT ceiling by tier size",
        description="Feeds one LRU shared tier with every request in arrival order at several multiples of "
        "the configured tier (params shared_tier) and prints, per size, the hit share, the seconds of unique "
        "prefixes it holds, and the TTFT ceiling: the share of SLO-feasible requests still feasible with "
        "those hits (tandem_lab.sim.kvsizing).",
    )
    _workload_args(tier)
    tier.add_argument(
        "--multiples",
        default=",".join(f"{m:g}" for m in DEFAULT_MULTIPLES),
        help="comma-separated multiples of the configured tier (default %(default)s)",
    )
    tier.add_argument("--target", type=float, default=99.0, help="TTFT ceiling to size for, percent (default 99)")
    tier.add_argument("--json", type=Path, help="also write the curve as JSON here")
    tier.set_defaults(func=cmd_kv_tier)
    sim.set_defaults(func=lambda _args: (sim.print_help(), 2)[1])


def _workload_args(parser: argparse.ArgumentParser) -> None:
    """The arguments that choose a workload and parameters (``run`` and ``kv-tier`` build the same one)."""
    parser.add_argument("--scenario", choices=SCENARIOS, help="required unless --trace is given (then W1)")
    parser.add_argument(
        "--trace",
        type=Path,
        help="W1 on your own trace: a JSONL file in the documented format (timestamp ms, input_length, "
        "output_length, hash_ids per 512-token block)",
    )
    parser.add_argument("--scale-to", type=float, metavar="RPS", help="W1: copies = RPS / the trace's mean rate")
    parser.add_argument(
        "--decorrelate",
        action="store_true",
        help="W1: shift each copy independently around the trace's span, so copies of one burst do not stack",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", choices=sorted(PROFILES), help="preset scale/compress")
    parser.add_argument("--scale", type=float, help="fraction of the reference fleet's rate (550 req/s peak)")
    parser.add_argument("--compress", type=float, help="envelope time compression of generated weeks")
    parser.add_argument("--days", type=float, help="envelope days (W2 default 7, W3-W6 default 2)")
    parser.add_argument("--copies", type=int, help="W1 prefix-root copies (default from --scale)")
    parser.add_argument(
        "--params",
        type=Path,
        help="YAML deep-merged over the shipped params.yaml (e.g. model: {max_context_tokens: 131072})",
    )


class _UsageError(Exception):
    """A bad command line: printed as ``tandem sim: …``, exit 2."""


def _config(args: argparse.Namespace) -> ScenarioConfig:
    """The scenario of ``args`` (scale and compression from ``--profile`` unless given)."""
    preset = PROFILES.get(args.profile or "", {})
    scale = args.scale if args.scale is not None else preset.get("scale", 0.05)
    compress = args.compress if args.compress is not None else preset.get("compress", 1.0)
    scenario = args.scenario or ("W1" if args.trace else None)
    if scenario is None:
        raise _UsageError("give --scenario or --trace")
    if args.trace is not None and (scenario != "W1" or not args.trace.is_file()):
        raise _UsageError(f"--trace needs an existing file and scenario W1 (got {args.trace})")
    if scenario == "W1":
        compress = 1.0
    try:
        return ScenarioConfig(
            scenario,
            scale=scale,
            compress=compress,
            days=args.days,
            copies=args.copies,
            trace_file=str(args.trace) if args.trace else None,
            scale_to_rps=args.scale_to,
            decorrelate=args.decorrelate,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc


def _multiples(text: str) -> list[float]:
    try:
        values = [float(m) for m in text.split(",") if m.strip()]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(m) or m <= 0 for m in values):
        raise _UsageError(f"--multiples must be comma-separated numbers > 0 (got {text!r})")
    return values


def _params(args: argparse.Namespace) -> SimParams:
    """The shipped parameters with ``--params`` deep-merged over them."""
    try:
        overrides = yaml.safe_load(args.params.read_text(encoding="utf-8")) if args.params else None
    except (OSError, yaml.YAMLError) as exc:
        raise _UsageError(f"cannot read --params {args.params}: {exc}") from exc
    if overrides is not None and not isinstance(overrides, dict):
        raise _UsageError("--params must hold a mapping")
    try:
        return load_params(overrides=overrides)
    except ValueError as exc:
        raise _UsageError(f"invalid --params: {exc}") from exc


def cmd_run(args: argparse.Namespace) -> int:
    from tandem_lab.sim.report import write  # noqa: PLC0415 - keeps `tandem --help` light
    from tandem_lab.sim.runner import run  # noqa: PLC0415

    try:
        names = list(POLICIES) if args.policy == "all" else [canonical(p.strip()) for p in args.policy.split(",")]
        config = _config(args)
        params = _params(args)
    except (_UsageError, ValueError) as exc:
        print(f"tandem sim: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:7.1f} s] {message}", flush=True)

    if config.scenario == "W5":
        print("tandem sim: W5 runs rollout policies: use `tandem bench fleet --scenarios W5`", file=sys.stderr)
        return 2
    result = run(config, names, args.seed, params, progress=progress)
    doc = write(result, args.out, plots=not args.no_plots)
    failed = [g for g in doc["gates"] if not g["pass"]]
    progress(
        f"wrote {args.out}/results.json and summary.md; "
        f"{len(doc['gates']) - len(failed)}/{len(doc['gates'])} gates pass"
    )
    return 0


def cmd_kv_tier(args: argparse.Namespace) -> int:
    """Print the shared tier's curve (:func:`tandem_lab.sim.kvsizing.tier_curve`) and the smallest size that
    reaches ``--target``."""
    from tandem_lab.sim.kvsizing import tier_curve  # noqa: PLC0415 - keeps `tandem --help` light
    from tandem_lab.sim.physics import Roofline  # noqa: PLC0415
    from tandem_lab.sim.runner import stream  # noqa: PLC0415
    from tandem_lab.sim.scenarios import build_workload  # noqa: PLC0415

    try:
        multiples = _multiples(args.multiples)
        if not 0 < args.target <= 100:
            raise _UsageError(f"--target is a percent in (0, 100] (got {args.target:g})")
        config = _config(args)
        params = _params(args)
    except _UsageError as exc:
        print(f"tandem sim: {exc}", file=sys.stderr)
        return 2
    built = build_workload(config, params, stream(args.seed, "arrivals"), stream(args.seed, "generator"))
    wl = built.workload
    print(
        f"{config.scenario}: {len(wl):,} requests over {wl.duration_s / 3600:.1f} h; feeding the tier ...", flush=True
    )
    curve = tier_curve(wl, params, Roofline.from_params(params), config.scale, multiples)
    tib = float(2**40)
    print(
        f"infinite cache: {curve.infinite_hit_share:.1%} of prompt tokens hit; {curve.feasible_requests:,} "
        f"SLO-feasible requests; {curve.unique_blocks:,} unique blocks"
    )
    print("| tier × | at this run | at fleet scale | token hits | holds (s of unique prefixes) | TTFT ceiling |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in curve.points:
        print(
            f"| {p.multiple:g} | {p.run_bytes / tib:.2f} TiB | {p.fleet_bytes / tib:.1f} TiB | {p.hit_share:.1%} "
            f"| {p.horizon_s:,.0f} | {p.ttft_ceiling:.2%} |"
        )
    best = curve.smallest(args.target / 100.0)
    if best is None:
        print(f"no size tried reaches a TTFT ceiling of {args.target:g} %: try larger --multiples")
    else:
        size = f"× {best.multiple:g} ({best.fleet_bytes / tib:.1f} TiB at fleet scale)"
        print(f"smallest tier tried with a TTFT ceiling ≥ {args.target:g} %: {size}")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(curve), indent=2) + "\n", encoding="utf-8")
    return 0
