"""SLO-driven pair autoscaling on the real local control plane (issue 7's cluster must-shows).

The engine pods' metrics come from the test exporter (scraped by the real Prometheus every second); the
operator reads them, decides with `tandem.core.autoscale`, and sets `spec.pairs.replicas`.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import yaml

from tandem.api.resources import InferencePool
from tandem.api.revision import revision_id, revision_spec
from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tests.support.tandem_cluster import REPO, GpuNodes, wait_until


def manifest(nodes: GpuNodes) -> dict[str, Any]:
    obj = copy.deepcopy(yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text()))
    obj["metadata"]["name"] = "auto"
    obj["spec"].update(
        {
            "pairs": {"replicas": 1, "drainTimeout": "2s"},
            "placement": {"nodeSelector": nodes.selector},
            "autoscaling": {
                "enabled": True,
                "minPairs": 1,
                "maxPairs": 3,
                "interval": "3s",
                "targets": {"kvCacheUtilizationPercent": 80},
                "scaleUp": {"stabilizationWindow": "0s", "period": "3s", "maxPairs": 1, "maxPercent": 100},
                "scaleDown": {"stabilizationWindow": "20s", "period": "3s", "maxPairs": 1, "maxPercent": 100},
            },
        }
    )
    return obj


def replicas(kube: Kubectl, ns: str) -> int:
    return int(
        kube.json("get", "inferencepools.tandem.dev", "auto", "-n", ns, "-o", "json")["spec"]["pairs"]["replicas"]
    )


def status(kube: Kubectl, ns: str) -> dict[str, Any]:
    return kube.json("get", "inferencepools.tandem.dev", "auto", "-n", ns, "-o", "json").get("status") or {}


def test_load_step_scales_up_within_bounds_and_down_only_after_stabilization(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> None:
    gpu_nodes.add(4)
    operator_factory([ns], extra_args=[f"--prometheus-url={prometheus.url}", "--scrape-interval=1"])
    obj = manifest(gpu_nodes)
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = ns
    revision = revision_id(revision_spec(InferencePool.model_validate(body).spec))
    live_metrics.set_revision(revision, kv_usage=0.4)
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(obj))
    wait_until("1 pair Ready", lambda: status(crds, ns).get("pairs", {}).get("ready") == 1, timeout_s=90)

    # steady load within the target: no change for several evaluations
    time.sleep(10)
    assert replicas(crds, ns) == 1

    # load step: KV utilization 95 % > 80 % target → scale up, one pair per period, never above maxPairs
    live_metrics.set_revision(revision, kv_usage=0.95)
    wait_until("scaled up to maxPairs", lambda: replicas(crds, ns) == 3, timeout_s=120)
    events = crds.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=auto").stdout
    assert "ScaleUpKVCache" in events and "2 → 3 pairs" in events
    assert wait_until(
        "lastScaling recorded", lambda: (ls := status(crds, ns).get("lastScaling")) and ls["toPairs"] == 3
    )
    seen_max = 0
    for _ in range(8):
        seen_max = max(seen_max, replicas(crds, ns))
        time.sleep(1)
    assert seen_max == 3  # maxPairs respected under sustained overload

    # NaN: every pod reports NaN → hold (no change either way)
    for pod in live_metrics.pods:
        live_metrics.set_pod(pod.name, mode="nan")
    time.sleep(12)
    assert replicas(crds, ns) == 3
    assert status(crds, ns)["lastScaling"]["reason"].startswith("Hold")

    # load drops: scale down only after the 20 s stabilization window
    for pod in live_metrics.pods:
        live_metrics.set_pod(pod.name, mode="normal")
    live_metrics.set_revision(revision, kv_usage=0.1)
    dropped = time.monotonic()
    wait_until("scaled down", lambda: replicas(crds, ns) < 3, timeout_s=120)
    assert time.monotonic() - dropped >= 15  # not before the window (allowing scrape/eval lag)
    events = crds.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=auto").stdout
    assert "ScaleUp" in events


def test_prefill_bound_pool_is_reshaped_to_a_new_ratio(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> None:
    """Optional P:D adjustment: TTFT at its target while decode idles → 1P:1D becomes 2P:1D, each group replaced
    surge first on the same revision (no rollout: the stack did not change)."""
    gpu_nodes.add(8)
    operator_factory([ns], extra_args=[f"--prometheus-url={prometheus.url}", "--scrape-interval=1"])
    obj = manifest(gpu_nodes)
    obj["spec"]["pairs"]["replicas"] = 2
    obj["spec"]["autoscaling"].update(
        {
            "minPairs": 1,
            "maxPairs": 3,
            "targets": {"ttftP95Ms": 400, "tpotP90Ms": 40},
            "scaleDown": {"stabilizationWindow": "10s", "period": "3s", "maxPairs": 1, "maxPercent": 100},
            "ratio": {"enabled": True, "minPrefill": 1, "maxPrefill": 2, "minDecode": 1, "maxDecode": 1},
        }
    )
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(obj))
    wait_until(
        "reshaped to 2P:1D",
        lambda: (
            crds.json("get", "inferencepools.tandem.dev", "auto", "-n", ns, "-o", "json")["spec"]["pairs"]
            .get("prefill", {})
            .get("instances")
            == 2
        ),
        timeout_s=180,
    )
    events = crds.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=auto").stdout
    assert "1P:1D → 2P:1D" in events

    def shapes() -> set[tuple[int, int]]:
        items = crds.json("get", "pods", "-n", ns, "-l", "tandem.dev/pool=auto", "-o", "json")["items"]
        by_pair: dict[str, list[str]] = {}
        for pod in items:
            by_pair.setdefault(pod["metadata"]["labels"]["tandem.dev/pair"], []).append(
                pod["metadata"]["labels"]["tandem.dev/role"]
            )
        return {(roles.count("prefill"), roles.count("decode")) for roles in by_pair.values()}

    wait_until("every pair 2P:1D", lambda: shapes() == {(2, 1)}, timeout_s=180)
