"""A small kubectl wrapper for the dev tooling and the cluster tests.

What it owns: running the pinned kubectl against one kubeconfig, feeding manifests as JSON on stdin and
decoding JSON output, and turning failures into ``KubectlError`` with kubectl's stderr in the message.

What it must not do: be used by the operator. The operator talks to Kubernetes through ``adapters/``
with the Python client; this is dev tooling only (subprocess I/O is fine here).

Invariants: every call passes ``--kubeconfig`` explicitly (never ``~/.kube/config``) and a timeout, so a
dead API server fails a call instead of hanging a test.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 60.0


class KubectlError(RuntimeError):
    """kubectl exited non-zero (or timed out); ``stderr`` holds its message."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.args_ = list(args)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"kubectl {' '.join(args)} failed ({returncode}): {stderr.strip()}")


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one binary and one kubeconfig."""

    binary: Path
    kubeconfig: Path
    timeout_s: float = DEFAULT_TIMEOUT_S

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout_s: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig=... <args>``; raise ``KubectlError`` on failure if ``check``."""
        cmd = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        try:
            proc = subprocess.run(
                cmd,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout_s or self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KubectlError(args, -1, f"timed out after {exc.timeout} s") from exc
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stderr)
        return proc

    def json(self, *args: str, timeout_s: float | None = None) -> Any:
        """Run a read command with ``-o json`` and return the decoded document."""
        proc = self.run(*args, "-o", "json", timeout_s=timeout_s)
        return json.loads(proc.stdout)

    def apply(self, *objects: Mapping[str, Any], server_side: bool = False) -> str:
        """``kubectl apply -f -`` for one or more objects (sent as a v1 List)."""
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--field-manager=tandem-dev"]
        return self.run(*args, stdin=_as_list(objects)).stdout

    def create(self, *objects: Mapping[str, Any]) -> str:
        """``kubectl create -f -`` for one or more objects; fails if any exists."""
        return self.run("create", "-f", "-", stdin=_as_list(objects)).stdout

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One object as a dict, or None when it does not exist."""
        args = ["get", kind, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        proc = self.run(*args, check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise KubectlError(args, proc.returncode, proc.stderr)
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    def wait_for(
        self,
        what: str,
        predicate: Callable[[], bool],
        timeout_s: float = 60.0,
        interval_s: float = 0.5,
    ) -> None:
        """Poll ``predicate`` until true; ``TimeoutError`` naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            if predicate():
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(interval_s)


def _as_list(objects: Sequence[Mapping[str, Any]]) -> str:
    if len(objects) == 1:
        return json.dumps(objects[0])
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
