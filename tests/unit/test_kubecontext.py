"""Kubeconfig resolution as kubectl does it, and one-line errors (never a traceback) without a cluster.

No cluster: kubeconfigs are temp files, and "unreachable" is a 127.0.0.1 port with nothing listening.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.adapters.kubecontext import ClusterClient, ClusterError, Target, resolve_target
from tandem.cli import main
from tandem_lab.dev.ports import free_port


def closed_port() -> int:
    """A local port nobody listens on (bound, then released: connecting is refused)."""
    return free_port()


def write_kubeconfig(path: Path, server: str, current: str | None = "dev", **namespaces: str) -> Path:
    contexts = ["dev", "prod", "bare"]
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {
                "name": name,
                "context": {
                    "cluster": "c",
                    "user": "u",
                    **({"namespace": namespaces[name]} if name in namespaces else {}),
                },
            }
            for name in contexts
        ],
    }
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "config", f"https://127.0.0.1:{closed_port()}", dev="team-a", prod="serving")


@pytest.fixture(autouse=True)
def no_ambient_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The developer's own kubeconfig or an in-pod service account must not leak into a test."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.parametrize(
    ("context", "namespace", "want_context", "want_namespace"),
    [
        pytest.param(None, None, "dev", "team-a", id="current context and its namespace"),
        pytest.param(None, "other", "dev", "other", id="-n overrides the context's namespace"),
        pytest.param("prod", None, "prod", "serving", id="--context picks its namespace"),
        pytest.param("bare", None, "bare", "default", id="a context without namespace means default"),
        pytest.param("bare", "x", "bare", "x", id="--context and -n"),
    ],
)
def test_resolve_target_like_kubectl(
    kubeconfig: Path, context: str | None, namespace: str | None, want_context: str, want_namespace: str
) -> None:
    target = resolve_target(str(kubeconfig), context, namespace)
    assert target == Target(kubeconfig=str(kubeconfig), context=want_context, namespace=want_namespace)


def test_resolve_target_reads_kubeconfig_env_at_call_time(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert resolve_target().namespace == "team-a"


def test_resolve_target_without_current_context_needs_context(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://127.0.0.1:1", current=None, prod="serving")
    with pytest.raises(ClusterError, match=r"no current context .*; pass --context"):
        resolve_target(str(path))
    assert resolve_target(str(path), "prod").namespace == "serving"


@pytest.mark.parametrize(
    ("file", "context", "want"),
    [
        pytest.param("missing", None, r"^no kubeconfig at .*/missing; set --kubeconfig or \$KUBECONFIG$", id="no file"),
        pytest.param(None, None, r"^no kubeconfig at .*/home/\.kube/config; set", id="no default kubeconfig"),
        pytest.param(
            "config", "nope", r"^context 'nope' not found in .*config \(contexts: bare, dev, prod\)$", id="bad context"
        ),
    ],
)
def test_resolve_target_errors_are_one_line(kubeconfig: Path, file: str | None, context: str | None, want: str) -> None:
    path = str(kubeconfig.parent / file) if file else None
    with pytest.raises(ClusterError, match=want) as info:
        resolve_target(path, context)
    assert "\n" not in str(info.value)


def test_unreachable_cluster_is_one_line(kubeconfig: Path) -> None:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with ClusterClient(resolve_target(str(kubeconfig))) as cluster, pytest.raises(ClusterError) as info:
        cluster.list_pools("team-a")
    assert str(info.value) == f"cannot reach the cluster at {server} (connection refused); check --context/--kubeconfig"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["get", "pools"], id="get pools"),
        pytest.param(["get", "pool", "speed", "-o", "yaml"], id="get pool"),
        pytest.param(["rollout", "status", "speed", "--watch", "--timeout", "10s"], id="rollout status --watch"),
        pytest.param(["rollout", "promote", "speed"], id="rollout promote"),
    ],
)
def test_cli_without_a_cluster_prints_one_line_and_exits_1(
    kubeconfig: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--kubeconfig", str(kubeconfig)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("tandem: cannot reach the cluster at https://127.0.0.1:") and "(connection refused)" in err


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        pytest.param(["get", "pools"], "tandem: no kubeconfig at ", id="no kubeconfig"),
        pytest.param(
            ["get", "pools", "--context", "nope", "--kubeconfig", "{kc}"],
            "tandem: context 'nope' not found",
            id="no such context",
        ),
    ],
)
def test_cli_without_kubeconfig_or_context_prints_one_line(
    kubeconfig: Path, argv: list[str], want: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([a.replace("{kc}", str(kubeconfig)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(want) and err.count("\n") == 1


def test_version_never_fails_without_a_cluster(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version", "--kubeconfig", str(kubeconfig)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Client Version: ")
    assert lines[1].startswith("Server Version: unavailable: cannot reach the cluster at https://127.0.0.1:")
    assert len(lines) == 2


def test_rollout_timeout_must_be_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["rollout", "status", "speed", "--watch", "--timeout", "soon"])
    assert info.value.code == 2
    assert "not a duration: 'soon'" in capsys.readouterr().err


def test_invoked_as_kubectl_plugin_the_program_is_kubectl_tandem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin" / "kubectl-tandem")])
    assert main(["get", "pools", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("kubectl tandem: no kubeconfig at ")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: kubectl tandem [-h] COMMAND ...")
