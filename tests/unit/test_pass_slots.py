"""The operator runs at most ``--max-concurrent-passes`` pool passes at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tandem.controller import pools
from tandem.controller.config import OperatorConfig
from tandem.controller.runtime import Runtime
from tandem.reconcile.pool import PassResult


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
        runtime = Runtime(OperatorConfig(), kube=object(), pass_slots=asyncio.Semaphore(2))  # type: ignore[arg-type]
        return list(await asyncio.gather(*(pools.one_pass(runtime, "ns", f"p{i}", 0) for i in range(6))))

    monkeypatch.setattr(pools, "reconcile_pool", fake_pass)
    results = asyncio.run(many())
    assert most == 2
    assert results == [(30.0, 0)] * 6


def test_a_standby_starts_no_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that lost its Lease looks again soon and never calls the reconcile."""
    calls: list[str] = []

    async def fake_pass(*_: Any, **__: Any) -> PassResult:
        calls.append("pass")
        return PassResult(requeue_after=30.0)

    monkeypatch.setattr(pools, "reconcile_pool", fake_pass)
    runtime = Runtime(OperatorConfig(), kube=object(), is_leader=lambda: False)  # type: ignore[arg-type]
    assert asyncio.run(pools.one_pass(runtime, "ns", "p", 3)) == (2.0, 3)
    assert calls == []
