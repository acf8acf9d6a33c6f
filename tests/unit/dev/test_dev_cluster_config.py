"""kwokctl configuration rendering: binary runtime, loopback, local absolute binaries, our stages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tandem_lab.dev import cli, cluster, testenv

VERSIONS = testenv.Versions(k8s="v1.34.4", etcd="v3.6.14", kwok="v0.8.0", helm="v3.21.4")


@pytest.fixture
def toolchain(tmp_path: Path) -> testenv.Toolchain:
    return testenv.locate(cache=tmp_path / "cache", versions=VERSIONS)


def test_kwokctl_config_uses_binary_runtime_on_loopback_with_local_binaries(
    toolchain: testenv.Toolchain, tmp_path: Path
) -> None:
    docs = cluster.build_kwokctl_config(toolchain, tmp_path / "audit.yaml", cache_dir=tmp_path / "kc")
    config = docs[0]
    assert config["kind"] == "KwokctlConfiguration"
    assert config["apiVersion"] == "config.kwok.x-k8s.io/v1alpha1"
    opts = config["options"]
    assert opts["runtime"] == "binary"
    assert opts["bindAddress"] == "127.0.0.1"
    assert opts["kubeVersion"] == "v1.34.4"
    assert opts["kubeAuditPolicy"] == str(tmp_path / "audit.yaml")
    assert opts["kubeAuthorization"] is True and opts["kubeAdmission"] is True
    for key in (
        "kubeApiserverBinary",
        "kubeControllerManagerBinary",
        "kubeSchedulerBinary",
        "kubectlBinary",
        "etcdBinary",
        "kwokControllerBinary",
    ):
        value = opts[key]
        assert Path(value).is_absolute(), key
        assert "://" not in value, f"{key} would be downloaded"
    assert opts["kubeApiserverBinary"].endswith("k8s-v1.34.4/kube-apiserver")
    assert opts["kwokControllerBinary"].endswith("kwok-v0.8.0/kwok")


def test_kwokctl_config_carries_the_whole_stage_set(toolchain: testenv.Toolchain, tmp_path: Path) -> None:
    """kwokctl adds its default stages only when none are given: ours must include node stages."""
    docs = cluster.build_kwokctl_config(toolchain, tmp_path / "a.yaml", cache_dir=tmp_path, load_delay_s=3)
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "KwokctlConfiguration" and set(kinds[1:]) == {"Stage"}
    names = {d["metadata"]["name"] for d in docs[1:]}
    assert {"tandem-node-initialize", "tandem-node-heartbeat", "tandem-pod-ready", "tandem-pod-delete"} <= names
    ready = next(d for d in docs[1:] if d["metadata"]["name"] == "tandem-pod-ready")
    assert ready["spec"]["delay"]["durationMilliseconds"] == 3000


def test_config_round_trips_through_yaml(toolchain: testenv.Toolchain, tmp_path: Path) -> None:
    docs = cluster.build_kwokctl_config(toolchain, tmp_path / "a.yaml", cache_dir=tmp_path)
    assert list(yaml.safe_load_all(cluster.dump_yaml_documents(docs))) == docs


@pytest.mark.parametrize(
    ("options", "want_error"),
    [
        pytest.param(cluster.ClusterOptions(name="Bad_Name"), "cluster name", id="bad name"),
        pytest.param(cluster.ClusterOptions(nodes=-1), "--nodes", id="negative nodes"),
        pytest.param(cluster.ClusterOptions(load_delay_s=-2), "--load-delay", id="negative delay"),
        pytest.param(cluster.ClusterOptions(product="A100"), "unknown GPU product", id="bad product"),
    ],
)
def test_cluster_options_validate(options: cluster.ClusterOptions, want_error: str) -> None:
    with pytest.raises(ValueError, match=want_error):
        options.validate()


def test_state_round_trips_and_ignores_unknown_fields(tmp_path: Path) -> None:
    state = cluster.ClusterState(
        name="x",
        state_dir=str(tmp_path),
        kubeconfig=str(tmp_path / "kubeconfig"),
        kwok_workdir="w",
        cluster_dir="c",
        audit_log="a",
        kubectl="k",
        kwokctl="kc",
        prometheus_port=9090,
    )
    state.save()
    raw = (tmp_path / cluster.STATE_FILE).read_text().replace('"name"', '"future_field": 1, "name"')
    (tmp_path / cluster.STATE_FILE).write_text(raw)
    loaded = cluster.ClusterState.load(tmp_path / cluster.STATE_FILE)
    assert loaded == state
    assert loaded.prometheus_url == "http://127.0.0.1:9090"


def test_state_root_honours_env_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cluster.STATE_ROOT_ENV, str(tmp_path / "env"))
    assert cluster.state_root() == (tmp_path / "env").resolve()
    assert cluster.state_root(tmp_path / "flag") == (tmp_path / "flag").resolve()
    assert cluster.kwok_workdir() == (tmp_path / "env" / ".kwok").resolve()


def test_controller_manager_and_scheduler_run_without_leader_election(
    toolchain: testenv.Toolchain, tmp_path: Path
) -> None:
    """A single controller-manager or scheduler that loses its lease under load exits for good (seen on
    CI-sized machines): the dev cluster turns their leader election off."""
    config = cluster.build_kwokctl_config(toolchain, tmp_path / "a.yaml", cache_dir=tmp_path)[0]
    patched = {p["name"]: p["extraArgs"] for p in config["componentsPatches"]}
    want = [{"key": "leader-elect", "value": "false"}]
    assert patched == {"kube-controller-manager": want, "kube-scheduler": want}


def test_guard_teardown_is_the_dev_cli_down_command_for_that_cluster(tmp_path: Path) -> None:
    argv = cluster.teardown_command("pytest-abc", tmp_path)
    assert argv[:3] == [sys.executable, "-m", "tandem_lab.dev.cli"]
    args = cli.build_parser().parse_args(argv[3:])
    assert args.func is cli.cmd_down
    assert (args.name, args.state_dir) == ("pytest-abc", tmp_path.resolve())
