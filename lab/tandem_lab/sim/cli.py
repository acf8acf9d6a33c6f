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
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tandem_lab.sim.config import load_params
from tandem_lab.sim.policies import POLICIES, canonical
from tandem_lab.sim.scenarios import SCENARIOS, ScenarioConfig

PROFILES: dict[str, dict[str, float]] = {
    "ci": {"scale": 0.05, "compress": 5.0},
    "full": {"scale": 1.0, "compress": 1.0},
}


def register(subparsers: Any) -> None:
    """Add ``tandem sim`` and its ``run`` sub-command."""
    sim = subparsers.add_parser("sim", help="offline fleet simulator (benchmarks.md)")
    sub = sim.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    run = sub.add_parser("run", help="simulate one scenario for one or more policies")
    run.add_argument("--scenario", choices=SCENARIOS, help="required unless --trace is given (then W1)")
    run.add_argument(
        "--trace",
        type=Path,
        help="W1 on your own trace: a JSONL file in the documented format (timestamp ms, input_length, "
        "output_length, hash_ids per 512-token block)",
    )
    run.add_argument("--scale-to", type=float, metavar="RPS", help="W1: copies = RPS / the trace's mean rate")
    run.add_argument(
        "--decorrelate",
        action="store_true",
        help="W1: shift each copy independently around the trace's span, so copies of one burst do not stack",
    )
    run.add_argument(
        "--policy",
        default="all",
        help=f"comma-separated policy ids or aliases ({', '.join(POLICIES)}), or 'all'",
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--out", type=Path, required=True, help="directory for results.json, summary.md, PNGs")
    run.add_argument("--profile", choices=sorted(PROFILES), help="preset scale/compress")
    run.add_argument("--scale", type=float, help="fraction of the reference fleet's rate (550 req/s peak)")
    run.add_argument("--compress", type=float, help="envelope time compression of generated weeks")
    run.add_argument("--days", type=float, help="envelope days (W2 default 7, W3-W6 default 2)")
    run.add_argument("--copies", type=int, help="W1 prefix-root copies (default from --scale)")
    run.add_argument(
        "--params",
        type=Path,
        help="YAML deep-merged over the shipped params.yaml (e.g. model: {max_context_tokens: 131072})",
    )
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.set_defaults(func=cmd_run)
    sim.set_defaults(func=lambda _args: (sim.print_help(), 2)[1])


def cmd_run(args: argparse.Namespace) -> int:
    from tandem_lab.sim.report import write  # noqa: PLC0415 - keeps `tandem --help` light
    from tandem_lab.sim.runner import run  # noqa: PLC0415

    preset = PROFILES.get(args.profile or "", {})
    scale = args.scale if args.scale is not None else preset.get("scale", 0.05)
    compress = args.compress if args.compress is not None else preset.get("compress", 1.0)
    scenario = args.scenario or ("W1" if args.trace else None)
    if scenario is None:
        print("tandem sim: give --scenario or --trace", file=sys.stderr)
        return 2
    if args.trace is not None and (scenario != "W1" or not args.trace.is_file()):
        print(f"tandem sim: --trace needs an existing file and scenario W1 (got {args.trace})", file=sys.stderr)
        return 2
    if scenario == "W1":
        compress = 1.0
    try:
        names = list(POLICIES) if args.policy == "all" else [canonical(p.strip()) for p in args.policy.split(",")]
        config = ScenarioConfig(
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
        print(f"tandem sim: {exc}", file=sys.stderr)
        return 2
    overrides = yaml.safe_load(args.params.read_text(encoding="utf-8")) if args.params else None
    if overrides is not None and not isinstance(overrides, dict):
        print("tandem sim: --params must hold a mapping", file=sys.stderr)
        return 2
    try:
        params = load_params(overrides=overrides)
    except ValueError as exc:
        print(f"tandem sim: invalid --params: {exc}", file=sys.stderr)
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
