"""tandem_lab.dev.lifetime: bound children and guards die with (or clean up after) a SIGKILLed parent.

Why these tests: the cluster fixtures and the benchmarks rely on them to leave no control plane or
Prometheus behind when pytest is killed; the cluster tier shows it end to end, these show the mechanism
without a control plane. A stand-in parent (a Python helper) starts a bound child, a plain control child
and a guard, then is killed with SIGKILL, which no cleanup code can intercept. The control child must
survive, so the test fails if the mechanism stops working rather than passing because children happen to
die anyway. Waiting on processes is event-driven (a pidfd polls readable on exit); the file the guard's
teardown writes is polled for, bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tandem_lab.dev import lifetime

REPO = Path(__file__).resolve().parents[2]
EXIT_DEADLINE_S = 30.0  # the signal is delivered at once; generous for a loaded 2-core machine
HELPER = """
import subprocess, sys
from pathlib import Path
from tandem_lab.dev.lifetime import bind_to_this_process, start_guard
idle = [sys.executable, "-c", "import signal; signal.pause()"]  # no stdin: the parent's death is no EOF here
bound = subprocess.Popen(idle, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=bind_to_this_process())
unbound = subprocess.Popen(idle, stdin=subprocess.DEVNULL, start_new_session=True)
marker = Path(sys.argv[1])
teardown = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('torn down')"]
guard = start_guard(teardown, marker.with_suffix(".log"))
print(bound.pid, unbound.pid, guard.pid, flush=True)
if sys.argv[2] == "dismiss":
    from tandem_lab.dev.lifetime import dismiss_guard
    dismiss_guard(guard.pid)
    print("dismissed", flush=True)
sys.stdin.read()
"""


def _exited(pidfd: int, timeout_s: float) -> bool:
    readable, _, _ = select.select([pidfd], [], [], timeout_s)
    return bool(readable)


def _helper(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    path = os.pathsep.join([str(REPO / "lab"), str(REPO / "operator"), os.environ.get("PYTHONPATH", "")])
    parent = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(tmp_path / "torn-down"), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    if mode == "dismiss":
        assert parent.stdout.readline().strip() == b"dismissed"
    return parent, pids


def _wait_file(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_bound_child_dies_and_guard_tears_down_when_the_parent_is_killed(tmp_path: Path) -> None:
    parent, (bound_pid, unbound_pid, guard_pid) = _helper(tmp_path, "keep")
    fds = [os.pidfd_open(pid) for pid in (bound_pid, unbound_pid, guard_pid)]
    bound, unbound, guard = fds
    try:
        assert not _exited(bound, 0) and not _exited(unbound, 0) and not _exited(guard, 0)
        assert lifetime.is_guard(guard_pid) and not lifetime.is_guard(bound_pid)
        parent.kill()
        parent.wait()
        assert _exited(bound, EXIT_DEADLINE_S), "the bound child outlived its parent"
        assert _wait_file(tmp_path / "torn-down", EXIT_DEADLINE_S), "the guard did not run its teardown"
        assert _exited(guard, EXIT_DEADLINE_S), "the guard did not exit after its teardown"
        assert not _exited(unbound, 0), "control: a plain child should outlive its killed parent"
    finally:
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_dismissed_guard_runs_no_teardown(tmp_path: Path) -> None:
    parent, (bound_pid, unbound_pid, guard_pid) = _helper(tmp_path, "dismiss")
    fds = [os.pidfd_open(pid) for pid in (bound_pid, unbound_pid)]
    try:
        assert not lifetime.is_guard(guard_pid), "dismiss_guard left the guard running"
        parent.kill()
        parent.wait()
        assert _exited(fds[0], EXIT_DEADLINE_S)
        assert not (tmp_path / "torn-down").exists(), "a dismissed guard ran its teardown"
    finally:
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_dismiss_guard_leaves_other_processes_alone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        lifetime.dismiss_guard(proc.pid)
        assert proc.poll() is None, "dismiss_guard signalled a process that is not a guard"
    finally:
        proc.kill()
        proc.wait()
