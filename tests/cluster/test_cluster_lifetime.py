"""A cluster started with ``die_with_caller`` (what the session fixture and the benchmarks do) goes when its
caller is killed with SIGKILL: the control plane kwokctl daemonised, Prometheus and the guard.

Why a cluster-tier test: kwokctl's components are not the caller's children, so the parent-death signal
alone cannot reach them (tests/component/test_lifetime.py checks the mechanism); only a real ``up`` shows
that the guard finds and stops every one of them. The stand-in caller makes the fixture's own call in a
private state root; whatever outlives the check is torn down by hand in ``finally``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tandem_lab.dev import cluster, lifetime

REPO = Path(__file__).resolve().parents[2]
GONE_DEADLINE_S = 90.0  # the guard's teardown is `tandem dev cluster down`: kwokctl delete, then /proc
CALLER = """
import os, sys, time
from pathlib import Path
from tandem_lab.dev import cluster
options = cluster.ClusterOptions(name=sys.argv[1], nodes=1, zones=("zone-a",), scrape_interval_s=1.0)
state = cluster.up(options, root=Path(sys.argv[2]), owner_pid=os.getpid(), die_with_caller=True)
print(state.guard_pid, flush=True)
time.sleep(3600)
"""


def _ours(state_dir: Path, cluster_dir: Path) -> list[tuple[int, str]]:
    return cluster.processes_mentioning(str(cluster_dir) + "/", str(state_dir / "prometheus") + "/")


def test_cluster_of_a_killed_caller_is_torn_down(tmp_path: Path) -> None:
    name = "pytest-lifetime"
    root = tmp_path / "clusters"
    sdir, cdir = cluster.state_dir(name, root), cluster.kwok_workdir(root) / "clusters" / name
    path = os.pathsep.join([str(REPO / "lab"), str(REPO / "operator"), str(REPO), os.environ.get("PYTHONPATH", "")])
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, name, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        assert caller.stdout is not None
        line = caller.stdout.readline().decode().strip()  # the guard's pid once `up` returned
        assert line.isdigit(), f"the caller's cluster did not come up: {line}{caller.stdout.read().decode()}"
        guard = int(line)
        running = {Path(cmd.split(" ", 1)[0]).name for _, cmd in _ours(sdir, cdir)}
        assert {"etcd", "kube-apiserver", "kwok-controller", "prometheus"} <= running, running
        assert lifetime.is_guard(guard)

        caller.kill()
        caller.wait()

        deadline = time.monotonic() + GONE_DEADLINE_S
        while (left := _ours(sdir, cdir)) or lifetime.is_guard(guard):
            assert time.monotonic() < deadline, f"outlived their killed caller: {left}, guard alive: {guard}"
            time.sleep(0.5)
        assert not sdir.exists(), "the guard's teardown leaves no state behind"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        if _ours(sdir, cdir) or sdir.exists():
            cluster.down(name, root)
