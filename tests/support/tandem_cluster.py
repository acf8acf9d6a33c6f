"""Tandem on the real local cluster: CRDs, per-test GPU nodes, and the operator as a process or in-process.

What it owns (fixtures are registered by the root conftest through tests/support/clusterfix.py users):
- ``install_crds(kube)``: server-side apply of the committed ``crds/`` and wait until Established;
- ``GpuNodes``: simulated MI325X nodes labelled for one test (`tandem.dev/test-nodes=<id>`), so a
  pool placed with that nodeSelector never competes with another test's leftovers; deleted after;
- ``OperatorProcess``: `tandem run` as a subprocess (SIGKILL/SIGTERM-able, its own identity via an
  optional ServiceAccount kubeconfig), with logs in `.logs/operator-<test>.log`;
  both are the shared kit's (``tandem_lab.dev.kit``, also used by the controller benchmark and the demo)
  with the tests' defaults;
- ``operator_in_process``: the same operator inside the test process through kopf's KopfRunner;
- ``wait_until``: polling with a deadline and a message that says what was awaited.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tandem_lab.dev.kit import NodeGroup
from tandem_lab.dev.kit import OperatorProcess as KitOperatorProcess
from tandem_lab.dev.kube import Kubectl
from tandem_lab.dev.ports import free_port

__all__ = [
    "LOGS",
    "REPO",
    "GpuNodes",
    "OperatorProcess",
    "free_port",
    "install_crds",
    "operator_in_process",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / ".logs"
NODE_LABEL = "tandem.dev/test-nodes"
T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, interval_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def install_crds(kube: Kubectl) -> None:
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for crd in ("inferencepools.tandem.dev", "mooncakecaches.tandem.dev"):
        kube.run("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


class GpuNodes(NodeGroup):
    """Nodes that belong to one test (label ``tandem.dev/test-nodes=<id>``); pools select them with
    ``selector``. The shared kit's node group (``tandem_lab.dev.kit``) with the tests' label."""

    def __init__(self, kube: Kubectl, group: str | None = None) -> None:
        super().__init__(kube, label=NODE_LABEL, **({"group": group} if group else {}))

    def cleanup(self) -> None:
        self.delete(wait=False)


class OperatorProcess(KitOperatorProcess):
    """`tandem run` as a child process, the shared kit's (``tandem_lab.dev.kit``) with the tests' defaults:
    its log in `.logs/operator-<name>.log`, the repository as working directory, and one leader-election
    identity per ``name``, the same across restarts."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        name: str = "operator",
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        LOGS.mkdir(exist_ok=True)
        super().__init__(
            kubeconfig=kubeconfig,
            namespaces=namespaces,
            log_path=LOGS / f"operator-{name}.log",
            identity=name,
            extra_args=list(extra_args or []),
            env=dict(env or {}),
            cwd=REPO,
        )
        self.name = name

    def start(self, timeout_s: float = 60.0, settle_s: float = 0.0) -> OperatorProcess:
        super().start(timeout_s=timeout_s, settle_s=settle_s)
        return self

    def metrics(self) -> str:
        return self.metrics_text()

    def __enter__(self) -> OperatorProcess:
        return self.start()


@contextlib.contextmanager
def operator_in_process(kubeconfig: Path, namespace: str) -> Iterator[Any]:
    """The operator inside this process (kopf's KopfRunner, a thread with its own event loop)."""
    from kopf.testing import KopfRunner  # noqa: PLC0415 - kopf only where a test asks for it

    old = {k: os.environ.get(k) for k in ("KUBECONFIG", "TANDEM_NAMESPACES")}
    os.environ["KUBECONFIG"] = str(kubeconfig)
    os.environ["TANDEM_NAMESPACES"] = namespace
    try:
        with KopfRunner(
            ["run", "-m", "tandem.controller.main", "--standalone", f"--namespace={namespace}"],
            timeout=60,
        ) as runner:
            yield runner
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
