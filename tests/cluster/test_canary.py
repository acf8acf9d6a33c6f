"""Staged canary rollouts on the real local control plane, gated on the real Prometheus (issue 6).

Every engine pod the operator creates is mirrored into the test exporter (`tandem_lab.dev.podmetrics`),
which serves vLLM-named metrics per pod with behaviour scripted per revision; the cluster's
Prometheus scrapes it (1 s) and the operator queries that Prometheus. An observer samples the routing
table every second and records any second with fewer serving pairs than `replicas − maxUnavailable`.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.api.resources import InferencePool
from tandem.api.revision import revision_id, revision_spec
from tandem_lab.dev.exporter import Exporter
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.prometheus import PrometheusServer
from tests.support.tandem_cluster import REPO, GpuNodes, OperatorProcess, wait_until

REPLICAS = 3
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "ab" * 32


def pool_manifest(nodes: GpuNodes, version: str = "v1", **analysis: Any) -> dict[str, Any]:
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
                "progressDeadline": "5m",
                "steps": [
                    {"setCanaryPairs": 1},
                    {"analysis": {}},
                    {"setWeight": 50},
                    {"analysis": {}},
                    {"setWeight": 100},
                ],
                "analysis": {
                    "interval": "4s",
                    "timeout": "2s",
                    "initialDelay": "4s",
                    "successStreak": 2,
                    "failureLimit": 0,
                    "noDataDeadline": "20s",
                    "onNoData": "Rollback",
                    "metrics": [
                        {"name": "ttft", "template": "TTFTP90", "successCondition": "result <= baseline * 1.2"},
                        {"name": "errors", "template": "ErrorRate", "failureCondition": "result > 0.01"},
                    ],
                    **analysis,
                },
            },
        }
    )
    return obj


def revision_of(obj: dict[str, Any]) -> str:
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = "x"
    return revision_id(revision_spec(InferencePool.model_validate(body).spec))


def status(kube: Kubectl, ns: str) -> dict[str, Any]:
    return kube.json("get", "inferencepools.tandem.dev", "speed", "-n", ns, "-o", "json").get("status") or {}


def routing(kube: Kubectl, ns: str) -> dict[str, Any]:
    cm = kube.get("configmap", "speed-routing", namespace=ns)
    return dict(json.loads(cm["data"]["routing.json"])) if cm else {"pairs": []}


class FloorObserver:
    """Samples serving pairs every second; remembers every sample below the capacity floor."""

    def __init__(self, kube: Kubectl, ns: str, floor: int) -> None:
        self.kube, self.ns, self.floor = kube, ns, floor
        self.samples = 0
        self.below: list[tuple[float, int]] = []
        self.revisions_seen: set[frozenset[str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                table = routing(self.kube, self.ns)
            except Exception:
                continue
            serving = [p for p in table["pairs"] if p["state"] == "serving"]
            self.samples += 1
            self.revisions_seen.add(frozenset(p["revision"] for p in serving))
            if len(serving) < self.floor:
                self.below.append((time.time(), len(serving)))

    def __enter__(self) -> FloorObserver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def rollout_env(
    crds: Kubectl,
    ns: str,
    gpu_nodes: GpuNodes,
    operator_factory: Any,
    prometheus: PrometheusServer,
    live_metrics: Exporter,
) -> tuple[Kubectl, str, GpuNodes, OperatorProcess, Exporter]:
    gpu_nodes.add(REPLICAS + 1)
    op = operator_factory([ns], extra_args=[f"--prometheus-url={prometheus.url}", "--scrape-interval=1"])
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes)))
    wait_until("stable pairs Ready", lambda: status(crds, ns).get("pairs", {}).get("ready") == REPLICAS, timeout_s=120)
    return crds, ns, gpu_nodes, op, live_metrics


def roll_to(env: tuple[Kubectl, str, GpuNodes, OperatorProcess, Exporter], version: str, **analysis: Any) -> str:
    kube, ns, nodes, _, _ = env
    manifest = pool_manifest(nodes, version, **analysis)
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    return revision_of(manifest)


def test_good_version_walks_every_step_and_is_promoted(rollout_env: Any) -> None:
    kube, ns, _, _, _ = rollout_env
    stable = status(kube, ns)["revisions"]["stable"]["name"]
    with FloorObserver(kube, ns, REPLICAS) as observer:
        new = roll_to(rollout_env, "v2")
        final = wait_until(
            "v2 promoted",
            lambda: (
                (s := status(kube, ns))["rollout"]["phase"] == "Promoted"
                and s["revisions"]["stable"]["name"] == new
                and s["pairs"]["ready"] == REPLICAS
                and s["pairs"]["draining"] == 0
                and s
            ),
            timeout_s=240,
        )
    assert observer.below == [], f"capacity floor violated: {observer.below}"
    assert observer.samples > 10
    assert {p["revision"] for p in routing(kube, ns)["pairs"]} == {new} and new != stable
    events = kube.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=speed").stdout
    for reason in ("RolloutStarted", "AnalysisPassed", "Promoted"):
        assert reason in events
    assert any(row["version"] == "v2" and row.get("ttftP90Ms") for row in final["scorecard"])


def test_bad_version_is_rolled_back_with_capacity_kept(rollout_env: Any) -> None:
    kube, ns, _, _, exporter = rollout_env
    stable = status(kube, ns)["revisions"]["stable"]["name"]
    with FloorObserver(kube, ns, REPLICAS) as observer:
        bad = roll_to(rollout_env, "v2-slow")
        exporter.set_revision(bad, ttft_multiplier=1.5)
        wait_until("canary analysing", lambda: status(kube, ns)["rollout"].get("stepIndex") == 1, timeout_s=90)
        started = time.monotonic()
        final = wait_until(
            "rolled back",
            lambda: (s := status(kube, ns))["rollout"]["phase"] == "RolledBack" and s,
            timeout_s=120,
        )
        elapsed = time.monotonic() - started
    assert observer.below == [], f"capacity floor violated: {observer.below}"
    assert final["rollout"]["failedRevision"] == bad
    assert {p["revision"] for p in routing(kube, ns)["pairs"] if p["state"] == "serving"} == {stable}
    wait_until(
        "canary pods gone",
        lambda: not kube.json("get", "pods", "-n", ns, "-l", f"tandem.dev/revision={bad}", "-o", "json")["items"],
        timeout_s=60,
    )
    # interval × (failureLimit + 1) + initialDelay + the time to act; generous for a shared 2-core machine
    assert elapsed < 60, elapsed
    gates = {g["name"]: g for g in final["rollout"].get("gates") or []}
    assert not gates or gates.get("ttft", {}).get("verdict") in ("Failure", None)


def test_no_traffic_never_promotes_then_no_data_deadline_rolls_back(rollout_env: Any) -> None:
    kube, ns, _, _, exporter = rollout_env
    idle = roll_to(rollout_env, "v2-idle")
    exporter.set_revision(idle, request_rate=0.0)  # 0/0 = NaN everywhere: NoData, never a pass
    wait_until("analysing", lambda: status(kube, ns)["rollout"].get("stepIndex") == 1, timeout_s=90)
    seen = wait_until(
        "rolled back after noDataDeadline",
        lambda: (s := status(kube, ns))["rollout"]["phase"] in ("RolledBack", "RollingBack") and s,
        timeout_s=120,
    )
    assert seen["rollout"]["stepIndex"] <= 1  # never advanced past the analysis step
    events = kube.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=speed").stdout
    assert "AnalysisNoData" in events and "Promoted" not in events


def test_prometheus_outage_holds_then_pauses(
    crds: Kubectl, ns: str, gpu_nodes: GpuNodes, operator_factory: Any
) -> None:
    gpu_nodes.add(REPLICAS + 1)
    operator_factory([ns], extra_args=["--prometheus-url=http://127.0.0.1:9", "--scrape-interval=1"])
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes, onNoData="Pause")))
    wait_until("stable Ready", lambda: status(crds, ns).get("pairs", {}).get("ready") == REPLICAS, timeout_s=120)
    crds.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(pool_manifest(gpu_nodes, "v2", onNoData="Pause")))
    held = wait_until(
        "gates report MetricsUnavailable",
        lambda: (
            (s := status(crds, ns))["rollout"].get("gates")
            and all(g["verdict"] == "Error" for g in s["rollout"]["gates"])
            and s
        ),
        timeout_s=90,
    )
    assert held["rollout"]["stepIndex"] == 1 and held["rollout"]["phase"] == "Progressing"
    paused = wait_until(
        "paused at the deadline", lambda: (s := status(crds, ns))["rollout"]["phase"] == "Paused" and s, timeout_s=90
    )
    assert paused["rollout"]["stepIndex"] == 1
    assert paused["revisions"]["canary"]["pairs"] == 1  # traffic and pairs held, nothing promoted


def test_operator_killed_at_each_step_resumes_that_step(rollout_env: Any) -> None:
    """OP-01: SIGKILL at every step the poll sees (always both analysis steps); each restart resumes the
    persisted step, advances at most one step, and never leaves duplicate or extra pairs."""
    kube, ns, _, op, _ = rollout_env
    roll_to(rollout_env, "v2", successStreak=3)
    killed_at: list[int] = []
    seen = -1
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rollout = status(kube, ns)["rollout"]
        if rollout["phase"] == "Promoted":
            break
        step = rollout.get("stepIndex", 0)
        if rollout["phase"] == "Progressing" and step > seen:
            seen = step
            op.kill()
            persisted = status(kube, ns)["rollout"]
            op.start()
            time.sleep(2)
            after = status(kube, ns)["rollout"]
            # never started again, failed or rolled back by a restart
            assert after["phase"] in ("Progressing", "Promoted"), (persisted, after)
            if persisted["phase"] == "Promoted":
                # killed just after the promotion was persisted, before stable moved: finished, not restarted
                assert after["phase"] == "Promoted", (persisted, after)
                break
            step, resumed = persisted.get("stepIndex", 0), after.get("stepIndex", 0)
            assert resumed in (step, step + 1), (persisted, after)  # resumed, at most one advance
            killed_at.append(step)
            items = kube.json("get", "pods", "-n", ns, "-l", "tandem.dev/component=engine", "-o", "json")["items"]
            live = {
                p["metadata"]["labels"]["tandem.dev/pair"] for p in items if not p["metadata"].get("deletionTimestamp")
            }
            table = routing(kube, ns)
            draining = {p["id"] for p in table["pairs"] if p["state"] == "draining"}
            assert len(live - draining) <= REPLICAS + 1  # replicas + maxSurge
        time.sleep(0.5)
    assert status(kube, ns)["rollout"]["phase"] == "Promoted"
    # setWeight steps finish within one pass, so a 0.5 s poll cannot promise to land in them; the two
    # analysis steps (indices 1 and 3) last initialDelay + successStreak × interval ≥ 16 s, so a kill in
    # each is certain. Kills were recorded in order: the persisted step never went backwards.
    assert {1, 3} <= set(killed_at), killed_at
    assert killed_at == sorted(killed_at), killed_at

    def engine_pods() -> list[str]:
        items = kube.json("get", "pods", "-n", ns, "-l", "tandem.dev/component=engine", "-o", "json")["items"]
        return [p["metadata"]["name"] for p in items]

    names = wait_until("old pairs drained", lambda: (n := engine_pods()) and len(n) == 2 * REPLICAS and n, timeout_s=60)
    assert len(names) == len(set(names))


def test_stable_pod_deleted_mid_canary_returns_on_stable(rollout_env: Any) -> None:
    kube, ns, _, _, _ = rollout_env
    stable = status(kube, ns)["revisions"]["stable"]["name"]
    roll_to(rollout_env, "v2", successStreak=50)  # stays in analysis
    wait_until("in analysis", lambda: status(kube, ns)["rollout"].get("stepIndex") == 1, timeout_s=90)
    victim = next(
        p for p in kube.json("get", "pods", "-n", ns, "-l", f"tandem.dev/revision={stable}", "-o", "json")["items"]
    )
    name = victim["metadata"]["name"]
    kube.run("delete", "pod", name, "-n", ns, "--wait=false")
    back = wait_until(
        "stable pod recreated",
        lambda: (p := kube.get("pod", name, namespace=ns)) and p["metadata"]["uid"] != victim["metadata"]["uid"] and p,
        timeout_s=60,
    )
    assert back["metadata"]["labels"]["tandem.dev/revision"] == stable
    assert back["spec"]["containers"][0]["image"] == victim["spec"]["containers"][0]["image"]


@pytest.mark.parametrize(
    ("score", "want_phase"),
    [pytest.param(99, "Promoted", id="score 99 passes"), pytest.param(50, "RolledBack", id="score 50 fails")],
)
def test_eval_gate(rollout_env: Any, score: int, want_phase: str) -> None:
    kube, ns, _, _, _ = rollout_env
    gate = {
        "image": "ghcr.io/example/tool-call-eval:1.4@sha256:" + "cd" * 32,
        "minScorePercent": 98,
        "deadline": "2m",
        "env": [{"name": "SIM_EVAL_SCORE", "value": str(score)}],
    }
    manifest = pool_manifest(rollout_env[2], "v2-eval", eval=gate, metrics=[])
    manifest["spec"]["rollout"]["steps"] = [{"setCanaryPairs": 1}, {"analysis": {"eval": True}}, {"setWeight": 100}]
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    final = wait_until(
        f"rollout {want_phase}", lambda: (s := status(kube, ns))["rollout"]["phase"] == want_phase and s, timeout_s=180
    )
    jobs = kube.json("get", "jobs", "-n", ns, "-l", "tandem.dev/component=eval", "-o", "json")["items"]
    assert len(jobs) == 1
    env = {e["name"]: e.get("value") for e in jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TANDEM_MODEL"] == "Qwen/Qwen3-8B" and env["TANDEM_TARGET_URLS"].startswith("http://")
    if want_phase == "Promoted":
        assert any(row.get("evalScorePercent") == 99 for row in final["scorecard"])


def test_rollout_cli_status_pause_resume(rollout_env: Any, dev_cluster: Any) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    kube, ns, _, _, _ = rollout_env
    roll_to(rollout_env, "v2", successStreak=50)
    wait_until("in analysis", lambda: status(kube, ns)["rollout"].get("stepIndex") == 1, timeout_s=90)
    base = [sys.executable, "-m", "tandem.cli", "rollout"]
    kubeconfig = f"--kubeconfig={Path(dev_cluster.kubeconfig)}"
    out = subprocess.run(
        [*base, "status", "speed", "-n", ns, kubeconfig], capture_output=True, text=True, check=True
    ).stdout
    assert "Progressing" in out and "canary" in out
    subprocess.run([*base, "pause", "speed", "-n", ns, kubeconfig], check=True, capture_output=True)
    wait_until("paused", lambda: status(kube, ns)["rollout"]["phase"] == "Paused", timeout_s=30)
    subprocess.run([*base, "resume", "speed", "-n", ns, kubeconfig], check=True, capture_output=True)
    wait_until("resumed", lambda: status(kube, ns)["rollout"]["phase"] == "Progressing", timeout_s=30)
    subprocess.run([*base, "promote", "speed", "-n", ns, "--full", kubeconfig], check=True, capture_output=True)
    wait_until("promoted by roll-forward", lambda: status(kube, ns)["rollout"]["phase"] == "Promoted", timeout_s=120)
    events = kube.run("get", "events", "-n", ns, "--field-selector", "involvedObject.name=speed").stdout
    assert "RollForward" in events and "RolloutPaused" in events
