"""The eval Job manifest: what its container is told to call (router or decode pods) and with which
headers, visible in env and in the `tandem.dev/eval-target` annotation of the Job and its pod."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.api.labels import ANNOTATION_EVAL_TARGET, EVAL_TARGET_DECODE_PODS, EVAL_TARGET_ROUTER
from tandem.api.pool import EvalGate
from tandem.builders.evaljob import build_eval_job
from tandem.routing import HEADER_REVISION, parse_revision_pin

GATE = EvalGate.model_validate(
    {
        "image": "ghcr.io/example/tool-call-eval:1.4@sha256:" + "cd" * 32,
        "minScorePercent": 98,
        "env": [{"name": "SUITE", "value": "tool-calling"}],
    }
)


def _job(**target: Any) -> dict[str, Any]:
    return build_eval_job(
        pool="speed",
        namespace="llm",
        pool_uid="uid-1",
        revision="7f3a9c",
        step=1,
        gate=GATE,
        model="org/model",
        **target,
    )


def _env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("target", "want_env", "want_annotation"),
    [
        pytest.param(
            {
                "target_urls": ["http://tandem-router.tandem-system.svc:8000"],
                "target": EVAL_TARGET_ROUTER,
                "target_headers": {HEADER_REVISION: "llm/speed/7f3a9c"},
            },
            {
                "TANDEM_TARGET_URLS": "http://tandem-router.tandem-system.svc:8000",
                "TANDEM_TARGET": "router",
                "TANDEM_TARGET_HEADERS": '{"X-Tandem-Revision":"llm/speed/7f3a9c"}',
            },
            "router",
            id="router with the revision pin",
        ),
        pytest.param(
            {"target_urls": ["http://10.0.0.2:8000", "http://10.0.0.4:8000"]},
            {
                "TANDEM_TARGET_URLS": "http://10.0.0.2:8000,http://10.0.0.4:8000",
                "TANDEM_TARGET": "decode-pods",
                "TANDEM_TARGET_HEADERS": "{}",
            },
            "decode-pods",
            id="no router: decode pods, no headers",
        ),
    ],
)
def test_build_eval_job_says_what_the_eval_calls(
    target: dict[str, Any], want_env: dict[str, str], want_annotation: str
) -> None:
    job = _job(**target)
    env = _env(job)
    assert {k: env[k] for k in want_env} == want_env
    assert env["TANDEM_MODEL"] == "org/model" and env["TANDEM_REVISION"] == "7f3a9c" and env["SUITE"] == "tool-calling"
    assert job["metadata"]["annotations"] == {ANNOTATION_EVAL_TARGET: want_annotation}
    assert job["spec"]["template"]["metadata"]["annotations"] == {ANNOTATION_EVAL_TARGET: want_annotation}


def test_build_eval_job_headers_parse_back_to_the_pin() -> None:
    job = _job(
        target_urls=["http://r:8000"], target=EVAL_TARGET_ROUTER, target_headers={HEADER_REVISION: "llm/speed/7f3a9c"}
    )
    headers = json.loads(_env(job)["TANDEM_TARGET_HEADERS"])
    pin = parse_revision_pin(headers[HEADER_REVISION])
    assert (pin.namespace, pin.pool, pin.revision) == ("llm", "speed", "7f3a9c")


def test_build_eval_job_default_target_is_decode_pods() -> None:
    assert _env(_job(target_urls=["http://10.0.0.2:8000"]))["TANDEM_TARGET"] == EVAL_TARGET_DECODE_PODS
