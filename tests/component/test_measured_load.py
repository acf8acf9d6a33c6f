"""Measured model load time through one reconcile: the pool's pods as the API server lists them (a fake that
answers ``list_pods``), read by ``observe_pods``, planned by ``plan_pool``.

The pods carry ``PodScheduled`` and ``Ready`` transition times; the plan records the revision's measured load
time in ``status.revisions.stable.measuredLoadSeconds`` and work planning takes it as its lead time, bounded
by the declared ``capacityProfile.loadTime``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from tandem.api.labels import LABEL_COMPONENT
from tandem.core.autoscale import MetricsSnapshot, PoolSample
from tandem.core.observed import ObservedPod
from tandem.core.plan import Plan, plan_pool
from tandem.reconcile.pool import observe_pods
from tests.support.factories import World, make_nodes, make_pool


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def raw_pod(pod: ObservedPod, bound: datetime, load_s: float, restarts: int = 0) -> dict[str, Any]:
    """``pod`` as the API server returns it: bound at ``bound``, Ready ``load_s`` later."""
    assert pod.node is not None and pod.built_revision is not None
    return {
        "metadata": {
            "name": pod.name,
            "uid": pod.uid,
            "labels": dict(pod.labels),
            "creationTimestamp": _time(bound - timedelta(seconds=20)),
            "ownerReferences": [{"controller": True, "uid": pod.controller_uid, "kind": "InferencePool"}],
        },
        "spec": {
            "nodeName": pod.node,
            "containers": [
                {
                    "name": "engine",
                    "env": [{"name": "TANDEM_REVISION", "value": pod.built_revision}],
                    "resources": {"limits": {"amd.com/gpu": str(pod.gpus)}},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": pod.pod_ip,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _time(bound)},
                {"type": "Ready", "status": "True", "lastTransitionTime": _time(bound + timedelta(seconds=load_s))},
            ],
            "containerStatuses": [{"name": "engine", "restartCount": restarts}],
        },
    }


class PodLister:
    """The one read ``observe_pods`` makes: engine pods by label selector."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.selectors: list[str] = []

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        return self.pods


LOADS = {0: (95, 102), 1: (110, 98), 2: (300, 97)}
"""Per pair: (prefill, decode) seconds from bind to Ready. Pair loads 102, 110, 300: the median is 110 s."""


def world(load_time: str) -> World:
    autoscaling = {
        "enabled": True,
        "minPairs": 1,
        "maxPairs": 8,
        "capacityProfile": {
            "prefill": [{"promptTokens": 8192, "uncachedTokensPerSecond": 16000}],
            "decode": [{"contextTokens": 10000, "streams": 32, "tokensPerSecond": 2000}],
            "loadTime": load_time,
        },
    }
    w = World(make_pool().pairs(3).set("spec.autoscaling", autoscaling).obj(), make_nodes(4))
    w.run_until(lambda x: x.ready_pairs() == 3)
    return w


async def observed_pass(w: World, restarts: int = 0) -> Plan:
    """List the pool's pods with their load times (``restarts`` on every pod), observe and plan one pass."""
    bound = w.now - timedelta(hours=1)
    raw = [
        raw_pod(p, bound, LOADS[p.pair_index or 0][0 if p.role == "prefill" else 1], restarts) for p in w.pods.values()
    ]
    lister = PodLister(raw)
    own, others = await observe_pods(lister, "ns", "speed", "amd.com/gpu")  # type: ignore[arg-type]
    assert lister.selectors == [f"{LABEL_COMPONENT}=engine"] and not others and len(own) == 6
    metrics = MetricsSnapshot(
        pool=PoolSample(request_rate=1.0, prompt_tokens_rate=1000.0, cache_hit_ratio=0.0, generation_tokens_rate=10.0),
        expected_prefill=3,
        expected_decode=3,
    )
    plan = plan_pool(replace(w.snapshot(), pods=tuple(sorted(own, key=lambda p: p.name)), scaling_metrics=metrics))
    w.apply(plan)
    return plan


@pytest.mark.parametrize(
    ("load_time", "want_lead"),
    [
        pytest.param("300s", "110s measured (declared 300s)", id="measured below declared: the lead time"),
        pytest.param("60s", "60s declared (measured 110s)", id="declared bounds it"),
    ],
)
async def test_measured_load_time_is_recorded_and_used_as_lead_time(load_time: str, want_lead: str) -> None:
    w = world(load_time)
    plan = await observed_pass(w)
    stable = plan.status.revisions.stable
    assert stable is not None and stable.measured_load_seconds == 110
    assert plan.status.last_scaling is not None
    assert plan.status.last_scaling.metrics["leadTime"] == want_lead


async def test_measured_load_time_is_kept_when_no_pair_is_measurable_and_written_once() -> None:
    w = world("300s")
    first = await observed_pass(w)
    again = await observed_pass(w)
    assert again.status == first.status  # unchanged pods: nothing new to write
    restarted = await observed_pass(w, restarts=1)  # every Ready transition moved: no first load to measure
    stable = restarted.status.revisions.stable
    assert stable is not None and stable.measured_load_seconds == 110
