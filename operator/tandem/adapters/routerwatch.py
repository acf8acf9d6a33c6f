"""The router's Kubernetes table source: a watch on the ``<pool>-routing`` ConfigMaps of its namespaces.

Owns: listing and watching the routing-table ConfigMaps (label ``tandem.dev/component=routing-table``,
the label the operator's builder sets) of each namespace ``tandem router --namespace`` names, and turning
what it sees into :meth:`~tandem.router.tables.TableStore.offer` / ``remove`` calls. The store does the
rest: a changed fingerprint swaps the table atomically, an invalid one keeps the last good table (counted
and logged there).

Why a watch and not a mounted volume: a projected ConfigMap volume reaches the pod only after the kubelet's
sync period (up to a minute and more), and a pool created after the router started would need a restart.

How it runs: the ``kubernetes`` client is synchronous, so each namespace is followed by its own daemon
thread (list, then watch from the list's resourceVersion with bookmarks) and every store call is handed to
the event loop with ``call_soon_threadsafe``: the request path never waits for the API server, and the
store is only touched on the loop thread. A watch that ends normally (server timeout) resumes from the last
resourceVersion; one that expires (410 Gone) or fails re-lists after a capped, jittered exponential backoff,
and a re-list removes tables whose ConfigMap disappeared while no watch was open. Errors are logged and
counted (``tandem_router_table_source_errors_total``); the last good tables stay live meanwhile.

Must not: write anything (the router's RBAC is get/list/watch on ConfigMaps), or parse tables itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tandem.adapters.kube import REQUEST_TIMEOUT, KubeError, _wrap
from tandem.api.labels import COMPONENT_ROUTING, LABEL_COMPONENT
from tandem.router.tables import REASON_INVALID, TableStore
from tandem.routing import CONFIGMAP_KEY

log = logging.getLogger(__name__)

ROUTING_SELECTOR: Final = f"{LABEL_COMPONENT}={COMPONENT_ROUTING}"
"""The label the operator puts on every ``<pool>-routing`` ConfigMap (builders.objects)."""
WATCH_TIMEOUT_S: Final = 290
"""Server-side watch timeout: below common load-balancer idle limits (300 s), so a watch never dies silently."""
BACKOFF_BASE_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
HTTP_GONE: Final = 410

REASON_EXPIRED: Final = "WatchExpired"
"""The watch's resourceVersion is too old (410 Gone): re-list."""
REASON_API_ERROR: Final = "ApiError"
"""The API server refused or could not be reached (403, 5xx, connection): re-list after backoff."""


REASON_UNEXPECTED: Final = "Unexpected"
"""Anything else (a bug): logged with its traceback, then the same re-list after backoff."""


class WatchExpired(Exception):
    """The watch's resourceVersion is no longer served (410 Gone)."""


class ConfigMapApi(Protocol):
    """What the source needs from Kubernetes (a fake stream implements it in the unit tests)."""

    def list(self, namespace: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        """The matching ConfigMaps and the list's resourceVersion."""

    def watch(self, namespace: str, selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Watch events (``type``, ``object``) after ``resource_version``; :class:`WatchExpired` on 410."""


Dispatch = Callable[[Callable[[], None]], None]
"""Runs a store call on the thread that owns the store (the event loop's ``call_soon_threadsafe``)."""


def source_key(namespace: str, name: str) -> str:
    """The store's key of one ConfigMap (``namespace/name``, as ``tandem_router_table_info{source}`` shows)."""
    return f"{namespace}/{name}"


def backoff_delay(attempt: int, jitter: float) -> float:
    """Seconds before retry ``attempt`` (0-based): doubling from :data:`BACKOFF_BASE_S`, capped, and scaled by
    ``0.5 + 0.5 * jitter`` so the replicas of a router do not re-list in step after an API server restart."""
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + 0.5 * jitter))


def _direct(call: Callable[[], None]) -> None:
    call()


def _discard(_: object) -> None:
    """Drops a store call's result, so a lambda around it is a ``Callable[[], None]``."""


class ConfigMapSource:
    """A :class:`~tandem.router.tables.TableSource` over the routing ConfigMaps of ``namespaces``."""

    def __init__(
        self,
        namespaces: Sequence[str],
        api: ConfigMapApi,
        *,
        selector: str = ROUTING_SELECTOR,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.api = api
        self.selector = selector
        self.watch_timeout_s = watch_timeout_s
        self.jitter = jitter
        self._rv: dict[str, str] = {}
        """Last resourceVersion seen per namespace; absent: the next round starts with a list."""
        self._known: dict[str, set[str]] = {ns: set() for ns in self.namespaces}
        """Source keys offered per namespace (what a re-list compares against to find deletions)."""
        self.stopping = threading.Event()
        """Set when :meth:`run` is cancelled; the watching threads end at their next event or timeout."""

    # --- the steps (each one list or one event), on the watching thread ------------------------------

    def relist(self, store: TableStore, namespace: str, dispatch: Dispatch = _direct) -> None:
        """List the namespace: offer every table, remove those whose ConfigMap is gone, remember the version."""
        items, resource_version = self.api.list(namespace, self.selector)
        seen: set[str] = set()
        for obj in items:
            key = self._offer(store, namespace, obj, dispatch)
            if key is not None:
                seen.add(key)
        for key in sorted(self._known[namespace] - seen):
            dispatch(functools.partial(store.remove, key))
            log.info("routing ConfigMap %s is gone: its table is no longer served", key)
        self._known[namespace] = seen
        self._rv[namespace] = resource_version

    def apply(self, store: TableStore, namespace: str, event: Mapping[str, Any], dispatch: Dispatch = _direct) -> None:
        """One watch event: ADDED/MODIFIED offer the table, DELETED removes it, BOOKMARK moves the version."""
        kind = event.get("type")
        obj = event.get("object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            key = self._offer(store, namespace, obj, dispatch)
            if key is not None:
                self._known[namespace].add(key)
        elif kind == "DELETED":
            name = (obj.get("metadata") or {}).get("name")
            if name:
                key = source_key(namespace, name)
                self._known[namespace].discard(key)
                dispatch(lambda: store.remove(key))
                log.info("routing ConfigMap %s deleted: its table is no longer served", key)
        if version:
            self._rv[namespace] = str(version)

    def _offer(self, store: TableStore, namespace: str, obj: Mapping[str, Any], dispatch: Dispatch) -> str | None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return None
        key = source_key(namespace, name)
        payload = (obj.get("data") or {}).get(CONFIGMAP_KEY)
        if isinstance(payload, str):
            dispatch(lambda: _discard(store.offer(key, payload)))
        else:
            dispatch(lambda: store.fail(key, REASON_INVALID, f"ConfigMap has no data[{CONFIGMAP_KEY!r}]"))
        return key

    # --- the loop -------------------------------------------------------------------------------------

    def follow(
        self,
        store: TableStore,
        namespace: str,
        stop: threading.Event,
        dispatch: Dispatch = _direct,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        """Keep ``namespace``'s tables current until ``stop`` is set (the body of its thread).

        ``wait(seconds)`` sleeps between retries and returns True to stop early (default ``stop.wait``).
        """
        pause = wait or stop.wait
        attempt = 0
        while not stop.is_set():
            try:
                if namespace not in self._rv:
                    self.relist(store, namespace, dispatch)
                for event in self.api.watch(namespace, self.selector, self._rv[namespace], self.watch_timeout_s):
                    if stop.is_set():
                        return
                    self.apply(store, namespace, event, dispatch)
                    attempt = 0
                continue  # the server closed the watch at its timeout: resume from the last version
            except WatchExpired as exc:
                reason, message = REASON_EXPIRED, str(exc) or "410 Gone"
            except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                reason, message = REASON_API_ERROR, str(exc)
            except Exception as exc:  # a bug must not end this namespace's thread: log it and re-list
                log.exception("routing ConfigMap watch of %s failed unexpectedly", namespace)
                reason, message = REASON_UNEXPECTED, f"{type(exc).__name__}: {exc}"
            self._rv.pop(namespace, None)
            delay = backoff_delay(attempt, self.jitter())
            attempt += 1
            note = f"{message}; re-list in {delay:.1f} s"
            dispatch(functools.partial(store.source_error, namespace, reason, note))
            if pause(delay):
                return

    def load_once(self, store: TableStore) -> None:
        """List every namespace once before serving. An unreachable API server is logged, not fatal: the
        router starts not ready (``/ready`` 503) and :meth:`run` keeps trying."""
        for namespace in self.namespaces:
            try:
                self.relist(store, namespace)
            except (WatchExpired, KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                store.source_error(namespace, REASON_API_ERROR, f"initial list failed: {exc}")

    async def run(self, store: TableStore) -> None:
        """One daemon thread per namespace; store calls come back to this loop. Cancel to stop (a source
        runs once: :attr:`stopping` stays set)."""
        loop = asyncio.get_running_loop()
        stop = self.stopping

        def dispatch(call: Callable[[], None]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a thread still winding down
                loop.call_soon_threadsafe(call)

        threads = [
            threading.Thread(
                target=self.follow, args=(store, ns, stop, dispatch), name=f"tandem-router-watch-{ns}", daemon=True
            )
            for ns in self.namespaces
        ]
        for thread in threads:
            thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            # Threads notice at their next event or watch timeout; daemon threads never hold up exit.
            stop.set()


def router_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In a pod without ``--kubeconfig``: the pod's ServiceAccount (its token file is re-read as the kubelet
    rotates it); otherwise the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``)."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = 0
    return client.ApiClient(configuration)


class KubeConfigMaps:
    """:class:`ConfigMapApi` over the official client (raw JSON, no model objects)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)

    def list(self, namespace: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        try:
            response: Any = self.core.list_namespaced_config_map(
                namespace, label_selector=selector, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            raise _wrap(exc) from None
        data = json.loads(response.data or b"{}")
        return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion") or "")

    def watch(self, namespace: str, selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        try:
            stream: Any = self.core.list_namespaced_config_map(
                namespace,
                label_selector=selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=(REQUEST_TIMEOUT[0], timeout_s + REQUEST_TIMEOUT[0]),
            )
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise WatchExpired(str(exc.reason)) from None
            raise _wrap(exc) from None
        try:
            for line in iter_resp_lines(stream):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event: dict[str, Any] = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = int(status.get("code") or 0)
                    if code == HTTP_GONE:
                        raise WatchExpired(str(status.get("message") or "410 Gone"))
                    raise KubeError(code, str(status.get("reason") or ""), str(status.get("message") or ""))
                yield event
        finally:
            stream.close()
            stream.release_conn()
