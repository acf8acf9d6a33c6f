"""A plain `pip install` of the repository (no extras, no dependency group) gives a working CLI (issue 13,
item 3): the help, an offline validation and the operator's own command run without a traceback, numpy
is not installed, and the `kubectl-tandem` plugin executable is there.

Needs PyPI (or a configured index) for the runtime dependencies; pip's cache makes a rerun fast.
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

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
        pytest.param(("tandem", "--help"), "needs the sim extra: pip install 'tandem-operator[sim]'", id="help"),
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


def test_plain_install_has_no_numpy(plain_venv: Path) -> None:
    proc = run(plain_venv, str(plain_venv / "bin" / "python"), "-c", "import numpy")
    assert proc.returncode == 1
    assert "No module named 'numpy'" in proc.stderr
