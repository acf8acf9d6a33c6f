"""CPU-tier shim, loaded by every Python process of a realengine vLLM (its PYTHONPATH; engines.py).

It patches three things this CPU-only test machine needs and a GPU node does not, each only when the
module that needs it is imported (nothing is imported eagerly, so a process that never loads NIXL or
Mooncake is untouched), and each says so on stderr once (the tier asserts the lines, so a patch that
stopped applying after an upgrade cannot go unnoticed):

- NIXL idle spin: NIXL's Python agent (``nixl_cuXX._api.nixl_agent``) hard-codes ``pthrDelay = 0`` for the
  UCX backend's progress thread, and that delay is the thread's ``poll()`` timeout: each idle NIXL agent
  spins one core. On a GPU node that is one core of dozens; on the 2-core test machine a prefill and a
  decode engine spin both cores, and vLLM's NIXL handshake (a fixed 5 s receive timeout) then misses and
  the decode engine dies (docs/design/011-real-engine.md, "The idle spin"). The timeout becomes
  ``PROGRESS_THREAD_DELAY_US``: the idle thread sleeps in ``poll()`` and still wakes at once on a UCX event.
- Mooncake's device index: ``MooncakeConnectorWorker.__init__`` asks ``torch.accelerator.
  current_device_index()``, which on PyPI's CUDA build of torch with no GPU raises "Found no NVIDIA
  driver". On the CPU platform the index is 0 (the only device, and ``set_device`` ignores it), so that
  one error becomes 0; any other error still raises.
- Mooncake store events: ``MooncakeStoreWorker.wait_for_save`` records a ``torch.cuda.Event`` so the
  store's put waits for the forward pass on the GPU stream. On the CPU the forward pass has finished when
  the call returns, so when CUDA is unavailable the event is one that is always complete.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

PROGRESS_THREAD_DELAY_US = 1000  # 1 ms: short, because some UCX-over-TCP events only land on the timeout
APPLIED_LINE = "tandem-realengine-shim: NIXL progress-thread poll timeout 0 -> {} us"
DEVICE_INDEX_LINE = "tandem-realengine-shim: Mooncake current_device_index without a GPU -> 0"
EVENT_LINE = "tandem-realengine-shim: Mooncake store torch.cuda.Event without a GPU -> a completed event"
NO_DRIVER = "Found no NVIDIA driver"
MOONCAKE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _patch_nixl(module: ModuleType) -> None:
    base: Any = module.nixlAgentConfig

    class AgentConfig(base):  # type: ignore[misc,valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "pthrDelay" and value == 0:
                value = PROGRESS_THREAD_DELAY_US
                _say(APPLIED_LINE.format(value))
            super().__setattr__(name, value)

    module.nixlAgentConfig = AgentConfig


def _patch_device_index(module: ModuleType) -> None:
    accelerator: Any = module.torch.accelerator
    original: Callable[[], int] = accelerator.current_device_index

    def current_device_index() -> int:
        try:
            return original()
        except RuntimeError as exc:
            if NO_DRIVER not in str(exc):
                raise
            _say(DEVICE_INDEX_LINE)
            return 0

    accelerator.current_device_index = current_device_index


class _CompletedEvent:
    """A CUDA event stand-in for the CPU: recorded work is already done."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None


def _patch_store_event(module: ModuleType) -> None:
    torch: Any = module.torch
    if torch.cuda.is_available():
        return
    said = []

    def event(*args: Any, **kwargs: Any) -> _CompletedEvent:
        if not said:
            said.append(True)
            _say(EVENT_LINE)
        return _CompletedEvent()

    torch.cuda.Event = event


PATCHES: dict[re.Pattern[str], Callable[[ModuleType], None]] = {
    re.compile(r"nixl_cu\d+\._bindings"): _patch_nixl,
    re.compile(re.escape(f"{MOONCAKE}.mooncake_connector")): _patch_device_index,
    re.compile(re.escape(f"{MOONCAKE}.store.worker")): _patch_store_event,
}


def _patch_for(name: str) -> Callable[[ModuleType], None] | None:
    return next((patch for pattern, patch in PATCHES.items() if pattern.fullmatch(name)), None)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = _patch_for(name)
        if patch is None:
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
            patch(module)

        loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _Finder())
