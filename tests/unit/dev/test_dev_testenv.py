"""Locating the local control plane binaries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tandem_lab.dev import testenv

REPO = Path(__file__).resolve().parents[3]


def test_parse_versions_reads_assignments_and_ignores_comments() -> None:
    text = "# pinned\nK8S_VERSION=v1.34.4\nETCD_VERSION=v3.6.14  # etcd\nKWOK_VERSION=v0.8.0\nHELM_VERSION='v3.21.4'\n"
    assert testenv.parse_versions(text) == testenv.Versions("v1.34.4", "v3.6.14", "v0.8.0", "v3.21.4")


def test_parse_versions_rejects_a_missing_component() -> None:
    with pytest.raises(ValueError, match="HELM_VERSION"):
        testenv.parse_versions("K8S_VERSION=v1\nETCD_VERSION=v2\nKWOK_VERSION=v3\n")


def test_builtin_defaults_match_versions_sh() -> None:
    from_file = testenv.parse_versions((REPO / testenv.VERSIONS_FILE).read_text())
    assert testenv.parse_versions("\n".join(f"{k}={v}" for k, v in testenv.DEFAULT_VERSIONS.items())) == from_file


def test_locate_builds_absolute_versioned_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(testenv.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", "")
    versions = testenv.Versions("v1.34.4", "v3.6.14", "v0.8.0", "v3.21.4")
    tc = testenv.locate(versions=versions)
    assert tc.cache_dir == tmp_path.resolve()
    assert tc.kube_apiserver == tmp_path.resolve() / "k8s-v1.34.4" / "kube-apiserver"
    assert tc.etcd == tmp_path.resolve() / "etcd-v3.6.14" / "etcd"
    assert tc.kwokctl == tmp_path.resolve() / "kwok-v0.8.0" / "kwokctl"
    assert tc.helm == tmp_path.resolve() / "helm-v3.21.4" / "helm"
    assert all(p.is_absolute() for p in tc.binaries().values())


def test_require_names_missing_binaries_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    tc = testenv.locate(cache=tmp_path, versions=testenv.Versions("v1.34.4", "v3.6.14", "v0.8.0", "v3.21.4"))
    etcd = tc.etcd
    etcd.parent.mkdir(parents=True)
    etcd.write_text("#!/bin/sh\n")
    os.chmod(etcd, 0o755)
    assert "etcd" not in tc.missing()
    with pytest.raises(testenv.TestenvError, match="make testenv") as info:
        tc.require(("etcd", "kwokctl"))
    assert "kwokctl" in str(info.value) and "etcd:" not in str(info.value)
    assert tc.require(("etcd",)) is tc


def test_kubectl_falls_back_to_path_only_when_the_built_one_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fallback = bindir / "kubectl"
    fallback.write_text("#!/bin/sh\n")
    os.chmod(fallback, 0o755)
    monkeypatch.setenv("PATH", str(bindir))
    versions = testenv.Versions("v1.34.4", "v3.6.14", "v0.8.0", "v3.21.4")
    assert testenv.locate(cache=tmp_path / "c", versions=versions).kubectl == fallback.resolve()
    built = tmp_path / "c" / "k8s-v1.34.4" / "kubectl"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    os.chmod(built, 0o755)
    assert testenv.locate(cache=tmp_path / "c", versions=versions).kubectl == built.resolve()
