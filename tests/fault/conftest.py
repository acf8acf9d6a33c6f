"""Fault tier (the ``fault`` marker comes from tests/conftest.py).

Fixtures come from tests/support/clusterfix.py and faultlib.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fault.faultlib import TcpFault


@pytest.fixture
def tcp_fault() -> Iterator[TcpFault]:
    """A loopback TCP endpoint the test switches between forward, refuse and blackhole (stopped afterwards)."""
    fault = TcpFault()
    fault.start()
    try:
        yield fault
    finally:
        fault.stop()
