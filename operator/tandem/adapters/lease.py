"""The Lease I/O of leader election: read, create and replace one coordination.k8s.io/v1 Lease.

What it owns: the wire format of a Lease (``spec.holderIdentity``, ``renewTime`` as a MicroTime,
``leaseDurationSeconds``, ``leaseTransitions``) and the optimistic-concurrency write: every replace
carries the resourceVersion that was read, so of two candidates taking one expired Lease exactly one
wins. It is synchronous on purpose: the elector runs in its own thread, so a busy event loop can
neither delay a renewal nor make a leader miss its deadline unnoticed.

It must not decide anything (tandem.core.leader does) and must not retry (the elector's loop does).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tandem.adapters.kube import KubeError, _wrap
from tandem.core.leader import LeaseRecord

REQUEST_TIMEOUT = (5, 5)  # connect, read: shorter than the renew deadline, so a hung call cannot hide it


class LeaseStore(Protocol):
    """The three calls leader election needs (one fake in tests/unit)."""

    def get(self) -> LeaseRecord | None: ...

    def create(self, holder: str, duration_s: int) -> LeaseRecord: ...

    def replace(self, seen: LeaseRecord, holder: str, duration_s: int, transitions: int) -> LeaseRecord: ...


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


class KubeLeaseStore:
    """`LeaseStore` over the official client (CoordinationV1Api), JSON in and out."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        try:
            resp = fn(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _wrap(exc) from None
        data: dict[str, Any] = json.loads(resp.data or b"{}")
        return data

    def _body(self, holder: str, duration_s: int, transitions: int, resource_version: str = "") -> dict[str, Any]:
        now = _micro_now()
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration_s,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def get(self) -> LeaseRecord | None:
        try:
            obj = self._call(self.api.read_namespaced_lease, self.name, self.namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return _record(obj or {})

    def create(self, holder: str, duration_s: int) -> LeaseRecord:
        obj = self._call(self.api.create_namespaced_lease, self.namespace, self._body(holder, duration_s, 0))
        return _record(obj or {})

    def replace(self, seen: LeaseRecord, holder: str, duration_s: int, transitions: int) -> LeaseRecord:
        body = self._body(holder, duration_s, transitions, seen.resource_version)
        obj = self._call(self.api.replace_namespaced_lease, self.name, self.namespace, body)
        return _record(obj or {})
