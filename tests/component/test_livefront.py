"""The demo's data plane: the live model's arrivals go through a real `tandem router` to paced doubles.

An in-process router reads a table file naming four loopback addresses (two pairs); the live model
(external routing) reads the same table and pods from a fake kubectl; :class:`LiveFront` serves doubles on
those addresses and sends every arrival to the router. What must hold: every request completes through the
router, both pairs serve (the router's hash, not the model's), the model's pods count exactly what the
router sent them, and conversations find their prefixes (the router keys the prompt's first two blocks).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem.api.labels import (
    COMPONENT_ENGINE,
    COMPONENT_ROUTING,
    LABEL_COMPONENT,
    LABEL_PAIR,
    LABEL_POOL,
    LABEL_REVISION,
    LABEL_ROLE,
)
from tandem.router.proxy import RouterConfig
from tandem.router.server import start_router
from tandem.router.tables import FileSource
from tandem.routing import (
    CONFIGMAP_KEY,
    Admission,
    Endpoint,
    KvTransfer,
    Pair,
    PairState,
    Revisions,
    RoutingTable,
)
from tandem.routing.table import DEFAULT_PAIR_WEIGHT
from tandem_lab.dev.livefront import LiveFront
from tandem_lab.dev.ports import free_port
from tandem_lab.dev.simlive import LiveMetrics
from tandem_lab.sim.config import load_params
from tandem_lab.sim.live import TTFT, LiveOptions
from tests.sim.test_live import sessions_workload

NS = "ml"
MODEL = "m"


def fleet(connector: str, mirror: bool = False) -> tuple[RoutingTable, list[dict[str, Any]]]:
    """Two 1P+1D pairs on 127.77.<run>.{1..4} (one port; loopback addresses are ours), and their pods. ``mirror``:
    the second pair is a canary (``r2``) at 0 % of keys whose table mirrors it (a ``setMirrorPairs`` step)."""
    port, boot = free_port(), free_port()
    run = port % 250
    kv = KvTransfer(connector=connector, bootstrap_port=boot)
    pairs, pods = [], []
    for i in range(2):
        endpoints = {}
        for j, role in enumerate(("prefill", "decode")):
            name = f"speed-p{i}-{role}-0"
            endpoints[role] = (Endpoint(pod=name, address=f"127.77.{run}.{2 * i + j + 1}:{port}"),)
            labels = {
                LABEL_COMPONENT: COMPONENT_ENGINE,
                LABEL_ROLE: role,
                LABEL_POOL: "speed",
                LABEL_REVISION: _revision(i, mirror),
                LABEL_PAIR: f"speed-p{i}",
            }
            pods.append(
                {
                    "kind": "Pod",
                    "metadata": {"name": name, "uid": f"u-{name}", "labels": labels},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
        pairs.append(
            Pair(
                id=f"speed-p{i}",
                index=i,
                revision=_revision(i, mirror),
                weight=0 if mirror and i == 1 else DEFAULT_PAIR_WEIGHT,
                state=PairState.SERVING,
                prefill=endpoints["prefill"],
                decode=endpoints["decode"],
                kv_transfer=kv,
            )
        )
    table = RoutingTable(
        pool="speed",
        namespace=NS,
        traffic_class="speed",
        admission=Admission(max_in_flight=64, max_queued=16),
        revisions=(
            Revisions(stable="r1", canary="r2", canary_weight_percent=0, canary_mirror=True)
            if mirror
            else Revisions(stable="r1")
        ),
        pairs=tuple(pairs),
        served_model_name=MODEL,
    )
    configmap = {
        "kind": "ConfigMap",
        "metadata": {"name": "speed-routing", "labels": {LABEL_COMPONENT: COMPONENT_ROUTING}},
        "data": {CONFIGMAP_KEY: table.to_json()},
    }
    return table, [configmap, *pods]


def _revision(i: int, mirror: bool) -> str:
    return "r2" if mirror and i == 1 else "r1"


class FakeKube:
    """``kubectl get pods,configmaps -o json`` of one namespace, fixed."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def json(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"items": self.items}


def live_model(items: list[dict[str, Any]], *, sessions: int, turns: int) -> LiveMetrics:
    """The live model on ``items``, its arrivals left to a LiveFront (25 conversations' turns per second)."""
    return LiveMetrics(
        FakeKube(items),  # type: ignore[arg-type]
        [NS],
        None,
        workload=sessions_workload(sessions=sessions, turns=turns),
        options=LiveOptions(rate=25.0, seed=5, key_blocks=1, capacity_scale=4.0, external_routing=True),
        params=load_params(),
        poll_interval_s=0.5,
    ).start()


async def _send_then_drain(front: LiveFront, live: LiveMetrics, count: int) -> None:
    """Let ``count`` client requests end, stop the arrivals, then let every request in flight finish (so the
    client, the router and the model count the same requests)."""
    for _ in range(300):
        if sum(front.outcome_counts().values()) >= count:
            break
        await asyncio.sleep(0.1)
    live.set_rate(0.0)
    for _ in range(300):
        if front.in_flight() == 0 and not live.fleet.outbox:
            break
        await asyncio.sleep(0.1)


async def _router_samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The router's ``name`` samples (labels, value) from its /metrics."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        text = await resp.text()
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


@pytest.mark.parametrize("connector", ["NixlConnector", "MooncakeConnector", "MoRIIOConnector"])
async def test_the_live_models_arrivals_complete_through_the_router(tmp_path: Path, connector: str) -> None:
    table, items = fleet(connector)
    path = tmp_path / "speed-routing.json"
    path.write_text(table.to_json())
    router = await start_router([FileSource([path], interval_s=3600)], config=RouterConfig(prefill_timeout_s=10))
    live = live_model(items, sessions=60, turns=4)
    front = LiveFront(live, f"http://127.0.0.1:{router.port}", model=MODEL).start()
    try:
        await _send_then_drain(front, live, 80)
        outcomes = front.outcome_counts()
        assert sum(outcomes.values()) >= 80, outcomes
        assert set(outcomes) == {"ok"}, outcomes
        stats = live.stats()
        served = {}
        for i in range(2):
            metrics = live.fleet.pod_metrics(NS, f"speed-p{i}-decode-0")
            assert metrics is not None
            served[i] = metrics.histograms[TTFT].count
        assert all(n > 0 for n in served.values()), served  # the router's hash spread the conversations
        assert sum(served.values()) == stats.completed >= outcomes["ok"]
        assert stats.prefix_hits > 0  # later turns found their conversation's blocks on the same prefill
        url = f"http://127.0.0.1:{router.metrics_port}/metrics"
        oks = await _router_samples(url, "tandem_router_requests_total")
        by_pair = {labels["pair"]: value for labels, value in oks if labels["outcome"] == "ok"}
        assert sum(by_pair.values()) == outcomes["ok"]  # the router served every request the client saw complete
        assert set(by_pair) == {"speed-p0", "speed-p1"}
    finally:
        front.stop()
        live.stop()
        await router.stop()


async def test_a_mirrored_canary_pair_is_paced_and_counted_by_the_live_model(tmp_path: Path) -> None:
    """The router's mirror copies (``live-<n>-mirror``) reach the live model as copies of request n: the canary
    pair's pods run and count them (what the gates read), the users' answers all come from stable, and the
    model's client counters count each user request once."""
    table, items = fleet("NixlConnector", mirror=True)
    path = tmp_path / "speed-routing.json"
    path.write_text(table.to_json())
    router = await start_router([FileSource([path], interval_s=3600)], config=RouterConfig(prefill_timeout_s=10))
    live = live_model(items, sessions=60, turns=4)
    front = LiveFront(live, f"http://127.0.0.1:{router.port}", model=MODEL).start()
    url = f"http://127.0.0.1:{router.metrics_port}/metrics"
    try:
        await _send_then_drain(front, live, 80)
        copies: dict[str, float] = {}
        for _ in range(100):  # copies end after their users' answers
            copies = {
                labels["outcome"]: value
                for labels, value in await _router_samples(url, "tandem_router_mirror_requests_total")
            }
            canary = live.fleet.pod_metrics(NS, "speed-p1-decode-0")
            assert canary is not None
            if copies.get("ok", 0) > 0 and canary.histograms[TTFT].count == copies.get("ok"):
                break
            await asyncio.sleep(0.1)
        outcomes = front.outcome_counts()
        assert set(outcomes) == {"ok"} and sum(outcomes.values()) >= 80, outcomes
        assert copies.get("ok", 0) > 0 and set(copies) <= {"ok", "skipped_full"}, copies
        canary = live.fleet.pod_metrics(NS, "speed-p1-decode-0")
        stable = live.fleet.pod_metrics(NS, "speed-p0-decode-0")
        assert canary is not None and stable is not None
        assert canary.histograms[TTFT].count == copies["ok"]  # the canary's engine counted every copy
        assert stable.histograms[TTFT].count == live.stats().completed == outcomes["ok"]  # users: stable only
    finally:
        front.stop()
        live.stop()
        await router.stop()


async def test_client_errors_are_named_by_their_exception() -> None:
    """With no router listening every request fails to connect, and the demo's outcome counts say how
    (``error-ClientConnectorError``), not a bare ``error`` nobody can explain."""
    _, items = fleet("NixlConnector")
    live = live_model(items, sessions=20, turns=2)
    front = LiveFront(live, f"http://127.0.0.1:{free_port()}", model=MODEL).start()
    try:
        for _ in range(300):
            if sum(front.outcome_counts().values()) >= 10:
                break
            await asyncio.sleep(0.1)
        outcomes = front.outcome_counts()
        assert sum(outcomes.values()) >= 10, outcomes
        assert set(outcomes) == {"error-ClientConnectorError"}, outcomes
    finally:
        front.stop()
        live.stop()
