"""The examples' own canary gates on the real local control plane and Prometheus (issue 17, must-show 2).

The pool takes `examples/speed-pool.yaml`'s `rollout.analysis` unchanged (compare gates, errors with a
floor, local-kv-hits, the cold-cache warm-up, interval 30 s, initialDelay 60 s, successStreak 3,
failureLimit 1, the TTFT gate's own 2) and its first step (`setMirrorPairs: 4`: four surge pairs that get copies and
serve no key); only the pool's size and the steps after the first analysis are the test's. Engine metrics come from
the test exporter, scripted per revision (they stand for the copies the router would send):

- a good version behaves like stable and is promoted;
- a bad version has TTFT × 3 *and* a cold cache that never warms (hit ratio 0.3 against stable's 0.6), so
  the warm-up holds its hit-ratio gate if the score test finds the gap at all; its TTFT failure still stands,
  because the extra misses explain at most (0.7/0.4) × 1.1 = ×1.93. It is rolled back at its third TTFT Failure
  (the gate's own `failureLimit: 2`), not after the warm-up's 5 minutes, and the pass that decides it publishes
  the canary's weight as 0.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml

from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tests.cluster.test_canary import FloorObserver, revision_of, routing, status
from tests.support.tandem_cluster import REPO, GpuNodes, wait_until

REPLICAS = 3
MIRRORED = 4
"""The example's first step mirrors four surge pairs (capped at the test pool's 3 replicas); the test's pool has room
for them beside stable's."""
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "ef" * 32
EXAMPLE = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
EXAMPLE_ANALYSIS = EXAMPLE["spec"]["rollout"]["analysis"]


def pool_manifest(node_selector: dict[str, str], version: str = "v1") -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text()))
    obj["metadata"]["name"] = "speed"
    first = EXAMPLE["spec"]["rollout"]["steps"][0]
    assert first == {"setMirrorPairs": MIRRORED}, first  # the example's first step: four mirrored pairs
    obj["spec"].update(
        {
            "stack": {"version": version, "image": IMAGE.format(tag=version)},
            "pairs": {"replicas": REPLICAS, "drainTimeout": "2s"},
            "placement": {"nodeSelector": node_selector},
            "rollout": {
                "maxSurge": MIRRORED,
                "maxUnavailable": 0,
                "progressDeadline": "5m",
                # The example's first exposure and analysis; its eval step needs an eval image, its bake
                # and later steps only take time.
                "steps": [first, {"analysis": {}}, {"setWeight": 100}],
                "analysis": copy.deepcopy(EXAMPLE_ANALYSIS),
            },
        }
    )
    return obj


@pytest.fixture
def example_env(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> tuple[Kubectl, str, GpuNodes, Exporter]:
    gpu_nodes.add(REPLICAS + min(MIRRORED, REPLICAS))
    operator_factory([ns], extra_args=[f"--prometheus-url={prometheus.url}", "--scrape-interval=1"])
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes.selector)))
    wait_until("stable pairs Ready", lambda: status(crds, ns).get("pairs", {}).get("ready") == REPLICAS, timeout_s=120)
    return crds, ns, gpu_nodes, live_metrics


def test_manifest_carries_the_examples_analysis_unchanged() -> None:
    """The test's pool must not drift from the example's gates: the point is to test *those*."""
    manifest = pool_manifest({"tandem.dev/test-nodes": "x"})
    assert manifest["spec"]["rollout"]["analysis"] == EXAMPLE_ANALYSIS
    assert {m["name"] for m in EXAMPLE_ANALYSIS["metrics"]} == {
        "ttft-p95",
        "tokens-per-user",
        "errors",
        "local-kv-hits",
    }
    assert "warmUp" in EXAMPLE_ANALYSIS


def test_good_version_is_promoted_with_the_examples_gates(example_env: Any) -> None:
    kube, ns, nodes, _ = example_env
    stable = status(kube, ns)["revisions"]["stable"]["name"]
    manifest = pool_manifest(nodes.selector, "v2")
    new = revision_of(manifest)
    started = time.monotonic()
    with FloorObserver(kube, ns, REPLICAS) as observer:
        kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
        final = wait_until(
            "v2 promoted",
            lambda: (
                (s := status(kube, ns))["rollout"]["phase"] == "Promoted"
                and s["revisions"]["stable"]["name"] == new
                and s["pairs"]["draining"] == 0
                and s
            ),
            timeout_s=420,
        )
    print(f"good version promoted with the example's gates in {time.monotonic() - started:.0f} s")
    assert observer.below == [], f"capacity floor violated: {observer.below}"
    assert new != stable
    assert {p["revision"] for p in routing(kube, ns)["pairs"] if p["state"] == "serving"} == {new}
    events = kube.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=speed").stdout
    assert "AnalysisPassed" in events and "Promoted" in events and "RolledBack" not in events
    row = next(r for r in final["scorecard"] if r["version"] == "v2")
    assert row.get("ttftP95Ms") and row.get("localKvHitPercent")


def test_slow_cold_version_is_rolled_back_inside_the_warm_up(example_env: Any) -> None:
    kube, ns, nodes, exporter = example_env
    stable = status(kube, ns)["revisions"]["stable"]["name"]
    manifest = pool_manifest(nodes.selector, "v2-slow")
    bad = revision_of(manifest)
    exporter.set_revision(bad, ttft_multiplier=3.0, prefix_hit_ratio=0.3)
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    wait_until("canary analysing", lambda: status(kube, ns)["rollout"].get("stepIndex") == 1, timeout_s=120)
    mirrored = routing(kube, ns)  # the example's first step: the canary pairs get copies and serve no key
    assert mirrored["revisions"].get("canaryMirror") is True, mirrored["revisions"]
    # A mirror step has at most as many pairs as stable (core.rollout.canary_target): 3 of the example's 4 here.
    want = min(MIRRORED, REPLICAS)
    assert len({p["id"] for p in mirrored["pairs"] if p["revision"] == bad}) == want, mirrored["pairs"]
    assert [p for p in mirrored["pairs"] if p["revision"] == bad and p["state"] == "serving" and p["weight"] > 0] == []
    assert status(kube, ns)["revisions"]["canary"].get("mirrored") is True
    started = time.monotonic()
    flipped = wait_until(
        "rollback decided",
        lambda: s if (s := status(kube, ns))["rollout"]["phase"] in ("RollingBack", "RolledBack") else None,
        timeout_s=300,
    )
    decided_s = time.monotonic() - started
    # The pass that decided the rollback published its table before it wrote status (reconcile/pool.py: act,
    # then report), so the table read now is that pass's or a later one: the bad revision serves nothing.
    table = routing(kube, ns)
    assert [p for p in table["pairs"] if p["revision"] == bad and p["state"] == "serving" and p["weight"] > 0] == []
    print(f"bad version: rollback decided {decided_s:.0f} s after its analysis step started")
    gates = {g["name"]: g for g in flipped["rollout"].get("gates") or []}
    assert gates["ttft-p95"]["verdict"] == "Failure", gates
    assert flipped["rollout"]["analysis"]["gateFailures"] == {"ttft-p95": 3}, flipped["rollout"]["analysis"]
    assert "not a cold cache" in gates["ttft-p95"]["condition"], gates["ttft-p95"]
    # cold: held (WarmingUp) or within the hit ratio's noise (NotSignificantlyWorse) — not the cause
    assert gates["local-kv-hits"]["verdict"] != "Failure", gates["local-kv-hits"]
    final = wait_until(
        "rolled back", lambda: s if (s := status(kube, ns))["rollout"]["phase"] == "RolledBack" else None, timeout_s=120
    )
    assert final["rollout"]["failedRevision"] == bad
    assert {p["revision"] for p in routing(kube, ns)["pairs"] if p["state"] == "serving"} == {stable}
    events = kube.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=speed").stdout
    assert "Promoted" not in events
