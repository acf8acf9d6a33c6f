"""The admission rules of issue 19 items 1, 3, 4 (and the simple part of 2), rule by rule.

Durations beyond Go's limit, engine flags Tandem manages or that run outside code, injection and
literal-secret env vars, passwords in addresses, gate conditions that would only fail at run time,
duplicate gate names. Each table row is one manifest change and whether `tandem validate` refuses it
(and where); the catalog under tests/contract/bad_inputs/ checks the same rules on the API server.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest
import yaml
from pydantic import ValidationError

from tandem.adapters.kube import KubeApi
from tandem.api.celenv import condition_problem, evaluate
from tandem.api.quantity import MAX_DURATION, MAX_DURATION_NS, parse_duration, parse_duration_ns
from tandem.api.resources import InferencePool
from tandem.api.validate import validate_object
from tandem.reconcile.pool import reconcile_pool
from tests.support.catalog import EXAMPLES

BASE: dict[str, Any] = yaml.safe_load((EXAMPLES / "minimal-pool.yaml").read_text(encoding="utf-8"))


def pool_with(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return obj


def errors_at(obj: dict[str, Any]) -> dict[str, str]:
    return {e.path: e.message for e in validate_object(obj)}


# --- durations (item 3) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        pytest.param("30s", 30 * 10**9, id="seconds"),
        pytest.param("1h30m", 5400 * 10**9, id="compound"),
        pytest.param("1.5s", 1_500_000_000, id="fraction"),
        pytest.param("500ms", 500_000_000, id="milliseconds"),
        pytest.param(MAX_DURATION, 2562047 * 3600 * 10**9, id="largest-whole-hours"),
        pytest.param("2562047h47m16.854775807s", MAX_DURATION_NS, id="exactly-go-max"),
    ],
)
def test_durations_parse_exactly_like_go(text: str, nanoseconds: int) -> None:
    assert parse_duration_ns(text) == nanoseconds
    assert parse_duration(text) == nanoseconds / 10**9


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2562047h47m16.854775808s", id="one-ns-past-go-max"),
        pytest.param("2562048h", id="hours-past-go-max"),
        pytest.param("9" * 31 + "h", id="31-digit-hours"),
        pytest.param("10x", id="bad-unit"),
        pytest.param("", id="empty"),
    ],
)
def test_durations_beyond_go_or_malformed_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ns(text)


def test_cel_duration_fails_beyond_go_limit_like_the_api_server() -> None:
    rule = f"duration(self) <= duration('{MAX_DURATION}')"
    assert evaluate(rule, {"self": MAX_DURATION})
    assert not evaluate(rule, {"self": "2562047h47m16s"})  # Go holds it, the rule does not
    with pytest.raises(Exception, match="out of range"):
        evaluate(rule, {"self": "2562048h"})


@pytest.mark.parametrize(
    "path",
    [
        "spec.pairs.drainTimeout",
        "spec.pairs.orphanTimeout",
        "spec.autoscaling.interval",
        "spec.autoscaling.scaleDown.stabilizationWindow",
        "spec.rollout.progressDeadline",
        "spec.rollout.analysis.initialDelay",
    ],
)
def test_every_duration_field_is_bounded(path: str) -> None:
    assert errors_at(pool_with(path, "2562047h")) == {}
    errors = errors_at(pool_with(path, "99999999999999h"))
    assert "at most 2562047h" in errors[path]


def test_operator_parse_refuses_a_stored_out_of_range_duration() -> None:
    obj = pool_with("spec.pairs.drainTimeout", "99999999999999h")
    with pytest.raises(ValidationError, match="out of range"):
        InferencePool.model_validate(obj)


class _OneObject:
    """Just get_custom: the pass must stop at the parse of the stored pool."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def test_a_stored_pool_with_an_overflowing_duration_makes_the_pass_report_not_raise() -> None:
    stored = pool_with("spec.pairs.drainTimeout", "99999999999999h")
    stored["metadata"].update(namespace="llm", uid="u1", generation=1, resourceVersion="1")
    kube = cast(KubeApi, _OneObject(stored))
    result = asyncio.run(reconcile_pool(kube, "llm", "minimal"))
    assert "is not valid" in result.error
    assert result.requeue_after is not None and result.requeue_after > 0
    assert result.writes == 0


# --- engine args and env (item 1) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "refused"),
    [
        pytest.param("--enable-chunked-prefill", None, id="allowed-flag"),
        pytest.param("--max-num-batched-tokens=16384", None, id="allowed-with-value"),
        pytest.param("--portal", None, id="prefix-of-nothing-managed"),
        pytest.param("--no-trust-remote-code", None, id="negated-dangerous-flag"),
        pytest.param("--port=9000", "set by Tandem", id="port"),
        pytest.param("--port", "set by Tandem", id="port-value-in-next-arg"),
        pytest.param("--max_num_seqs=512", "set by Tandem", id="underscore-spelling"),
        pytest.param("--served-model-name=x", "set by Tandem", id="served-model-name"),
        pytest.param('--kv-transfer-config={"kv_role":"kv_both"}', "set by Tandem", id="kv-transfer-config"),
        pytest.param("-tp=8", "set by Tandem", id="short-tensor-parallel"),
        pytest.param("--config=/tmp/all.yaml", "set by Tandem", id="config-file"),
        pytest.param("--trust-remote-code", "not allowed", id="trust-remote-code"),
        pytest.param("--api-key=sk-123", "not allowed", id="api-key-literal"),
        pytest.param("--middleware=evil.mod", "not allowed", id="middleware"),
        pytest.param("--hf-token=hf_x", "not allowed", id="hf-token-literal"),
    ],
)
def test_engine_args(arg: str, refused: str | None) -> None:
    for path, where in (("spec.stack.args", "spec.stack.args[0]"), ("spec.stack.prefill.args", None)):
        obj = pool_with(path, [arg])
        errors = errors_at(obj)
        if refused is None:
            assert errors == {}
        else:
            key = where or "spec.stack.prefill.args[0]"
            assert refused in errors[key]


@pytest.mark.parametrize(
    ("env", "field", "refused"),
    [
        pytest.param({"name": "VLLM_ROCM_USE_AITER", "value": "1"}, None, None, id="ordinary"),
        pytest.param({"name": "MAX_TOKENS", "value": "5"}, None, None, id="tokens-is-not-token"),
        pytest.param({"name": "HF_TOKEN", "value": ""}, None, None, id="empty-literal"),
        pytest.param(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            None,
            None,
            id="secret-ref",
        ),
        pytest.param({"name": "LD_PRELOAD", "value": "/x.so"}, "name", "outside the image", id="ld-preload"),
        pytest.param({"name": "LD_LIBRARY_PATH", "value": "/x"}, "name", "outside the image", id="ld-library-path"),
        pytest.param({"name": "PYTHONPATH", "value": "/x"}, "name", "outside the image", id="pythonpath"),
        pytest.param({"name": "HF_TOKEN", "value": "hf_x"}, "value", "secretKeyRef", id="hf-token"),
        pytest.param({"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}, "value", "secretKeyRef", id="aws-secret"),
        pytest.param({"name": "openai_api_key", "value": "x"}, "value", "secretKeyRef", id="lowercase-key"),
        pytest.param({"name": "DB_PASSWORD", "value": "x"}, "value", "secretKeyRef", id="password"),
    ],
)
def test_engine_env(env: dict[str, Any], field: str | None, refused: str | None) -> None:
    errors = errors_at(pool_with("spec.stack.env", [env]))
    if refused is None:
        assert errors == {}
    else:
        assert refused in errors[f"spec.stack.env[0].{field}"]


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        pytest.param("https://prometheus.monitoring:9090", True, id="plain"),
        pytest.param("https://reader@prometheus:9090", True, id="user-without-password"),
        pytest.param("https://admin:hunter2@prometheus:9090", False, id="user-and-password"),
    ],
)
def test_prometheus_address_carries_no_password(address: str, ok: bool) -> None:
    errors = errors_at(pool_with("spec.rollout.analysis.prometheusAddress", address))
    assert (errors == {}) is ok


# --- gate conditions (item 4) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        pytest.param("result <= 1.0", None, id="simple"),
        pytest.param("result > baseline * 1.2", None, id="baseline"),
        pytest.param("[0.5, 1.0].exists(t, result <= t)", None, id="macro-variable"),
        pytest.param("int(result) / int(baseline - 1.0) > 1", None, id="data-dependent-division"),
        pytest.param("result <=", "does not compile", id="syntax"),
        pytest.param("latency < 1.0", "unknown variable 'latency'", id="unknown-variable"),
        pytest.param("result > 2.0 && foo", "unknown variable 'foo'", id="unknown-after-short-circuit"),
        pytest.param("result * 2.0", "must be a boolean", id="double"),
        pytest.param("'fast'", "must be a boolean", id="string"),
        pytest.param("'a' + result > 1.0", "cannot be evaluated", id="type-error"),
    ],
)
def test_condition_problem(condition: str, problem: str | None) -> None:
    found = condition_problem(condition)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_gate_condition_checked_at_admission_only() -> None:
    gate = {"name": "ttft", "template": "TTFTP95", "successCondition": "latency < 1.0"}
    obj = pool_with("spec.rollout.analysis.metrics", [gate])
    path = "spec.rollout.analysis.metrics[0].successCondition"
    assert "condition: must be comparisons" in errors_at(obj)[path]
    # The operator parses the stored object without admission checks: the API server accepted it, so
    # the rollout pauses on it at run time instead of the whole pool going unreconciled.
    assert InferencePool.model_validate(obj).spec.rollout.analysis.metrics[0].success_condition == "latency < 1.0"


def test_duplicate_gate_names_are_refused() -> None:
    gate = {"name": "ttft", "template": "TTFTP95", "successCondition": "result <= 1.0"}
    errors = errors_at(pool_with("spec.rollout.analysis.metrics", [gate, {**gate, "template": "TTFTP90"}]))
    assert "gate names must be unique" in errors["spec.rollout.analysis.metrics"]


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        pytest.param('sum(rate(x{pool="${pool}",role=~"${role}"}[${interval}]))', None, id="renders"),
        pytest.param('sum(x{pool="${pol}"})', "query: variables are written ${name}", id="unknown-variable"),
        pytest.param('sum(x{pool="$pool"})', "query: variables are written ${name}", id="grafana-style"),
        pytest.param('sum(x{pool="${pool"})', "query: variables are written ${name}", id="malformed"),
        pytest.param('sum(x{pool=~"a$"})', None, id="regex-anchor"),
        pytest.param("sum(x{pool=${pool}})", "inside a quoted label matcher", id="unquoted"),
        pytest.param('sum(x{role="${role}"})', "is a regex", id="role-not-regex-matcher"),
        pytest.param('sum(x{pool="${pool}})', "unterminated string", id="unterminated"),
    ],
)
def test_custom_query_must_render_at_admission(query: str, problem: str | None) -> None:
    gate = {"name": "q", "query": query, "successCondition": "result < 1.0"}
    obj = pool_with("spec.rollout.analysis.metrics", [gate])
    errors = errors_at(obj)
    if problem is None:
        assert errors == {}
    else:
        assert problem in errors["spec.rollout.analysis.metrics[0].query"]
        InferencePool.model_validate(obj)  # the operator still parses it (the API server accepted it)


@pytest.mark.parametrize(
    ("memory", "ok"),
    [
        pytest.param("512Gi", True, id="ordinary"),
        pytest.param("7Ei", True, id="below-bound"),
        pytest.param("8Ei", False, id="at-bound"),
        pytest.param("9" * 31 + "E", False, id="31-digit-exabytes"),
    ],
)
def test_quantities_stay_below_8ei(memory: str, ok: bool) -> None:
    errors = errors_at(pool_with("spec.stack.prefill.resources", {"memory": memory}))
    assert (errors == {}) is ok
    if not ok:
        assert "must be less than 8Ei" in errors["spec.stack.prefill.resources.memory"]


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        pytest.param("hf://Qwen/Qwen3-8B", True, id="hf"),
        pytest.param("oci://registry.example:5000/models/qwen@sha256:" + "a" * 64, True, id="oci-with-port"),
        pytest.param("s3://AKIAEXAMPLE:secret@models/qwen", False, id="s3-key-and-secret"),
    ],
)
def test_model_source_carries_no_password(source: str, ok: bool) -> None:
    errors = errors_at(pool_with("spec.model.source", source))
    assert (errors == {}) is ok
    if not ok:
        assert "may not carry a password" in errors["spec.model.source"]
