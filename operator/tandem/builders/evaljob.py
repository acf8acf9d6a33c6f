"""The eval Job of an analysis step: runs the user's eval image against the canary revision's pairs.

What it owns: the Job manifest. The eval container gets where to send requests in `TANDEM_TARGET_URLS`
(comma-separated base URLs), what they are in `TANDEM_TARGET` (`router`: the router Service, and every
request must carry the headers of `TANDEM_TARGET_HEADERS`, a JSON object, which pin it to the canary
revision of this pool — the real P/D path; `decode-pods`: `http://<decode-pod-ip>:8000` of the canary's
pairs, when the operator has no router, and `TANDEM_TARGET_HEADERS` is `{}`), the model name in
`TANDEM_MODEL`, the revision in `TANDEM_REVISION`, and reports `{"score": <percent>}` as its termination
message, which the operator reads from the finished pod. The Job and its pod carry the target kind in the
`tandem.dev/eval-target` annotation, so `kubectl` and the rollout status show what an eval measured.
The Job never retries (`backoffLimit: 0`: a flaky eval is an Error verdict, not a silent second chance),
is bounded by the gate's deadline, and runs restricted (non-root, no token, read-only root, no
privileges).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tandem.api.labels import (
    ANNOTATION_EVAL_TARGET,
    COMPONENT_EVAL,
    EVAL_TARGET_DECODE_PODS,
    LABEL_COMPONENT,
    LABEL_REVISION,
    eval_job_name,
)
from tandem.api.pool import EvalGate
from tandem.api.quantity import parse_duration
from tandem.builders.common import base_labels, container_security, metadata, owner_reference


def build_eval_job(
    *,
    pool: str,
    namespace: str,
    pool_uid: str,
    revision: str,
    step: int,
    gate: EvalGate,
    model: str,
    target_urls: list[str],
    target: str = EVAL_TARGET_DECODE_PODS,
    target_headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    name = eval_job_name(pool, revision, step)
    labels = base_labels(pool) | {LABEL_COMPONENT: COMPONENT_EVAL, LABEL_REVISION: revision}
    annotations = {ANNOTATION_EVAL_TARGET: target}
    headers = json.dumps(dict(target_headers or {}), sort_keys=True, separators=(",", ":"))
    env = [
        {"name": "TANDEM_TARGET_URLS", "value": ",".join(target_urls)},
        {"name": "TANDEM_TARGET", "value": target},
        {"name": "TANDEM_TARGET_HEADERS", "value": headers},
        {"name": "TANDEM_MODEL", "value": model},
        {"name": "TANDEM_REVISION", "value": revision},
        {"name": "TANDEM_POOL", "value": pool},
        *[var.wire() for var in gate.env],
    ]
    container: dict[str, Any] = {
        "name": "eval",
        "image": gate.image,
        "env": env,
        "terminationMessagePolicy": "File",
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "securityContext": container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if gate.command:
        container["command"] = list(gate.command)
    if gate.args:
        container["args"] = list(gate.args)
    deadline = int(parse_duration(gate.deadline))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, namespace, labels, owner_reference("InferencePool", pool, pool_uid), annotations),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True},
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
