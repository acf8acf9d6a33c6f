"""Test tiers: a test's tier is the directory it lives in (testing.md §1), set here and nowhere else.

Why one place: a tier decides what CI runs where and under which lock (heavy tiers need the local control
plane), so a test file that forgot its ``pytestmark``, or a copied conftest hook that drifted, silently
moved tests between tiers. Test files do not set a tier marker; a test that belongs to a second tier as
well (a unit test that also serves a component socket) adds that marker on itself.

A test file in a directory that has no tier fails the collection, so a new directory cannot ship
untiered tests.

Also here, as the suite's one command-line option: ``--update-golden`` rewrites golden files instead of
comparing them (the same as ``TANDEM_UPDATE_GOLDEN=1``, tests/support/golden.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.golden import UPDATE_ENV

TESTS = Path(__file__).resolve().parent

TIERS: dict[str, str] = {
    "unit": "unit",
    "sim": "unit",  # the simulator's own tests are pure, like the unit tier
    "component": "component",
    "contract": "contract",
    "chart": "contract",  # offline `helm template` / `helm lint`: the chart's contract
    "security": "contract",
    "cluster": "cluster",
    "fault": "fault",
    "scale": "scale",
    "realengine": "realengine",
}
"""Top-level directory under tests/ -> tier marker."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help=f"rewrite golden files instead of comparing them (same as {UPDATE_ENV}=1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The environment, not a fixture: golden modules read it at import (tests/cluster/test_chart.py).
    if config.getoption("--update-golden", default=False):
        os.environ[UPDATE_ENV] = "1"


def tier_of(path: Path) -> str | None:
    """The tier of a test file from its first directory under tests/ (None: untiered)."""
    parts = path.relative_to(TESTS).parts
    return TIERS.get(parts[0]) if len(parts) > 1 else None


@pytest.hookimpl(tryfirst=True)  # before the -m deselection runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered: set[str] = set()
    for item in items:
        path = Path(str(item.path)).resolve()
        if TESTS not in path.parents:
            continue  # not ours (a file given on the command line from elsewhere)
        tier = tier_of(path)
        if tier is None:
            untiered.add(str(path.relative_to(TESTS)))
            continue
        item.add_marker(getattr(pytest.mark, tier))
    if untiered:
        raise pytest.UsageError(
            "tests outside a tier directory (add the directory to TIERS in tests/conftest.py): "
            + ", ".join(sorted(untiered))
        )
