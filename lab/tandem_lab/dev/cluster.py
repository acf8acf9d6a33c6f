"""The local dev cluster: a real control plane on 127.0.0.1 with KWOK AMD GPU nodes and Prometheus.

What it owns: ``up`` (kwokctl ``runtime: binary`` with our binaries, audit log, Stages; then GPU nodes
and Prometheus), ``down`` (stop everything, verify nothing is left, remove the state), ``status``,
the on-disk state of a cluster and ``serviceaccount_kubeconfig`` (a kubeconfig that authenticates as
a ServiceAccount through the TokenRequest API, so the operator can run with its chart's identity).

Layout (``$TANDEM_CLUSTERS_DIR``, default ``~/.tandem/clusters``, or ``--state-dir``)::

    <root>/<name>/state.json         what `status`/`down`/the pytest fixture read
    <root>/<name>/kubeconfig         admin kubeconfig (override with --kubeconfig)
    <root>/<name>/kwokctl.yaml       KwokctlConfiguration + our Stages (generated)
    <root>/<name>/audit-policy.yaml  Metadata-level audit policy
    <root>/<name>/prometheus/        prometheus.yml, targets/*.json (file_sd), tsdb/, prometheus.log
    <root>/.kwok/clusters/<name>/    kwokctl's workdir: pki, etcd data, logs/ (audit.log, component logs)

The kwokctl workdir is shared by all clusters under one root so kwokctl sees the ports the others use;
two clusters with different names coexist (every port is chosen free at ``up``).

What it must not do: download anything (every binary path is absolute and local), touch
``~/.kube/config``, or bind anything but 127.0.0.1.

Lifetime: a cluster started by ``tandem dev cluster up`` outlives the command (``make demo`` and users
rely on that). A caller that owns the cluster's whole life (a pytest session, a benchmark) passes
``die_with_caller``: Prometheus gets the parent-death signal, and a guard (``lifetime.start_guard``) runs
``down`` when the caller dies, even by SIGKILL, because kwokctl's components are not the caller's children.

Invariants: ``down`` leaves no process whose command line mentions the cluster's directories
(checked by scanning /proc after kwokctl's own teardown); a failed ``up`` tears down what it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tandem_lab.dev import audit, lifetime, stages
from tandem_lab.dev import nodes as gpu_nodes
from tandem_lab.dev.kube import Kubectl, KubectlError
from tandem_lab.dev.prometheus import DEFAULT_LOOKBACK_DELTA, DEFAULT_SCRAPE_INTERVAL_S, PrometheusServer
from tandem_lab.dev.testenv import CLUSTER_BINARIES, Toolchain, locate

STATE_ROOT_ENV = "TANDEM_CLUSTERS_DIR"
DEFAULT_STATE_ROOT = Path("~/.tandem/clusters")
STATE_FILE = "state.json"
KWOK_DIR = ".kwok"
KWOKCTL_CONFIG_API = "config.kwok.x-k8s.io/v1alpha1"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")

Progress = Callable[[str], None]


def loopback_pod_cidr(index: int) -> str:
    """Node ``index``'s loopback pod CIDR (127.128.0.0/9: apart from the test kit's 127.64.0.0/10 range)."""
    if not 0 <= index < 256 * 127:
        raise ValueError(f"node index {index} has no loopback pod CIDR")
    return f"127.{128 + index // 256}.{index % 256}.0/24"


class ClusterError(RuntimeError):
    """A dev cluster could not be started, found or stopped; the message says why and where to look."""


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class ClusterOptions:
    """What ``tandem dev cluster up`` builds."""

    name: str = "tandem"
    nodes: int = 4
    gpus_per_node: int = 8
    product: str = "MI325X"
    zones: tuple[str, ...] = gpu_nodes.DEFAULT_ZONES
    region: str = gpu_nodes.DEFAULT_REGION
    nodes_per_rack: int = gpu_nodes.DEFAULT_NODES_PER_RACK
    load_delay_s: float = 0.0
    load_jitter_s: float = 0.0
    prometheus: bool = True
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    lookback_delta: str = DEFAULT_LOOKBACK_DELTA
    kubeconfig: Path | None = None  # default <state_dir>/kubeconfig
    wait_s: float = 180.0
    loopback_pods: bool = False
    """Give node ``i`` the pod CIDR ``127.(128 + i // 256).(i % 256).0/24`` (:func:`loopback_pod_cidr`), so the
    addresses KWOK gives engine pods can be served by local processes (the demo's engine doubles)."""

    def validate(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"cluster name {self.name!r}: lower-case letters, digits and '-', at most 40")
        if self.nodes < 0 or self.gpus_per_node < 0:
            raise ValueError("--nodes and --gpus-per-node must be >= 0")
        if self.load_delay_s < 0 or self.load_jitter_s < 0:
            raise ValueError("--load-delay and --load-jitter must be >= 0")
        gpu_nodes.product(self.product)


@dataclass
class ClusterState:
    """Everything needed to use or stop a running cluster; persisted as ``state.json``."""

    name: str
    state_dir: str
    kubeconfig: str
    kwok_workdir: str
    cluster_dir: str
    audit_log: str
    kubectl: str
    kwokctl: str
    node_names: list[str] = field(default_factory=list)
    prometheus_binary: str | None = None
    prometheus_port: int | None = None
    prometheus_pid: int | None = None
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    lookback_delta: str = DEFAULT_LOOKBACK_DELTA
    options: dict[str, Any] = field(default_factory=dict)
    owner_pid: int | None = None  # set by the pytest fixture; stale clusters of dead owners are reaped
    guard_pid: int | None = None  # the guard that runs `down` when the caller dies (up's die_with_caller)
    created_at: str = ""
    startup_seconds: float = 0.0

    @property
    def prometheus_url(self) -> str | None:
        return f"http://127.0.0.1:{self.prometheus_port}" if self.prometheus_port else None

    def kube(self, timeout_s: float = 60.0) -> Kubectl:
        return Kubectl(Path(self.kubectl), Path(self.kubeconfig), timeout_s=timeout_s)

    def prometheus_server(self) -> PrometheusServer | None:
        if not self.prometheus_binary or not self.prometheus_port:
            return None
        return PrometheusServer(
            binary=Path(self.prometheus_binary),
            state_dir=Path(self.state_dir) / "prometheus",
            port=self.prometheus_port,
            scrape_interval_s=self.scrape_interval_s,
            lookback_delta=self.lookback_delta,
            pid=self.prometheus_pid,
        )

    def save(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        data = json.loads(path.read_text())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


# --- paths -----------------------------------------------------------------------------------------


def state_root(override: Path | None = None) -> Path:
    """``override`` or ``$TANDEM_CLUSTERS_DIR`` or ``~/.tandem/clusters``, absolute."""
    raw = override or Path(os.environ.get(STATE_ROOT_ENV) or DEFAULT_STATE_ROOT)
    return Path(raw).expanduser().resolve()


def state_dir(name: str, root: Path | None = None) -> Path:
    return state_root(root) / name


def kwok_workdir(root: Path | None = None) -> Path:
    return state_root(root) / KWOK_DIR


def load_state(name: str, root: Path | None = None) -> ClusterState | None:
    path = state_dir(name, root) / STATE_FILE
    return ClusterState.load(path) if path.is_file() else None


def list_states(root: Path | None = None) -> list[ClusterState]:
    base = state_root(root)
    if not base.is_dir():
        return []
    out = []
    for entry in sorted(base.iterdir()):
        if (entry / STATE_FILE).is_file():
            try:
                out.append(ClusterState.load(entry / STATE_FILE))
            except (ValueError, TypeError):
                continue
    return out


# --- pure config rendering -------------------------------------------------------------------------


def build_kwokctl_config(
    toolchain: Toolchain,
    audit_policy: Path,
    cache_dir: Path,
    load_delay_s: float = 0.0,
    load_jitter_s: float = 0.0,
) -> list[dict[str, Any]]:
    """The multi-document kwokctl config: one KwokctlConfiguration followed by our Stages (pure).

    Every binary is an absolute local path (kwokctl downloads only when a path is a URL or empty);
    ``kubectlBinary`` included, else kwokctl fetches one. Authorization (RBAC) and admission stay on,
    so a ServiceAccount's permissions are real.
    """
    v = toolchain.versions
    options: dict[str, Any] = {
        "runtime": "binary",
        "bindAddress": "127.0.0.1",
        "kubeVersion": v.k8s,
        "kwokVersion": v.kwok,
        "securePort": True,
        "kubeAuthorization": True,
        "kubeAdmission": True,
        "kubeAuditPolicy": str(audit_policy),
        "kubeApiserverBinary": str(toolchain.kube_apiserver),
        "kubeControllerManagerBinary": str(toolchain.kube_controller_manager),
        "kubeSchedulerBinary": str(toolchain.kube_scheduler),
        "kubectlBinary": str(toolchain.kubectl),
        "etcdBinary": str(toolchain.etcd),
        "kwokControllerBinary": str(toolchain.kwok),
        "cacheDir": str(cache_dir),
    }
    # One controller-manager and one scheduler: their leader election only adds a way to die. On a loaded
    # 2-core machine (a vLLM engine starting beside the suite) a lease renewal took > 10 s, both exited
    # with "leaderelection lost", nothing restarted them, and every later test failed on namespaces stuck
    # in Terminating. Without leader election they ride out a slow API server.
    patches = [
        {"name": component, "extraArgs": [{"key": "leader-elect", "value": "false"}]}
        for component in ("kube-controller-manager", "kube-scheduler")
    ]
    config: dict[str, Any] = {
        "apiVersion": KWOKCTL_CONFIG_API,
        "kind": "KwokctlConfiguration",
        "options": options,
        "componentsPatches": patches,
    }
    return [
        config,
        *stages.build_stages(
            kube_version=v.k8s,
            kwok_version=v.kwok,
            load_delay_s=load_delay_s,
            load_jitter_s=load_jitter_s,
        ),
    ]


def dump_yaml_documents(docs: Sequence[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False, width=200)


# --- processes -------------------------------------------------------------------------------------


def _kwok_env(workdir: Path) -> dict[str, str]:
    """The environment for kwokctl: our workdir, and no stray KWOK_* overrides from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
    env["KWOK_WORKDIR"] = str(workdir)
    return env


def _run_kwokctl(
    toolchain_kwokctl: str, args: Sequence[str], workdir: Path, log: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    cmd = [toolchain_kwokctl, *args]
    try:
        proc = subprocess.run(
            cmd,
            env=_kwok_env(workdir),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = "".join(_text(part) for part in (exc.stdout, exc.stderr))
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(cmd)}\n{out}(killed after {timeout_s:.0f} s)\n")
        raise ClusterError(
            f"kwokctl {args[0]} {args[1]} did not finish in {timeout_s:.0f} s; see {log}:\n" + _tail(out)
        ) from exc
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}(exit {proc.returncode})\n")
    return proc


def _text(part: str | bytes | None) -> str:
    if part is None:
        return ""
    return part.decode(errors="replace") if isinstance(part, bytes) else part


# Only these programs are ever stopped by path: a user's `tail -f <cluster>/logs/...` is left alone.
OWNED_PROGRAMS = frozenset(
    {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwok-controller", "prometheus"}
)


def processes_mentioning(*needles: str, programs: frozenset[str] = OWNED_PROGRAMS) -> list[tuple[int, str]]:
    """(pid, cmdline) of every ``programs`` process whose command line contains one of ``needles``."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv0 = raw.split(b"\0", 1)[0].decode(errors="replace")
        if Path(argv0).name not in programs:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if any(n in cmdline for n in needles):
            found.append((int(entry.name), cmdline))
    return found


def _terminate(pids: Sequence[int], timeout_s: float = 10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pid_alive(pid: int | None) -> bool:
    return pid is not None and _alive(pid)


# --- up / down / status ----------------------------------------------------------------------------


def teardown_command(name: str, root: Path | None = None) -> list[str]:
    """``tandem dev cluster down`` for this cluster, runnable by this interpreter without the console script."""
    return [
        sys.executable,
        "-m",
        "tandem_lab.dev.cli",
        "dev",
        "cluster",
        "down",
        f"--name={name}",
        f"--state-dir={state_root(root)}",
    ]


def up(
    options: ClusterOptions,
    root: Path | None = None,
    toolchain: Toolchain | None = None,
    progress: Progress = _quiet,
    owner_pid: int | None = None,
    die_with_caller: bool = False,
) -> ClusterState:
    """Start a cluster (or return the running one of that name). Raises ClusterError on failure.

    ``die_with_caller``: the cluster this call starts goes when the calling process dies, however it dies
    (module docstring, "Lifetime"); a running cluster it returns keeps its own lifetime. Call it from the
    thread whose end is the caller's end (the main thread): the parent-death signal follows that thread.
    """
    options.validate()
    toolchain = toolchain or locate()
    needed = CLUSTER_BINARIES + (("prometheus",) if options.prometheus else ())
    toolchain.require(needed)
    existing = load_state(options.name, root)
    if existing is not None:
        if _api_ready(existing.kube(timeout_s=10)):
            progress(f"cluster {options.name!r} is already up")
            return existing
        progress(f"cluster {options.name!r} has stale state; cleaning it up first")
        down(options.name, root, toolchain, progress)

    started = time.monotonic()
    sdir = state_dir(options.name, root)
    workdir = kwok_workdir(root)
    cluster_dir = workdir / "clusters" / options.name
    if cluster_dir.exists():  # leftovers of a crashed run without state.json
        down(options.name, root, toolchain, progress)
    sdir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = (options.kubeconfig or sdir / "kubeconfig").expanduser().resolve()
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    if kubeconfig.exists():
        kubeconfig.unlink()
    policy = sdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit.AUDIT_POLICY, sort_keys=False))
    config_path = sdir / "kwokctl.yaml"
    config_path.write_text(
        dump_yaml_documents(
            build_kwokctl_config(
                toolchain,
                policy,
                cache_dir=workdir / "cache",
                load_delay_s=options.load_delay_s,
                load_jitter_s=options.load_jitter_s,
            )
        )
    )
    state = ClusterState(
        name=options.name,
        state_dir=str(sdir),
        kubeconfig=str(kubeconfig),
        kwok_workdir=str(workdir),
        cluster_dir=str(cluster_dir),
        audit_log=str(cluster_dir / "logs" / "audit.log"),
        kubectl=str(toolchain.kubectl),
        kwokctl=str(toolchain.kwokctl),
        scrape_interval_s=options.scrape_interval_s,
        lookback_delta=options.lookback_delta,
        options={
            k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
            for k, v in asdict(options).items()
        },
        owner_pid=owner_pid,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    log = sdir / "kwokctl.log"
    if die_with_caller:  # before anything starts, so a caller killed during `up` leaves nothing either
        state.guard_pid = lifetime.start_guard(teardown_command(options.name, root), sdir / "guard.log").pid
    state.save()
    try:
        progress("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (kwokctl)")
        proc = _run_kwokctl(
            str(toolchain.kwokctl),
            [
                "create",
                "cluster",
                f"--name={options.name}",
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                f"--wait={int(options.wait_s)}s",
            ],
            workdir,
            log,
            timeout_s=options.wait_s + 30,
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"kwokctl create cluster failed (exit {proc.returncode}); see {log} and "
                f"{sdir / 'failed-start-logs'}:\n" + _tail(proc.stderr or proc.stdout)
            )
        kube = state.kube()
        progress(
            f"control plane up in {time.monotonic() - started:.1f} s; waiting for /readyz and the "
            "default ServiceAccount"
        )
        _wait_api(kube, options.wait_s)
        specs = gpu_nodes.plan_fleet(
            options.nodes,
            product_name=options.product,
            gpus=options.gpus_per_node,
            zones=options.zones,
            region=options.region,
            nodes_per_rack=options.nodes_per_rack,
            kubelet_version=toolchain.versions.k8s,
        )
        if options.loopback_pods:
            specs = [replace(spec, pod_cidr=loopback_pod_cidr(i)) for i, spec in enumerate(specs)]
        if specs:
            progress(
                f"adding {len(specs)} × {options.product} nodes ({options.gpus_per_node} GPUs each) in "
                f"{', '.join(options.zones)}"
            )
            gpu_nodes.add_nodes(kube, specs)
            gpu_nodes.wait_nodes_ready(kube, [s.name for s in specs], timeout_s=options.wait_s)
        state.node_names = [s.name for s in specs]
        if options.prometheus:
            prom = PrometheusServer(
                binary=toolchain.prometheus,
                state_dir=sdir / "prometheus",
                scrape_interval_s=options.scrape_interval_s,
                lookback_delta=options.lookback_delta,
                die_with_parent=die_with_caller,
            )
            progress("starting Prometheus on 127.0.0.1")
            prom.start()
            state.prometheus_binary = str(toolchain.prometheus)
            state.prometheus_port = prom.port
            state.prometheus_pid = prom.pid
        state.startup_seconds = round(time.monotonic() - started, 1)
        state.save()
        progress(f"cluster {options.name!r} ready in {state.startup_seconds:.1f} s")
        return state
    except BaseException as exc:
        progress(f"start failed ({exc.__class__.__name__}); keeping logs, tearing down")
        saved = sdir / "failed-start-logs"
        if (cluster_dir / "logs").is_dir():  # kwokctl delete removes its workdir, logs included
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(cluster_dir / "logs", saved, dirs_exist_ok=True)
        try:
            down(options.name, root, toolchain, progress, keep_state=True)
        except Exception as cleanup_exc:  # keep the original error; report the cleanup one with it
            progress(f"cleanup after failed start also failed: {cleanup_exc}")
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
            raise
        apiserver_log = saved / "kube-apiserver.log"
        hint = f"\nlogs: {log}, {saved}"
        if apiserver_log.is_file():
            hint += f"\nkube-apiserver.log (tail):\n{_tail(apiserver_log.read_text(errors='replace'), 10)}"
        raise ClusterError(f"cluster {options.name!r} failed to start: {exc}{hint}") from exc


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _api_ready(kube: Kubectl) -> bool:
    try:
        return kube.run("get", "--raw=/readyz", check=False, timeout_s=10).returncode == 0
    except KubectlError:
        return False


def _wait_api(kube: Kubectl, timeout_s: float) -> None:
    kube.wait_for("API server /readyz", lambda: _api_ready(kube), timeout_s=timeout_s)

    def default_sa() -> bool:
        return kube.get("serviceaccount", "default", namespace="default") is not None

    kube.wait_for("ServiceAccount default/default", default_sa, timeout_s=timeout_s)


def down(
    name: str,
    root: Path | None = None,
    toolchain: Toolchain | None = None,
    progress: Progress = _quiet,
    keep_state: bool = False,
) -> list[tuple[int, str]]:
    """Stop everything of cluster ``name`` and remove its state; returns processes that had to be killed.

    Safe to call on a cluster that is half up, already down, or unknown.
    """
    toolchain = toolchain or locate()
    sdir = state_dir(name, root)
    workdir = kwok_workdir(root)
    cluster_dir = workdir / "clusters" / name
    state = load_state(name, root)
    if state is not None:
        # Our own teardown: the guard must not start a second one (unless it is the guard that runs this).
        if state.guard_pid not in (os.getpid(), os.getppid()):
            lifetime.dismiss_guard(state.guard_pid)
        prom = state.prometheus_server()
        if prom is not None:
            progress("stopping Prometheus")
            prom.stop()
    if cluster_dir.exists():
        progress("stopping the control plane (kwokctl delete cluster)")
        kwokctl = state.kwokctl if state else str(toolchain.kwokctl)
        sdir.mkdir(parents=True, exist_ok=True)
        proc = _run_kwokctl(
            kwokctl, ["delete", "cluster", f"--name={name}"], workdir, sdir / "kwokctl.log", timeout_s=120
        )
        if proc.returncode != 0:
            progress(f"kwokctl delete cluster exited {proc.returncode}; killing leftovers by path")
    # Whatever still runs with our paths on its command line is ours and must go.
    leftovers = processes_mentioning(str(cluster_dir) + "/", str(sdir / "prometheus") + "/")
    if leftovers:
        progress(f"terminating {len(leftovers)} leftover process(es)")
        _terminate([pid for pid, _ in leftovers])
    remaining = processes_mentioning(str(cluster_dir) + "/", str(sdir / "prometheus") + "/")
    if remaining:
        raise ClusterError(f"processes of cluster {name!r} survived SIGKILL: {remaining}")
    shutil.rmtree(cluster_dir, ignore_errors=True)
    if not keep_state:
        shutil.rmtree(sdir, ignore_errors=True)
    progress(f"cluster {name!r} is down")
    return leftovers


@dataclass
class ClusterStatus:
    """What ``tandem dev cluster status`` shows."""

    name: str
    state: ClusterState | None
    api_ready: bool = False
    server: str = ""
    components: dict[str, bool] = field(default_factory=dict)  # name -> running
    nodes: list[dict[str, Any]] = field(default_factory=list)  # name, ready, zone, gpus (alloc/cap)
    prometheus_ready: bool = False

    @property
    def gpus_allocatable(self) -> int:
        return sum(int(n["gpus_allocatable"]) for n in self.nodes)


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def status(name: str, root: Path | None = None) -> ClusterStatus:
    """Inspect a cluster without changing it."""
    state = load_state(name, root)
    result = ClusterStatus(name=name, state=state)
    if state is None:
        return result
    cluster_dir = state.cluster_dir + "/"
    running = processes_mentioning(cluster_dir)
    for comp in COMPONENTS:  # kwokctl runs each as <cluster_dir>/bin/<component>
        result.components[comp] = any(Path(cmd.split(" ", 1)[0]).name == comp for _, cmd in running)
    kube = state.kube(timeout_s=10)
    result.api_ready = _api_ready(kube)
    if result.api_ready:
        try:
            cfg = kube.json("config", "view", "--minify")
            result.server = cfg["clusters"][0]["cluster"]["server"]
            for node in kube.json("get", "nodes")["items"]:
                labels = node["metadata"].get("labels", {})
                st = node.get("status", {})
                result.nodes.append(
                    {
                        "name": node["metadata"]["name"],
                        "ready": gpu_nodes.node_is_ready(node),
                        "unschedulable": bool(node.get("spec", {}).get("unschedulable")),
                        "zone": labels.get(gpu_nodes.LABEL_ZONE, ""),
                        "rack": labels.get(gpu_nodes.LABEL_RACK, ""),
                        "product": labels.get(gpu_nodes.LABEL_GPU_PRODUCT_NAME, ""),
                        "gpus_capacity": int(st.get("capacity", {}).get(gpu_nodes.RESOURCE_GPU, 0)),
                        "gpus_allocatable": int(st.get("allocatable", {}).get(gpu_nodes.RESOURCE_GPU, 0)),
                    }
                )
        except (KubectlError, KeyError, IndexError, ValueError):
            pass
    prom = state.prometheus_server()
    result.prometheus_ready = bool(prom and prom.is_running() and prom.is_ready())
    return result


def serviceaccount_kubeconfig(
    cluster: ClusterState,
    namespace: str,
    serviceaccount: str,
    path: Path | None = None,
    duration: str = "24h",
) -> Path:
    """Write a kubeconfig that authenticates as ``system:serviceaccount:<namespace>:<serviceaccount>``.

    The token comes from the TokenRequest API (``kubectl create token``); the ServiceAccount must
    exist. Server and CA are copied from the admin kubeconfig. The file is private (mode 0600).
    """
    kube = cluster.kube()
    token = kube.run("create", "token", serviceaccount, "-n", namespace, f"--duration={duration}").stdout.strip()
    admin = kube.json("config", "view", "--raw", "--minify")
    admin_cluster = admin["clusters"][0]["cluster"]
    user = f"{namespace}-{serviceaccount}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster.name, "cluster": admin_cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster.name, "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    out = path or Path(cluster.state_dir) / f"sa-{namespace}-{serviceaccount}.kubeconfig"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(yaml.safe_dump(config, sort_keys=False))
    return out


def reap_stale(root: Path | None = None, prefix: str = "pytest-", progress: Progress = _quiet) -> list[str]:
    """Tear down clusters named ``<prefix>*`` whose owner process is gone (crashed test sessions)."""
    reaped = []
    for state in list_states(root):
        if state.name.startswith(prefix) and state.owner_pid is not None and not pid_alive(state.owner_pid):
            down(state.name, root, progress=progress)
            reaped.append(state.name)
    return reaped
