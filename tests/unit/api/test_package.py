"""`import tandem` works from an installed checkout, and Python's own `operator` module is untouched."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


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
