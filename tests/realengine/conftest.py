"""Realengine tier: every test here is marked ``realengine`` and runs against real vLLM engines.

Session fixtures start each engine once, one at a time (the machine has 2 cores): the prefill and the
decode instance Tandem's builders produce for examples/speed-pool.yaml (NixlConnector, the connector this
machine can run), after the CPU transform in engines.py, and `tandem router` in front of them. A missing
environment fails the tier (it is mandatory); tools/realengine/install.sh builds it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.api.labels import Role
from tests.realengine.builtpods import BuiltEngine, built_pod, example_pool
from tests.realengine.engines import (
    REPO,
    Engine,
    RealEnv,
    cpu_args,
    cpu_env,
    free_port,
    post_json,
    real_env,
    wait_http,
)

HERE = Path(__file__).resolve().parent
ROUTER_READY_TIMEOUT_S = 60.0
# pytest-timeout counts fixture setup: the first test that needs both engines waits for two starts.
TEST_TIMEOUT_S = 1200


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier comes from tests/conftest.py; here only this tier's longer timeout."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def realenv() -> RealEnv:
    return real_env()


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("realengine")


@pytest.fixture(scope="session")
def logs() -> Path:
    path = REPO / ".logs" / "realengine"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _start_built(realenv: RealEnv, scratch: Path, logs: Path, role: Role) -> BuiltEngine:
    pod = built_pod(example_pool("NixlConnector"), role)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    port = free_port()
    engine = Engine(
        name=role,
        port=port,
        argv=[str(realenv.vllm), "serve", *cpu_args(container["args"], realenv.model, port)],
        env=cpu_env(container["env"], scratch / role, free_port()),
        log=logs / f"{role}.log",
    )
    engine.start()
    print(f"\nrealengine: {role} engine healthy after {engine.startup_s:.0f}s", file=sys.stderr)
    return BuiltEngine(engine=engine, pod=pod)


@pytest.fixture(scope="session")
def prefill(realenv: RealEnv, scratch: Path, logs: Path) -> Iterator[BuiltEngine]:
    built = _start_built(realenv, scratch, logs, "prefill")
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def decode(prefill: BuiltEngine, realenv: RealEnv, scratch: Path, logs: Path) -> Iterator[BuiltEngine]:
    """Starts after prefill is healthy: one engine start at a time."""
    built = _start_built(realenv, scratch, logs, "decode")
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def served_name() -> str:
    return example_pool().spec.model.served_name


@pytest.fixture(scope="session")
def router(prefill: BuiltEngine, decode: BuiltEngine, served_name: str, scratch: Path, logs: Path) -> Iterator[str]:
    """`tandem router` serving a one-pair routing table: the real prefill and decode, NixlConnector."""
    table = json.loads((REPO / "examples" / "router" / "speed-routing.json").read_text())
    pair = copy.deepcopy(table["pairs"][0])
    pair["prefill"] = [{"address": f"127.0.0.1:{prefill.engine.port}", "pod": "speed-p0-prefill-0"}]
    pair["decode"] = [{"address": f"127.0.0.1:{decode.engine.port}", "pod": "speed-p0-decode-0"}]
    table.update(pairs=[pair], servedModelName=served_name)
    path = scratch / "speed-routing.json"
    path.write_text(json.dumps(table))
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), os.environ.get("PYTHONPATH", "")])}
    log = logs / "router.log"
    argv = [sys.executable, "-m", "tandem.cli", "router", "--routing-table", str(path)]
    argv += ["--port", str(port), "--metrics-port", str(metrics_port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{metrics_port}/ready", ROUTER_READY_TIMEOUT_S, proc, "tandem router", log)
        url = f"http://127.0.0.1:{port}"
        _warm_pd(url, served_name, prefill, decode)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def _warm_pd(router: str, served_name: str, prefill: BuiltEngine, decode: BuiltEngine) -> None:
    """One P/D request before any test: the decode engine's first request to a prefill engine runs the
    NIXL handshake, and it runs here, once, with nothing else in flight. No retry: a failure fails every
    test that needs the router, with both engines' log tails."""
    body = {"model": served_name, "prompt": "def warm(self):", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    try:
        out = post_json(f"{router}/v1/completions", body)
    except (OSError, urllib.error.HTTPError) as exc:
        pytest.fail(
            f"the first P/D request through the router failed: {exc}\n"
            f"--- prefill log ---\n{prefill.engine.tail()}\n--- decode log ---\n{decode.engine.tail()}",
            pytrace=False,
        )
    assert out["usage"]["completion_tokens"] == body["max_tokens"], out
