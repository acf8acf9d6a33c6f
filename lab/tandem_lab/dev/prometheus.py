"""A real Prometheus server on loopback for the dev cluster and the cluster tests.

What it owns: the Prometheus config (short scrape interval; targets come only from ``file_sd_configs``
reading ``<state>/targets/*.json``, so a test or ``tandem sim`` adds a target by writing a file), the
server process (started detached, so it outlives ``tandem dev cluster up``; stopped with SIGTERM; with
``die_with_parent`` it also gets SIGTERM when the process that started it dies, for test sessions and
benchmarks), and helpers to register targets and query the HTTP API.

What it must not do: discover anything through Kubernetes (``kubernetes_sd``) or scrape non-loopback
addresses: KWOK pod IPs are fake (testing.md §2.6).

Invariants: binds 127.0.0.1 only; target files are written atomically (temp file + rename, the temp
name does not match the glob); ``stop`` only signals a PID whose command line is this server's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tandem_lab.dev.lifetime import bind_to_this_process
from tandem_lab.dev.ports import free_port

DEFAULT_SCRAPE_INTERVAL_S = 2.0
DEFAULT_LOOKBACK_DELTA = "5m"
TARGETS_GLOB = "*.json"


def _duration(seconds: float) -> str:
    """Seconds -> a Prometheus duration ("1.5" -> "1500ms", "2" -> "2s")."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError("durations must be > 0")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def build_config(
    targets_dir: Path,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    relabel_configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """prometheus.yml as a dict (pure). One job, ``tandem``, fed only by file_sd.

    A target file may set ``job`` (and ``__metrics_path__``) in its labels to override the defaults.
    ``relabel_configs`` run on every target: a test that registers the ``__meta_kubernetes_*`` labels a
    Kubernetes SD would discover can run the chart's own relabel rules on them.
    """
    interval = _duration(scrape_interval_s)
    job: dict[str, Any] = {
        "job_name": "tandem",
        "file_sd_configs": [{"files": [str(targets_dir / TARGETS_GLOB)], "refresh_interval": interval}],
    }
    if relabel_configs:
        job["relabel_configs"] = [dict(rule) for rule in relabel_configs]
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
            "external_labels": {"tandem_dev": "true"},
        },
        "scrape_configs": [job],
    }


def target_group(targets: Sequence[str], labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A file_sd document: one group of ``host:port`` targets with shared labels (pure)."""
    for target in targets:
        host = target.rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            raise ValueError(f"target {target!r} is not on loopback (KWOK pod IPs are fake)")
    return [{"targets": list(targets), "labels": dict(labels or {})}]


@dataclass
class PrometheusServer:
    """One Prometheus process with its config, TSDB and target files under ``state_dir``."""

    binary: Path
    state_dir: Path
    port: int = 0
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    lookback_delta: str = DEFAULT_LOOKBACK_DELTA
    pid: int | None = None
    relabel_configs: Sequence[Mapping[str, Any]] = ()
    die_with_parent: bool = False
    """Start the server bound to this process (``lifetime.bind_to_this_process``): it stops when we die."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets_dir(self) -> Path:
        return self.state_dir / "targets"

    @property
    def config_path(self) -> Path:
        return self.state_dir / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "prometheus.log"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--config.file={self.config_path}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.path={self.state_dir / 'tsdb'}",
            "--storage.tsdb.retention.time=1d",
            f"--query.lookback-delta={self.lookback_delta}",
            "--web.enable-lifecycle",
        ]

    def start(self, timeout_s: float = 60.0) -> None:
        """Write the config and start the server detached; wait until ``/-/ready`` answers."""
        if self.pid is not None and self.is_running():
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(exist_ok=True)
        if not self.port:
            self.port = free_port()
        self.config_path.write_text(
            yaml.safe_dump(build_config(self.targets_dir, self.scrape_interval_s, self.relabel_configs))
        )
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the CLI that started it; not in its process group
                cwd=self.state_dir,
                preexec_fn=bind_to_this_process() if self.die_with_parent else None,  # noqa: PLW1509 - main thread
            )
        self.pid = proc.pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {proc.returncode}; see {self.log_path}:\n{self._log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout_s:.0f} s; see {self.log_path}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def is_running(self) -> bool:
        """True when ``pid`` is alive and is this server (checked through /proc cmdline)."""
        if self.pid is None:
            return False
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(arg == f"--config.file={self.config_path}".encode() for arg in cmdline)

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; a no-op when it is not running."""
        if not self.is_running():
            self.pid = None
            return
        assert self.pid is not None
        pid = self.pid
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.is_running():
            _reap(pid)
            time.sleep(0.1)
        if self.is_running():
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            _reap(pid)
        self.pid = None

    def add_target(self, name: str, targets: Sequence[str], labels: Mapping[str, str] | None = None) -> Path:
        """Register ``targets`` under ``name`` (replacing an earlier registration); returns the file."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad target name {name!r}")
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        path = self.targets_dir / f"{name}.json"
        tmp = self.targets_dir / f".{name}.json.tmp"
        tmp.write_text(json.dumps(target_group(targets, labels)))
        tmp.replace(path)
        return path

    def remove_target(self, name: str) -> None:
        (self.targets_dir / f"{name}.json").unlink(missing_ok=True)

    def query(self, promql: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """GET /api/v1/query; returns the decoded ``data`` ({"resultType", "result"})."""
        return query(self.url, promql, timeout_s)


def query(base_url: str, promql: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Instant query against any Prometheus URL; raises RuntimeError on a non-success answer."""
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus query {promql!r} failed: {body.get('error', body)}")
    data: dict[str, Any] = body["data"]
    return data


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child (started in this process); ignore otherwise."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
