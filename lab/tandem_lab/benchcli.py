"""The ``tandem bench`` command group, shared by the fleet and the controller benchmark.

Why a module of its own: ``tandem bench fleet`` (pure simulator, ``tandem_lab.sim``) and ``tandem bench
controller`` (local cluster, ``tandem.dev``) live in layers that must not import each other, yet
argparse allows one ``bench`` parser with one sub-command action. Whichever registers first creates
it; the other finds and reuses it.
"""

from __future__ import annotations

import argparse
from typing import Any


def bench_subparsers(subparsers: Any) -> Any:
    """The ``bench`` command's sub-command action, created if no other module added ``bench`` yet."""
    existing = subparsers.choices.get("bench") if hasattr(subparsers, "choices") else None
    if existing is not None:
        for action in existing._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
        return existing.add_subparsers(dest="bench_command", metavar="COMMAND")
    bench = subparsers.add_parser("bench", help="benchmarks (benchmarks.md): fleet simulator, controller, router")
    sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND")

    def _help(_args: argparse.Namespace) -> int:
        bench.print_help()
        return 2

    bench.set_defaults(func=_help)
    return sub
