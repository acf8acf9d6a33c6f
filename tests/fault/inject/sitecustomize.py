"""Crash points for the fault tier: wraps the operator's Kubernetes adapter when TANDEM_FAULT_* is set.

Python imports ``sitecustomize`` at start-up from any directory on ``sys.path``; the fault tests put this
directory on PYTHONPATH of one operator process only (``faultlib.injected_env``), so product code has no
test branches (testing.md §2.6: crash points come from a test entrypoint that wraps the adapter).

- ``TANDEM_FAULT_KILL_AFTER_POD_CREATES=N``: SIGKILL the process right after the N-th Pod create
  succeeded, i.e. between creating a pod and recording anything about it (OP-02).
"""

from __future__ import annotations

import os
import signal
from typing import Any

_KILL_AFTER = int(os.environ.get("TANDEM_FAULT_KILL_AFTER_POD_CREATES", "0") or 0)

if _KILL_AFTER:
    from tandem.adapters import kube as _kube

    _created = 0
    _real_create = _kube.RealKube.create

    async def _create(self: Any, body: Any) -> dict[str, Any]:
        global _created  # noqa: PLW0603 - one counter per process is the point
        result: dict[str, Any] = await _real_create(self, body)
        if body.get("kind") == "Pod":
            _created += 1
            if _created >= _KILL_AFTER:
                print(f"TANDEM_FAULT: SIGKILL after pod create {_created}: {body['metadata']['name']}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        return result

    _kube.RealKube.create = _create  # type: ignore[method-assign]
