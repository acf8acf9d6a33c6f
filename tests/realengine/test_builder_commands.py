"""The engine command lines Tandem's builders emit are ones vLLM accepts and starts (issue 16).

A builder change that vLLM rejects (a renamed or removed flag, a kv-transfer-config field or value vLLM
refuses) fails here: the parse test checks every variant through vLLM's own parser and config, and the
start test runs the prefill and decode commands for examples/speed-pool.yaml as real engines. The CPU
transform between the builder and the engine is asserted to touch only what engines.py documents.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tandem.api.labels import Role
from tests.realengine.builtpods import BuiltEngine, built_pod, example_cache_wiring, example_pool
from tests.realengine.engines import (
    ADDED_FLAGS,
    CPU_SHIM_APPLIED,
    LOOPBACK,
    SCRATCH_NAMES,
    SUBSTITUTED_FLAGS,
    RealEnv,
    cpu_args,
    cpu_env,
    cpu_kv_transfer_config,
    http_get,
    post_json,
)

HERE = __import__("pathlib").Path(__file__).resolve().parent
PARSE_TIMEOUT_S = 300
MIN_WORD = 6  # shorter config words ("cpu", "tcp") appear in unrelated warnings


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
    env = cpu_env(built_env, tmp_path, 5601)
    for var in built_env:
        if var["name"] == "HF_HOME":
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


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_built_engines_start_and_serve(role: str, prefill: BuiltEngine, decode: BuiltEngine, served_name: str) -> None:
    built = prefill if role == "prefill" else decode
    assert _kv(built.container["args"])["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
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
    assert CPU_SHIM_APPLIED in log, "the NIXL idle-spin shim did not apply (engines.py, cpushim/)"
