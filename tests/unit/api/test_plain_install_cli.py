"""`tandem` without the lab (the operator image, a plain `pip install tandem-operator`): the CLI works, and
the lab's commands are named in the help, with where they come from, instead of crashing it (issue 13,
item 3; issue 14, item 4).

The missing lab is simulated in a subprocess by emptying the entry-point lookup; a lab that is installed
but cannot import (numpy missing) by a `sys.meta_path` finder that refuses numpy the way a missing package
does. The real product-only install is checked by tests/contract/test_plain_install.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tandem.cli import LAB_COMMANDS, LAB_HINT

REPO = Path(__file__).resolve().parents[3]

BOOTSTRAP = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
import tandem.cli
if {no_lab!r}:
    tandem.cli.plugin_commands = dict
sys.exit(tandem.cli.main(sys.argv[1:]))
"""


def run(*argv: str, blocked: tuple[str, ...] = (), no_lab: bool = True) -> subprocess.CompletedProcess[str]:
    code = BOOTSTRAP.format(blocked=set(blocked), no_lab=no_lab)
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False, cwd=REPO, timeout=120
    )


def listed_commands(help_text: str) -> set[str]:
    commands = help_text.partition("not installed:")[0]
    return {line.split()[0] for line in commands.splitlines() if line.startswith("    ") and line.strip()[0] != "-"}


def test_help_without_the_lab_lists_the_lab_commands_and_where_they_come_from() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    listed = listed_commands(proc.stdout)
    assert {"validate", "crds", "plan", "run", "rollout", "get", "version", "router", "eval"} <= listed
    assert not listed & set(LAB_COMMANDS)
    epilog = proc.stdout.partition("not installed:")[2]
    for command in LAB_COMMANDS:
        assert f"  {command:<8}{LAB_HINT}" in epilog


@pytest.mark.parametrize(
    ("argv", "want_stdout"),
    [
        pytest.param(("validate", "examples/speed-pool.yaml"), "1 file(s) valid", id="validate an example"),
        pytest.param(("run", "--help"), "--namespace", id="run --help"),
        pytest.param(("rollout", "--help"), "exit codes of `status --watch`", id="rollout --help"),
        pytest.param(("router", "--help"), "--routing-table", id="router --help"),
    ],
)
def test_product_commands_without_the_lab_work(argv: tuple[str, ...], want_stdout: str) -> None:
    proc = run(*argv)
    assert proc.returncode == 0, proc.stderr
    assert want_stdout in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("sim",), id="sim"),
        pytest.param(("sim", "live", "--help"), id="sim live"),
        pytest.param(("demo",), id="demo"),
        pytest.param(("bench", "fleet"), id="bench fleet"),
        pytest.param(("dev", "cluster", "up"), id="dev cluster up"),
    ],
)
def test_a_lab_command_without_the_lab_says_so_in_one_line(argv: tuple[str, ...]) -> None:
    proc = run(*argv)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"tandem: '{argv[0]}' {LAB_HINT}\n", "")


def test_a_lab_that_cannot_import_is_named_and_the_product_still_works() -> None:
    """The lab installed without numpy: its commands are named with the import error; the rest works."""
    help_proc = run("--help", blocked=("numpy",), no_lab=False)
    assert help_proc.returncode == 0, help_proc.stderr
    assert "validate" in listed_commands(help_proc.stdout)
    assert "sim     installed but cannot be imported (ModuleNotFoundError: No module named 'numpy')" in help_proc.stdout
    sim = run("sim", "run", "--help", blocked=("numpy",), no_lab=False)
    assert sim.returncode == 2
    assert (
        sim.stderr == "tandem: 'sim' installed but cannot be imported (ModuleNotFoundError: No module named 'numpy')\n"
    )


def test_with_the_lab_its_commands_are_there() -> None:
    proc = run("--help", no_lab=False)
    assert proc.returncode == 0, proc.stderr
    assert set(LAB_COMMANDS) <= listed_commands(proc.stdout)
    assert "not installed:" not in proc.stdout


def test_any_other_missing_import_is_still_an_error() -> None:
    """A broken install (here: no PyYAML, a hard dependency) must fail loudly, not vanish from the help."""
    proc = run("--help", blocked=("yaml",))
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'yaml'" in proc.stderr
