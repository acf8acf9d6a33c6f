"""Processes that die with the process that started them: Linux's parent-death signal, and a guard.

Why: a test session or benchmark killed by SIGKILL (a CI timeout, a ^C escalated to SIGKILL) runs no
cleanup code, and what it started kept running: vLLM engines, Prometheus, a whole control plane (etcd,
kube-apiserver, kwok), holding ports, cores and memory on a shared machine. Linux can send a child a
signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``); the child asks for it between fork and exec
(``bind_to_this_process``), so it works whatever kills the parent.

Two limits shape this module. The signal follows the *thread* that forked the child (pytest fixtures and
the benchmarks start their processes from the main thread, whose end is the process's end). And it is not
inherited by grandchildren: ``kwokctl create cluster`` starts etcd, kube-apiserver, the controllers and
kwok, then exits, so those components are nobody's children. For them ``start_guard`` starts a bound guard
process that waits for the signal and then runs a teardown command (``tandem dev cluster down``); the
caller dismisses the guard (``dismiss_guard``, SIGKILL: no teardown) when it stops things itself.

What it must not do: bind anything a user expects to outlive the command that started it (``tandem dev
cluster up`` leaves its cluster running); binding is always the caller's choice.

Invariants: a guard whose parent died before the guard could wait for the signal still tears down (the
signal is blocked between fork and exec, so it stays pending until the guard takes it); ``dismiss_guard``
only signals a process whose command line is a guard's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEFAULT_SIGNAL = signal.SIGTERM  # lets the child stop its own workers; vLLM and Prometheus shut down on it
GUARD_MODULE = "tandem_lab.dev.lifetime"
GUARD_DISMISS_TIMEOUT_S = 10.0
LAB_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the tandem_lab package

_GUARDS: dict[int, subprocess.Popen[bytes]] = {}
"""Guards started by this process, by pid: ``dismiss_guard`` reaps its own children (no zombie)."""


def _die_with_parent(parent: int, sig: signal.Signals, hold: bool) -> None:
    """In the child before exec: ask Linux for ``sig`` when the parent dies, and take it now if the parent
    already died between fork and here (the request would then never fire). ``hold``: block ``sig`` first,
    so it stays pending across exec for a program that waits for it (the guard)."""
    if hold:
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def bind_to_this_process(sig: signal.Signals = DEFAULT_SIGNAL, *, hold: bool = False) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process dies.

    Call it in the thread that starts the child (the signal is tied to that thread). ``preexec_fn`` is not
    safe in a process with other threads that may hold locks across fork; pytest fixtures and the lab's
    commands start their processes before starting threads of their own, or from the main thread.
    """
    parent = os.getpid()
    return lambda: _die_with_parent(parent, sig, hold)


def start_guard(teardown: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a guard: bound to this process, it runs ``teardown`` (an argv) once this process dies.

    The guard runs in its own session, so a ^C in the terminal reaches the caller (whose own cleanup then
    dismisses the guard) and not the guard.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    # This checkout's lab first on the path: the guard and its teardown run the code that started them.
    path = os.pathsep.join(p for p in (str(LAB_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", GUARD_MODULE, "--", *teardown],
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=bind_to_this_process(DEFAULT_SIGNAL, hold=True),  # noqa: PLW1509 - see bind_to_this_process
        )
    _GUARDS[proc.pid] = proc
    return proc


def is_guard(pid: int) -> bool:
    """Whether ``pid`` is alive and runs this module as a guard (its command line says so)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and GUARD_MODULE.encode() in argv


def dismiss_guard(pid: int | None) -> None:
    """Stop a guard without its teardown (SIGKILL: it has no chance to run it); a no-op for anything else.

    A guard this process started is killed and reaped whatever its command line says (it may not have
    reached its exec yet); another process's guard only when its command line is a guard's.
    """
    if pid is None:
        return
    proc = _GUARDS.pop(pid, None)
    if proc is not None:  # ours and not reaped, so the pid is still it (even before its exec)
        proc.kill()
        proc.wait(GUARD_DISMISS_TIMEOUT_S)
        return
    if not is_guard(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GUARD_DISMISS_TIMEOUT_S
    while is_guard(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _guard_main(argv: Sequence[str]) -> int:
    """The guard: wait for the parent-death signal (blocked since before exec), then run the teardown."""
    teardown = list(argv[1:] if argv and argv[0] == "--" else argv)
    if not teardown:
        print("usage: python -m tandem_lab.dev.lifetime -- TEARDOWN-COMMAND...", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {DEFAULT_SIGNAL})  # already blocked when started by start_guard
    print(f"guard {os.getpid()}: waiting for the parent's death to run: {' '.join(teardown)}", flush=True)
    signal.sigwait({DEFAULT_SIGNAL})
    # The teardown must not inherit a blocked SIGTERM; from here a SIGTERM may stop the guard, not it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {DEFAULT_SIGNAL})
    print(f"guard {os.getpid()}: parent gone, tearing down", flush=True)
    return subprocess.run(teardown, stdin=subprocess.DEVNULL, check=False).returncode


if __name__ == "__main__":
    sys.exit(_guard_main(sys.argv[1:]))
