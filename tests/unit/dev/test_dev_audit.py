"""Audit log parsing and write counting."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev import audit

SA = "system:serviceaccount:tandem:tandem-operator"


def event(
    verb: str,
    resource: str,
    *,
    user: str = SA,
    at: str = "2026-01-01T00:00:10.000000Z",
    stage: str = "ResponseComplete",
    group: str = "",
    sub: str = "",
    ns: str = "tandem",
    name: str = "x",
    code: int = 200,
) -> str:
    ref: dict[str, Any] = {"resource": resource, "namespace": ns, "name": name, "apiVersion": "v1"}
    if group:
        ref["apiGroup"] = group
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": stage,
            "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
            "objectRef": ref,
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": at,
            "stageTimestamp": at,
        }
    )


def t(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


LOG = [
    event("create", "pods", at="2026-01-01T00:00:01.000000Z"),
    event("create", "pods", at="2026-01-01T00:00:02.000000Z"),
    event("patch", "inferencepools", group="tandem.dev", sub="status", at="2026-01-01T00:00:03.000000Z"),
    event("get", "pods", at="2026-01-01T00:00:04.000000Z"),
    event("watch", "pods", stage="ResponseStarted", at="2026-01-01T00:00:04.000000Z"),
    event("delete", "pods", user="kwok-admin", at="2026-01-01T00:00:05.000000Z"),
    event("update", "configmaps", code=409, at="2026-01-01T00:00:06.000000Z"),
    event("create", "pods", stage="ResponseStarted", at="2026-01-01T00:00:07.000000Z"),
    "not json",
    "",
    json.dumps({"kind": "EventList"}),
]


def test_count_writes_groups_by_user_verb_resource() -> None:
    got = audit.count_writes(audit.iter_events(LOG))
    assert got == {
        (SA, "create", "pods"): 2,
        (SA, "patch", "inferencepools.tandem.dev/status"): 1,
        ("kwok-admin", "delete", "pods"): 1,
        (SA, "update", "configmaps"): 1,
    }


@pytest.mark.parametrize(
    ("kwargs", "want_total"),
    [
        pytest.param({"since": t(2)}, 4, id="since is inclusive"),
        pytest.param({"until": t(2)}, 1, id="until is exclusive"),
        pytest.param({"users": [SA]}, 4, id="one user"),
        pytest.param({"users": [SA], "successful_only": True}, 3, id="successful only"),
        pytest.param({"namespace": "other"}, 0, id="other namespace"),
    ],
)
def test_count_writes_filters(kwargs: dict[str, Any], want_total: int) -> None:
    assert sum(audit.count_writes(audit.iter_events(LOG), **kwargs).values()) == want_total


def test_parse_event_skips_non_events_and_incomplete_stages() -> None:
    assert audit.parse_event("garbage") is None
    assert audit.parse_event(event("create", "pods", stage="ResponseStarted")) is None
    parsed = audit.parse_event(event("create", "pods", group="apps", name="web"))
    assert parsed is not None
    assert parsed.resource == "pods.apps" and parsed.name == "web" and parsed.is_write and parsed.succeeded
    assert parsed.timestamp == t(10)


def test_iter_events_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text("\n".join(LOG) + "\n" + '{"kind": "Event", "stage": "ResponseComplete"')  # torn last line
    assert len(list(audit.iter_events(path))) == 6


def test_policy_is_metadata_level_and_omits_request_received() -> None:
    assert audit.AUDIT_POLICY["omitStages"] == ["RequestReceived"]
    assert audit.AUDIT_POLICY["rules"][-1] == {"level": "Metadata"}
    assert all(rule["level"] in ("None", "Metadata") for rule in audit.AUDIT_POLICY["rules"])
