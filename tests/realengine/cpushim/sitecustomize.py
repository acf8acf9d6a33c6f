"""CPU-tier shim, loaded by every Python process of a realengine vLLM (its PYTHONPATH; engines.py).

Why: NIXL's Python agent (``nixl_cuXX._api.nixl_agent``) hard-codes ``pthrDelay = 0`` for the UCX
backend's progress thread, and that delay is the thread's ``poll()`` timeout: each idle NIXL agent spins
one core. On a GPU node that is one core of dozens; on the 2-core test machine a prefill and a decode
engine spin both cores, and vLLM's NIXL handshake (a fixed 5 s receive timeout) then misses and the
decode engine dies (docs/design/011-real-engine.md, "The idle spin"). This shim raises the timeout to
``PROGRESS_THREAD_DELAY_US``: the idle thread sleeps in ``poll()`` and still wakes at once on a UCX event.
It changes nothing else, and says so on stderr (the tier asserts the line, so a shim that stopped
applying cannot go unnoticed).

It patches the agent-config class of the NIXL binding module when that module is imported; nothing is
imported eagerly, so a process that never loads NIXL is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

PROGRESS_THREAD_DELAY_US = 1000  # 1 ms: short, because some UCX-over-TCP events only land on the timeout
BINDINGS = re.compile(r"nixl_cu\d+\._bindings")
APPLIED_LINE = "tandem-realengine-shim: NIXL progress-thread poll timeout 0 -> {} us"


def _patch(module: ModuleType) -> None:
    base: Any = module.nixlAgentConfig

    class AgentConfig(base):  # type: ignore[misc,valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "pthrDelay" and value == 0:
                value = PROGRESS_THREAD_DELAY_US
                print(APPLIED_LINE.format(value), file=sys.stderr, flush=True)
            super().__setattr__(name, value)

    module.nixlAgentConfig = AgentConfig


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not BINDINGS.fullmatch(name):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _Finder())
