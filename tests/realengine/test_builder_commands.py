"""The engine command lines Tandem's builders emit are ones vLLM accepts and starts (issue 16).

A builder change that vLLM rejects (a renamed or removed flag, a kv-transfer-config field or value vLLM
refuses) fails here: the parse test checks every variant through vLLM's own parser and config, and the
start tests run the prefill and decode commands for examples/speed-pool.yaml as real engines: with
NixlConnector and no cache, and as shipped (MooncakeConnector plus the example MooncakeCache, a real
`mooncake_master` from the cache builders' command line). The CPU transform between the builder and the
engine is asserted to touch only what engines.py documents.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from tandem.api.labels import Role
from tests.realengine.builtpods import BuiltEngine, built_pod, example_cache_wiring, example_pool
from tests.realengine.engines import (
    ADDED_FLAGS,
    CPU_SHIM_APPLIED,
    LOOPBACK,
    MOONCAKE_SHIM_APPLIED,
    SCRATCH_NAMES,
    SUBSTITUTED_ENV,
    SUBSTITUTED_FLAGS,
    RealEnv,
    cpu_args,
    cpu_env,
    cpu_kv_transfer_config,
    http_get,
    post_json,
)
from tests.realengine.routerproc import run_router

HERE = Path(__file__).resolve().parent
PARSE_TIMEOUT_S = 300
MIN_WORD = 6  # shorter config words ("cpu", "tcp") appear in unrelated warnings
STORE_CONNECTED = "Mooncake mode=standalone-store"  # MooncakeStoreWorker's line once its client is set up
VLLM_43828 = "MooncakeConnector is not contained in the list of registered connectors with Prometheus metrics"
TRANSFERS_BEFORE_CHECK = 2  # the warm-up's transfer plus these; the stats of any of them trigger the bug


def _words(value: Any) -> set[str]:
    """The keys and string values of a kv-transfer-config, long enough to be specific."""
    if isinstance(value, dict):
        return {w for k, v in value.items() for w in {k, *_words(v)} if len(w) >= MIN_WORD}
    if isinstance(value, list):
        return {w for v in value for w in _words(v)}
    return {value} if isinstance(value, str) and len(value) >= MIN_WORD else set()


def deprecations(log: str, args: list[str]) -> list[str]:
    """vLLM's deprecation warnings about what the builder emitted: a line that says "deprecat" and names
    one of the flags (``--flag`` or ``flag_name``) or a kv-transfer-config key or value (NixlConnector's
    ``kv_both``, for example). Other libraries' deprecations (torch's own) are not the builder's."""
    words = set()
    for arg in args[1:]:
        flag = arg.split("=", 1)[0]
        words |= {flag, flag.removeprefix("--").replace("-", "_")}
    words = {w for w in words if len(w) >= MIN_WORD} | _words(_kv(args))
    return [line for line in log.splitlines() if "deprecat" in line.lower() and any(w in line for w in words)]


VARIANTS = {
    # name: (connector or None for the example's own, with the example's MooncakeCache)
    "speed-pool-as-shipped-mooncake-with-cache": (None, True),
    "speed-pool-mooncake-without-cache": (None, False),
    "speed-pool-nixl-without-cache": ("NixlConnector", False),
    "speed-pool-nixl-with-cache": ("NixlConnector", True),
}


def _variant_args(connector: str | None, cache: bool, role: Role) -> list[str]:
    pod = built_pod(example_pool(connector), role, example_cache_wiring() if cache else None)
    args: list[str] = pod["spec"]["containers"][0]["args"]
    return args


def _kv(args: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(next(a for a in args if a.startswith("--kv-transfer-config=")).split("=", 1)[1])
    return config


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize(("connector", "cache"), list(VARIANTS.values()), ids=list(VARIANTS))
def test_cpu_transform_changes_only_the_documented_flags(
    role: Role, connector: str | None, cache: bool, tmp_path: Any
) -> None:
    built = _variant_args(connector, cache, role)
    ran = cpu_args(built, tmp_path / "model", 1234)
    assert ran[0] == str(tmp_path / "model")
    assert ran[len(built) :] == list(ADDED_FLAGS)
    for before, after in zip(built[1:], ran[1 : len(built)], strict=True):
        if before != after:
            assert before.split("=", 1)[0] in SUBSTITUTED_FLAGS, (before, after)
    assert _kv(ran) == cpu_kv_transfer_config(_kv(built))
    pod = built_pod(example_pool(connector), role, example_cache_wiring() if cache else None)
    built_env = pod["spec"]["containers"][0]["env"]
    env = cpu_env(built_env, tmp_path, 5601, bootstrap_port=5602, mooncake_config=tmp_path / "mooncake.json")
    for var in built_env:
        if var["name"] == "HF_HOME":
            continue
        if var["name"] in SUBSTITUTED_ENV:
            assert env[var["name"]] in {"5602", str(tmp_path / "mooncake.json")}, (var, env[var["name"]])
            continue
        if var["name"] in SCRATCH_NAMES:  # the pod's scratch emptyDir, relocated into the test's scratch
            assert env[var["name"]].startswith(str(tmp_path)), (var, env[var["name"]])
            continue
        assert env[var["name"]] == var.get("value", LOOPBACK), var


def test_vllm_parser_and_engine_config_accept_every_built_variant(realenv: RealEnv) -> None:
    variants = {
        f"{name}/{role}": cpu_args(_variant_args(connector, cache, role), realenv.model, 8000)
        for name, (connector, cache) in VARIANTS.items()
        for role in ("prefill", "decode")
    }
    result = subprocess.run(
        [str(realenv.python), str(HERE / "vllm_parse.py")],
        input=json.dumps(variants),
        check=False,
        capture_output=True,
        text=True,
        timeout=PARSE_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_TARGET_DEVICE": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    assert errors == dict.fromkeys(variants), errors
    found = [line for argv in variants.values() for line in deprecations(result.stderr, argv)]
    assert not found, found


def _assert_serves(built: BuiltEngine, served_name: str) -> str:
    """The engine serves the pool's name, completes a request and logged no deprecation; its log."""
    models = json.loads(http_get(f"{built.engine.url}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == [served_name]
    out = post_json(
        f"{built.engine.url}/v1/completions",
        {"model": served_name, "prompt": "def schedule(self):", "max_tokens": 4, "temperature": 0, "ignore_eos": True},
    )
    assert out["usage"]["completion_tokens"] == 4
    log = built.engine.log.read_text(errors="replace")
    found = deprecations(log, built.container["args"])
    assert not found, found
    return log


STARTED = {  # connector: (prefill fixture, decode fixture, the shim line its engines must log)
    "NixlConnector": ("prefill", "decode", CPU_SHIM_APPLIED),
    "MooncakeConnector": ("mooncake_prefill", "mooncake_decode", MOONCAKE_SHIM_APPLIED),
}


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("connector", list(STARTED))
def test_built_engines_start_and_serve(
    connector: str, role: str, request: pytest.FixtureRequest, served_name: str
) -> None:
    """Without a cache: the P->D connector alone, kv_producer on prefill and kv_consumer on decode."""
    prefill_fixture, decode_fixture, shim_line = STARTED[connector]
    built: BuiltEngine = request.getfixturevalue(prefill_fixture if role == "prefill" else decode_fixture)
    config = _kv(built.container["args"])
    assert config["kv_connector"] == connector
    assert config["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
    log = _assert_serves(built, served_name)
    assert shim_line in log, "the CPU shim did not apply (engines.py, cpushim/)"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_built_engines_with_the_example_cache_start_and_serve(
    role: str, cached_prefill: BuiltEngine, cached_decode: BuiltEngine, served_name: str
) -> None:
    """The example as shipped: a MultiConnector of MooncakeConnector (tcp) and MooncakeStoreConnector,
    the store client registered with a real master through the builders' mooncake.json."""
    built = cached_prefill if role == "prefill" else cached_decode
    config = _kv(built.container["args"])
    children = config["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in children] == ["MooncakeConnector", "MooncakeStoreConnector"]
    assert children[0]["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
    assert children[0]["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
    log = _assert_serves(built, served_name)
    assert MOONCAKE_SHIM_APPLIED in log, "the Mooncake device-index shim did not apply (engines.py, cpushim/)"
    assert STORE_CONNECTED in log, "the MooncakeStoreConnector did not set up its client (mooncake.json)"


class VllmIssue43828(Exception):
    """The engines failed the way vllm-project/vllm#43828 describes, and no other way."""


@pytest.mark.xfail(
    raises=VllmIssue43828,
    strict=True,
    reason="vLLM 0.32 (vllm-project/vllm#43828, open): a MultiConnector asserts that every child reporting "
    "transfer stats has Prometheus metrics; MooncakeConnector reports stats and has none, so the first "
    "Mooncake transfer of the example as shipped (MooncakeConnector + MooncakeCache) kills the engine's "
    "output handler. Strict: a vLLM that fixes it makes this pass, and the marker must go.",
)
def test_the_example_with_its_cache_keeps_serving_after_a_pd_transfer(
    cached_prefill: BuiltEngine, cached_decode: BuiltEngine, served_name: str, scratch: Path, logs: Path
) -> None:
    """Last in the module: the cached engines are stopped after it, whatever state it leaves them in."""
    body = {"model": served_name, "prompt": "def handler(request):\n" * 40, "max_tokens": 4, "temperature": 0}
    try:
        with run_router(cached_prefill, cached_decode, served_name, scratch, logs, "MooncakeConnector") as url:
            for _ in range(TRANSFERS_BEFORE_CHECK):
                post_json(f"{url}/v1/completions", body)
        for built in (cached_prefill, cached_decode):
            post_json(f"{built.engine.url}/v1/completions", body)
    except (OSError, urllib.error.HTTPError, pytest.fail.Exception) as exc:
        logs_text = "".join(b.engine.log.read_text(errors="replace") for b in (cached_prefill, cached_decode))
        if VLLM_43828 in logs_text:
            raise VllmIssue43828(VLLM_43828) from exc
        raise
