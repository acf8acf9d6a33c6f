"""The operator runs at most ``--max-concurrent-passes`` pool passes at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tandem import operator_main as om
from tandem.reconcile.pool import PassResult

pytestmark = pytest.mark.unit


def test_at_most_max_concurrent_passes_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    running = 0
    most = 0

    async def fake_pass(*_: Any, **__: Any) -> PassResult:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return PassResult(requeue_after=30.0)

    async def many() -> list[tuple[float, int]]:
        monkeypatch.setattr(om.RUNTIME, "pass_slots", asyncio.Semaphore(2))
        return list(await asyncio.gather(*(om._one_pass("ns", f"p{i}", 0) for i in range(6))))

    monkeypatch.setattr(om, "reconcile_pool", fake_pass)
    monkeypatch.setattr(om.RUNTIME, "kube", object())
    results = asyncio.run(many())
    assert most == 2
    assert results == [(30.0, 0)] * 6
