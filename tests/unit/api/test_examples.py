"""Every example is a valid manifest: offline validation, models, and yamllint's duplicate keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tandem.api.resources import KIND_BY_NAME
from tandem.api.validate import validate_object
from tests.support.catalog import EXAMPLES, example_files


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in example_files()])
def test_example_validates_offline(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        assert validate_object(doc) == []
        KIND_BY_NAME[doc["kind"]].resource_model.model_validate(doc)


def test_cli_validate_passes_on_all_examples() -> None:
    files = [str(p) for p in example_files()]
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "validate", *files], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_reference_fleet_is_complete() -> None:
    names = {p.stem for p in example_files()}
    assert {"speed-pool", "long-context-pool", "images-pool", "mooncake-cache", "minimal-pool"} <= names
    speed = yaml.safe_load((EXAMPLES / "speed-pool.yaml").read_text())["spec"]
    assert speed["model"]["quantization"] == "fp4"
    assert speed["pairs"]["prefill"] == {"instances": 1, "gpusPerInstance": 4}
    assert speed["pairs"]["decode"] == {"instances": 1, "gpusPerInstance": 4}
    assert speed["autoscaling"]["maxPairs"] >= 95
    assert any("analysis" in s for s in speed["rollout"]["steps"])


def test_examples_have_no_duplicate_keys() -> None:
    root = EXAMPLES.parent
    proc = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", str(root / ".yamllint.yaml"), str(EXAMPLES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout


def test_yamllint_catches_a_duplicate_key(tmp_path: Path) -> None:
    bad = tmp_path / "dup.yaml"
    bad.write_text("a: 1\na: 2\n")
    proc = subprocess.run(
        [sys.executable, "-m", "yamllint", "-c", str(EXAMPLES.parent / ".yamllint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "duplication" in proc.stdout
