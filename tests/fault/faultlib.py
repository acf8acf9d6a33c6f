"""Helpers of the fault tier (testing.md §4): manifests, observers, fault tools and invariant checks.

What it owns:
- ``pool_manifest``: the minimal example pool, sized for a test, pinned to the test's own nodes, with
  short timings (drain 2 s, analysis every 4 s) so the tier fits its budget;
- ``ObjectWatch``: a ``kubectl get --watch`` in a thread that records every version of the watched
  objects with the local time it arrived (exact step sequences and serving counts, not 1 s samples);
  it reconnects by itself when the API server goes away;
- ``TcpFault``: a loopback TCP endpoint switchable between *forward* (to a real Prometheus), *refuse*
  (nothing listens: connection refused) and *blackhole* (accepts, reads, never answers);
- ``injected_env``: environment for an operator process whose adapter is wrapped by
  ``tests/fault/inject/sitecustomize.py`` (crash points without test branches in product code);
- invariant checks over watch records: INV-1 (capacity floor), INV-3 (step discipline), and audit-log
  write selection for one identity.

OP-06's exception comes from a realistic poison (a foreign edit of the routing table), not from this
wrapper; API-01 uses ``kwokctl stop/start cluster`` (see test_control_plane.py for why not SIGSTOP).

What it must not do: touch product code or the shared fixtures in tests/support (others use them).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tandem.api.resources import InferencePool
from tandem.api.revision import revision_id, revision_spec
from tandem_lab.dev import audit
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.ports import free_port
from tests.support.tandem_cluster import REPO, GpuNodes, wait_until

POOLS = "inferencepools.tandem.dev"
IMAGE = "docker.io/vllm/vllm-openai-rocm:{tag}@sha256:" + "ab" * 32
INJECT_DIR = Path(__file__).resolve().parent / "inject"
MINIMAL = yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text())

GOOD_ANALYSIS: dict[str, Any] = {
    "interval": "4s",
    "timeout": "2s",
    "initialDelay": "2s",
    "successStreak": 2,
    "failureLimit": 0,
    "noDataDeadline": "16s",
    "onNoData": "Rollback",
    "metrics": [
        {"name": "ttft", "template": "TTFTP90", "successCondition": "result <= baseline * 1.2"},
        {"name": "errors", "template": "ErrorRate", "failureCondition": "result > 0.01"},
    ],
}
CANARY_STEPS: list[dict[str, Any]] = [{"setCanaryPairs": 1}, {"analysis": {}}, {"setWeight": 100}]


def now() -> datetime:
    return datetime.now(UTC)


def pool_manifest(
    name: str,
    nodes: GpuNodes,
    *,
    replicas: int,
    version: str = "v1",
    steps: list[dict[str, Any]] | None = None,
    analysis: dict[str, Any] | None = None,
    drain: str = "2s",
    orphan: str = "300s",
    max_surge: int = 1,
    max_unavailable: int = 0,
    progress_deadline: str = "5m",
) -> dict[str, Any]:
    """The minimal example pool (1P+1D, 4 GPUs each: one pair per 8-GPU node) with test timings."""
    obj = copy.deepcopy(MINIMAL)
    obj["metadata"] = {"name": name}
    obj["spec"].update(
        {
            "stack": {"version": version, "image": IMAGE.format(tag=version)},
            "pairs": {"replicas": replicas, "drainTimeout": drain, "orphanTimeout": orphan},
            "placement": {"nodeSelector": nodes.selector},
            "rollout": {
                "maxSurge": max_surge,
                "maxUnavailable": max_unavailable,
                "progressDeadline": progress_deadline,
                "steps": copy.deepcopy(steps if steps is not None else CANARY_STEPS),
                "analysis": {**copy.deepcopy(GOOD_ANALYSIS), **(analysis or {})},
            },
        }
    )
    return obj


def revision_of(obj: dict[str, Any]) -> str:
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = "x"
    return revision_id(revision_spec(InferencePool.model_validate(body).spec))


def apply(kube: Kubectl, ns: str, obj: dict[str, Any]) -> None:
    kube.run("apply", "-n", ns, "-f", "-", stdin=json.dumps(obj))


def pool_obj(kube: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    return kube.get(POOLS, name, namespace=ns)


def status(kube: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return (pool_obj(kube, ns, name) or {}).get("status") or {}


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c.get("type") == kind), {})


def engine_pods(kube: Kubectl, ns: str, pool: str | None = None) -> list[dict[str, Any]]:
    selector = "tandem.dev/component=engine" + (f",tandem.dev/pool={pool}" if pool else "")
    return list(kube.json("get", "pods", "-n", ns, "-l", selector)["items"])


def pod_uids(kube: Kubectl, ns: str, pool: str | None = None) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in engine_pods(kube, ns, pool)}


def routing(kube: Kubectl, ns: str, pool: str) -> dict[str, Any]:
    cm = kube.get("configmap", f"{pool}-routing", namespace=ns)
    return dict(json.loads(cm["data"]["routing.json"])) if cm else {"pairs": []}


def wait_ready(kube: Kubectl, ns: str, pool: str, pairs: int, timeout_s: float = 90) -> dict[str, Any]:
    """All ``pairs`` Ready, none extra or draining, Ready=True."""
    return wait_until(
        f"{pool}: {pairs} pairs Ready",
        lambda: (
            (s := status(kube, ns, pool)).get("pairs", {}).get("ready") == pairs
            and s["pairs"].get("current") == pairs
            and s["pairs"].get("draining", 0) == 0
            and condition(s, "Ready").get("status") == "True"
            and s
        ),
        timeout_s=timeout_s,
    )


def live_pair_slots(pods: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """pair label -> names of its pods that are not being deleted."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        out.setdefault(pod["metadata"]["labels"].get("tandem.dev/pair", "?"), []).append(pod["metadata"]["name"])
    return out


def events(kube: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    """Events about one object, oldest first."""
    items = kube.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


# --- observers ------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One watch event as it arrived."""

    t: float  # time.time() on arrival
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]


@dataclass
class ObjectWatch:
    """``kubectl get <kind> [name] -n ns --watch``: every version of the objects, with arrival times.

    Runs in a thread; when kubectl exits (API server gone, watch expired) it starts again after a short
    pause, which replays the current state as ADDED events. Use as a context manager.
    """

    kube: Kubectl
    kind: str
    namespace: str
    name: str | None = None
    selector: str | None = None
    records: list[Seen] = field(default_factory=list)
    restarts: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _proc: subprocess.Popen[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> ObjectWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{self.kind}")
        self._thread.start()
        wait_until(f"watch on {self.kind} delivering", lambda: self.records or self.name is None, timeout_s=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _cmd(self) -> list[str]:
        cmd = [str(self.kube.binary), f"--kubeconfig={self.kube.kubeconfig}", "get", self.kind, "-n", self.namespace]
        if self.name:
            cmd.append(self.name)
        if self.selector:
            cmd += ["-l", self.selector]
        return [*cmd, "--watch", "--output-watch-events", "-o", "json", "--request-timeout=0"]

    def _run(self) -> None:
        decoder = json.JSONDecoder()
        while not self._stop.is_set():
            proc = subprocess.Popen(
                self._cmd(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
            )
            with self._lock:
                self._proc = proc
            buffer = ""
            assert proc.stdout is not None
            for line in proc.stdout:
                buffer += line
                while buffer.strip():
                    try:
                        doc, end = decoder.raw_decode(buffer.lstrip())
                    except ValueError:
                        break
                    buffer = buffer.lstrip()[end:]
                    obj = doc.get("object") or {}
                    (obj.get("metadata") or {}).pop("managedFields", None)
                    self.records.append(Seen(time.time(), str(doc.get("type", "")), obj))
            proc.wait()
            if not self._stop.is_set():
                self.restarts += 1
                time.sleep(0.5)

    def objects(self, name: str | None = None) -> list[Seen]:
        return [r for r in list(self.records) if name is None or r.obj.get("metadata", {}).get("name") == name]


def step_sequence(watch: ObjectWatch) -> list[tuple[float, str, int, str]]:
    """(time, rollout revision, stepIndex, phase) at every change of any of the three."""
    out: list[tuple[float, str, int, str]] = []
    for seen in watch.objects():
        ro = (seen.obj.get("status") or {}).get("rollout") or {}
        key = (str(ro.get("revision", "")), int(ro.get("stepIndex", 0)), str(ro.get("phase", "")))
        if not out or out[-1][1:] != key:
            out.append((seen.t, *key))
    return out


def step_violations(seq: list[tuple[float, str, int, str]]) -> list[str]:
    """INV-3: per revision, stepIndex rises by at most 1 between consecutive versions and never falls
    (it returns to 0 only when the rollout revision changes)."""
    bad = []
    for (_, rev_a, step_a, _), (t, rev_b, step_b, phase) in itertools.pairwise(seq):
        if rev_a != rev_b:
            continue
        if step_b > step_a + 1 or step_b < step_a:
            bad.append(f"{rev_a}: step {step_a} -> {step_b} ({phase}) at {t:.1f}")
    return bad


def serving_series(watch: ObjectWatch, pool: str) -> list[tuple[float, int]]:
    """(time, pairs marked serving) for every published version of ``<pool>-routing``."""
    out = []
    for seen in watch.objects(f"{pool}-routing"):
        if seen.type == "DELETED":
            continue
        try:
            table = json.loads((seen.obj.get("data") or {}).get("routing.json", "{}"))
        except ValueError:
            continue
        out.append((seen.t, sum(1 for p in table.get("pairs") or [] if p.get("state") == "serving")))
    return out


def floor_breaches(series: list[tuple[float, int]], floor: int, until: float | None = None) -> list[tuple[float, int]]:
    """INV-1: every version of the routing table with fewer serving pairs than the floor (before ``until``)."""
    return [(t, n) for t, n in series if n < floor and (until is None or t < until)]


# --- audit log ------------------------------------------------------------------------------------


def writes_by(
    audit_log: Path,
    user: str,
    since: datetime,
    until: datetime | None = None,
    resource: str | None = None,
    verb: str | None = None,
    namespace: str | None = None,
) -> list[audit.AuditEvent]:
    """Write requests of ``user`` (failed ones included: a retry storm of 409/403 counts) in the window."""
    selected = audit.select_writes(
        audit.iter_events(audit_log), since=since, until=until, users=[user], namespace=namespace
    )
    return [e for e in selected if (resource is None or e.resource == resource) and (verb is None or e.verb == verb)]


def describe(writes: Iterable[audit.AuditEvent]) -> list[str]:
    return [f"{e.timestamp:%H:%M:%S.%f} {e.verb} {e.resource} {e.name} -> {e.code}" for e in writes]


def wait_audit_flushed(audit_log: Path, after: datetime, timeout_s: float = 15) -> None:
    """The API server writes the audit log in batches: wait until it holds an event newer than ``after``."""

    def newest() -> bool:
        last = None
        for ev in audit.iter_events(audit_log):
            last = ev
        return last is not None and last.timestamp >= after

    wait_until("audit log flushed", newest, timeout_s=timeout_s)


# --- fault tools ----------------------------------------------------------------------------------


class TcpFault:
    """A loopback TCP endpoint: ``forward`` to a target, ``refuse`` (nothing listens) or ``blackhole``.

    A mode change cuts every connection open at that moment, so a client's keep-alive connection
    cannot outlive the fault (refused means refused, blackholed means no answer at all).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.mode = "refuse"
        self.target: tuple[str, int] | None = None
        self.accepted = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="tcp-fault")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._close_listener()
        self._cut()
        self._thread.join(timeout=5)

    def forward(self, url: str) -> None:
        host, _, port = url.split("://", 1)[1].rstrip("/").partition(":")
        self.target = (host, int(port))
        self._switch("forward")

    def refuse(self) -> None:
        self._switch("refuse")

    def blackhole(self) -> None:
        self._switch("blackhole")

    def _switch(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
        self._cut()
        if mode == "refuse":
            self._close_listener()

    def _cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()

    def _close_listener(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()

    def _open_listener(self) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.2)
        return listener

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                mode, listener = self.mode, self._listener
            if mode == "refuse":
                time.sleep(0.05)
                continue
            if listener is None:
                try:
                    listener = self._open_listener()
                except OSError:
                    time.sleep(0.1)
                    continue
                with self._lock:
                    self._listener = listener
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self._conns.add(conn)
                self.accepted += 1
                mode = self.mode
            threading.Thread(target=self._serve, args=(conn, mode), daemon=True).start()

    def _serve(self, conn: socket.socket, mode: str) -> None:
        if mode == "blackhole" or self.target is None:
            with contextlib.suppress(OSError):
                while conn.recv(65536):
                    pass  # read and never answer
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            with contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            self._conns.add(upstream)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
        pump(conn, upstream)


def injected_env(**faults: str | int) -> dict[str, str]:
    """Environment of an operator process whose adapter is wrapped by tests/fault/inject/sitecustomize.py.

    ``kill_after_pod_creates=N``: SIGKILL itself right after the N-th successful Pod create returned
    (the pod exists; nothing about it was published yet).
    """
    env = {"PYTHONPATH": os.pathsep.join([str(INJECT_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for key, value in faults.items():
        env[f"TANDEM_FAULT_{key.upper()}"] = str(value)
    return env


def data_patch(key: str, value: Any) -> str:
    """A merge patch setting one ConfigMap data key (``value`` is JSON-encoded unless it is a string)."""
    return json.dumps({"data": {key: value if isinstance(value, str) else json.dumps(value)}})
