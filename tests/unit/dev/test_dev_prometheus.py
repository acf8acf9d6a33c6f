"""Prometheus config rendering and file_sd target files (no server started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem_lab.dev import prometheus


def test_config_scrapes_only_file_sd_targets_at_a_short_interval(tmp_path: Path) -> None:
    cfg = prometheus.build_config(tmp_path / "targets", scrape_interval_s=1.5)
    assert cfg["global"]["scrape_interval"] == "1500ms"
    assert cfg["global"]["scrape_timeout"] == "1500ms"  # must not exceed the interval
    (job,) = cfg["scrape_configs"]
    assert set(job) == {"job_name", "file_sd_configs"}
    assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "targets" / "*.json")]


def test_config_runs_the_given_relabel_rules_on_every_target(tmp_path: Path) -> None:
    rules = [{"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http"}]
    (job,) = prometheus.build_config(tmp_path, 1, relabel_configs=rules)["scrape_configs"]
    assert job["relabel_configs"] == rules
    assert job["relabel_configs"] is not rules  # a copy: the caller's rules stay the caller's


@pytest.mark.parametrize(
    ("seconds", "want"),
    [pytest.param(2, "2s", id="whole"), pytest.param(0.25, "250ms", id="fraction")],
)
def test_duration_formatting(seconds: float, want: str) -> None:
    assert prometheus.build_config(Path("/t"), seconds)["global"]["scrape_interval"] == want


def test_target_group_rejects_non_loopback_addresses() -> None:
    assert prometheus.target_group(["127.0.0.1:9000"], {"role": "x"}) == [
        {"targets": ["127.0.0.1:9000"], "labels": {"role": "x"}}
    ]
    with pytest.raises(ValueError, match="loopback"):
        prometheus.target_group(["10.0.0.5:8000"])


def test_add_and_remove_target_files(tmp_path: Path) -> None:
    server = prometheus.PrometheusServer(binary=Path("/usr/bin/prometheus"), state_dir=tmp_path, port=9999)
    path = server.add_target("probe", ["127.0.0.1:1234"], {"job": "sim"})
    assert path == tmp_path / "targets" / "probe.json"
    assert json.loads(path.read_text())[0]["labels"] == {"job": "sim"}
    assert [p.name for p in (tmp_path / "targets").iterdir()] == ["probe.json"]  # no temp file left
    server.remove_target("probe")
    assert not path.exists()
    with pytest.raises(ValueError):
        server.add_target("../escape", ["127.0.0.1:1"])


def test_command_binds_loopback_and_sets_lookback(tmp_path: Path) -> None:
    server = prometheus.PrometheusServer(
        binary=Path("/usr/bin/prometheus"), state_dir=tmp_path, port=19090, lookback_delta="30s"
    )
    cmd = server.command()
    assert "--web.listen-address=127.0.0.1:19090" in cmd
    assert "--query.lookback-delta=30s" in cmd
    assert f"--storage.tsdb.path={tmp_path / 'tsdb'}" in cmd
    assert not server.is_running()
