"""`tandem` without the `sim` extra (a plain `pip install tandem-operator`): the CLI works, the commands that
need numpy or matplotlib are named in the help instead of crashing it (issue 13, item 3).

The missing extra is simulated in a subprocess by a `sys.meta_path` finder that refuses numpy and
matplotlib the way a missing package does (ModuleNotFoundError with ``name`` set); the real install is
checked by tests/contract/test_plain_install.py.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tandem.cli import EXTRA_HINT, OPTIONAL_DEPENDENCIES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]

BOOTSTRAP = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from tandem.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_blocked(*argv: str, blocked: tuple[str, ...] = ("numpy", "matplotlib")) -> subprocess.CompletedProcess[str]:
    code = BOOTSTRAP.format(blocked=set(blocked))
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False, cwd=REPO, timeout=120
    )


def test_optional_dependencies_are_the_sim_extra() -> None:
    """The CLI's list of optional packages must be the `sim` extra of pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in project["optional-dependencies"]["sim"]}
    assert extra == set(OPTIONAL_DEPENDENCIES)


def test_help_without_the_sim_extra_lists_what_needs_it() -> None:
    proc = run_blocked("--help")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    commands, _, epilog = proc.stdout.partition("not installed:")
    listed = {line.split()[0] for line in commands.splitlines() if line.startswith("    ") and line.strip()[0] != "-"}
    assert {"validate", "crds", "plan", "run", "rollout", "get", "version", "dev", "bench"} <= listed
    assert not listed & {"sim", "demo"}
    assert f"sim                         {EXTRA_HINT}" in epilog
    assert "demo" in epilog and "bench (some sub-commands)" in epilog


@pytest.mark.parametrize(
    ("argv", "want_stdout"),
    [
        pytest.param(("validate", "examples/speed-pool.yaml"), "1 file(s) valid", id="validate an example"),
        pytest.param(("run", "--help"), "--namespace", id="run --help"),
        pytest.param(("rollout", "--help"), "exit codes of `status --watch`", id="rollout --help"),
    ],
)
def test_commands_without_the_sim_extra_work(argv: tuple[str, ...], want_stdout: str) -> None:
    proc = run_blocked(*argv)
    assert proc.returncode == 0, proc.stderr
    assert want_stdout in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "want_stderr"),
    [
        pytest.param(("sim",), f"tandem: 'sim' {EXTRA_HINT}\n", id="sim"),
        pytest.param(("sim", "live", "--help"), f"tandem: 'sim' {EXTRA_HINT}\n", id="sim live"),
        pytest.param(("demo",), f"tandem: 'demo' {EXTRA_HINT}\n", id="demo"),
    ],
)
def test_a_command_that_needs_the_extra_says_so_in_one_line(argv: tuple[str, ...], want_stderr: str) -> None:
    proc = run_blocked(*argv)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, want_stderr, "")


def test_a_partly_available_command_names_the_extra_after_the_usage_error() -> None:
    proc = run_blocked("bench", "fleet")
    assert proc.returncode == 2
    assert "invalid choice: 'fleet'" in proc.stderr
    assert proc.stderr.rstrip().endswith(f"'bench' (some sub-commands) {EXTRA_HINT}")


def test_any_other_missing_import_is_still_an_error() -> None:
    """A broken install (here: no PyYAML, a hard dependency) must fail loudly, not vanish from the help."""
    proc = run_blocked("--help", blocked=("yaml",))
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'yaml'" in proc.stderr
