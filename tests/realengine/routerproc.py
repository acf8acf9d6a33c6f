"""`tandem router` in front of one real prefill/decode pair, for the realengine tier.

Why a module of its own: the session fixtures (conftest.py) and a test that must own the router's whole
life (the known-vLLM-bug test in test_builder_commands.py, where the first transfer may already fail)
start it the same way: a one-pair routing table from examples/router/speed-routing.json pointing at the
real engines, the pair's connector and (Mooncake) the prefill's bootstrap port, then one warm-up request.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import urllib.error
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.ports import free_port
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import LOOPBACK, REPO, post_json, spawn, stop_process, wait_http

ROUTER_READY_TIMEOUT_S = 60.0


def example_pair(index: int, revision: str, weight: int, prefill: str, decode: str) -> dict[str, Any]:
    """examples/router/speed-routing.json's first pair as ``speed-p<index>`` of ``revision`` at ``weight``, its
    prefill and decode instances at the ``host:port`` addresses given (the example's connector)."""
    table = json.loads((REPO / "examples" / "router" / "speed-routing.json").read_text())
    pair: dict[str, Any] = copy.deepcopy(table["pairs"][0])
    pid = f"speed-p{index}"
    pair.update(
        id=pid,
        index=index,
        revision=revision,
        weight=weight,
        prefill=[{"address": prefill, "pod": f"{pid}-prefill-0"}],
        decode=[{"address": decode, "pod": f"{pid}-decode-0"}],
    )
    return pair


@contextmanager
def router_on(table: dict[str, Any], name: str, scratch: Path, logs: Path, *flags: str) -> Iterator[tuple[str, str]]:
    """(URL, metrics URL) of `tandem router` serving ``table`` (written to ``<scratch>/<name>.json``, logged to
    ``<logs>/<name>.log``, with ``flags``), once it is ready; stopped on exit."""
    path = scratch / f"{name}.json"
    path.write_text(json.dumps(table))
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), os.environ.get("PYTHONPATH", "")])}
    log = logs / f"{name}.log"
    argv = [sys.executable, "-m", "tandem.cli", "router", "--routing-table", str(path), *flags]
    argv += ["--port", str(port), "--metrics-port", str(metrics_port)]
    proc = spawn(argv, env, log)
    try:
        wait_http(f"http://{LOOPBACK}:{metrics_port}/ready", ROUTER_READY_TIMEOUT_S, proc, "tandem router", log)
        yield f"http://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{metrics_port}/metrics"
    finally:
        stop_process(proc)


@contextmanager
def run_router(
    prefill: BuiltEngine, decode: BuiltEngine, served_name: str, scratch: Path, logs: Path, connector: str
) -> Iterator[str]:
    """The router's URL, once it is ready and one P/D request went through it; stopped on exit."""
    table = json.loads((REPO / "examples" / "router" / "speed-routing.json").read_text())
    pair = copy.deepcopy(table["pairs"][0])
    pair["prefill"] = [{"address": f"{LOOPBACK}:{prefill.engine.port}", "pod": "speed-p0-prefill-0"}]
    pair["decode"] = [{"address": f"{LOOPBACK}:{decode.engine.port}", "pod": "speed-p0-decode-0"}]
    pair["kvTransfer"]["connector"] = connector
    if "VLLM_MOONCAKE_BOOTSTRAP_PORT" in prefill.engine.env:  # the CPU transform's free port for it
        pair["kvTransfer"]["bootstrapPort"] = int(prefill.engine.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"])
    table.update(pairs=[pair], servedModelName=served_name)
    with router_on(table, f"{prefill.engine.name}-router", scratch, logs) as (url, _):
        warm_pd(url, served_name, prefill, decode)
        yield url


MOONCAKE_STALL = ("no transfer progress within", "transfer timeout after")
"""What Mooncake's TCP transport logs when a loopback session stalls (stop 48's CI: the prefill's first send to the
decode waited 30 s for a status frame that never came; the same tests passed on an immediate rerun)."""


def warm_pd(router: str, served_name: str, prefill: BuiltEngine, decode: BuiltEngine) -> None:
    """One P/D request before any test: the decode engine's first request to a prefill engine runs the
    connector's handshake, and it runs here, once, with nothing else in flight. A failure fails every test that
    needs the router, with both engines' log tails. One retry, only when the engines logged Mooncake's transport
    stall (:data:`MOONCAKE_STALL`), with a warning: that stall is the third-party transport's, the router answered
    it correctly (502), and every later request is still checked without a retry."""
    body = {"model": served_name, "prompt": "def warm(self):", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    for attempt in (1, 2):
        try:
            out = post_json(f"{router}/v1/completions", body)
            break
        except (OSError, urllib.error.HTTPError) as exc:
            logs = f"--- prefill log ---\n{prefill.engine.tail()}\n--- decode log ---\n{decode.engine.tail()}"
            if attempt == 1 and any(mark in logs for mark in MOONCAKE_STALL):
                warnings.warn(
                    f"the first P/D request hit Mooncake's transport stall ({exc}); retrying once", stacklevel=1
                )
                continue
            pytest.fail(f"the first P/D request through the router failed: {exc}\n{logs}", pytrace=False)
    assert out["usage"]["completion_tokens"] == body["max_tokens"], out
