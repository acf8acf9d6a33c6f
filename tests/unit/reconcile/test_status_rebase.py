"""A status write that lost a 409 only to bookkeeping metadata (kopf's finalizer) is retried on the fresh object."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest

from tandem.adapters.kube import Conflict, KubeApi
from tandem.reconcile.pool import only_bookkeeping_changed, replace_status

OBSERVED: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferencePool",
    "metadata": {"name": "speed", "namespace": "llm", "uid": "u1", "generation": 1, "resourceVersion": "10"},
    "spec": {"pairs": {"replicas": 2}},
}


def changed(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(OBSERVED)
    *parents, leaf = path.split(".")
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    obj["metadata"]["resourceVersion"] = "11"
    return obj


class StatusServer:
    """Just the two calls replace_status makes: PUT /status guarded by resourceVersion, and GET."""

    def __init__(self, current: dict[str, Any]) -> None:
        self.current = current
        self.puts: list[tuple[str, int]] = []

    async def replace_status(self, plural: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        rv = obj["metadata"]["resourceVersion"]
        if rv != self.current["metadata"]["resourceVersion"]:
            self.puts.append((rv, 409))
            raise Conflict(409, "Conflict", "the object has been modified")
        self.puts.append((rv, 200))
        self.current = copy.deepcopy(obj) | {"metadata": self.current["metadata"] | {"resourceVersion": "12"}}
        return self.current

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.current)


@pytest.mark.parametrize(
    ("fresh", "want"),
    [
        pytest.param(changed("metadata.finalizers", ["tandem.dev/finalizer"]), True, id="kopf's finalizer"),
        pytest.param(changed("metadata.managedFields", [{"manager": "kopf"}]), True, id="managedFields"),
        pytest.param(changed("metadata.generation", 2), False, id="a spec edit"),
        pytest.param(changed("spec.pairs", {"replicas": 3}), False, id="spec"),
        pytest.param(changed("status", {"rollout": {"phase": "Paused"}}), False, id="another status writer"),
        pytest.param(changed("metadata.annotations", {"tandem.dev/rollout-action": "abort"}), False, id="annotation"),
        pytest.param(changed("metadata.labels", {"team": "a"}), False, id="label"),
        pytest.param(changed("metadata.deletionTimestamp", "2026-11-30T00:00:00Z"), False, id="being deleted"),
    ],
)
def test_only_bookkeeping_changed(fresh: dict[str, Any], want: bool) -> None:
    assert only_bookkeeping_changed(OBSERVED, fresh) is want


def test_a_status_write_lost_to_the_finalizer_patch_is_retried_once_on_the_fresh_object() -> None:
    server = StatusServer(changed("metadata.finalizers", ["tandem.dev/finalizer"]))
    result = asyncio.run(replace_status(cast(KubeApi, server), copy.deepcopy(OBSERVED), {"observedGeneration": 1}))
    assert server.puts == [("10", 409), ("11", 200)]
    assert result["status"] == {"observedGeneration": 1}
    assert result["metadata"]["finalizers"] == ["tandem.dev/finalizer"]  # kopf's patch kept


def test_a_status_write_lost_to_a_spec_edit_keeps_the_conflict() -> None:
    server = StatusServer(changed("metadata.generation", 2))
    with pytest.raises(Conflict):
        asyncio.run(replace_status(cast(KubeApi, server), copy.deepcopy(OBSERVED), {"observedGeneration": 1}))
    assert server.puts == [("10", 409)]  # no blind retry: the next pass plans from the new spec
