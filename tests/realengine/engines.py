"""Real vLLM engines for the realengine tier: where the environment is, the CPU transform, start and stop.

What it owns: finding the environment tools/realengine/install.sh built (failing, never skipping, when it is
missing: the tier is mandatory), turning a pod Tandem's builders produced into a `vllm serve` command line
and environment that runs on this CPU-only, loopback-only machine, and the engine processes' lifecycle.

The CPU transform is deliberately small and fully listed in ``SUBSTITUTED_FLAGS`` and ``ADDED_FLAGS``, so a
test can assert that everything else the builder emitted reaches vLLM unchanged (docs/design/011-real-engine.md):
- substituted: the model path (the tiny generated Llama), ``--host`` (loopback), ``--port`` (a free port);
  ``--tensor-parallel-size`` (1: the machine has 2 CPU cores, not the pool's 4 GPUs) and ``--max-model-len``
  (the tiny model's 2,048 positions; vLLM rejects a longer one);
- added: ``--enforce-eager`` (skips ~40 s of torch.compile per start) and ``kv_buffer_device: cpu`` in every
  NixlConnector dict (the default is a CUDA buffer);
- env: values from the Downward API (``status.podIP``) become 127.0.0.1; ``HF_HOME`` moves to the scratch
  directory; the CPU backend's own settings, the NIXL side-channel port and UCX loopback transports are added;
  ``PYTHONPATH`` loads ``cpushim/sitecustomize.py``, which stops each idle NIXL agent from spinning a core
  (NIXL's Python agent polls its UCX progress thread with a 0 ms timeout; two engines then starve a
  2-core machine and vLLM's fixed 5 s NIXL handshake timeout fails), and lets Mooncake's connector run
  without a GPU (cpushim/sitecustomize.py);
- Mooncake env: the prefill's bootstrap port (``VLLM_MOONCAKE_BOOTSTRAP_PORT``) becomes a free port, and
  ``MOONCAKE_CONFIG_PATH`` (the cache's client ConfigMap, mounted in a pod) a file in the scratch directory
  holding the builder's ``mooncake.json`` for a master on loopback (``SUBSTITUTED_ENV``).

Every process the tier starts goes through ``spawn``: it dies with the pytest process that started it
(Linux's parent-death signal, ``tandem_lab.dev.lifetime``, which the cluster fixtures use too), so a killed
test run leaves no engine behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tandem.builders.common import SCRATCH_DIR
from tandem.builders.pods import SCRATCH_ENV
from tandem_lab.dev.lifetime import bind_to_this_process

REPO = Path(__file__).resolve().parents[2]
CPU_SHIM = Path(__file__).resolve().parent / "cpushim"
CPU_SHIM_APPLIED = "tandem-realengine-shim: NIXL progress-thread poll timeout 0 -> "
MOONCAKE_SHIM_APPLIED = "tandem-realengine-shim: Mooncake current_device_index without a GPU -> 0"
PARENT_DEATH_SIGNAL = signal.SIGTERM  # vLLM's API server stops its engine-core processes on SIGTERM
INSTALLER = REPO / "tools" / "realengine" / "install.sh"
LOOPBACK = "127.0.0.1"
CPU_MAX_MODEL_LEN = 2048  # the tiny model's max_position_embeddings (make_tiny_model.py)
CPU_TENSOR_PARALLEL = 1
STARTUP_TIMEOUT_S = 420.0  # 43-141 s measured per start on a loaded 2-core box; generous for CI noise
STOP_TIMEOUT_S = 30.0
SUBSTITUTED_ENV = ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "MOONCAKE_CONFIG_PATH")
"""Builder variables whose value names a pod-only port or mount; each gets its loopback counterpart."""
SUBSTITUTED_FLAGS = ("--host", "--port", "--tensor-parallel-size", "--max-model-len", "--kv-transfer-config")
ADDED_FLAGS = ("--enforce-eager",)
SCRATCH_NAMES = frozenset(v["name"] for v in SCRATCH_ENV)
"""Builder variables that point into the pod's scratch emptyDir; relocated under the test's scratch."""
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: a million tokens of the tiny model
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # do not pin OpenMP threads on a shared 2-core machine
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "UCX_TLS": "sm,self,tcp",  # NIXL's UCX backend over shared memory and loopback TCP only
    "UCX_NET_DEVICES": "lo",
}


@dataclass(frozen=True)
class RealEnv:
    """The installed real-engine environment."""

    venv: Path
    model: Path

    @property
    def vllm(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def _installer_constant(name: str) -> str:
    """A version constant of install.sh, so the cache key has one source of truth."""
    match = re.search(rf"^{name}=(\S+)", INSTALLER.read_text(), re.MULTILINE)
    assert match, f"{INSTALLER} defines no {name}"
    return match.group(1)


def real_env() -> RealEnv:
    """The environment install.sh built; fails the tier with the fix when it is missing."""
    cache = Path(os.environ.get("TANDEM_REALENGINE_CACHE", Path.home() / ".cache" / "tandem-realengine"))
    venv = cache / f"vllm-cpu-{_installer_constant('VLLM_VERSION')}"
    model = cache / f"tiny-llama-{_installer_constant('MODEL_VERSION')}"
    mooncake = venv / f".tandem-mooncake-{_installer_constant('MOONCAKE_VERSION')}"
    if not all(p.is_file() for p in (venv / ".tandem-complete", mooncake, model / "model.safetensors")):
        pytest.fail(
            f"the real-engine environment is missing or older than this checkout ({venv} with {mooncake.name}, "
            f"{model}); the realengine tier is mandatory: "
            f"run {INSTALLER.relative_to(REPO)} (make test runs it first)",
            pytrace=False,
        )
    return RealEnv(venv=venv, model=model)


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def cpu_kv_transfer_config(config: dict[str, Any]) -> dict[str, Any]:
    """The builder's kv-transfer-config with ``kv_buffer_device: cpu`` in every NixlConnector dict."""
    out = dict(config)
    if out.get("kv_connector") == "NixlConnector":
        out["kv_buffer_device"] = "cpu"
    extra = out.get("kv_connector_extra_config")
    if isinstance(extra, dict) and isinstance(extra.get("connectors"), list):
        children = [cpu_kv_transfer_config(child) for child in extra["connectors"]]
        out["kv_connector_extra_config"] = {**extra, "connectors": children}
    return out


def cpu_args(built: Sequence[str], model: Path, port: int) -> list[str]:
    """The CPU transform of a builder's ``vllm serve`` arguments (see the module docstring)."""
    replace = {
        "--host": LOOPBACK,
        "--port": str(port),
        "--tensor-parallel-size": str(CPU_TENSOR_PARALLEL),
        "--max-model-len": str(CPU_MAX_MODEL_LEN),
    }
    out = [str(model)]
    for arg in built[1:]:
        flag = _flag(arg)
        if flag == "--kv-transfer-config":
            config = cpu_kv_transfer_config(json.loads(arg.split("=", 1)[1]))
            out.append(f"{flag}={json.dumps(config, sort_keys=True, separators=(',', ':'))}")
        elif flag in replace:
            out.append(f"{flag}={replace[flag]}")
        else:
            out.append(arg)
    return [*out, *ADDED_FLAGS]


def cpu_env(
    built: Sequence[Mapping[str, Any]],
    scratch: Path,
    side_channel_port: int,
    *,
    bootstrap_port: int | None = None,
    mooncake_config: Path | None = None,
) -> dict[str, str]:
    """The CPU transform of a builder's container env: a clean environment plus the builder's variables.
    A Mooncake variable the builder set must get its substitute (``bootstrap_port``, ``mooncake_config``)."""
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "LANG": "C.UTF-8"}
    for var in built:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", var
            env[var["name"]] = LOOPBACK
    env["HF_HOME"] = str(scratch / "hf")
    # The pod's scratch emptyDir (/tmp: HOME, XDG and compile caches) is this test's scratch directory.
    for name in SCRATCH_NAMES & env.keys():
        env[name] = str(tmp) + env[name].removeprefix(SCRATCH_DIR)
    substitutes = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": bootstrap_port, "MOONCAKE_CONFIG_PATH": mooncake_config}
    for name in SUBSTITUTED_ENV:
        if name in env:
            assert substitutes[name] is not None, f"the builder set {name}: the CPU transform needs its substitute"
            env[name] = str(substitutes[name])
    env.update(CPU_ENV)
    # TMPDIR keeps vLLM's ZMQ sockets, dist-init files and inductor cache in the scratch directory.
    env.update(
        TMPDIR=str(tmp),
        VLLM_CACHE_ROOT=str(scratch / "cache"),
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_channel_port),
        PYTHONPATH=str(CPU_SHIM),
    )
    return env


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process of the tier in its own session (so ``stop_process`` can reach its whole group),
    logging to ``log``, and bound to this process's life: when pytest dies, even by SIGKILL, the child
    gets ``PARENT_DEATH_SIGNAL``. The signal is tied to the thread that forks; pytest starts every
    fixture's process from its main thread, whose end is the process's end."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=bind_to_this_process(PARENT_DEATH_SIGNAL),  # noqa: PLW1509 - pytest's fixtures run single-threaded
        )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL to the session ``spawn`` started (the process's workers too), nothing else."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the session this fixture started
    proc.wait(timeout_s)


@dataclass
class Engine:
    """One running ``vllm serve`` process (its own session, so its workers stop with it)."""

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        t0 = time.monotonic()
        self.proc = spawn(self.argv, self.env, self.log)
        deadline = t0 + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM {self.name} exited {self.proc.returncode} at startup:\n{self.tail()}", pytrace=False)
            with contextlib.suppress(OSError):
                if http_get(f"{self.url}/health", timeout=2)[0] == 200:
                    self.startup_s = time.monotonic() - t0
                    return
            time.sleep(1)
        self.stop()
        pytest.fail(f"vLLM {self.name} not healthy after {STARTUP_TIMEOUT_S:.0f}s:\n{self.tail()}", pytrace=False)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> str:
        return http_get(f"{self.url}/metrics")[1].decode()


def http_get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read()


def post_json(url: str, body: Mapping[str, Any], timeout: float = 120) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def post_stream(url: str, body: Mapping[str, Any], timeout: float = 120) -> list[dict[str, Any]]:
    """The JSON events of a server-sent-event response, up to ``[DONE]``."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    events: list[dict[str, Any]] = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            events.append(json.loads(data))
    return events


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}", pytrace=False)
        with contextlib.suppress(OSError, urllib.error.HTTPError):
            if http_get(url, timeout=2)[0] == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"{what} not ready after {timeout_s:.0f}s", pytrace=False)
