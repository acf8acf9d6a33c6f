"""The data plane end to end on the local cluster: the real operator, `tandem router`, engine doubles (issue 15).

Each test applies a pool to KWOK GPU nodes whose pod CIDRs lie inside 127.0.0.0/8, so every address the
operator publishes in the routing table is a loopback address; an engine double listens on each one
(``tests/support/dataplane.py``). `tandem router` runs as a process watching the namespace's routing-table
ConfigMaps, and the operator runs with ``--router-service`` naming it (through an EndpointSlice), so drains
end on the router's open-streams report. Requests go to the router only; what the doubles received and the
router's ``X-Tandem-Pair`` header say where they went, and ``tandem.routing`` says where they should go.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import yaml

from tandem.api.labels import LABEL_PAIR
from tandem.core.plan import canary_share
from tandem.routing import HEADER_REVISION, NO_LOAD, PairState, RoutingTable, routing_key, select_for_table
from tandem.routing.table import CONFIGMAP_KEY
from tandem_lab.dev.enginedouble import Behaviour, EngineDouble, output_tokens, prompt_key
from tandem_lab.dev.kube import Kubectl
from tests.support.dataplane import ROUTER_SERVICE, LoopbackDoubles, RouterProcess, router_endpoint_slice
from tests.support.tandem_cluster import REPO, GpuNodes, OperatorProcess, wait_until

POOL = "speed"
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "cd" * 32
DRAIN_TIMEOUT = "600s"
"""Far longer than any test: a drained pair that goes is gone because the router reported, not the timer."""
HEADER_PAIR = "X-Tandem-Pair"


def pool_manifest(nodes: GpuNodes, replicas: int, version: str = "v1") -> dict[str, Any]:
    obj = copy.deepcopy(yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text()))
    obj["metadata"]["name"] = POOL
    obj["spec"].update(
        {
            "stack": {"version": version, "image": IMAGE.format(tag=version)},
            "pairs": {"replicas": replicas, "drainTimeout": DRAIN_TIMEOUT},
            "placement": {"nodeSelector": nodes.selector},
            "rollout": {
                "maxSurge": 1,
                "maxUnavailable": 0,
                "steps": [{"setCanaryPairs": 1}, {"setWeight": 50}, {"pause": {}}],
            },
        }
    )
    return obj


@dataclass
class Fleet:
    """One pool with its operator, router and doubles."""

    kube: Kubectl
    ns: str
    nodes: GpuNodes
    operator: OperatorProcess
    router: RouterProcess
    doubles: LoopbackDoubles
    model: str

    def table(self) -> RoutingTable | None:
        cm = self.kube.get("configmap", f"{POOL}-routing", namespace=self.ns)
        if cm is None:
            return None
        return RoutingTable.from_json(cm["data"][CONFIGMAP_KEY])

    def wait_table(self, what: str, ok: Any, timeout_s: float = 120) -> RoutingTable:
        """The published table once ``ok(table)``, with doubles on its addresses and the router routing with it."""

        def probe() -> RoutingTable | None:
            table = self.table()
            if table is None or not ok(table):
                return None
            return table

        table = wait_until(what, probe, timeout_s=timeout_s)
        self.doubles.serve(table, self.model)
        fingerprint = table.fingerprint()
        wait_until(
            "the router to route with the published table",
            lambda: self.streams().get("fingerprint") == fingerprint,
            timeout_s=60,
        )
        return table

    def streams(self) -> dict[str, Any]:
        status, body = self.router.admin("/streams")
        assert status == 200, status
        return dict((body or {}).get("pools", {}).get(f"{self.ns}/{POOL}", {}))

    def post(
        self,
        prompt: str,
        *,
        stream: bool = False,
        max_tokens: int = 4,
        timeout: float = 60,
        headers: dict[str, str] | None = None,
    ) -> requests.Response:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        url = f"{self.router.url}/v1/completions"
        return requests.post(url, json=body, timeout=timeout, stream=stream, headers=headers)

    def double(self, table: RoutingTable, pair_id: str, role: str) -> EngineDouble:
        pair = next(p for p in table.pairs if p.id == pair_id)
        endpoint = (pair.prefill if role == "prefill" else pair.decode)[0]
        assert endpoint.address is not None
        return self.doubles.by_address[endpoint.address]

    def pods_of(self, pair_id: str) -> list[dict[str, Any]]:
        pods = self.kube.json("get", "pods", "-n", self.ns, "-l", "tandem.dev/component=engine", "-o", "json")
        return [p for p in pods["items"] if p["metadata"]["labels"].get(LABEL_PAIR) == pair_id]


def serving(n: int) -> Any:
    return lambda t: sum(1 for p in t.pairs if p.state is PairState.SERVING and _addressed(p)) == n


def _addressed(pair: Any) -> bool:
    return all(e.address for e in (*pair.prefill, *pair.decode))


def winner(table: RoutingTable, prompt: str) -> str:
    """The pair ``tandem.routing`` chooses for ``prompt`` on idle loads: what the router must do."""
    loads = {p.id: NO_LOAD for p in table.pairs}
    decision = select_for_table(table, routing_key(prompt, table.hash.prefix_chars), loads)
    assert decision.pair is not None
    return decision.pair.id


@pytest.fixture
def fleet(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any, dev_cluster: Any, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    gpu_nodes.add(3, loopback_pods=True)
    # --allow-revision-header as the chart runs it: the eval Jobs' pin to the canary.
    router = RouterProcess(
        dev_cluster.kubeconfig, ns, name=request.node.name[:60], extra_args=("--allow-revision-header",)
    ).start()
    doubles = LoopbackDoubles()
    try:
        crds.apply(router_endpoint_slice(ns, router.metrics_host, router.metrics_port))
        operator = operator_factory([ns], extra_args=[f"--router-service={ns}/{ROUTER_SERVICE}"])
        obj = pool_manifest(gpu_nodes, replicas=2)
        crds.apply({**obj, "metadata": {**obj["metadata"], "namespace": ns}})
        fleet = Fleet(crds, ns, gpu_nodes, operator, router, doubles, obj["spec"]["model"]["servedName"])
        yield fleet
    finally:
        doubles.stop()
        router.stop()


def test_p_then_d_on_one_pair(fleet: Fleet) -> None:
    table = fleet.wait_table("2 serving pairs", serving(2))
    resp = fleet.post("hello through the router")
    assert resp.status_code == 200, resp.text
    pair = resp.headers[HEADER_PAIR]
    assert pair == winner(table, "hello through the router")
    prefill, decode = fleet.double(table, pair, "prefill"), fleet.double(table, pair, "decode")
    assert [r.kv_transfer_params["do_remote_decode"] for r in prefill.requests] == [True]
    [leg] = decode.requests
    # The decode leg carries what the prefill answered (so it ran second), and one request id spans both.
    assert leg.kv_transfer_params["do_remote_prefill"] is True
    assert leg.kv_transfer_params["remote_engine_id"] == prefill.engine_id
    assert leg.request_id == prefill.requests[0].request_id
    text = resp.json()["choices"][0]["text"]
    assert text == "".join(output_tokens(prompt_key({"prompt": "hello through the router"}), 4))
    assert fleet.doubles.requests() == 2


def test_one_prefix_goes_to_one_pair(fleet: Fleet) -> None:
    table = fleet.wait_table("2 serving pairs", serving(2))
    prefix = "You are a helpful assistant. " * (table.hash.prefix_chars // 29 + 1)
    pairs = {fleet.post(prefix + f"question {i}").headers[HEADER_PAIR] for i in range(8)}
    assert pairs == {winner(table, prefix)}


def test_canary_weight_50_splits_keys_as_the_table_says(fleet: Fleet) -> None:
    fleet.wait_table("2 serving pairs", serving(2))
    obj = pool_manifest(fleet.nodes, replicas=2, version="v2")
    fleet.kube.apply({**obj, "metadata": {**obj["metadata"], "namespace": fleet.ns}})

    def at_weight_50(t: RoutingTable) -> bool:
        """The `setWeight: 50` step published: with surge capacity stable keeps both pairs, so 50 % is capped
        at the canary's share of serving pairs (``core.plan.canary_share``: 1 of 3 → 33 %)."""
        canary = t.revisions.canary
        serving_pairs = [p for p in t.pairs if p.state is PairState.SERVING and _addressed(p)]
        canary_pairs = sum(1 for p in serving_pairs if p.revision == canary)
        return bool(
            canary
            and canary_pairs
            and t.revisions.canary_weight_percent == canary_share(50, canary_pairs, len(serving_pairs))
            and t.revisions.canary_weight_percent > 0
        )

    table = fleet.wait_table("the canary at the setWeight 50 step", at_weight_50)
    by_revision = {p.id: p.revision for p in table.pairs}
    got: dict[str, int] = {}
    for i in range(40):
        prompt = f"user {i}: tell me about canaries"
        resp = fleet.post(prompt)
        assert resp.status_code == 200, resp.text
        assert resp.headers[HEADER_PAIR] == winner(table, prompt), prompt
        got[by_revision[resp.headers[HEADER_PAIR]]] = got.get(by_revision[resp.headers[HEADER_PAIR]], 0) + 1
    assert set(got) == {table.revisions.stable, table.revisions.canary}  # both revisions take keys
    # The eval Job's pin (namespace/pool/revision, as the operator writes it): every key on a canary pair,
    # through its prefill and decode legs.
    canary = {p.id for p in table.pairs if p.revision == table.revisions.canary and p.state is PairState.SERVING}
    pin = {HEADER_REVISION: f"{fleet.ns}/{POOL}/{table.revisions.canary}"}
    for i in range(12):
        resp = fleet.post(f"eval case {i}", headers=pin)
        assert resp.status_code == 200, resp.text
        assert resp.headers[HEADER_PAIR] in canary


def test_one_prefill_rejecting_gives_no_client_error(fleet: Fleet) -> None:
    table = fleet.wait_table("2 serving pairs", serving(2))
    rejecting = table.pairs[0].id
    fleet.double(table, rejecting, "prefill").behaviour = Behaviour(status=429)
    prompts = [f"prompt {i}" for i in range(16)]
    assert any(winner(table, p) == rejecting for p in prompts)
    for prompt in prompts:
        resp = fleet.post(prompt)
        assert resp.status_code == 200, resp.text
        assert resp.headers[HEADER_PAIR] != rejecting
    if table.pairs[0].transfer.connector == "NixlConnector":  # decode only after a prefill succeeded
        assert fleet.double(table, rejecting, "decode").requests == []
    # MooncakeConnector sends both legs at once; the router aborts the decode leg of the refused prefill,
    # and the client only ever sees the pair that served it (the header check above).


def test_engine_dying_mid_stream_is_a_clean_error_without_retry(fleet: Fleet) -> None:
    table = fleet.wait_table("2 serving pairs", serving(2))
    for pair in table.pairs:
        fleet.double(table, pair.id, "decode").behaviour = Behaviour(die_after_tokens=3)
    resp = fleet.post("this stream breaks", stream=True, max_tokens=10)
    assert resp.status_code == 200
    raw = resp.content.decode()
    assert '"stream_broken"' in raw
    assert "[DONE]" not in raw
    assert fleet.doubles.requests() == 2  # one prefill, one decode: no retry after the first byte


def test_draining_pair_gets_nothing_new_and_goes_once_its_stream_ends(fleet: Fleet) -> None:
    table = fleet.wait_table("2 serving pairs", serving(2))
    last = max(table.pairs, key=lambda p: p.index).id  # scale-down drains the highest index first
    prompt = next(p for p in (f"long story {i}" for i in range(200)) if winner(table, p) == last)
    decode = fleet.double(table, last, "decode")
    decode.behaviour = Behaviour(tokens_per_s=1.0)  # 120 tokens: open until the test lets it finish
    stream = fleet.post(prompt, stream=True, max_tokens=120, timeout=300)
    assert stream.status_code == 200 and stream.headers[HEADER_PAIR] == last
    chunks: list[bytes] = []
    first = threading.Event()

    def read() -> None:
        for chunk in stream.iter_content(chunk_size=None):
            chunks.append(chunk)
            first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(30)

    obj = pool_manifest(fleet.nodes, replicas=1)
    fleet.kube.apply({**obj, "metadata": {**obj["metadata"], "namespace": fleet.ns}})
    drained = fleet.wait_table(
        f"{last} draining", lambda t: any(p.id == last and p.state is PairState.DRAINING for p in t.pairs)
    )
    assert fleet.streams()["openStreams"] == {last: 1}  # began before the drain: counted
    prefill = fleet.double(drained, last, "prefill")
    before = len(prefill.requests)
    for i in range(8):
        resp = fleet.post(f"after the drain {i}")
        assert resp.status_code == 200 and resp.headers[HEADER_PAIR] != last
    assert fleet.post(prompt).headers[HEADER_PAIR] != last  # even the key that was its own
    assert len(prefill.requests) == before
    # Several operator passes (it re-reads the router every few seconds) while the stream is open: kept.
    time.sleep(8)
    pods = fleet.pods_of(last)
    assert len(pods) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in pods)

    decode.behaviour.tokens_per_s = 0.0  # let the stream finish (the double reads it per token)
    reader.join(60)
    body = b"".join(chunks).decode()
    assert body.endswith("data: [DONE]\n\n")
    assert fleet.streams().get("openStreams") == {}
    wait_until(f"{last}'s pods deleted (long before drainTimeout {DRAIN_TIMEOUT})", lambda: not fleet.pods_of(last))
    assert "drain finished (routers report no open stream)" in fleet.operator.logs()
