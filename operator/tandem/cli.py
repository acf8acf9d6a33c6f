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
import os
import sys
from collections.abc import Sequence

# Sub-command modules, in help order, with the top-level commands each registers (a test keeps the two in
# step). Each must define ``register(subparsers) -> None``.
COMMAND_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tandem.api.commands", ("crds", "validate")),
    ("tandem.planview", ("plan",)),
    ("tandem.controller.main", ("run",)),
    ("tandem.rolloutctl", ("rollout",)),
    ("tandem.poolctl", ("get", "version")),
    ("tandem.sim.cli", ("sim",)),
    ("tandem.dev.simlive", ("sim",)),  # sim live (after tandem.sim.cli: it adds a sub-command to `sim`)
    ("tandem.dev.cli", ("dev",)),
    ("tandem.dev.demo", ("demo",)),
    ("tandem.sim.bench", ("bench",)),  # bench fleet
    ("tandem.dev.benchctl", ("bench",)),  # bench controller
    ("tandem.dev.routerbench", ("bench",)),  # bench router
    ("tandem.router.cli", ("router",)),
    ("tandem.evalclient", ("eval",)),
)

# Third-party packages of the optional `sim` extra (pyproject.toml; a test keeps the two in step). A command
# module that cannot import one of them is left out of the parser and named in the help epilog instead, so
# a plain `pip install tandem-operator` still has a working `tandem --help`.
OPTIONAL_DEPENDENCIES: frozenset[str] = frozenset({"numpy", "matplotlib"})
EXTRA_HINT = "needs the sim extra: pip install 'tandem-operator[sim]'"
# Exit code of a command that exists but whose extra is not installed: a usage problem, like argparse's.
EXIT_MISSING_EXTRA = 2
# Invoked as `kubectl tandem ...`, kubectl runs the `kubectl-tandem` executable found on PATH.
KUBECTL_PLUGIN = "kubectl-tandem"


def _prog() -> str:
    return "kubectl tandem" if os.path.basename(sys.argv[0]) == KUBECTL_PLUGIN else "tandem"


def build_parser(command: str | None = None, unavailable: dict[str, bool] | None = None) -> argparse.ArgumentParser:
    """Build the parser from the command modules that are importable.

    With ``command`` (a known top-level command) only its modules are imported: the operator process
    (`tandem run`) then never loads the simulator, numpy or the benchmark code (17 MiB of its RSS).
    A module that is missing (a feature not built yet) is skipped, so the CLI stays usable while the
    project grows. A module that needs a package of the `sim` extra which is not installed is skipped
    too, and its commands are recorded in ``unavailable`` (command -> True when no module registered it
    at all, False when only some of its sub-commands are missing) and named in the epilog. Any other
    ImportError *inside* an existing module is re-raised, never hidden.
    """
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Tandem: prefill/decode inference fleets on AMD GPU nodes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [name for name, commands in COMMAND_MODULES if command in commands]
    skipped: list[str] = []
    for name in wanted or [name for name, _ in COMMAND_MODULES]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            if (exc.name or "").partition(".")[0] not in OPTIONAL_DEPENDENCIES:
                raise
            skipped.extend(dict(COMMAND_MODULES)[name])
            continue
        module.register(subparsers)
    missing = {cmd: cmd not in subparsers.choices for cmd in dict.fromkeys(skipped)}
    if unavailable is not None:
        unavailable.update(missing)
    if missing:
        lines = [
            f"  {cmd if whole else cmd + ' (some sub-commands)':<28}{EXTRA_HINT}" for cmd, whole in missing.items()
        ]
        parser.epilog = "\n".join(["not installed:", *lines])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tandem`` sub-command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    unavailable: dict[str, bool] = {}
    parser = build_parser(command, unavailable)
    if command is not None and unavailable.get(command):
        print(f"{parser.prog}: '{command}' {EXTRA_HINT}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        if command in unavailable:  # e.g. `bench fleet` without numpy: say why it is not a choice
            print(f"{parser.prog}: '{command}' (some sub-commands) {EXTRA_HINT}", file=sys.stderr)
        raise
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
