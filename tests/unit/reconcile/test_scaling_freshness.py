"""Autoscaling reads: a pod whose gauge stopped updating is missing, though the answer is stamped now (item 7)."""

from __future__ import annotations

import re

import pytest

from tandem.core.promql import QueryResult, QueryStatus, Series
from tandem.reconcile.pool import Metrics, PoolMemory, observe_scaling
from tests.fakes import prometheus as fp
from tests.support.factories import World, make_nodes, make_pool


def _per_pod(at: float, prefill: float, decode: float) -> QueryResult:
    return QueryResult(
        QueryStatus.OK,
        http_status=200,
        result_type="vector",
        series=(
            Series({"pod": "speed-p0-prefill-0"}, at, repr(prefill)),
            Series({"pod": "speed-p0-decode-0"}, at, repr(decode)),
        ),
    )


@pytest.mark.parametrize(
    ("decode_age_s", "want_decode"),
    [
        pytest.param(0.0, 3.0, id="scraped now"),
        pytest.param(120.0, None, id="last scraped 2 min ago, answer stamped now"),
    ],
)
async def test_observe_scaling_drops_a_pod_whose_gauge_stopped_updating(
    decode_age_s: float, want_decode: float | None
) -> None:
    world = World(make_pool().pairs(1).set("spec.autoscaling", {"enabled": True}).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 1)
    now = world.now.timestamp()
    fake = fp.FakePrometheus(now=lambda: world.now)
    fake.script(re.compile(r"^max by \(pod\) \(vllm:"), fp.raw(_per_pod(now, 3.0, 3.0)))
    fake.script(re.compile(r"^max by \(pod\) \(timestamp\("), fp.raw(_per_pod(now, now, now - decode_age_s)))
    snapshot = await observe_scaling(world.snapshot(), Metrics(default=fake), PoolMemory())
    assert snapshot.scaling_metrics is not None
    got = {(i.role, i.running) for i in snapshot.scaling_metrics.instances}
    assert got == {("prefill", 3.0), ("decode", want_decode)}
