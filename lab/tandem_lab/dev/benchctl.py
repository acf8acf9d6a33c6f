"""`tandem bench controller`: the controller benchmark of benchmarks.md §7 (C1, C2, C4, C6) on a local cluster.

What it owns: the benchmark's script (what it measures and how it records it) —

- **C1** apply → all pairs Ready: (A) an InferencePool with N pairs while the operator runs, against
  (B) the identical pods (the builders' output) and Service created directly with kubectl, alternating
  arms (A first on even repeats, B first on odd ones) in fresh namespaces on fresh node groups;
- **C2** API writes by verb from the kube-apiserver audit log, the operator running as its own
  ServiceAccount (``tandem_lab.dev.identity``): create, +1 pair, a canary step, rollback, a no-op window,
  a restart against a steady fleet (and a quiet window after the rollback);
- **C4** operator RSS (VmRSS, VmHWM) with 0 pools and with K empty pools (``pairs.replicas: 0``), and the
  time until every pool's ``status.observedGeneration`` is set;
- **C6** SLO breach → rollback, split into observe (t0 → the first Failure verdict's ``evaluatedAt``),
  decide (→ phase ``RollingBack`` seen) and act (→ the routing table gives the canary no traffic);
- ``controller.json``, ``controller.md`` and PNG plots (``controller-*.png``) in ``--out``.

Timing: changes are seen through API watches (``kubectl get --raw ...?watch=1&sendInitialEvents=true``,
whose initial-events-end bookmark says the watch is established before anything is triggered), so a
state change is timestamped when its event arrives (milliseconds), not at a polling tick. API writes
come from the audit log (microsecond ``stageTimestamp``), read incrementally.

What it must not do: edit or steer the operator beyond its inputs (manifests, the exporter's scripted
metrics, annotations a user would set), touch clusters other than its own, or end processes it did not
start. Dev tooling: subprocesses and kubectl are fine here; the operator never imports this module.

Invariants: the pure arithmetic lives in ``benchstats`` and the report in ``benchreport`` (no I/O,
unit-tested); this module records; every measured
section is written to ``controller.json`` as soon as it finishes (a later failure keeps earlier
results); wall-clock facts of the run itself (start, end, section durations) sit under ``timing``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import yaml

from tandem import GROUP, VERSION
from tandem.api.labels import ANNOTATION_ABORT, COMPONENT_ENGINE, LABEL_COMPONENT
from tandem.api.resources import InferencePool
from tandem.api.revision import revision_id, revision_spec
from tandem.builders.objects import build_service
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.observed import ObservedNode, Snapshot, parse_node
from tandem.core.plan import plan_pool
from tandem_lab.benchcli import bench_subparsers
from tandem_lab.dev import audit, identity
from tandem_lab.dev import cluster as devcluster
from tandem_lab.dev.benchreport import render_markdown, write_plots
from tandem_lab.dev.benchstats import (
    CATEGORY_OPERATOR,
    PLURAL,
    SECTIONS,
    TARGET_C2_ADD_PAIR_CREATE_PASS,
    TARGET_C2_ADD_PAIR_READY_PASS,
    api_writes,
    counter_delta,
    metric_sum,
    parse_metrics,
    ratio_summary,
    split_create_and_ready,
    split_passes,
    summarize,
    tally_writes,
    timeline,
    total_writes,
)
from tandem_lab.dev.kit import NodeGroup as KitNodeGroup
from tandem_lab.dev.kit import OperatorProcess
from tandem_lab.dev.kube import Kubectl, KubectlError
from tandem_lab.dev.testenv import TestenvError, Toolchain, locate

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
CRDS = REPO / "crds"
POOL = "speed"
NODE_LABEL = "tandem.dev/bench-nodes"
ENGINE_SELECTOR = f"{LABEL_COMPONENT}={COMPONENT_ENGINE}"
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:{digest}"
MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class Profile:
    """How much to measure: ``full`` (what bench/results holds) or ``quick`` (a smoke run)."""

    name: str
    c1_sizes: tuple[int, ...]
    c1_repeats: int
    c2_noop_s: float
    c2_restart_s: float
    c2_after_rollback_s: float
    c4_pools: int
    c4_restart: bool
    c6_repeats: int
    c6_load_delay_s: float
    """> 0: one more C6 run on a second cluster whose KWOK pods take this long to turn Ready (a model load)."""
    settle_s: float = 3.0


FULL = Profile("full", (10, 95), 5, 120.0, 30.0, 30.0, 1000, True, 2, 5.0)
QUICK = Profile("quick", (10,), 2, 60.0, 20.0, 15.0, 200, False, 1, 0.0)


# --- I/O: small helpers ----------------------------------------------------------------------------------


def image(tag: str) -> str:
    return IMAGE.format(tag=tag, digest=(tag.encode().hex() * 64)[:64])


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def pod_ready(obj: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def pool_ready(obj: Mapping[str, Any] | None, pairs: int) -> bool:
    """Status reports ``pairs`` Ready pairs, no more, and the Ready condition is True."""
    if not obj:
        return False
    status = obj.get("status") or {}
    counts = status.get("pairs") or {}
    ready_cond = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return counts.get("ready") == pairs and counts.get("current") == pairs and ready_cond


def read_proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process in MiB (from /proc/<pid>/status)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key.lower() + "_mib"] = round(int(rest.split()[0]) / 1024.0, 1)
    return out


def read_proc_cpu(pid: int) -> float:
    """User + system CPU seconds a process has used (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / float(ticks)


class AuditTail:
    """The audit log read incrementally from where the benchmark started; keeps write events only."""

    _WRITE_MARKS = tuple(f'"verb":"{v}"'.encode() for v in sorted(audit.WRITE_VERBS))

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""
        self.writes: list[audit.AuditEvent] = []
        self._lock = threading.Lock()

    def poll(self) -> None:
        with self._lock:
            if not self.path.exists():
                return
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
            self._offset += len(chunk)
            data = self._partial + chunk
            lines = data.split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                if not any(mark in line for mark in self._WRITE_MARKS):
                    continue
                ev = audit.parse_event(line.decode(errors="replace"))
                if ev is not None:  # one rule for what counts as a write (Lease heartbeats do not)
                    self.writes.extend(audit.select_writes([ev]))

    def select(self, since: datetime, until: datetime | None = None, user: str | None = None) -> list[audit.AuditEvent]:
        self.poll()
        return [
            ev
            for ev in self.writes
            if ev.timestamp >= since and (until is None or ev.timestamp < until) and (user is None or ev.user == user)
        ]

    def last_write(self, user: str) -> datetime | None:
        self.poll()
        for ev in reversed(self.writes):
            if ev.user == user:
                return ev.timestamp
        return None

    def wait_quiet(self, user: str, quiet_s: float, timeout_s: float = 120.0) -> datetime:
        """Block until ``user`` has written nothing for ``quiet_s`` (and at least ``quiet_s`` has passed)."""
        start = datetime.now(UTC)
        deadline = time.monotonic() + timeout_s
        while True:
            now = datetime.now(UTC)
            last = self.last_write(user)
            if (now - start).total_seconds() >= quiet_s and (last is None or (now - last).total_seconds() >= quiet_s):
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"{user} kept writing for {timeout_s:.0f} s (last write {last})")
            time.sleep(0.25)


class Tracker:
    """Objects from one watch by name, and named probes whose first-true time is recorded at event arrival."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._probes: dict[str, Callable[[dict[str, dict[str, Any]]], bool]] = {}
        self.hits: dict[str, float] = {}
        self.listeners: list[Callable[[float, str, dict[str, Any]], None]] = []
        self._cond = threading.Condition()

    def handle(self, t: float, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._cond:
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj
            self._check(t)
            self._cond.notify_all()
        for listener in self.listeners:
            listener(t, kind, obj)

    def _check(self, t: float) -> None:
        for key, probe in list(self._probes.items()):
            if key not in self.hits and probe(self.objects):
                self.hits[key] = t

    def expect(self, key: str, probe: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
        with self._cond:
            self.hits.pop(key, None)
            self._probes[key] = probe
            self._check(time.time())

    def when(self, key: str, timeout_s: float, what: str, progress: Callable[[], None] | None = None) -> float:
        """The epoch time at which probe ``key`` first held; TimeoutError naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout_s
        next_note = time.monotonic() + 15.0
        with self._cond:
            while key not in self.hits:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
                self._cond.wait(timeout=min(left, 1.0))
                if progress is not None and time.monotonic() > next_note:
                    next_note = time.monotonic() + 15.0
                    self._cond.release()
                    try:
                        progress()
                    finally:
                        self._cond.acquire()
            return self.hits[key]

    def get(self, name: str) -> dict[str, Any] | None:
        with self._cond:
            return self.objects.get(name)


class RawWatch:
    """``kubectl get --raw <path>?watch=1&sendInitialEvents=true…``: one JSON event per line, timestamped on arrival."""

    def __init__(
        self,
        kube: Kubectl,
        path: str,
        handler: Callable[[float, str, dict[str, Any]], None],
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> None:
        params = {
            "watch": "1",
            "sendInitialEvents": "true",
            "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan",
            "timeoutSeconds": "7200",
        }
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        self.kube = kube
        self.url = f"{path}?{urllib.parse.urlencode(params)}"
        self.handler = handler
        self.established = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self, timeout_s: float = 30.0) -> RawWatch:
        self.proc = subprocess.Popen(
            [str(self.kube.binary), f"--kubeconfig={self.kube.kubeconfig}", "get", "--raw", self.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        self._thread = threading.Thread(target=self._read, name=f"watch {self.url[:40]}", daemon=True)
        self._thread.start()
        if not self.established.wait(timeout_s):
            self.stop()
            raise TimeoutError(f"watch {self.url} not established in {timeout_s:.0f} s")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream: IO[bytes] = self.proc.stdout
        for raw in iter(stream.readline, b""):
            t = time.time()
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            kind = str(event.get("type", ""))
            obj = event.get("object") or {}
            if kind == "BOOKMARK":
                if ((obj.get("metadata") or {}).get("annotations") or {}).get("k8s.io/initial-events-end"):
                    self.established.set()
                continue
            if kind == "ERROR":
                self.errors.append(str(obj.get("message", obj)))
                continue
            try:
                self.handler(t, kind, obj)
            except Exception as exc:  # a probe bug must not kill the reader silently
                self.errors.append(f"handler: {exc!r}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def pools_path(ns: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}"


def configmaps_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


class OperatorRun(OperatorProcess):
    """``tandem run`` as a child process of the benchmark (the shared kit's, ``tandem_lab.dev.kit``): its pid
    is the operator's, so RSS and CPU are read there; the benchmark scrapes with a 1 s interval."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], log_path: Path, prometheus_url: str = "") -> None:
        super().__init__(
            kubeconfig=kubeconfig,
            namespaces=namespaces,
            log_path=log_path,
            prometheus_url=prometheus_url,
            scrape_interval_s=1.0,
        )

    def start(self, timeout_s: float = 90.0, settle_s: float = 2.0) -> OperatorRun:
        super().start(timeout_s=timeout_s, settle_s=settle_s)
        return self

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(self.metrics_text())

    def passes(self) -> int:
        return int(metric_sum(self.metrics(), "tandem_reconcile_total"))

    def memory(self) -> dict[str, float]:
        return read_proc_memory(self.pid)


class NodeGroup(KitNodeGroup):
    """KWOK MI325X nodes labelled ``tandem.dev/bench-nodes=<group>`` (the shared kit's node group)."""

    def __init__(self, kube: Kubectl, group: str) -> None:
        super().__init__(kube, label=NODE_LABEL, group=group, prefix="b", wait_s=240.0)

    def observed(self) -> tuple[ObservedNode, ...]:
        return tuple(parse_node(n) for n in self.items())

    def delete(self, wait: bool = True) -> None:
        super().delete(wait=wait)


def speed_pool(
    replicas: int,
    selector: Mapping[str, str],
    *,
    namespace: str,
    version: str = "v1",
    rollout: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The reference speed pool (1P:1D, 4 GPUs per instance), autoscaling off, no MooncakeCache, pinned
    to one node group; ``rollout`` replaces ``spec.rollout`` when given."""
    obj = yaml.safe_load((EXAMPLES / "speed-pool.yaml").read_text())
    obj["metadata"] = {"name": POOL, "namespace": namespace}
    spec = obj["spec"]
    spec["stack"].update({"version": version, "image": image(version)})
    spec["pairs"].update({"replicas": replicas, "drainTimeout": "2s"})
    spec["autoscaling"]["enabled"] = False
    spec["kvCache"].pop("mooncakeRef", None)
    spec["model"].pop("tokenSecretRef", None)
    spec["placement"]["nodeSelector"] = dict(selector)
    if rollout is not None:
        spec["rollout"] = copy.deepcopy(dict(rollout))
    else:
        spec["rollout"]["analysis"].pop("eval", None)
        spec["rollout"]["steps"] = [s for s in spec["rollout"]["steps"] if not (s.get("analysis") or {}).get("eval")]
    return dict(obj)


def empty_pool(name: str, namespace: str) -> dict[str, Any]:
    """The minimal example pool with ``pairs.replicas: 0`` (no pods): the unit of C4."""
    obj = yaml.safe_load((EXAMPLES / "minimal-pool.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": namespace}
    obj["spec"]["pairs"] = {"replicas": 0}
    return dict(obj)


def pool_revision(obj: Mapping[str, Any]) -> str:
    """The revision id the operator gives this manifest (no MooncakeCache wiring)."""
    body = copy.deepcopy(dict(obj))
    body.setdefault("metadata", {}).setdefault("namespace", "x")
    return revision_id(revision_spec(InferencePool.model_validate(body).spec))


def direct_objects(pool_obj: Mapping[str, Any], nodes: tuple[ObservedNode, ...]) -> list[dict[str, Any]]:
    """Arm B of C1: the pods the operator's planner and builders would create, and the Service, unowned."""
    body = copy.deepcopy(dict(pool_obj))
    body["metadata"] = {**body["metadata"], "uid": "00000000-0000-0000-0000-000000000000", "generation": 1}
    pool = InferencePool.model_validate(body)
    ns = pool.metadata.namespace
    plan = plan_pool(Snapshot(pool=pool, pods=(), nodes=nodes, now=datetime.now(UTC)))
    rev = revision_spec(pool.spec)
    objects: list[dict[str, Any]] = []
    for create in plan.creates:
        pod = build_instance_pod(
            InstanceParams(
                pool=pool.metadata.name,
                namespace=ns,
                pool_uid="direct",
                pair=create.pair,
                role=create.role,
                instance=create.instance,
                revision=create.revision,
                spec=rev,
                node=create.node,
            )
        )
        pod["metadata"].pop("ownerReferences", None)
        objects.append(pod)
    service = build_service(pool.metadata.name, ns, "direct")
    service["metadata"].pop("ownerReferences", None)
    objects.append(service)
    return objects


# --- the run context --------------------------------------------------------------------------------------


@dataclass
class Bench:
    """Everything a section needs: the cluster, the audit tail, logs, progress output."""

    state: devcluster.ClusterState
    kube: Kubectl
    tail: AuditTail
    profile: Profile
    log_dir: Path
    started: float = field(default_factory=time.monotonic)
    root: Path | None = None
    toolchain: Toolchain | None = None
    keep: bool = False
    _namespaces: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self.started:7.1f}s] {message}", flush=True)

    def namespace(self, prefix: str) -> str:
        name = f"bench-{prefix}-{secrets.token_hex(3)}"
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.kube.wait_for(
            f"ServiceAccount {name}/default",
            lambda: self.kube.get("serviceaccount", "default", namespace=name) is not None,
            timeout_s=60,
        )
        self._namespaces.append(name)
        return name

    def drop_namespace(self, name: str, wait_s: float = 300.0) -> None:
        """Release pool finalizers (no operator runs any more), delete the namespace, wait until it is gone."""
        out = self.kube.run("get", f"{PLURAL}.{GROUP}", "-n", name, "-o", "name", check=False).stdout.split()
        for obj in out:
            self.kube.run(
                "patch", obj, "-n", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
            )
        identity.drop_identity(self.kube, name)
        self.kube.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
        if wait_s > 0:
            self.kube.wait_for(
                f"namespace {name} gone",
                lambda: self.kube.run("get", "namespace", name, check=False).returncode != 0,
                timeout_s=wait_s,
                interval_s=1.0,
            )

    def operator(self, name: str, namespace: str, prometheus_url: str = "") -> tuple[OperatorRun, str]:
        kubeconfig, user = identity.operator_identity(self.kube, self.state, namespace)
        run = OperatorRun(
            kubeconfig=kubeconfig,
            namespaces=[namespace],
            log_path=self.log_dir / f"operator-{name}.log",
            prometheus_url=prometheus_url,
        )
        return run, user

    def apply(self, obj: Mapping[str, Any]) -> None:
        self.kube.run("apply", "-f", "-", stdin=json.dumps(obj))


# --- C1 -----------------------------------------------------------------------------------------------


def c1_arm_operator(b: Bench, pairs: int, label: str) -> dict[str, Any]:
    ns = b.namespace(f"c1a{pairs}")
    nodes = NodeGroup(b.kube, secrets.token_hex(3))
    op: OperatorRun | None = None
    watches: list[RawWatch] = []
    try:
        nodes.add(pairs)
        op, user = b.operator(f"c1-{label}", ns)
        op.start()
        pods, pools = Tracker(), Tracker()
        watches.append(RawWatch(b.kube, pods_path(ns), pods.handle, label_selector=ENGINE_SELECTOR).start())
        watches.append(RawWatch(b.kube, pools_path(ns), pools.handle).start())
        pods.expect("ready", lambda objs: sum(pod_ready(o) for o in objs.values()) >= 2 * pairs)
        pools.expect("ready", lambda objs: pool_ready(objs.get(POOL), pairs))
        passes0, cpu0 = op.passes(), read_proc_cpu(op.pid)
        t0 = time.time()
        b.apply(speed_pool(pairs, nodes.selector, namespace=ns))

        def note() -> None:
            b.say(f"    … {sum(pod_ready(o) for o in list(pods.objects.values()))}/{2 * pairs} pods Ready")

        t_pods = pods.when("ready", 600, f"{2 * pairs} operator pods Ready", note)
        t_status = pools.when("ready", 600, f"status: {pairs} pairs Ready")
        until = b.tail.wait_quiet(user, b.profile.settle_s)
        writes = tally_writes(b.tail.select(_utc(t0), until, user))
        return {
            "arm": "A",
            "status_s": round(t_status - t0, 3),
            "pods_s": round(t_pods - t0, 3),
            "writes": writes,
            "passes": op.passes() - passes0,
            "operator_cpu_s": round(read_proc_cpu(op.pid) - cpu0, 2),
        }
    finally:
        for w in watches:
            w.stop()
        if op is not None:
            op.stop()
        b.drop_namespace(ns)
        nodes.delete()


def c1_arm_direct(b: Bench, pairs: int) -> dict[str, Any]:
    ns = b.namespace(f"c1b{pairs}")
    nodes = NodeGroup(b.kube, secrets.token_hex(3))
    watches: list[RawWatch] = []
    try:
        nodes.add(pairs)
        objects = direct_objects(speed_pool(pairs, nodes.selector, namespace=ns), nodes.observed())
        if sum(o["kind"] == "Pod" for o in objects) != 2 * pairs:
            raise RuntimeError(f"the planner made {len(objects) - 1} pods for {pairs} pairs")
        pods = Tracker()
        watches.append(RawWatch(b.kube, pods_path(ns), pods.handle, label_selector=ENGINE_SELECTOR).start())
        pods.expect("ready", lambda objs: sum(pod_ready(o) for o in objs.values()) >= 2 * pairs)
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        t0 = time.time()
        b.kube.run("create", "-n", ns, "-f", "-", stdin=body, timeout_s=600)
        t_pods = pods.when("ready", 600, f"{2 * pairs} direct pods Ready")
        return {"arm": "B", "pods_s": round(t_pods - t0, 3)}
    finally:
        for w in watches:
            w.stop()
        b.drop_namespace(ns)
        nodes.delete()


def _run(kube: Kubectl, *args: str) -> None:
    kube.run(*args)


def median_tally(tallies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The tally of the repeat whose total is the (lower) median: one real repeat, not a blend."""
    if not tallies:
        return {}
    ordered = sorted(tallies, key=total_writes)
    return dict(ordered[(len(ordered) - 1) // 2])


def run_c1(b: Bench) -> dict[str, Any]:
    sizes = []
    for pairs in b.profile.c1_sizes:
        arms: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for r in range(b.profile.c1_repeats):
            order = "AB" if r % 2 == 0 else "BA"
            for arm in order:
                b.say(
                    f"C1 N={pairs} repeat {r + 1}/{b.profile.c1_repeats}: arm {arm} "
                    + ("(operator)" if arm == "A" else "(direct)")
                )
                res = c1_arm_operator(b, pairs, f"{pairs}-{r}") if arm == "A" else c1_arm_direct(b, pairs)
                res["repeat"] = r
                res["order"] = order
                res["load1_after"] = round(os.getloadavg()[0], 2)
                arms[arm].append(res)
                shown = res.get("status_s", res["pods_s"])
                b.say(f"    arm {arm}: {shown:.2f} s" + (f" (pods Ready {res['pods_s']:.2f} s)" if arm == "A" else ""))
        a_status = [x["status_s"] for x in arms["A"]]
        a_pods = [x["pods_s"] for x in arms["A"]]
        b_pods = [x["pods_s"] for x in arms["B"]]
        row = {
            "pairs": pairs,
            "pods": 2 * pairs,
            "repeats": b.profile.c1_repeats,
            "a_status": summarize(a_status),
            "a_pods": summarize(a_pods),
            "b_pods": summarize(b_pods),
            "ratio": ratio_summary(a_status, b_pods),
            "ratio_pods": ratio_summary(a_pods, b_pods),
            "overhead_s": summarize([x - y for x, y in zip(a_status, b_pods, strict=True)]),
            "operator_writes": median_tally([x["writes"] for x in arms["A"]]),
            "passes_median": statistics.median([x["passes"] for x in arms["A"]]),
            "operator_cpu_s": summarize([x["operator_cpu_s"] for x in arms["A"]]),
            "arms": arms,
        }
        b.say(
            f"C1 N={pairs}: A/B median {row['ratio']['median']:.2f} "
            f"({row['ratio']['min']:.2f}–{row['ratio']['max']:.2f})"
        )
        sizes.append(row)
    return {"sizes": sizes}


# --- C2 -----------------------------------------------------------------------------------------------

C2_ROLLOUT: dict[str, Any] = {
    "maxSurge": 1,
    "maxUnavailable": 0,
    "progressDeadline": "10m",
    "steps": [{"setCanaryPairs": 1}, {"pause": {}}],
}


def _scenario(
    name: str,
    events: Sequence[audit.AuditEvent],
    since: datetime,
    until: datetime,
    passes: int | None,
    own: dict[str, int] | None,
    expected: str,
) -> dict[str, Any]:
    return {
        "name": name,
        "window_s": round((until - since).total_seconds(), 2),
        "passes": passes,
        "writes": tally_writes(events),
        "operator_metric_writes": own,
        "expected": expected,
        "timeline": timeline(events, since),
    }


def judge(sc: dict[str, Any]) -> dict[str, Any]:
    """Set ``verdict`` (PASS/FAIL/—) and a reason from the scenario's budget (benchmarks.md §7 C2)."""
    name = sc["name"]
    if name.startswith(("no-op", "restart", "quiet")):
        n = total_writes(sc["writes"])
        sc["verdict"] = "PASS" if n == 0 else "FAIL"
        if n:
            sc["verdict_reason"] = f"{n} write(s) where 0 were expected: " + "; ".join(sc["timeline"][:12])
    elif name == "+1 pair" and sc.get("split"):
        create = sc["split"]["create"][CATEGORY_OPERATOR]["total"]
        ready = sc["split"]["ready"][CATEGORY_OPERATOR]["total"]
        ok = create <= TARGET_C2_ADD_PAIR_CREATE_PASS and ready <= TARGET_C2_ADD_PAIR_READY_PASS
        sc["verdict"] = "PASS" if ok else "FAIL"
        if not ok:
            sc["verdict_reason"] = (
                f"creating pass(es) made {create} operator writes (budget {TARGET_C2_ADD_PAIR_CREATE_PASS}), "
                f"pass(es) seeing Ready {ready} (budget {TARGET_C2_ADD_PAIR_READY_PASS})"
            )
            calls = sc["split"]["create"][CATEGORY_OPERATOR]["by_call"]
            if create > TARGET_C2_ADD_PAIR_CREATE_PASS and "patch configmaps" in calls:
                sc["verdict_reason"] += (
                    "; the write over budget is the routing-table ConfigMap: the creating pass already publishes "
                    "the new pair (as `warming`), and the pass seeing it Ready publishes it again (as `serving`)"
                )
    else:
        sc["verdict"] = "—"
    return sc


def run_c2(b: Bench) -> dict[str, Any]:
    ns = b.namespace("c2")
    nodes = NodeGroup(b.kube, secrets.token_hex(3))
    extra = NodeGroup(b.kube, secrets.token_hex(3))
    op: OperatorRun | None = None
    watch: RawWatch | None = None
    scenarios: list[dict[str, Any]] = []
    out: dict[str, Any] = {"namespace": ns, "settle_s": b.profile.settle_s, "scenarios": scenarios}
    try:
        b.say("C2: 5 nodes, the operator under its own ServiceAccount")
        nodes.add(5)
        op, user = b.operator("c2", ns)
        out["user"] = user
        op.start()
        pools = Tracker()
        watch = RawWatch(b.kube, pools_path(ns), pools.handle).start()

        def measure(
            name: str,
            trigger: Callable[[], None],
            done: Callable[[dict[str, dict[str, Any]]], bool] | None,
            expected: str,
            split: bool = False,
        ) -> dict[str, Any]:
            assert op is not None
            b.say(f"C2 scenario: {name}")
            before, passes0 = api_writes(op.metrics()), op.passes()
            since = datetime.now(UTC)
            trigger()
            if done is not None:
                pools.expect(name, done)
                pools.when(name, 300, f"C2 {name}")
            until = b.tail.wait_quiet(user, b.profile.settle_s)
            events = b.tail.select(since, until, user)
            samples = op.metrics()
            sc = _scenario(
                name,
                events,
                since,
                until,
                int(metric_sum(samples, "tandem_reconcile_total")) - passes0,
                counter_delta(before, api_writes(samples)),
                expected,
            )
            if split:
                halves = split_create_and_ready(events)
                sc["split"] = {k: tally_writes(v) for k, v in halves.items()}
                sc["split_passes"] = len(split_passes(events))
            scenarios.append(judge(sc))
            b.say(f"    {name}: {total_writes(sc['writes'])} writes ({sc['passes']} passes) → {sc['verdict']}")
            return sc

        manifest = speed_pool(2, nodes.selector, namespace=ns, rollout=C2_ROLLOUT)
        measure(
            "create (2 pairs)",
            lambda: b.apply(manifest),
            lambda objs: pool_ready(objs.get(POOL), 2),
            "report",
            split=True,
        )
        measure(
            "+1 pair",
            lambda: _run(b.kube, "scale", f"{PLURAL}.{GROUP}/{POOL}", "-n", ns, "--replicas=3"),
            lambda objs: pool_ready(objs.get(POOL), 3),
            f"creating pass ≤ {TARGET_C2_ADD_PAIR_CREATE_PASS}, pass seeing Ready ≤ {TARGET_C2_ADD_PAIR_READY_PASS}",
            split=True,
        )

        # No-op: a steady window; two nudges make sure passes really run inside it (an annotation on the
        # pool wakes its daemon; an unrelated node ADDED wakes every pool).
        window = b.profile.c2_noop_s

        def idle() -> None:
            third = window / 3.0
            time.sleep(third)
            b.kube.run("annotate", f"{PLURAL}.{GROUP}/{POOL}", "-n", ns, "bench.tandem.dev/nudge=1", "--overwrite")
            time.sleep(third)
            extra.add(1)
            time.sleep(max(0.0, window - 2 * third - 1.0))

        sc = measure(f"no-op ({window:.0f} s)", idle, None, "0 writes")
        sc["note"] = "nudged at 1/3 (an annotation on the pool) and 2/3 (an unrelated node added) so passes run in it"

        # Restart against the steady fleet: shutdown writes and restart writes are counted apart.
        b.say("C2 scenario: restart against the steady fleet")
        t_stop = datetime.now(UTC)
        op.stop()
        t_exit = datetime.now(UTC)
        shutdown = b.tail.select(t_stop, t_exit, user)
        op.start(settle_s=0.0)
        time.sleep(b.profile.c2_restart_s)
        t_end = datetime.now(UTC)
        restart_events = b.tail.select(t_exit, t_end, user)
        samples = op.metrics()
        sc = _scenario(
            f"restart ({b.profile.c2_restart_s:.0f} s)",
            restart_events,
            t_exit,
            t_end,
            int(metric_sum(samples, "tandem_reconcile_total")),
            counter_delta({}, api_writes(samples)),
            "0 writes",
        )
        sc["shutdown_writes"] = tally_writes(shutdown)
        sc["note"] = f"SIGTERM → exit took {(t_exit - t_stop).total_seconds():.1f} s with {len(shutdown)} write(s)"
        scenarios.append(judge(sc))
        b.say(f"    restart: {total_writes(sc['writes'])} writes ({sc['passes']} passes) → {sc['verdict']}")

        v2 = speed_pool(3, nodes.selector, namespace=ns, version="v2", rollout=C2_ROLLOUT)
        canary = pool_revision(v2)

        def canary_up(objs: dict[str, dict[str, Any]]) -> bool:
            status = (objs.get(POOL) or {}).get("status") or {}
            rollout = status.get("rollout") or {}
            can = (status.get("revisions") or {}).get("canary") or {}
            return rollout.get("stepIndex") == 1 and can.get("name") == canary and can.get("readyPairs") == 1

        measure("canary step", lambda: b.apply(v2), canary_up, "report")

        def rolled_back(objs: dict[str, dict[str, Any]]) -> bool:
            status = (objs.get(POOL) or {}).get("status") or {}
            pairs = status.get("pairs") or {}
            return (status.get("rollout") or {}).get("phase") == "RolledBack" and (
                pairs.get("draining") == 0 and pairs.get("current") == 3 and pairs.get("ready") == 3
            )

        measure(
            "rollback (abort)",
            lambda: _run(
                b.kube,
                "annotate",
                f"{PLURAL}.{GROUP}/{POOL}",
                "-n",
                ns,
                f"{ANNOTATION_ABORT}=bench-{secrets.token_hex(3)}",
            ),
            rolled_back,
            "report",
        )
        quiet = b.profile.c2_after_rollback_s
        measure(f"quiet after rollback ({quiet:.0f} s)", lambda: time.sleep(quiet), None, "0 writes")
        return out
    finally:
        if watch is not None:
            watch.stop()
        if op is not None:
            op.stop()
        b.drop_namespace(ns)
        nodes.delete()
        extra.delete()


# --- C4 -----------------------------------------------------------------------------------------------


class ObservedCount:
    """Counts pools whose ``status.observedGeneration`` equals their generation (handler of a pool watch)."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.first_all: float | None = None
        self.target = 0
        self._lock = threading.Lock()

    def handle(self, t: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        og = (obj.get("status") or {}).get("observedGeneration")
        with self._lock:
            if kind != "DELETED" and og and og == meta.get("generation"):
                self.done.add(name)
            if self.target and self.first_all is None and len(self.done) >= self.target:
                self.first_all = t


def run_c4(b: Bench) -> dict[str, Any]:
    pools = b.profile.c4_pools
    ns = b.namespace("c4")
    op: OperatorRun | None = None
    watch: RawWatch | None = None
    quiet_s = 10.0
    out: dict[str, Any] = {"pools": pools, "quiet_s": quiet_s, "namespace": ns}
    samples: list[list[float]] = []
    out["samples"] = samples
    stop_sampler = threading.Event()
    observed = ObservedCount()
    t_ref = time.time()

    def sampler() -> None:
        while not stop_sampler.wait(1.0):
            with contextlib.suppress(OSError, AssertionError):
                assert op is not None
                mem = op.memory()
                samples.append([round(time.time() - t_ref, 1), mem["vmrss_mib"], float(len(observed.done))])

    thread = threading.Thread(target=sampler, daemon=True)
    try:
        op, user = b.operator("c4", ns)
        op.start()
        thread.start()
        b.say(f"C4: operator idle with 0 pools ({quiet_s:.0f} s)")
        b.tail.wait_quiet(user, quiet_s)
        out["baseline"] = op.memory()
        watch = RawWatch(b.kube, pools_path(ns), observed.handle).start()
        observed.target = pools
        b.say(f"C4: creating {pools} InferencePools (replicas 0)")
        t0 = time.time()
        for start in range(0, pools, 100):
            items = [empty_pool(f"p{i:04d}", ns) for i in range(start, min(pools, start + 100))]
            b.kube.run(
                "create",
                "-f",
                "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                timeout_s=300,
            )
        out["create_s"] = round(time.time() - t0, 2)
        deadline = time.monotonic() + 1800
        last_note = 0.0
        while observed.first_all is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(observed.done)}/{pools} pools observed after 1800 s")
            if time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                b.say(f"    … {len(observed.done)}/{pools} pools have status.observedGeneration")
            time.sleep(0.5)
        out["observed_all_s"] = round(observed.first_all - t0, 2)
        b.say(f"C4: every pool observed after {out['observed_all_s']:.1f} s; waiting for a quiet operator")
        until = b.tail.wait_quiet(user, quiet_s, timeout_s=600)
        out["writes"] = tally_writes(b.tail.select(_utc(t0), until, user))
        out["loaded"] = op.memory()
        out["passes"] = op.passes()
        base, loaded = out["baseline"]["vmrss_mib"], out["loaded"]["vmrss_mib"]
        out["rss_ratio"] = round(loaded / base, 2)
        out["rss_per_pool_kib"] = round((loaded - base) * 1024.0 / pools, 1)
        b.say(f"C4: VmRSS {base:.1f} → {loaded:.1f} MiB (HWM {out['loaded']['vmhwm_mib']:.1f})")
        if b.profile.c4_restart:
            b.say(f"C4: restarting the operator against {pools} pools")
            op.stop()
            t_exit = time.time()
            op.start(settle_s=0.0)
            deadline = time.monotonic() + 900
            while op.passes() < pools:
                if time.monotonic() > deadline:
                    raise TimeoutError("restart: not every pool had a pass in 900 s")
                time.sleep(1.0)
            all_passed = time.time() - t_exit
            until = b.tail.wait_quiet(user, quiet_s, timeout_s=600)
            restart: dict[str, Any] = dict(op.memory())
            restart["all_passed_s"] = round(all_passed, 1)
            restart["window_s"] = round((until - _utc(t_exit)).total_seconds(), 1)
            restart["writes"] = tally_writes(b.tail.select(_utc(t_exit), until, user))
            out["restart"] = restart
            b.say(f"C4: restart: every pool passed after {all_passed:.1f} s, {total_writes(restart['writes'])} writes")
        return out
    finally:
        stop_sampler.set()
        if thread.is_alive():
            thread.join(timeout=5)
        if watch is not None:
            watch.stop()
        if op is not None:
            op.stop()
        # Without an operator, 1,000 finalizers would have to be released one by one; the namespace is
        # left to the cluster's teardown (or deleted with the operator running when --keep).


# --- C6 -----------------------------------------------------------------------------------------------

C6_ANALYSIS: dict[str, Any] = {
    "interval": "5s",
    "timeout": "3s",
    "initialDelay": "5s",
    "successStreak": 2,
    "failureLimit": 0,
    "noDataDeadline": "60s",
    "onNoData": "Pause",
    "metrics": [{"name": "ttft-p90", "template": "TTFTP90", "successCondition": "result <= baseline * 1.2"}],
}
C6_ROLLOUT: dict[str, Any] = {
    "maxSurge": 1,
    "maxUnavailable": 0,
    "progressDeadline": "10m",
    "steps": [{"setCanaryPairs": 1}, {"analysis": {}}, {"setWeight": 100}],
    "analysis": C6_ANALYSIS,
}


def canary_has_traffic(table: Mapping[str, Any], canary: str) -> bool:
    """True while the routing table can send the canary new requests (a serving pair with weight > 0)."""
    revisions = table.get("revisions") or {}
    if revisions.get("canary") == canary and (revisions.get("canaryWeightPercent") or 0) > 0:
        return True
    return any(
        p.get("revision") == canary and p.get("state") == "serving" and (p.get("weight") or 0) > 0
        for p in table.get("pairs") or []
    )


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class BreachClock:
    """Timestamps of one C6 run, set from the pool and routing-table watches as events arrive."""

    canary: str
    on_t0: Callable[[], None]
    t0: float | None = None
    step_started_at: float | None = None
    failure_seen: float | None = None
    evaluated_at: float | None = None
    gate: dict[str, Any] = field(default_factory=dict)
    rolling_back: float | None = None
    rolled_back: float | None = None
    verdicts: list[str] = field(default_factory=list)
    act: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_pool(self, t: float, kind: str, obj: dict[str, Any]) -> None:
        rollout = (obj.get("status") or {}).get("rollout") or {}
        with self._lock:
            if (
                self.t0 is None
                and rollout.get("revision") == self.canary
                and rollout.get("phase") == "Progressing"
                and rollout.get("stepIndex") == 1
            ):
                self.on_t0()  # the breach starts now: the exporter's canary TTFT × 1.5
                self.t0 = t
                self.step_started_at = _parse_time(rollout.get("stepStartedAt"))
            if self.t0 is None:
                return
            for gate in rollout.get("gates") or []:
                line = f"{gate.get('evaluatedAt')} {gate.get('verdict')} {gate.get('value')} vs {gate.get('baseline')}"
                if line not in self.verdicts:
                    self.verdicts.append(line)
            if self.failure_seen is None:
                for gate in rollout.get("gates") or []:
                    if gate.get("verdict") == "Failure":
                        self.failure_seen = t
                        self.evaluated_at = _parse_time(gate.get("evaluatedAt"))
                        self.gate = dict(gate)
                        break
            phase = rollout.get("phase")
            if self.rolling_back is None and phase in ("RollingBack", "RolledBack"):
                self.rolling_back = t
            if self.rolled_back is None and phase == "RolledBack":
                self.rolled_back = t

    def on_routing(self, t: float, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if self.t0 is None or self.act is not None or kind == "DELETED":
                return
            try:
                table = json.loads((obj.get("data") or {}).get("routing.json", "{}"))
            except ValueError:
                return
            if not canary_has_traffic(table, self.canary):
                self.act = t

    def split(self) -> dict[str, Any]:
        """observe / decide / act in seconds (None where a mark is missing)."""
        if self.t0 is None or self.act is None or self.rolling_back is None:
            return {}
        evaluated = self.evaluated_at if self.evaluated_at is not None else self.failure_seen
        assert evaluated is not None
        act_at = max(self.act, self.rolling_back)
        return {
            "observe_s": round(max(0.0, evaluated - self.t0), 3),
            "decide_s": round(max(0.0, self.rolling_back - max(evaluated, self.t0)), 3),
            "act_s": round(act_at - self.rolling_back, 3),
            "total_s": round(act_at - self.t0, 3),
            "failure_seen_s": round((self.failure_seen or 0.0) - self.t0, 3),
            "act_seen_before_phase": self.act < self.rolling_back,
            "gate_value": self.gate.get("value"),
            "gate_baseline": self.gate.get("baseline"),
            "step_started_at_lag_s": round(self.t0 - self.step_started_at, 3) if self.step_started_at else None,
        }


def c6_once(b: Bench, exporter: Any, prometheus: Any, label: str) -> dict[str, Any]:
    from tandem_lab.dev.podmetrics import PodMetricsBridge  # noqa: PLC0415 - only C6 needs the exporter

    ns = b.namespace("c6")
    nodes = NodeGroup(b.kube, secrets.token_hex(3))
    op: OperatorRun | None = None
    watches: list[RawWatch] = []
    bridge = PodMetricsBridge(b.kube, [ns], exporter, prometheus, prefix=f"bench-{ns}")
    try:
        nodes.add(4)
        op, user = b.operator(f"c6-{label}", ns, prometheus_url=prometheus.url)
        op.start()
        bridge.start()
        pools = Tracker()
        watches.append(RawWatch(b.kube, pools_path(ns), pools.handle).start())
        pools.expect("stable", lambda objs: pool_ready(objs.get(POOL), 2))
        b.apply(speed_pool(2, nodes.selector, namespace=ns, rollout=C6_ROLLOUT))
        pools.when("stable", 180, "C6 stable pairs Ready")
        time.sleep(5.0)  # the stable revision's series exist in Prometheus before the canary's
        bad = speed_pool(2, nodes.selector, namespace=ns, version="v2-slow", rollout=C6_ROLLOUT)
        canary = pool_revision(bad)
        clock = BreachClock(canary, on_t0=lambda: exporter.set_revision(canary, ttft_multiplier=1.5))
        pools.listeners.append(clock.on_pool)
        routing = Tracker()
        routing.listeners.append(clock.on_routing)
        watches.append(
            RawWatch(
                b.kube, configmaps_path(ns), routing.handle, field_selector=f"metadata.name={POOL}-routing"
            ).start()
        )
        b.say(f"C6 {label}: rolling out the bad version (canary {canary})")
        b.apply(bad)
        pools.expect(
            "rolledback",
            lambda objs: ((objs.get(POOL) or {}).get("status") or {}).get("rollout", {}).get("phase") == "RolledBack",
        )
        pools.when("rolledback", 300, "C6 RolledBack")
        deadline = time.monotonic() + 30
        while clock.act is None and time.monotonic() < deadline:
            time.sleep(0.2)
        split = clock.split()
        if not split:
            raise RuntimeError(f"C6 marks incomplete: {clock}")
        # Cross-check of the watch: the routing-table write the watch delivered as "act" (the last
        # operator write of the ConfigMap at or before the event arrived), from the audit log.
        t0, t_act = clock.t0 or 0.0, clock.act or 0.0
        routing_writes = [
            ev
            for ev in b.tail.select(_utc(t0), _utc(t_act + 0.001), user)
            if ev.resource == "configmaps" and ev.name == f"{POOL}-routing"
        ]
        if routing_writes:
            split["act_write_audit_s"] = round(routing_writes[-1].timestamp.timestamp() - t0, 3)
        split["verdicts"] = clock.verdicts
        if clock.evaluated_at is not None:
            before = b.tail.select(_utc(t0), _utc(clock.evaluated_at - 0.05), user)
            split["prior_pass_s"] = round(before[-1].timestamp.timestamp() - t0, 3) if before else None
        # The operator's writes around the step: evidence for when its passes ran (from 1 s before t0).
        around = b.tail.select(_utc(t0 - 1.0), _utc(t_act + 0.5), user)
        split["timeline"] = timeline(around, _utc(t0))
        b.say(
            f"    observe {split['observe_s']:.2f} s, decide {split['decide_s']:.2f} s, act {split['act_s']:.2f} s "
            f"→ total {split['total_s']:.2f} s"
        )
        return split
    finally:
        for w in watches:
            w.stop()
        bridge.stop()
        if op is not None:
            op.stop()
        b.drop_namespace(ns)
        nodes.delete()


def run_c6(b: Bench) -> dict[str, Any]:
    from tandem_lab.dev.exporter import Behaviour, Exporter  # noqa: PLC0415

    prometheus = b.state.prometheus_server()
    if prometheus is None:
        raise RuntimeError("the bench cluster has no Prometheus")
    exporter = Exporter(seed=2026, tick_s=0.25, default=Behaviour(request_rate=20.0))
    exporter.start()
    repeats: list[dict[str, Any]] = []
    with_load: dict[str, Any] | None = None
    try:
        for r in range(b.profile.c6_repeats):
            b.say(f"C6 repeat {r + 1}/{b.profile.c6_repeats}")
            repeats.append(c6_once(b, exporter, prometheus, str(r)))
        if b.profile.c6_load_delay_s > 0:
            with_load = c6_with_load_delay(b, exporter, b.profile.c6_load_delay_s)
    finally:
        exporter.stop()
    summary = {key: summarize([rep[key] for rep in repeats]) for key in ("observe_s", "decide_s", "act_s", "total_s")}
    config = {
        "interval": C6_ANALYSIS["interval"],
        "initialDelay": C6_ANALYSIS["initialDelay"],
        "successStreak": C6_ANALYSIS["successStreak"],
        "failureLimit": C6_ANALYSIS["failureLimit"],
        "successCondition": C6_ANALYSIS["metrics"][0]["successCondition"],
        "scrape_interval_s": b.state.scrape_interval_s,
        "ttft_multiplier": 1.5,
    }
    out: dict[str, Any] = {"config": config, "repeats": repeats, "summary": summary}
    if with_load is not None:
        out["with_load_delay"] = with_load
    return out


def install_crds(kube: Kubectl) -> None:
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    for crd in (f"{PLURAL}.{GROUP}", f"mooncakecaches.{GROUP}"):
        kube.run("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


def c6_with_load_delay(b: Bench, exporter: Any, delay_s: float) -> dict[str, Any]:
    """One C6 run where pods take ``delay_s`` to turn Ready (a model load), on a second cluster.

    KWOK's Ready delay is a cluster setting (its Stages) and C1 needs 0, hence a second cluster.
    """
    name = f"{b.state.name}-load"[:40]
    b.say(f"C6 with a {delay_s:g} s model load: second cluster {name!r} (KWOK Ready delay {delay_s:g} s)")
    options = devcluster.ClusterOptions(name=name, nodes=0, scrape_interval_s=1.0, load_delay_s=delay_s)
    state = devcluster.up(options, root=b.root, toolchain=b.toolchain, progress=b.say, die_with_caller=not b.keep)
    try:
        kube = state.kube(timeout_s=120)
        install_crds(kube)
        other = Bench(
            state=state,
            kube=kube,
            tail=AuditTail(Path(state.audit_log)),
            profile=b.profile,
            log_dir=b.log_dir,
            started=b.started,
        )
        prometheus = state.prometheus_server()
        if prometheus is None:
            raise RuntimeError(f"cluster {name} has no Prometheus")
        return {"load_delay_s": delay_s, "cluster": name, "repeat": c6_once(other, exporter, prometheus, "load")}
    finally:
        if not b.keep:
            devcluster.down(name, root=b.root, toolchain=b.toolchain, progress=b.say)


# --- machine, versions, CLI --------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024.0 / 1024.0, 1)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def code_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    return {"revision": git("rev-parse", "HEAD") or "unknown", "dirty": bool(git("status", "--porcelain"))}


def versions(toolchain: Toolchain) -> dict[str, str]:
    out = {
        "kubernetes": toolchain.versions.k8s,
        "etcd": toolchain.versions.etcd,
        "kwok": toolchain.versions.kwok,
        "python": platform.python_version(),
    }
    for dist, key in (
        ("tandem-operator", "tandem"),
        ("kopf", "kopf"),
        ("kubernetes", "kubernetes-python-client"),
        ("prometheus-client", "prometheus-client"),
        ("matplotlib", "matplotlib"),
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[key] = importlib.metadata.version(dist)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = subprocess.run(
            [str(toolchain.prometheus), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        first = (proc.stdout or proc.stderr).splitlines()[0] if (proc.stdout or proc.stderr) else ""
        m = re.search(r"version (\S+)", first)
        if m:
            out["prometheus"] = m.group(1)
    return out


def other_apiservers(own_cluster_dir: str) -> int:
    running = devcluster.processes_mentioning("", programs=frozenset({"kube-apiserver"}))
    return sum(1 for _, cmd in running if own_cluster_dir not in cmd)


def write_outputs(results: dict[str, Any], out: Path, plots: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "controller.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(out / "controller.json")
    (out / "controller.md").write_text(render_markdown(results))
    if plots:
        write_plots(results, out)


def register(subparsers: Any) -> None:
    """Add ``tandem bench controller`` to the top-level parser."""
    sub = bench_subparsers(subparsers)
    ctl = sub.add_parser(
        "controller",
        help="controller benchmark: C1 apply→Ready vs direct, C2 API writes, C4 memory, C6 breach→rollback",
        description=(
            "Starts its own local cluster (KWOK MI325X nodes, Prometheus scraping every second), runs the "
            "operator as a child process under its own ServiceAccount, and writes controller.json, "
            "controller.md and controller-*.png to --out. A full run takes about 30 minutes on 2 cores."
        ),
    )
    ctl.add_argument("--out", type=Path, required=True, help="output directory (e.g. bench/results)")
    ctl.add_argument("--quick", action="store_true", help="smoke profile: C1 at N=10 x2, 60 s no-op, 200 pools, 1 C6")
    ctl.add_argument("--cluster", default="bench", help="name of the cluster to start (default: bench)")
    ctl.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    ctl.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections to run (default: {','.join(SECTIONS)})"
    )
    ctl.add_argument(
        "--render", action="store_true", help="only re-render controller.md and the plots from --out/controller.json"
    )
    ctl.add_argument("--log-dir", type=Path, default=Path(".logs/bench-controller"), help="operator logs")
    ctl.add_argument("--state-dir", type=Path, default=None, help="cluster state root (default: ~/.tandem/clusters)")
    ctl.set_defaults(func=cmd_controller)


def cmd_controller(args: argparse.Namespace) -> int:
    profile = QUICK if args.quick else FULL
    only = [s.strip().lower() for s in str(args.only).split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(f"tandem bench controller: unknown section(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.render:
        saved: dict[str, Any] = json.loads((args.out / "controller.json").read_text())
        write_outputs(saved, args.out, plots=True)
        print(f"re-rendered {args.out / 'controller.md'} and the plots")
        return 0
    if importlib.util.find_spec("matplotlib") is None:  # fail before a 20-minute run, not after it
        print("tandem bench controller: matplotlib is missing (pip install -e . --group dev)", file=sys.stderr)
        return 1
    started_wall = datetime.now(UTC)
    t_start = time.monotonic()

    def say(message: str) -> None:
        print(f"[bench {time.monotonic() - t_start:7.1f}s] {message}", flush=True)

    try:
        toolchain = locate()
        toolchain.require()
    except TestenvError as exc:
        print(f"tandem bench controller: {exc}", file=sys.stderr)
        return 1
    results: dict[str, Any] = {
        "benchmark": "controller",
        "schema": 1,
        "profile": profile.name,
        "sections": only,
        "code": code_revision(),
        "machine": machine_info(),
        "versions": versions(toolchain),
        "config": {
            "profile": {k: v for k, v in profile.__dict__.items()},
            "kwok_ready_delay_s": 0.0,
            "scrape_interval_s": 1.0,
        },
        "timing": {"started_at": started_wall.isoformat(timespec="seconds"), "sections_s": {}},
    }
    reused = devcluster.status(args.cluster, args.state_dir).api_ready
    say(f"cluster {args.cluster!r}: " + ("reusing the running one (it stays up)" if reused else "starting"))
    t_up = time.monotonic()
    try:
        state = devcluster.up(
            devcluster.ClusterOptions(name=args.cluster, nodes=0, scrape_interval_s=1.0, load_delay_s=0.0),
            root=args.state_dir,
            toolchain=toolchain,
            progress=say,
            # A benchmark that tears its cluster down also takes it along when killed; --keep leaves it up.
            die_with_caller=not args.keep,
        )
    except (devcluster.ClusterError, TestenvError) as exc:
        print(f"tandem bench controller: {exc}", file=sys.stderr)
        return 1
    results["timing"]["sections_s"]["cluster_up"] = round(time.monotonic() - t_up, 1)
    results["machine"]["other_apiservers"] = other_apiservers(state.cluster_dir)
    kube = state.kube(timeout_s=120)
    install_crds(kube)
    bench = Bench(
        state=state,
        kube=kube,
        tail=AuditTail(Path(state.audit_log)),
        profile=profile,
        log_dir=args.log_dir.resolve(),
        started=t_start,
        root=args.state_dir,
        toolchain=toolchain,
        keep=bool(args.keep),
    )
    runners: dict[str, Callable[[Bench], dict[str, Any]]] = {"c1": run_c1, "c2": run_c2, "c6": run_c6, "c4": run_c4}
    code = 0
    try:
        for name in ("c1", "c2", "c6", "c4"):  # C4 last: its 1,000 pools are left to the teardown
            if name not in only:
                continue
            t_section = time.monotonic()
            say(f"=== {name.upper()} ===")
            try:
                results[name] = runners[name](bench)
            except (TimeoutError, KubectlError, RuntimeError, OSError) as exc:
                say(f"{name.upper()} failed: {exc}")
                results[name] = {"error": str(exc)[:2000]}
                code = 1
            results["timing"]["sections_s"][name] = round(time.monotonic() - t_section, 1)
            results["machine"].setdefault("loadavg_after_section", {})[name] = [round(x, 2) for x in os.getloadavg()]
            write_outputs(results, args.out, plots=False)
    finally:
        results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        results["timing"]["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        results["timing"]["wall_s"] = round(time.monotonic() - t_start, 1)
        write_outputs(results, args.out, plots=True)
        if args.keep or reused:
            if "c4" in only and args.keep:
                say("--keep: the C4 namespace still holds its pools; delete it with an operator running")
            say(f"cluster {args.cluster!r} left running (KUBECONFIG={state.kubeconfig})")
        else:
            say(f"tearing down cluster {args.cluster!r}")
            devcluster.down(args.cluster, root=args.state_dir, toolchain=toolchain, progress=say)
    say(f"wrote {args.out / 'controller.json'}, controller.md and plots")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tandem_lab.dev.benchctl controller ...`` (the same as ``tandem bench controller ...``)."""
    parser = argparse.ArgumentParser(prog="tandem")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
