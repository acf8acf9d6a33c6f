"""A pass whose act fails (quota) keeps the published table's fingerprint in status (design note 010, rule 2).

Status marks the published routing table as the operator's own; writing the unpublished plan's fingerprint
made the next pass distrust the table and restart every drain, on every failing pass: a drain that never
ends while pod creation hits a quota the drain would have freed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.adapters.kube import Forbidden
from tandem.core import conditions as c
from tandem.core.plan import plan_pool
from tandem.reconcile.pool import _act_and_report
from tests.support.factories import World, make_nodes, make_pool


class QuotaKube:
    """Just enough of KubeApi: pod creation fails on quota; status writes and Events are recorded."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.applied: list[str] = []

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if body["kind"] == "Pod":
            raise Forbidden(403, "Forbidden", 'pods "x" is forbidden: exceeded quota: gpus')
        return dict(body)

    async def replace_status(self, plural: str, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.statuses.append(dict(obj["status"]))
        return dict(obj)

    async def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.applied.append(body["kind"])
        return dict(body)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        return None


async def test_failed_act_keeps_the_published_tables_fingerprint() -> None:
    builder = make_pool().pairs(1)
    world = World(builder.obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 1)
    assert world.pool.status is not None
    published = world.pool.status.routing.fingerprint
    world.set_spec(builder.pairs(2))  # a new pair: creates, which hit the quota
    snapshot = world.snapshot()
    plan = plan_pool(snapshot)
    assert plan.creates and plan.status.routing.fingerprint != published
    raw = world.pool.model_dump(mode="json", by_alias=True, exclude_none=True)
    kube = QuotaKube()
    result = await _act_and_report(kube, snapshot, raw, plan, None, 0.0)  # type: ignore[arg-type]
    assert result.error and "ConfigMap" not in kube.applied  # the table was not published
    assert [s["routing"]["fingerprint"] for s in kube.statuses] == [published]
    degraded = next(x for x in kube.statuses[0]["conditions"] if x["type"] == c.CONDITION_DEGRADED)
    assert degraded["reason"] == c.REASON_QUOTA_EXCEEDED
