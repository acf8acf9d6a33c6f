"""Live mode on the real local control plane: a pool brought up by the real operator, the Mooncake
conversation trace replayed through its routing table (``tandem_lab.dev.simlive.LiveMetrics``), and the
real Prometheus scraping the per-pod vLLM metrics with the series label contract as target labels.

A canary made slow through the control API (HTTP, prefill cost × 3) shows a higher TTFT p90 than
the stable revision in Prometheus. The rollout holds at an indefinite pause with no analysis, so the
operator never rolls the canary back while we measure.
"""

from __future__ import annotations

import copy
import json
import math
import time
import urllib.request
from typing import Any

import pytest
import yaml

from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tandem_lab.dev.simlive import LiveMetrics, load_workload
from tandem_lab.sim.config import load_params
from tandem_lab.sim.live import LiveOptions
from tandem_lab.sim.traces import CONVERSATION, traces_dir
from tests.support.tandem_cluster import REPO, GpuNodes, wait_until

REPLICAS = 3
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "cd" * 32
WINDOW = "30s"


def pool_manifest(nodes: GpuNodes, version: str) -> dict[str, Any]:
    obj = copy.deepcopy(yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text()))
    obj["metadata"]["name"] = "speed"
    obj["spec"].update(
        {
            "stack": {"version": version, "image": IMAGE.format(tag=version)},
            "pairs": {"replicas": REPLICAS, "drainTimeout": "2s"},
            "placement": {"nodeSelector": nodes.selector},
            "rollout": {
                "maxSurge": 1,
                "maxUnavailable": 0,
                "progressDeadline": "10m",
                "steps": [{"setCanaryPairs": 1}, {"pause": {}}],
            },
        }
    )
    return obj


def status(kube: Kubectl, ns: str) -> dict[str, Any]:
    return kube.json("get", "inferencepools.tandem.dev", "speed", "-n", ns).get("status") or {}


def routing(kube: Kubectl, ns: str) -> dict[str, Any]:
    cm = kube.get("configmap", "speed-routing", namespace=ns)
    return dict(json.loads(cm["data"]["routing.json"])) if cm else {"pairs": []}


def series(prometheus: PrometheusServer, promql: str) -> list[dict[str, Any]]:
    return list(prometheus.query(promql)["result"])


def p90(prometheus: PrometheusServer, ns: str, revision: str) -> float:
    sel = f'namespace="{ns}",pool="speed",revision="{revision}",role="decode"'
    result = series(
        prometheus,
        f"histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[{WINDOW}])))",
    )
    return float(result[0]["value"][1]) if result else math.nan


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return dict(json.load(resp))


def test_live_mode_replays_a_trace_through_the_routing_table_into_prometheus(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
) -> None:
    if not (traces_dir() / CONVERSATION).exists():
        pytest.fail(f"trace not present: {traces_dir() / CONVERSATION} (set TANDEM_TRACES_DIR)")
    kube = crds
    gpu_nodes.add(REPLICAS + 1)
    operator_factory([ns], extra_args=[f"--prometheus-url={prometheus.url}", "--scrape-interval=1"])
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes, "v1")))
    wait_until("stable pairs Ready", lambda: status(kube, ns).get("pairs", {}).get("ready") == REPLICAS, timeout_s=120)
    stable = status(kube, ns)["revisions"]["stable"]["name"]

    params = load_params()
    options = LiveOptions(rate=10.0, speedup=1.0, seed=5, key_blocks=2, capacity_scale=8.0)
    live = LiveMetrics(
        kube,
        [ns],
        prometheus,
        workload=load_workload("conversation", params, options.seed),
        options=options,
        params=params,
        prefix=f"simlive-{ns}",
    ).start()
    try:
        # 1. The real Prometheus has the trace's metrics for the pool's pods, with the contract labels.
        sel = f'namespace="{ns}",pool="speed"'
        ttft = wait_until(
            "TTFT buckets of every engine pod in Prometheus",
            lambda: (
                (s := series(prometheus, f'vllm:time_to_first_token_seconds_bucket{{{sel},le="+Inf"}}'))
                and len({x["metric"]["pod"] for x in s}) == 2 * REPLICAS
                and all(float(x["value"][1]) > 0 for x in s)
                and s
            ),
            timeout_s=90,
        )
        assert {x["metric"]["revision"] for x in ttft} == {stable}
        assert {x["metric"]["role"] for x in ttft} == {"prefill", "decode"}
        table_pods = {e["pod"] for p in routing(kube, ns)["pairs"] for e in (*p["prefill"], *p["decode"])}
        assert {x["metric"]["pod"] for x in ttft} == table_pods
        assert all(x["metric"]["pair"] == x["metric"]["pod"].rsplit("-", 2)[0] for x in ttft)
        hits = wait_until(
            "prefix cache hits on the prefill pods",
            lambda: (
                (s := series(prometheus, f'vllm:prefix_cache_hits_total{{{sel},role="prefill"}}'))
                and sum(float(x["value"][1]) for x in s) > 0
                and s
            ),
            timeout_s=90,
        )
        assert {x["metric"]["revision"] for x in hits} == {stable}
        assert {x["metric"]["pool"] for x in hits} == {"speed"}
        stats = live.stats()
        assert stats.routed > 0 and stats.unmatched == 0 and stats.failed == 0

        # 2. A canary pair comes up (traffic by pair count); made slow through the control API.
        kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes, "v2")))
        canary = wait_until(
            "a serving canary pair in the routing table",
            lambda: (
                (t := routing(kube, ns)).get("revisions", {}).get("canary")
                and any(p["revision"] == t["revisions"]["canary"] and p["state"] == "serving" for p in t["pairs"])
                and t["revisions"]["canary"]
            ),
            timeout_s=120,
        )
        assert canary != stable
        answer = post(f"{live.url}/-/revisions/{canary}", {"ttft_multiplier": 3.0})
        assert answer["prefill_multiplier"] == 3.0
        changed = time.monotonic()
        wait_until(
            "canary TTFT series in Prometheus",
            lambda: series(prometheus, f'vllm:time_to_first_token_seconds_count{{{sel},revision="{canary}"}}'),
            timeout_s=60,
        )
        time.sleep(max(0.0, 35 - (time.monotonic() - changed)))  # a whole rate window after the change
        slow, base = wait_until(
            "canary TTFT p90 above stable's",
            lambda: (c := p90(prometheus, ns, canary)) > (s := p90(prometheus, ns, stable)) and s > 0 and (c, s),
            timeout_s=90,
            interval_s=2,
        )
        assert slow > base
        print(f"TTFT p90 over {WINDOW}: canary {slow:.3f} s, stable {base:.3f} s; {live.summary()}")
    finally:
        live.stop()
    # Stopping unregisters every target.
    assert not list(prometheus.targets_dir.glob(f"simlive-{ns}-*.json"))
