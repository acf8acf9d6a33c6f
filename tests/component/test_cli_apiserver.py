"""`tandem get|version|rollout` end to end against a tiny fake API server on 127.0.0.1 (no cluster).

The server answers the handful of paths the CLI uses (version, discovery of tandem.dev, pools per
namespace and across namespaces, merge patches) from a dict of pools, records every request, and can
script the successive states a pool shows to a watch. It checks the real client calls: URL paths, the
merge-patch content type, and how API errors become one line.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem import rolloutctl
from tandem.cli import main

API = "/apis/tandem.dev/v1alpha1"


def pool(name: str, ns: str, phase: str = "Idle", version: str = "v1", generation: int = 1) -> dict[str, Any]:
    stable = {"name": f"r-{version}", "version": version, "pairs": 2, "readyPairs": 2, "weightPercent": 100}
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {
            "name": name,
            "namespace": ns,
            "generation": generation,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"stack": {"version": version}, "pairs": {"replicas": 2}, "rollout": {"steps": [{"setWeight": 100}]}},
        "status": {
            "observedGeneration": generation,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllPairsReady"}],
            "pairs": {"desired": 2, "ready": 2, "summary": "2/2"},
            "revisions": {"stable": stable},
            "rollout": {"phase": phase, "step": "-"},
        },
    }


def canary(obj: dict[str, Any], version: str, weight: int) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["generation"] = out["status"]["observedGeneration"] = 2
    out["spec"]["stack"]["version"] = version
    out["status"]["revisions"]["canary"] = {
        "name": f"r-{version}",
        "version": version,
        "pairs": 1,
        "readyPairs": 1,
        "weightPercent": weight,
    }
    out["status"]["rollout"] = {"phase": "Progressing", "step": "1/1", "stepIndex": 0}
    return out


class FakeApiServer:
    """Serves ``pools`` (keyed by (namespace, name)); ``script`` overrides successive GETs of one pool."""

    def __init__(self) -> None:
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.script: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str, Any]] = []  # method, path, content type, body
        self.crds_installed = True
        self.forbid_lists = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "status": "Failure", "reason": reason, "message": message})

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, "", None))
                self._route()

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(("PATCH", self.path, self.headers.get("Content-Type", ""), body))
                self._route(patch=body)

            def _route(self, patch: Any = None) -> None:
                path = self.path.split("?")[0].rstrip("/")
                parts = path.strip("/").split("/")
                if path == "/version":
                    return self._send(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.1"})
                if path == API:
                    if not outer.crds_installed:
                        return self._status(404, "NotFound", "the server could not find the requested resource")
                    names = ["inferencepools", "inferencepools/status", "mooncakecaches"]
                    return self._send(200, {"kind": "APIResourceList", "resources": [{"name": n} for n in names]})
                if outer.forbid_lists and len(parts) in (4, 6):
                    return self._status(403, "Forbidden", 'inferencepools.tandem.dev is forbidden: User "dev"')
                if path == f"{API}/inferencepools":
                    return self._send(200, {"kind": "List", "items": list(outer.pools.values())})
                if len(parts) == 6:  # apis/tandem.dev/v1alpha1/namespaces/NS/inferencepools
                    items = [o for (ns, _), o in outer.pools.items() if ns == parts[4]]
                    return self._send(200, {"kind": "List", "items": items})
                if len(parts) == 7:
                    key = (parts[4], parts[6])
                    if key not in outer.pools:
                        return self._status(404, "NotFound", f'inferencepools.tandem.dev "{parts[6]}" not found')
                    if patch is None and outer.script:
                        outer.pools[key] = outer.script.pop(0)
                    return self._send(200, outer.pools[key])
                return self._status(404, "NotFound", path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.pools[("team-a", "speed")] = pool("speed", "team-a")
        server.pools[("team-a", "batch")] = pool("batch", "team-a", version="v7")
        server.pools[("team-b", "speed")] = pool("speed", "team-b")
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "dev", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "dev", "namespace": "team-a"}}],
                "current-context": "fake",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


def test_get_pools_uses_the_context_namespace(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["get", "pools"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["NAME", "VERSION", "PHASE"],
        ["batch", "v7", "Idle"],
        ["speed", "v1", "Idle"],
    ]
    assert api.requests[-1][:2] == ("GET", f"{API}/namespaces/team-a/inferencepools")


def test_get_pools_all_namespaces_json(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["get", "pools", "-A", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "List" and len(doc["items"]) == 3
    assert api.requests[-1][:2] == ("GET", f"{API}/inferencepools")


def test_get_one_pool_yaml_and_a_missing_one(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["get", "pool", "speed", "-n", "team-b", "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["metadata"]["namespace"] == "team-b"
    assert main(["get", "pool", "nope"]) == 1
    assert capsys.readouterr().err == 'tandem: inferencepools.tandem.dev "nope" not found in namespace team-a\n'


def test_forbidden_is_one_line(api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.forbid_lists = True
    assert main(["get", "pools"]) == 1
    assert capsys.readouterr().err == 'tandem: 403 Forbidden: inferencepools.tandem.dev is forbidden: User "dev"\n'


@pytest.mark.parametrize(
    ("installed", "want"),
    [
        pytest.param(True, "CRDs: inferencepools, mooncakecaches installed", id="installed"),
        pytest.param(False, "CRDs: not installed (helm install or tandem crds)", id="not installed"),
    ],
)
def test_version_reports_server_and_crds(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str], installed: bool, want: str
) -> None:
    api.crds_installed = installed
    assert main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"Server Version: v1.34.1 ({api.url}, context fake)"
    assert lines[2] == want


@pytest.mark.parametrize(
    ("argv", "want_body"),
    [
        pytest.param(["promote", "speed"], "tandem.dev/promote", id="promote"),
        pytest.param(["abort", "speed"], "tandem.dev/abort", id="abort"),
        pytest.param(["pause", "speed"], {"spec": {"rollout": {"paused": True}}}, id="pause"),
        pytest.param(["resume", "speed"], {"spec": {"rollout": {"paused": False}}}, id="resume"),
    ],
)
def test_rollout_controls_are_one_merge_patch(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str], argv: list[str], want_body: Any
) -> None:
    assert main(["rollout", *argv]) == 0
    assert capsys.readouterr().out == f"{argv[0]} requested for team-a/speed\n"
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert len(patches) == 1
    _, path, content_type, body = patches[0]
    assert path == f"{API}/namespaces/team-a/inferencepools/speed"
    assert content_type == "application/merge-patch+json"
    if isinstance(want_body, str):
        assert list(body["metadata"]["annotations"]) == [want_body]
    else:
        assert body == want_body


def test_rollout_status_watch_prints_changes_and_exits_0_when_promoted(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rolloutctl, "WATCH_INTERVAL_S", 0.01)
    start = api.pools[("team-a", "speed")]
    step = canary(start, "v2", 50)
    done = pool("speed", "team-a", phase="Promoted", version="v2", generation=2)
    api.script = [step, step, step, done]
    assert main(["rollout", "status", "speed", "--watch", "--timeout", "30s"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Progressing step 1/1: canary v2 1/1 pairs ready, 50% of traffic",
        "Promoted: v2 is stable, 2/2 pairs ready",
    ]


def test_rollout_status_without_watch_prints_once_and_exits_0(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.pools[("team-a", "speed")] = canary(api.pools[("team-a", "speed")], "v2", 50)
    assert main(["rollout", "status", "speed"]) == 0
    out = capsys.readouterr().out
    assert "phase       Progressing" in out and "canary      v2" in out
