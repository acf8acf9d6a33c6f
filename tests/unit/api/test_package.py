"""`import tandem` works from an installed checkout, and Python's own `operator` module is untouched."""

from __future__ import annotations

import subprocess
import sys


def test_tandem_imports_and_stdlib_operator_is_not_shadowed() -> None:
    code = (
        "import operator, sysconfig, tandem, tandem.api.pool; "
        "assert operator.add(2, 3) == 5; "
        "assert operator.__file__.startswith(sysconfig.get_paths()['stdlib']), operator.__file__; "
        "print(tandem.API_VERSION)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert proc.stdout.strip() == "tandem.dev/v1alpha1"


def test_console_script_is_installed() -> None:
    proc = subprocess.run([sys.executable, "-m", "tandem.cli", "--help"], capture_output=True, text=True, check=True)
    assert "validate" in proc.stdout and "crds" in proc.stdout


def test_command_modules_register_exactly_the_commands_they_declare() -> None:
    """`tandem run` imports only the operator's module; the declared map must match what each registers."""
    import argparse  # noqa: PLC0415
    import importlib  # noqa: PLC0415

    from tandem.cli import COMMAND_MODULES, LAB_COMMANDS, build_parser, plugin_commands  # noqa: PLC0415

    declared: set[str] = set()
    for name, commands in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers(dest="command")
        importlib.import_module(name).register(sub)
        assert set(sub.choices) == set(commands), name
        declared |= set(commands)
    for command, entry_point in plugin_commands().items():  # the lab's entry points, one command each
        sub = argparse.ArgumentParser().add_subparsers(dest="command")
        entry_point.load()(sub)
        assert set(sub.choices) == {command}, entry_point.value
        declared.add(command)
    assert set(LAB_COMMANDS) <= declared, "the dev install (make setup) has the lab"
    full = build_parser()
    choices = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(choices) == declared
    for command in ("run", "sim"):
        only = build_parser(command)
        only_choices = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert set(only_choices) == {command}


def test_tandem_run_does_not_import_the_simulator_or_numpy() -> None:
    code = (
        "import sys\n"
        "from tandem.cli import build_parser\n"
        "build_parser('run').parse_args(['run', '--namespace', 'x'])\n"
        "lab = ('numpy', 'tandem_lab', 'matplotlib')\n"
        "print(sorted(m for m in lab if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
