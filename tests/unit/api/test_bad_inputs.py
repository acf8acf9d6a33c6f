"""`tandem validate` rejects every case of the admission bad-input catalog, naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tandem.api.validate import validate_object
from tests.support.catalog import BadInput, case_params, load_cases


@pytest.mark.parametrize("case", case_params())
def test_validate_rejects_bad_input_naming_the_field(case: BadInput) -> None:
    errors = validate_object(case.new, case.old)
    assert errors, f"{case.id} was accepted"
    for want_field, want_text in case.expect:
        matching = [e for e in errors if e.path == want_field and want_text in e.message]
        assert matching, (
            f"{case.id}: no error on {want_field!r} containing {want_text!r}; got {[str(e) for e in errors]}"
        )


@pytest.mark.parametrize("case", case_params(updates_only=True))
def test_update_cases_are_valid_as_creates(case: BadInput) -> None:
    """An immutability case must fail only as an update: the same object is a valid create."""
    assert validate_object(case.old) == []
    assert validate_object(case.new) == []


def test_catalog_covers_every_static_row_of_testing_md() -> None:
    ids = {c.id.split("a")[0].split("b")[0].split("c")[0].split("d")[0] for c in load_cases()}
    static_rows = {f"B-{n:02d}" for n in range(1, 28)} - {"B-20", "B-22"}  # B-20 VAP, B-22 generator test
    assert static_rows <= ids, sorted(static_rows - ids)


def test_cli_validate_exits_1_and_prints_the_field() -> None:
    case = next(c for c in load_cases() if c.id == "B-01")
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "validate", str(case.path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert "spec.pairs.replicas" in proc.stderr
    assert "greater than or equal to 0" in proc.stderr


def test_cli_validate_update_with_old(tmp_path: Path) -> None:
    case = next(c for c in load_cases() if c.id == "B-09b")
    old = tmp_path / "old.yaml"
    new = tmp_path / "new.yaml"
    old.write_text(yaml.safe_dump(case.old))
    new.write_text(yaml.safe_dump(case.new))
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "validate", str(new), "--old", str(old)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "spec.model.quantization" in proc.stderr and "is immutable" in proc.stderr
