"""Realengine tier: every test here is marked ``realengine`` and runs against real vLLM engines.

Session fixtures start each engine once, one at a time (the machine has 2 cores): the prefill and the
decode instance Tandem's builders produce for examples/speed-pool.yaml with NixlConnector and with the
example's own MooncakeConnector, both without a cache, after the CPU transform in engines.py, and
`tandem router` in front of each pair. Module fixtures start the example as shipped (MooncakeConnector and
examples/mooncake-cache.yaml's MooncakeCache, whose master runs the cache builders' command line on
loopback) for the module that tests it, and stop it after. A missing environment fails the tier (it is mandatory);
tools/realengine/install.sh builds it. Every process goes through engines.spawn, so a killed pytest
leaves none behind.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tandem.api.labels import Role
from tandem_lab.dev.ports import free_port
from tests.realengine.builtpods import (
    BuiltEngine,
    built_pod,
    example_cache_wiring,
    example_pool,
    loopback_client_config,
    master_container,
)
from tests.realengine.engines import (
    LOOPBACK,
    REPO,
    Engine,
    RealEnv,
    cpu_args,
    cpu_env,
    real_env,
    spawn,
    stop_process,
    wait_http,
)
from tests.realengine.routerproc import run_router

HERE = Path(__file__).resolve().parent
MASTER_READY_TIMEOUT_S = 60.0
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


@dataclass(frozen=True)
class MooncakeMaster:
    """The Mooncake master of the example cache, running the cache builders' command line on loopback."""

    rpc: str
    args: list[str]


def _start_built(
    realenv: RealEnv,
    scratch: Path,
    logs: Path,
    role: Role,
    name: str,
    connector: str | None,
    master: MooncakeMaster | None = None,
) -> BuiltEngine:
    pod = built_pod(example_pool(connector), role, example_cache_wiring() if master is not None else None)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    port = free_port()
    mooncake_config = None
    if master is not None:
        mooncake_config = scratch / name / "mooncake.json"
        mooncake_config.parent.mkdir(parents=True, exist_ok=True)
        mooncake_config.write_text(json.dumps(loopback_client_config(master.rpc)))
    engine = Engine(
        name=name,
        port=port,
        argv=[str(realenv.vllm), "serve", *cpu_args(container["args"], realenv.model, port)],
        env=cpu_env(
            container["env"], scratch / name, free_port(), bootstrap_port=free_port(), mooncake_config=mooncake_config
        ),
        log=logs / f"{name}.log",
    )
    engine.start()
    print(f"\nrealengine: {name} engine healthy after {engine.startup_s:.0f}s", file=sys.stderr)
    return BuiltEngine(engine=engine, pod=pod)


@pytest.fixture(scope="session")
def prefill(realenv: RealEnv, scratch: Path, logs: Path) -> Iterator[BuiltEngine]:
    built = _start_built(realenv, scratch, logs, "prefill", "prefill", "NixlConnector")
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def decode(prefill: BuiltEngine, realenv: RealEnv, scratch: Path, logs: Path) -> Iterator[BuiltEngine]:
    """Starts after prefill is healthy: one engine start at a time."""
    built = _start_built(realenv, scratch, logs, "decode", "decode", "NixlConnector")
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def mooncake_prefill(realenv: RealEnv, scratch: Path, logs: Path) -> Iterator[BuiltEngine]:
    """examples/speed-pool.yaml's connector (MooncakeConnector) without its MooncakeCache."""
    built = _start_built(realenv, scratch, logs, "prefill", "mooncake-prefill", None)
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def mooncake_decode(
    mooncake_prefill: BuiltEngine, realenv: RealEnv, scratch: Path, logs: Path
) -> Iterator[BuiltEngine]:
    built = _start_built(realenv, scratch, logs, "decode", "mooncake-decode", None)
    yield built
    built.engine.stop()


@pytest.fixture(scope="module")
def mooncake_master(realenv: RealEnv, logs: Path) -> Iterator[MooncakeMaster]:
    """`mooncake_master` from the real-engine venv with the master pod's arguments: ``$(POD_IP)`` is
    loopback, the RPC and metrics ports free ones (nothing else substituted). Module scope, like the
    engines that use it: they are stopped when their module is done."""
    container = master_container()
    assert container["command"] == ["mooncake_master"]
    rpc, metrics = free_port(), free_port()
    replace = {"--rpc_port": str(rpc), "--metrics_port": str(metrics)}
    args = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        args.append(f"{flag}={replace.get(flag, value.replace('$(POD_IP)', LOOPBACK))}")
    log = logs / "mooncake-master.log"
    proc = spawn([str(realenv.venv / "bin" / "mooncake_master"), *args], {"PATH": "/usr/bin:/bin"}, log)
    try:
        wait_http(f"http://{LOOPBACK}:{metrics}/health", MASTER_READY_TIMEOUT_S, proc, "mooncake_master", log)
        yield MooncakeMaster(rpc=f"{LOOPBACK}:{rpc}", args=args)
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def cached_prefill(
    mooncake_master: MooncakeMaster, realenv: RealEnv, scratch: Path, logs: Path
) -> Iterator[BuiltEngine]:
    """examples/speed-pool.yaml as shipped: MooncakeConnector, and the example MooncakeCache wired in."""
    built = _start_built(realenv, scratch, logs, "prefill", "cached-prefill", None, mooncake_master)
    yield built
    built.engine.stop()


@pytest.fixture(scope="module")
def cached_decode(
    cached_prefill: BuiltEngine, mooncake_master: MooncakeMaster, realenv: RealEnv, scratch: Path, logs: Path
) -> Iterator[BuiltEngine]:
    built = _start_built(realenv, scratch, logs, "decode", "cached-decode", None, mooncake_master)
    yield built
    built.engine.stop()


@pytest.fixture(scope="session")
def served_name() -> str:
    return example_pool().spec.model.served_name


@pytest.fixture(scope="session")
def router(prefill: BuiltEngine, decode: BuiltEngine, served_name: str, scratch: Path, logs: Path) -> Iterator[str]:
    """`tandem router` in front of the NixlConnector pair."""
    with run_router(prefill, decode, served_name, scratch, logs, "NixlConnector") as url:
        yield url


@pytest.fixture(scope="session")
def mooncake_router(
    mooncake_prefill: BuiltEngine, mooncake_decode: BuiltEngine, served_name: str, scratch: Path, logs: Path
) -> Iterator[str]:
    """`tandem router` in front of the MooncakeConnector pair (the example's own connector, no cache)."""
    with run_router(mooncake_prefill, mooncake_decode, served_name, scratch, logs, "MooncakeConnector") as url:
        yield url
