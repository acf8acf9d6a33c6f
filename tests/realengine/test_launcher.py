"""Processes the realengine tier starts die with the pytest process that started them.

Why: a killed test run (a CI timeout, a ^C that escalated to SIGKILL) used to leave vLLM engines running,
each holding ports, gigabytes and a core on a shared 2-core machine. engines.spawn asks Linux for a
parent-death signal; this test kills a stand-in for pytest (a helper that spawns through engines.spawn)
with SIGKILL, which no cleanup code can intercept, and checks that its child is gone. A control child the
same helper starts with a plain Popen must survive, so the test fails if the mechanism stops working
rather than passing because children happen to die anyway. Processes are watched through pidfds: waiting
is event-driven, bounded by a deadline, and no signal can reach a process that reused a pid.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.realengine.engines import REPO

EXIT_DEADLINE_S = 30.0  # the signal is delivered at once; generous for a loaded machine
HELPER = """
import subprocess, sys
from pathlib import Path
from tests.realengine.engines import spawn
idle = [sys.executable, "-c", "import signal; signal.pause()"]  # not stdin: the parent's death is no EOF here
bound = spawn(idle, {"PATH": "/usr/bin:/bin"}, Path(sys.argv[1]))
unbound = subprocess.Popen(idle, stdin=subprocess.DEVNULL, start_new_session=True)
print(bound.pid, unbound.pid, flush=True)
sys.stdin.read()
"""


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process behind ``pidfd`` has exited (a pidfd polls readable on exit), waiting up to
    ``timeout_s``."""
    readable, _, _ = select.select([pidfd], [], [], timeout_s)
    return bool(readable)


def test_spawned_processes_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator"), str(REPO / "lab")])}
    parent = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(tmp_path / "child.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert parent.stdout is not None
    bound_pid, unbound_pid = map(int, parent.stdout.readline().split())
    bound, unbound = os.pidfd_open(bound_pid), os.pidfd_open(unbound_pid)
    try:
        assert not _exited(bound, 0) and not _exited(unbound, 0)
        parent.kill()
        parent.wait()
        assert _exited(bound, EXIT_DEADLINE_S), "the child spawned through engines.spawn outlived its parent"
        assert not _exited(unbound, 0), "control: a plain child should outlive its killed parent"
    finally:
        for pidfd in (bound, unbound):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
