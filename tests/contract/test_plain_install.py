"""A plain `pip install` of the repository installs the product alone (the `tandem-operator` distribution,
what the image installs) and gives a working CLI (issue 13, item 3; issue 14, item 4): the help, an
offline validation and the operator's own command run without a traceback, no lab module, numpy or
matplotlib is installed, the lab's commands say where they come from, and the `kubectl-tandem` plugin
executable is there.

Needs PyPI (or a configured index) for the runtime dependencies; pip's cache makes a rerun fast.
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from tandem.cli import LAB_HINT

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plain-install") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    proc = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=INSTALL_TIMEOUT_S,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def run(venv_root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv_root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO, env=env, timeout=120)


@pytest.mark.parametrize(
    ("argv", "want_stdout"),
    [
        pytest.param(("tandem", "--help"), LAB_HINT, id="help"),
        pytest.param(("tandem", "validate", "examples/speed-pool.yaml"), "1 file(s) valid", id="validate example"),
        pytest.param(("tandem", "run", "--help"), "--namespace", id="run --help"),
        pytest.param(("kubectl-tandem", "--help"), "usage: kubectl tandem", id="kubectl plugin help"),
        pytest.param(("tandem", "version", "--kubeconfig", "/nonexistent"), "Client Version: 0.", id="version"),
    ],
)
def test_plain_install_cli_works(plain_venv: Path, argv: tuple[str, ...], want_stdout: str) -> None:
    proc = run(plain_venv, str(plain_venv / "bin" / argv[0]), *argv[1:])
    assert proc.returncode == 0, proc.stderr
    assert want_stdout in proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("module", ["numpy", "matplotlib", "tandem_lab", "tandem.sim", "tandem.dev"])
def test_plain_install_has_no_lab(plain_venv: Path, module: str) -> None:
    proc = run(plain_venv, str(plain_venv / "bin" / "python"), "-c", f"import {module}")
    assert proc.returncode == 1
    assert f"No module named '{module}'" in proc.stderr


def test_the_installed_product_holds_no_lab_file(plain_venv: Path) -> None:
    """The distribution's file list (what a wheel of `tandem-operator` carries) has no lab path."""
    code = "from importlib.metadata import files; print('\\n'.join(str(f) for f in files('tandem-operator')))"
    proc = run(plain_venv, str(plain_venv / "bin" / "python"), "-c", code)
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert any(p.startswith("tandem/cli.py") for p in paths)
    assert not [p for p in paths if p.startswith(("tandem_lab/", "tandem/sim/", "tandem/dev/"))]


def test_a_lab_command_says_where_it_comes_from(plain_venv: Path) -> None:
    proc = run(plain_venv, str(plain_venv / "bin" / "tandem"), "sim", "run")
    assert (proc.returncode, proc.stderr) == (2, f"tandem: 'sim' {LAB_HINT}\n")
