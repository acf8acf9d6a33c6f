"""The ``tandem`` command line: one entry point, one sub-command per feature.

What it owns: argument parsing and dispatch only. Each product feature module exposes
``register(subparsers)`` that adds its sub-command and sets ``func`` (a callable taking the parsed
``argparse.Namespace`` and returning an exit code). Feature modules are imported lazily inside
``main`` so that ``tandem validate`` never pays for importing kopf or the Kubernetes client.

The lab (``tandem-lab``: the simulator, the local cluster, the demo, the benchmarks) is a separate
distribution. Its commands arrive through the entry-point group ``tandem.commands`` (one entry per
top-level command, each a ``register(subparsers)`` callable), so they exist when the lab is installed
and are simply absent from the operator image. The product never imports a lab module; it only knows
the lab's command names, to say where they come from when they are missing.

Exit codes: 0 success, 1 the command ran and found a problem (invalid manifest, failed check),
2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

# Product sub-command modules, in help order, with the top-level commands each registers (a test keeps the
# two in step). Each must define ``register(subparsers) -> None``.
COMMAND_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tandem.api.commands", ("crds", "validate")),
    ("tandem.planview", ("plan",)),
    ("tandem.controller.main", ("run",)),
    ("tandem.rolloutctl", ("rollout",)),
    ("tandem.poolctl", ("get", "version")),
    ("tandem.router.cli", ("router",)),
    ("tandem.evalclient", ("eval",)),
)

# Entry-point group through which other distributions (the lab) add top-level commands.
ENTRY_POINT_GROUP = "tandem.commands"
# The lab's commands, named so that a missing lab is explained rather than reported as a typo.
LAB_COMMANDS: tuple[str, ...] = ("sim", "bench", "demo", "dev")
LAB_HINT = "comes with the lab distribution: pip install ./lab (from a Tandem checkout)"
# Exit code of a command that exists in the lab but is not installed here: a usage problem, like argparse's.
EXIT_NOT_INSTALLED = 2
# Invoked as `kubectl tandem ...`, kubectl runs the `kubectl-tandem` executable found on PATH.
KUBECTL_PLUGIN = "kubectl-tandem"


def _prog() -> str:
    return "kubectl tandem" if os.path.basename(sys.argv[0]) == KUBECTL_PLUGIN else "tandem"


def plugin_commands() -> dict[str, EntryPoint]:
    """The commands other installed distributions register, by name (the first one wins on a clash)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def build_parser(command: str | None = None, unavailable: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """Build the parser from the product's modules and the installed plugins' entry points.

    With ``command`` (a known top-level command) only what registers it is imported: the operator process
    (`tandem run`) then never loads the simulator, numpy or the benchmark code. A lab command that is not
    installed, or whose entry point fails to import, is recorded in ``unavailable`` (command -> why) and
    named in the epilog instead of crashing the help. An ImportError inside a *product* module is
    re-raised: a broken install must fail loudly.
    """
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Tandem: prefill/decode inference fleets on AMD GPU nodes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    product = [name for name, commands in COMMAND_MODULES if command in commands]
    plugins = plugin_commands()
    if command is not None and (product or command in plugins):
        wanted_plugins = [command] if command in plugins else []
    else:
        order = {cmd: i for i, cmd in enumerate(LAB_COMMANDS)}
        product = [name for name, _ in COMMAND_MODULES]
        wanted_plugins = sorted(plugins, key=lambda cmd: (order.get(cmd, len(order)), cmd))
    for name in product:
        importlib.import_module(name).register(subparsers)
    missing: dict[str, str] = {}
    for cmd in wanted_plugins:
        try:
            register: Callable[[Any], None] = plugins[cmd].load()
            register(subparsers)
        except ImportError as exc:  # e.g. the lab without numpy: name it, keep the product's commands usable
            missing[cmd] = f"installed but cannot be imported ({type(exc).__name__}: {exc})"
            subparsers.choices.pop(cmd, None)
    if command is None or command in LAB_COMMANDS:
        for cmd in LAB_COMMANDS:
            if cmd not in plugins and (command is None or command == cmd):
                missing[cmd] = LAB_HINT
    if unavailable is not None:
        unavailable.update(missing)
    if missing:
        parser.epilog = "\n".join(["not installed:", *(f"  {cmd:<8}{why}" for cmd, why in missing.items())])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tandem`` sub-command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    unavailable: dict[str, str] = {}
    parser = build_parser(command, unavailable)
    if command is not None and command in unavailable:
        print(f"{parser.prog}: '{command}' {unavailable[command]}", file=sys.stderr)
        return EXIT_NOT_INSTALLED
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
