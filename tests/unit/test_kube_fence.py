"""The Kubernetes adapter's write fence: a process that does not lead sends no write at all."""

from __future__ import annotations

import pytest
from kubernetes import client

from tandem.adapters.kube import NotLeader, RealKube

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {}}


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda k: k.create(POD), id="create"),
        pytest.param(lambda k: k.apply(POD), id="apply"),
        pytest.param(lambda k: k.delete_pod("ns", "p", "uid"), id="delete pod"),
        pytest.param(lambda k: k.patch_status("inferencepools", "ns", "p", {}, None), id="patch status"),
        pytest.param(lambda k: k.patch_custom("inferencepools", "ns", "p", {}), id="patch custom"),
    ],
)
async def test_a_write_without_the_lease_is_refused_before_any_request(write: object) -> None:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens: a request would fail differently
    kube = RealKube(client.ApiClient(configuration), may_write=lambda: False)
    with pytest.raises(NotLeader, match="does not hold the leader Lease"):
        await write(kube)  # type: ignore[operator]
