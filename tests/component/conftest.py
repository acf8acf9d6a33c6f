"""Fixtures shared by the router's component tests: a `Lab` of engine doubles and routers, an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.component.test_router import Lab


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        await lab.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session
