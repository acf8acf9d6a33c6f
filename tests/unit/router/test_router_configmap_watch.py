"""The ConfigMap watch source against a fake list/watch stream: add, modify, invalid, delete, 410 re-list.

Each case scripts the API (one list result per (re-)list, one event sequence per watch) and states the
tables that must be live afterwards, the store's offer results, the source errors and the backoff waits.
The loop runs synchronously here (``follow`` with a direct dispatch and a recording ``wait``); one async
test checks that ``run`` hands store calls back to the event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tandem.adapters.kube import KubeError, ServerError
from tandem.adapters.routerwatch import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    REASON_API_ERROR,
    REASON_EXPIRED,
    REASON_UNEXPECTED,
    ROUTING_SELECTOR,
    ConfigMapSource,
    WatchExpired,
    backoff_delay,
)
from tandem.api.labels import COMPONENT_ROUTING, LABEL_COMPONENT
from tandem.router.tables import REASON_INVALID, REASON_UNKNOWN_VERSION, TableStore
from tandem.routing import CONFIGMAP_KEY, RoutingTable
from tests.unit.routing.routing_factories import make_table

NS = "ml"
SPEED2 = make_table("speed").namespace(NS).pairs(2).obj()
SPEED3 = make_table("speed").namespace(NS).pairs(3).obj()
FAST2 = make_table("fast").namespace(NS).pairs(2).obj()


def _cm(name: str, table: RoutingTable | None = None, *, raw: str | None = None, rv: str = "1") -> dict[str, Any]:
    data = {CONFIGMAP_KEY: table.to_json()} if table is not None else ({CONFIGMAP_KEY: raw} if raw else {})
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": rv,
            "labels": {LABEL_COMPONENT: COMPONENT_ROUTING},
        },
        "data": data,
    }


def _ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


Listed = tuple[list[dict[str, Any]], str]
Step = dict[str, Any] | Exception


@dataclass
class FakeApi:
    """Scripted list results and watch streams; when the watches run out it stops the source."""

    lists: list[Listed | Exception]
    watches: list[list[Step]]
    stop: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def list(self, namespace: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", namespace, selector))
        result = self.lists.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def watch(self, namespace: str, selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.calls.append(("watch", namespace, resource_version))
        if not self.watches:
            self.stop.set()
            return iter(())
        script = self.watches.pop(0)

        def stream() -> Iterator[dict[str, Any]]:
            for step in script:
                if isinstance(step, Exception):
                    raise step
                yield step

        return stream()


@dataclass(frozen=True)
class Case:
    lists: Sequence[Listed | Exception]
    watches: Sequence[list[Step]]
    live: dict[str, RoutingTable]
    offers: list[tuple[str, str | None]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    watched_from: list[str] = field(default_factory=list)


CASES = [
    pytest.param(
        Case(
            lists=[([], "1")],
            watches=[[_ev("ADDED", _cm("speed-routing", SPEED2, rv="2"))]],
            live={"ml/speed-routing": SPEED2},
            offers=[("ml/speed-routing", None)],
            watched_from=["1", "2"],
        ),
        id="add",
    ),
    pytest.param(
        Case(
            lists=[([_cm("speed-routing", SPEED2)], "1")],
            watches=[[_ev("MODIFIED", _cm("speed-routing", SPEED3, rv="3"))]],
            live={"ml/speed-routing": SPEED3},
            offers=[("ml/speed-routing", None), ("ml/speed-routing", None)],
            watched_from=["1", "3"],
        ),
        id="modify swaps the table",
    ),
    pytest.param(
        Case(
            lists=[([_cm("speed-routing", SPEED2)], "1")],
            watches=[
                [
                    _ev("MODIFIED", _cm("speed-routing", raw="{not json", rv="2")),
                    _ev("MODIFIED", _cm("speed-routing", raw='{"apiVersion": "tandem.dev/routing-v9"}', rv="3")),
                    _ev("MODIFIED", _cm("speed-routing", rv="4")),
                ]
            ],
            live={"ml/speed-routing": SPEED2},
            offers=[
                ("ml/speed-routing", None),
                ("ml/speed-routing", REASON_INVALID),
                ("ml/speed-routing", REASON_UNKNOWN_VERSION),
                ("ml/speed-routing", REASON_INVALID),
            ],
            watched_from=["1", "4"],
        ),
        id="invalid, unknown version, no routing.json: last good kept",
    ),
    pytest.param(
        Case(
            lists=[([_cm("speed-routing", SPEED2), _cm("fast-routing", FAST2)], "1")],
            watches=[[_ev("DELETED", _cm("speed-routing", SPEED2, rv="5"))]],
            live={"ml/fast-routing": FAST2},
            offers=[("ml/speed-routing", None), ("ml/fast-routing", None)],
            watched_from=["1", "5"],
        ),
        id="delete removes the pool's table",
    ),
    pytest.param(
        Case(
            lists=[
                ([_cm("speed-routing", SPEED2), _cm("fast-routing", FAST2)], "1"),
                ([_cm("speed-routing", SPEED3)], "9"),
            ],
            watches=[[WatchExpired("too old resource version")], []],
            live={"ml/speed-routing": SPEED3},
            offers=[("ml/speed-routing", None), ("ml/fast-routing", None), ("ml/speed-routing", None)],
            errors=[(NS, REASON_EXPIRED)],
            waits=[backoff_delay(0, 1.0)],
            watched_from=["1", "9", "9"],
        ),
        id="410 re-lists after backoff; a table deleted meanwhile goes",
    ),
    pytest.param(
        Case(
            lists=[
                ServerError(503, "ServiceUnavailable", "apiserver restarting"),
                ServerError(503, "ServiceUnavailable", "still"),
                ([_cm("speed-routing", SPEED2)], "4"),
            ],
            watches=[[]],
            live={"ml/speed-routing": SPEED2},
            offers=[("ml/speed-routing", None)],
            errors=[(NS, REASON_API_ERROR), (NS, REASON_API_ERROR)],
            waits=[backoff_delay(0, 1.0), backoff_delay(1, 1.0)],
            watched_from=["4", "4"],
        ),
        id="list errors back off exponentially",
    ),
    pytest.param(
        Case(
            lists=[([], "1"), ([_cm("speed-routing", SPEED2)], "3")],
            watches=[[TypeError("a bug")], []],
            live={"ml/speed-routing": SPEED2},
            offers=[("ml/speed-routing", None)],
            errors=[(NS, REASON_UNEXPECTED)],
            waits=[backoff_delay(0, 1.0)],
            watched_from=["1", "3", "3"],
        ),
        id="an unexpected error does not end the thread",
    ),
    pytest.param(
        Case(
            lists=[([], "1")],
            watches=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "77"}}}], []],
            live={},
            watched_from=["1", "77", "77"],
        ),
        id="bookmark moves the resume version; a closed watch resumes without a list",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_follow(case: Case) -> None:
    api = FakeApi(list(case.lists), [list(w) for w in case.watches])
    source = ConfigMapSource([NS], api, jitter=lambda: 1.0)
    store = TableStore()
    offers: list[tuple[str, str | None]] = []
    errors: list[tuple[str, str]] = []
    store.listeners.append(lambda key, reason, _live: offers.append((key, reason)))
    store.error_listeners.append(lambda origin, reason: errors.append((origin, reason)))
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return False

    source.follow(store, NS, api.stop, wait=wait)

    assert {t.source: t.table for t in store.snapshot} == case.live
    assert offers == case.offers
    assert errors == case.errors
    assert waits == case.waits
    assert [rv for call, _, rv in api.calls if call == "watch"] == case.watched_from
    assert all(sel == ROUTING_SELECTOR for call, _, sel in api.calls if call == "list")


def test_selector_is_the_label_the_operator_sets() -> None:
    from tandem.builders.objects import build_routing_configmap  # noqa: PLC0415

    labels = build_routing_configmap(SPEED2, "uid")["metadata"]["labels"]
    key, value = ROUTING_SELECTOR.split("=")
    assert labels[key] == value


def test_load_once_survives_an_unreachable_api_server() -> None:
    api = FakeApi([ServerError(0, "", "connection refused")], [])
    store = TableStore()
    errors: list[tuple[str, str]] = []
    store.error_listeners.append(lambda origin, reason: errors.append((origin, reason)))
    ConfigMapSource([NS], api).load_once(store)
    assert store.snapshot == ()
    assert errors == [(NS, REASON_API_ERROR)]


@pytest.mark.parametrize(
    ("attempt", "jitter", "want"),
    [
        pytest.param(0, 1.0, BACKOFF_BASE_S, id="first"),
        pytest.param(3, 1.0, BACKOFF_BASE_S * 8, id="doubles"),
        pytest.param(30, 1.0, BACKOFF_MAX_S, id="capped"),
        pytest.param(3, 0.0, BACKOFF_BASE_S * 4, id="jitter halves at most"),
    ],
)
def test_backoff_delay(attempt: int, jitter: float, want: float) -> None:
    assert backoff_delay(attempt, jitter) == pytest.approx(want)


async def test_run_applies_events_on_the_event_loop_thread() -> None:
    loop_thread = threading.get_ident()
    api = FakeApi([([], "1")], [[_ev("ADDED", _cm("speed-routing", SPEED2, rv="2"))]])
    store = TableStore()
    applied = asyncio.Event()
    threads: list[int] = []

    def on_offer(_key: str, _reason: str | None, _live: object) -> None:
        threads.append(threading.get_ident())
        applied.set()

    store.listeners.append(on_offer)
    source = ConfigMapSource([NS], api)
    api.stop = source.stopping  # the fake ends the watching thread once its script is played
    task = asyncio.create_task(source.run(store))
    await asyncio.wait_for(applied.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [t.table for t in store.snapshot] == [SPEED2]
    assert threads == [loop_thread]


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        pytest.param(["--routing-table", "t.json"], ["FileSource"], id="files only: no Kubernetes client"),
        pytest.param(["-n", "ml", "--namespace", "speed"], ["ConfigMapSource"], id="namespaces"),
        pytest.param(["--routing-table", "t.json", "-n", "ml"], ["FileSource", "ConfigMapSource"], id="both"),
    ],
)
def test_cli_sources(monkeypatch: pytest.MonkeyPatch, argv: list[str], want: list[str]) -> None:
    from tandem.adapters import routerwatch  # noqa: PLC0415
    from tandem.cli import build_parser  # noqa: PLC0415
    from tandem.router import cli as router_cli  # noqa: PLC0415

    kubeconfigs: list[str | None] = []
    monkeypatch.setattr(routerwatch, "router_api_client", lambda kubeconfig=None: kubeconfigs.append(kubeconfig))
    monkeypatch.setattr(routerwatch, "KubeConfigMaps", lambda api_client: FakeApi([], []))
    args = build_parser("router").parse_args(["router", *argv, "--kubeconfig", "/k"])
    sources = router_cli._sources(args)
    assert [type(s).__name__ for s in sources] == want
    for source in sources:
        if isinstance(source, ConfigMapSource):
            assert list(source.namespaces) == args.namespace
            assert kubeconfigs == ["/k"]


def test_cli_needs_a_source() -> None:
    from tandem.cli import build_parser  # noqa: PLC0415
    from tandem.router import cli as router_cli  # noqa: PLC0415

    args = build_parser("router").parse_args(["router"])
    with pytest.raises(SystemExit, match="--routing-table FILE or --namespace NS"):
        router_cli.run(args)


class _RawResponse:
    """What the client returns with ``_preload_content=False``: chunks that split lines anywhere."""

    def __init__(self, body: bytes, chunk: int = 7) -> None:
        self.data = body
        self._chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]
        self.closed = False

    def stream(self, amt: object = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._chunks

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


def _kube_configmaps(response: _RawResponse | Exception, calls: list[dict[str, Any]]) -> Any:
    from tandem.adapters.routerwatch import KubeConfigMaps  # noqa: PLC0415

    api = KubeConfigMaps.__new__(KubeConfigMaps)

    class _Core:
        def list_namespaced_config_map(self, namespace: str, **kwargs: Any) -> _RawResponse:
            calls.append({"namespace": namespace, **kwargs})
            if isinstance(response, Exception):
                raise response
            return response

    api.core = _Core()  # type: ignore[assignment]
    return api


def test_kube_watch_parses_lines_and_turns_410_into_watch_expired() -> None:
    added = {"type": "ADDED", "object": _cm("speed-routing", SPEED2, rv="2")}
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    body = (json.dumps(added) + "\n" + json.dumps(gone) + "\n").encode()
    response = _RawResponse(body)
    calls: list[dict[str, Any]] = []
    api = _kube_configmaps(response, calls)
    events = []
    with pytest.raises(WatchExpired, match="too old"):
        for event in api.watch(NS, ROUTING_SELECTOR, "1", 290):
            events.append(event)
    assert events == [added]
    assert response.closed
    (call,) = calls
    assert call["watch"] is True and call["allow_watch_bookmarks"] is True
    assert (call["resource_version"], call["timeout_seconds"], call["label_selector"]) == ("1", 290, ROUTING_SELECTOR)
    assert call["_preload_content"] is False


@pytest.mark.parametrize(
    ("failure", "want"),
    [
        pytest.param(ApiException(status=410, reason="Gone"), WatchExpired, id="410 at the request"),
        pytest.param(ApiException(status=403, reason="Forbidden"), KubeError, id="403"),
    ],
)
def test_kube_watch_request_errors(failure: Exception, want: type[Exception]) -> None:
    api = _kube_configmaps(failure, [])
    with pytest.raises(want):
        list(api.watch(NS, ROUTING_SELECTOR, "1", 290))


def test_kube_list_returns_items_and_resource_version() -> None:
    body = json.dumps({"metadata": {"resourceVersion": "42"}, "items": [_cm("speed-routing", SPEED2)]}).encode()
    api = _kube_configmaps(_RawResponse(body), [])
    items, version = api.list(NS, ROUTING_SELECTOR)
    assert version == "42" and [i["metadata"]["name"] for i in items] == ["speed-routing"]
