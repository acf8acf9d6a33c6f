"""The chart's NetworkPolicies for engine, Mooncake and eval pods, evaluated against the pods the builders make.

Issue 19 class 8: vLLM and Mooncake ports have no authentication. The policies are rendered from
``ci/full-values.yaml`` (three served namespaces, cache namespace ``mooncake``, router on) and evaluated
with ``tests.support.netpol`` (NetworkPolicy semantics in Python: no CNI here) over pods built by
``tandem.builders`` exactly as the operator builds them, plus the router pod template, a Prometheus pod
and strangers. Two questions: does each policy select exactly the pods it is for, and which peers may
connect on which ports. The same checks run against the applied objects in tests/cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tandem.api.cache import MooncakeCacheSpec
from tandem.api.pool import EvalGate
from tandem.api.revision import revision_spec
from tandem.builders import mooncake as mc
from tandem.builders.evaljob import build_eval_job
from tandem.builders.pods import ENGINE_PORT, MOONCAKE_BOOTSTRAP_PORT, NIXL_SIDE_CHANNEL_PORT, InstanceParams
from tandem.builders.pods import build_instance_pod as build_pod
from tests.chart.chartlib import FULL_VALUES, RELEASE_NAMESPACE, Obj, of_kind, one, render
from tests.support.factories import make_pool
from tests.support.netpol import Endpoint, allowed, isolating

SERVED = "speed"
CACHE_NS = "mooncake"
IMAGE = "docker.io/vllm/vllm-openai@sha256:" + "a" * 64
MOONCAKE_IMAGE = "ghcr.io/example/mooncake@sha256:" + "b" * 64
NAMESPACES = {
    name: {"kubernetes.io/metadata.name": name}
    for name in ("speed", "long-context", "images", CACHE_NS, RELEASE_NAMESPACE, "monitoring", "gateway", "other")
}


def engine(role: str, pair: int = 0, pool: str = "speed", namespace: str = SERVED) -> Endpoint:
    spec = revision_spec(
        make_pool(pool).pairs(2).set("spec.stack.kvTransfer", {"connector": "MooncakeConnector"}).obj().spec
    )
    params = InstanceParams(
        pool=pool,
        namespace=namespace,
        pool_uid="u",
        pair=pair,
        role=role,
        instance=0,
        revision="r",
        spec=spec,  # type: ignore[arg-type]
    )
    return Endpoint.of_pod(build_pod(params))


def cache_pods() -> dict[str, Endpoint]:
    ref = mc.CacheRef(
        name="fleet-cache",
        namespace=CACHE_NS,
        uid="u",
        spec=MooncakeCacheSpec.model_validate({"image": MOONCAKE_IMAGE, "version": "0.3.13"}),
    )
    endpoints = mc.cache_endpoints(ref.name, ref.namespace, ref.spec)
    return {
        "master": Endpoint.of_pod(mc.build_master_pod(ref, 0, {})),
        "metadata": Endpoint.of_pod(mc.build_metadata_pod(ref, {})),
        "store": Endpoint.of_pod(mc.build_store_pod(mc.StoreParams(ref, 0, "n1"), endpoints)),
    }


def eval_pod() -> Endpoint:
    gate = EvalGate.model_validate({"image": IMAGE, "deadline": "10m", "minScorePercent": 90})
    job = build_eval_job(
        pool="speed", namespace=SERVED, pool_uid="u", revision="r", step=1, gate=gate, model="m", target_urls=[]
    )
    return Endpoint.of_pod(job["spec"]["template"], namespace=SERVED)


@pytest.fixture(scope="module")
def policies() -> list[Obj]:
    return of_kind(render([FULL_VALUES]), "NetworkPolicy")


@pytest.fixture(scope="module")
def pods(policies: Sequence[Obj]) -> dict[str, Endpoint]:
    router_template = one(render([FULL_VALUES]), "Deployment", "tandem-router")["spec"]["template"]
    stranger_labels = {"app": "curious"}
    return {
        "prefill": engine("prefill"),
        "decode": engine("decode"),
        "other-pool-decode": engine("decode", pool="other"),
        "engine-elsewhere": engine("decode", namespace="long-context"),
        **cache_pods(),
        "eval": eval_pod(),
        "router": Endpoint.of_pod(router_template, namespace=RELEASE_NAMESPACE),
        "prometheus": Endpoint("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}),
        "stranger": Endpoint("stranger", SERVED, stranger_labels),
        "stranger-in-cache-ns": Endpoint("stranger", CACHE_NS, stranger_labels),
        "stranger-elsewhere": Endpoint("stranger", "other", stranger_labels),
    }


def test_each_policy_selects_exactly_its_pods(policies: Sequence[Obj], pods: dict[str, Endpoint]) -> None:
    """Engines, Mooncake components and eval pods are isolated (ingress) by their own policy and only by it;
    strangers, the router's and Prometheus's pods are not selected by these policies."""
    want = {
        "prefill": "tandem-engines",
        "decode": "tandem-engines",
        "other-pool-decode": "tandem-engines",
        "engine-elsewhere": "tandem-engines",
        "master": "tandem-mooncake",
        "metadata": "tandem-mooncake",
        "store": "tandem-mooncake",
        "eval": "tandem-eval",
        "router": "tandem-router",
    }
    for name, pod in pods.items():
        selecting = sorted(p["metadata"]["name"] for p in isolating(policies, pod, "Ingress"))
        assert selecting == ([want[name]] if name in want else []), name
    assert [p["metadata"]["name"] for p in isolating(policies, pods["eval"], "Egress")] == ["tandem-eval"]
    assert not isolating(policies, pods["prefill"], "Egress")  # engines still reach model stores and Mooncake


MASTER_RPC = 50051
MASTER_METRICS = 9003
STORE_RPC = mc.STORE_RPC_PORT
STORE_HTTP = mc.STORE_HTTP_PORT

CASES: list[Any] = [
    # engines: the router, their pair peers, eval on the OpenAI port, Prometheus on /metrics; nobody else
    pytest.param("router", "decode", ENGINE_PORT, True, id="router->engine openai"),
    pytest.param("router", "prefill", MOONCAKE_BOOTSTRAP_PORT, True, id="router->prefill bootstrap"),
    pytest.param("prefill", "decode", NIXL_SIDE_CHANNEL_PORT, True, id="pair peer side channel"),
    pytest.param("decode", "prefill", MOONCAKE_BOOTSTRAP_PORT, True, id="pair peer mooncake bootstrap"),
    pytest.param("prometheus", "decode", ENGINE_PORT, True, id="prometheus scrape"),
    pytest.param("prometheus", "prefill", NIXL_SIDE_CHANNEL_PORT, False, id="prometheus not to side channel"),
    pytest.param("eval", "decode", ENGINE_PORT, True, id="eval->engine openai"),
    pytest.param("eval", "decode", NIXL_SIDE_CHANNEL_PORT, False, id="eval not to side channel"),
    pytest.param("stranger", "decode", ENGINE_PORT, False, id="stranger same ns->engine"),
    pytest.param("stranger", "prefill", NIXL_SIDE_CHANNEL_PORT, False, id="stranger->side channel (KV read/poison)"),
    pytest.param("stranger-elsewhere", "decode", ENGINE_PORT, False, id="stranger other ns->engine"),
    pytest.param("engine-elsewhere", "prefill", NIXL_SIDE_CHANNEL_PORT, False, id="engine of another ns->engine"),
    pytest.param("master", "decode", ENGINE_PORT, False, id="mooncake->engine"),
    # Mooncake: the served namespaces' engines, each other, Prometheus on the metrics ports
    pytest.param("prefill", "master", MASTER_RPC, True, id="engine->master rpc"),
    pytest.param("decode", "store", STORE_RPC, True, id="engine->store"),
    pytest.param("engine-elsewhere", "metadata", 8080, True, id="engine of another served ns->metadata"),
    pytest.param("store", "master", MASTER_RPC, True, id="store->master"),
    pytest.param("prometheus", "master", MASTER_METRICS, True, id="prometheus->master metrics"),
    pytest.param("prometheus", "store", STORE_HTTP, True, id="prometheus->store metrics"),
    pytest.param("prometheus", "master", MASTER_RPC, False, id="prometheus not to master rpc"),
    pytest.param("stranger", "master", MASTER_RPC, False, id="stranger served ns->master"),
    pytest.param("stranger-in-cache-ns", "store", STORE_RPC, False, id="stranger cache ns->store"),
    pytest.param("router", "store", STORE_RPC, False, id="router->store"),
    pytest.param("eval", "master", MASTER_RPC, False, id="eval->master"),
    # eval: no ingress; egress only to engines (OpenAI port) and the router
    # the eval pod's egress allows the router, but full-values narrows the router's clients to `gateway`
    pytest.param("eval", "router", 8000, False, id="eval->router refused by the narrowed router clients"),
    pytest.param("eval", "stranger", 80, False, id="eval->stranger same ns"),
    pytest.param("eval", "stranger-elsewhere", 443, False, id="eval->elsewhere"),
    pytest.param("eval", "engine-elsewhere", ENGINE_PORT, False, id="eval->engine of another ns"),
    pytest.param("stranger", "eval", 8080, False, id="stranger->eval"),
    pytest.param("decode", "eval", 8080, False, id="engine->eval"),
]


@pytest.mark.parametrize(("src", "dst", "port", "want"), CASES)
def test_peers(policies: Sequence[Obj], pods: dict[str, Endpoint], src: str, dst: str, port: int, want: bool) -> None:
    assert allowed(policies, NAMESPACES, pods[src], pods[dst], port) is want


def test_mooncake_policy_in_each_served_namespace_without_a_cache_namespace() -> None:
    """Without cache.namespace, caches live in the served namespaces: one Mooncake policy in each."""
    objects = render([FULL_VALUES], {"cache": {"namespace": ""}})
    where = sorted(
        p["metadata"]["namespace"]
        for p in of_kind(objects, "NetworkPolicy")
        if p["metadata"]["name"] == "tandem-mooncake"
    )
    assert where == sorted(["speed", "long-context", "images"])


@pytest.mark.parametrize("switch", ["mooncake", "eval"])
def test_policies_can_be_switched_off(switch: str) -> None:
    network = {"networkPolicy": {switch: {"enabled": False}, "apiServer": {"cidrs": ["10.0.0.1/32"]}}}
    names = {p["metadata"]["name"] for p in of_kind(render([FULL_VALUES], network), "NetworkPolicy")}
    assert f"tandem-{switch}" not in names and "tandem-engines" in names


def test_eval_reaches_the_router_with_the_default_router_clients() -> None:
    """Default values: router clients are every pod of the cluster, so the eval egress rule to the router is
    what lets an eval Job use the router's Service; nothing else outside engines is open to it."""
    objects = render()
    policies = of_kind(objects, "NetworkPolicy")
    served = one(objects, "NetworkPolicy", "tandem-eval")["metadata"]["namespace"]
    namespaces = {**NAMESPACES, served: {"kubernetes.io/metadata.name": served}}
    router = Endpoint.of_pod(one(objects, "Deployment", "tandem-router")["spec"]["template"], RELEASE_NAMESPACE)
    evaluator = Endpoint("eval", served, {"tandem.dev/component": "eval", "app.kubernetes.io/managed-by": "tandem"})
    assert allowed(policies, namespaces, evaluator, router, 8000)
    assert not allowed(policies, namespaces, evaluator, router, 9090)
