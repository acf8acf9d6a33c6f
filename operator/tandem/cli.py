"""The ``tandem`` command line: one entry point, one sub-command per feature.

What it owns: argument parsing and dispatch only. Each feature module exposes
``register(subparsers)`` that adds its sub-command and sets ``func`` (a callable taking the parsed
``argparse.Namespace`` and returning an exit code). Feature modules are imported lazily inside
``main`` so that ``tandem validate`` never pays for importing kopf or the Kubernetes client.

Exit codes: 0 success, 1 the command ran and found a problem (invalid manifest, failed check),
2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Sub-command modules, in help order, with the top-level commands each registers (a test keeps the two in
# step). Each must define ``register(subparsers) -> None``.
COMMAND_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tandem.api.commands", ("crds", "validate")),
    ("tandem.planview", ("plan",)),
    ("tandem.operator_main", ("run",)),
    ("tandem.rolloutctl", ("rollout",)),
    ("tandem.sim.cli", ("sim",)),
    ("tandem.dev.simlive", ("sim",)),  # sim live (after tandem.sim.cli: it adds a sub-command to `sim`)
    ("tandem.dev.cli", ("dev",)),
    ("tandem.dev.demo", ("demo",)),
    ("tandem.sim.bench", ("bench",)),  # bench fleet
    ("tandem.dev.benchctl", ("bench",)),  # bench controller
    ("tandem.router.cli", ("router",)),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the parser from the command modules that are importable.

    With ``command`` (a known top-level command) only its modules are imported: the operator process
    (`tandem run`) then never loads the simulator, numpy or the benchmark code (17 MiB of its RSS).
    A module that is missing (a feature not built yet) is skipped, so the CLI stays usable while the
    project grows; an ImportError *inside* an existing module is re-raised, never hidden.
    """
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: prefill/decode inference fleets on AMD GPU nodes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [name for name, commands in COMMAND_MODULES if command in commands]
    for name in wanted or [name for name, _ in COMMAND_MODULES]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tandem`` sub-command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
