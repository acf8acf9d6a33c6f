"""All Kubernetes I/O of the operator: one small interface and its real implementation.

What it owns: reading and writing objects through the official `kubernetes` client. The client is
synchronous, so every call runs in a worker thread (`asyncio.to_thread`): a blocked event loop would
stall every watch. Responses are read raw (`_preload_content=False`) and returned as plain JSON dicts,
which is what the pure parsers in core/ expect and costs far less memory than client model objects.

Error contract: API errors become `KubeError` subclasses (NotFound, Conflict, Forbidden with
`quota` set for "exceeded quota", Invalid, Throttled with `retry_after`, ServerError) so the reconcile
can turn them into conditions and backoff instead of crashing. Every call has a request timeout.
Writes use server-side apply with one field manager for objects Tandem owns whole (ConfigMaps,
Services), plain create for pods, and `fieldValidation=Strict`. Each write is counted by verb and
resource in `WRITES` (the operator's own metrics expose it).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tandem import GROUP, VERSION
from tandem.api.labels import FIELD_MANAGER

REQUEST_TIMEOUT = (10, 60)  # connect, read
WRITES: Counter[tuple[str, str]] = Counter()


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Forbidden(KubeError):
    @property
    def quota(self) -> bool:
        return "exceeded quota" in self.message


class Invalid(KubeError):
    pass


class Throttled(KubeError):
    pass


class ServerError(KubeError):
    pass


class NotLeader(KubeError):
    """Raised before any request: this process lost the leader Lease (see tandem.controller.election)."""


def _wrap(exc: ApiException) -> KubeError:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = str(body.get("message") or exc.reason or "")
    reason = str(body.get("reason") or exc.reason or "")
    status = int(exc.status or 0)
    retry = None
    headers = exc.headers or {}
    if headers.get("Retry-After"):
        try:
            retry = float(headers["Retry-After"])
        except ValueError:
            retry = None
    kinds: dict[int, type[KubeError]] = {
        404: NotFound,
        409: Conflict,
        403: Forbidden,
        422: Invalid,
        400: Invalid,
        429: Throttled,
    }
    kind = kinds.get(status, ServerError if status >= 500 or status == 0 else KubeError)
    return kind(status, reason, message, retry)


class KubeApi(Protocol):
    """What the reconcile needs from Kubernetes. `RealKube` is its only full implementation.

    There is no in-memory fake of the whole interface: component tests run `RealKube` against KMock's
    HTTP emulator (tests/component/test_reconcile_kmock.py), the cluster tier against a real API server,
    and unit tests hand a function a stand-in with just the methods it calls (e.g. `QuotaKube` in
    tests/unit/reconcile/test_act_failure_keeps_table_own.py, `StatusServer` in test_status_rebase.py).
    """

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]: ...

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    async def list_nodes(self) -> list[dict[str, Any]]: ...

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list_configmaps(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def apply(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    async def delete_configmap(self, namespace: str, name: str, uid: str) -> None: ...

    async def delete_service(self, namespace: str, name: str, uid: str) -> None: ...

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]: ...

    async def replace_status(self, plural: str, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch_scale(self, plural: str, namespace: str, name: str, replicas: int) -> None: ...

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_custom(
        self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...


def load_config(kubeconfig: str | None = None) -> client.ApiClient:
    """A client from a kubeconfig (explicit path, $KUBECONFIG, ~/.kube/config) or in-cluster credentials."""
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, FileNotFoundError, TypeError):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = 0
    return client.ApiClient(configuration)


class RealKube:
    """`KubeApi` over the official client; every call in a worker thread, with a timeout."""

    def __init__(self, api_client: client.ApiClient, may_write: Callable[[], bool] | None = None) -> None:
        self.api_client = api_client
        self.may_write = may_write
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.batch = client.BatchV1Api(api_client)

    def _fence(self) -> None:
        """Refuse a write while this process does not lead (leader election): the fence that keeps a
        demoted operator's in-flight pass from writing after another operator took over."""
        if self.may_write is not None and not self.may_write():
            raise NotLeader(0, "NotLeader", "this operator does not hold the leader Lease; write refused")

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        kwargs["_preload_content"] = False

        def run() -> Any:
            try:
                response = fn(*args, **kwargs)
            except ApiException as exc:
                raise _wrap(exc) from None
            data = response.data
            return json.loads(data) if data else {}

        return await asyncio.to_thread(run)

    async def _maybe(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call(fn, *args, **kwargs)
        except NotFound:
            return None
        return result

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._maybe(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        data = await self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return list(data.get("items") or [])

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        data = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return list(data.get("items") or [])

    async def list_nodes(self) -> list[dict[str, Any]]:
        data = await self._call(self.core.list_node)
        return list(data.get("items") or [])

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._maybe(self.core.read_namespaced_config_map, name, namespace)

    async def list_configmaps(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        data = await self._call(self.core.list_namespaced_config_map, namespace, label_selector=selector)
        return list(data.get("items") or [])

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._maybe(self.core.read_namespaced_service, name, namespace)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._maybe(self.batch.read_namespaced_job, name, namespace)

    async def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return await self.list_pods(namespace, f"job-name={job}")

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = body["kind"]
        namespace = body["metadata"]["namespace"]
        self._fence()
        WRITES[("create", kind)] += 1
        strict = {"field_validation": "Strict"}
        if kind == "Pod":
            result: dict[str, Any] = await self._call(self.core.create_namespaced_pod, namespace, dict(body), **strict)
        elif kind == "ConfigMap":
            result = await self._call(self.core.create_namespaced_config_map, namespace, dict(body), **strict)
        elif kind == "Service":
            result = await self._call(self.core.create_namespaced_service, namespace, dict(body), **strict)
        elif kind == "Event":
            result = await self._call(self.core.create_namespaced_event, namespace, dict(body))
        elif kind == "Job":
            result = await self._call(self.batch.create_namespaced_job, namespace, dict(body), **strict)
        else:
            raise ValueError(f"create of {kind} is not something Tandem does")
        return result

    async def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply (force) with Tandem's field manager: restores fields a foreign writer changed."""
        kind = body["kind"]
        name = body["metadata"]["name"]
        namespace = body["metadata"]["namespace"]
        self._fence()
        WRITES[("apply", kind)] += 1
        kwargs = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": "application/apply-patch+yaml"}
        if kind == "ConfigMap":
            result: dict[str, Any] = await self._call(
                self.core.patch_namespaced_config_map, name, namespace, dict(body), **kwargs
            )
        elif kind == "Service":
            result = await self._call(self.core.patch_namespaced_service, name, namespace, dict(body), **kwargs)
        elif kind == "Pod":
            result = await self._call(self.core.patch_namespaced_pod, name, namespace, dict(body), **kwargs)
        else:
            raise ValueError(f"apply of {kind} is not something Tandem does")
        return result

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self._fence()
        WRITES[("delete", "Pod")] += 1
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            await self._call(self.core.delete_namespaced_pod, name, namespace, body=body)
        except NotFound:
            return

    async def delete_configmap(self, namespace: str, name: str, uid: str) -> None:
        self._fence()
        WRITES[("delete", "ConfigMap")] += 1
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            await self._call(self.core.delete_namespaced_config_map, name, namespace, body=body)
        except NotFound:
            return

    async def delete_service(self, namespace: str, name: str, uid: str) -> None:
        self._fence()
        WRITES[("delete", "Service")] += 1
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            await self._call(self.core.delete_namespaced_service, name, namespace, body=body)
        except NotFound:
            return

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the status subresource; with ``resource_version`` it is a precondition (409 if stale)."""
        self._fence()
        WRITES[("patch", f"{plural}/status")] += 1
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        result: dict[str, Any] = await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
            _content_type="application/merge-patch+json",
        )
        return result

    async def replace_status(self, plural: str, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the status subresource (resourceVersion-guarded, removes fields that went away)."""
        self._fence()
        WRITES[("update", f"{plural}/status")] += 1
        result: dict[str, Any] = await self._call(
            self.custom.replace_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            obj["metadata"]["name"],
            dict(obj),
        )
        return result

    async def patch_scale(self, plural: str, namespace: str, name: str, replicas: int) -> None:
        """Set spec.pairs.replicas (what `kubectl scale` changes through the scale subresource).

        A merge patch on the object itself: the operator's RBAC has `patch` on pools but, by the
        security ceiling, not on their `/scale` subresource.
        """
        self._fence()
        WRITES[("patch", plural)] += 1
        await self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            {"spec": {"pairs": {"replicas": replicas}}},
            _content_type="application/merge-patch+json",
        )

    async def patch_custom(self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a Tandem object (annotations, spec fields): used by `tandem rollout` commands."""
        self._fence()
        WRITES[("patch", plural)] += 1
        result: dict[str, Any] = await self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )
        return result
