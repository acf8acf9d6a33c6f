"""Fault tier: every test here is marked ``fault`` (fixtures come from tests/support/clusterfix.py and faultlib)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault.faultlib import TcpFault

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before the -m deselection runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.fault)


@pytest.fixture
def tcp_fault() -> Iterator[TcpFault]:
    """A loopback TCP endpoint the test switches between forward, refuse and blackhole (stopped afterwards)."""
    fault = TcpFault()
    fault.start()
    try:
        yield fault
    finally:
        fault.stop()
