"""``OperatorConfig`` is the one source of the operator's defaults: flags, environment and chart agree."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from tandem.controller import main
from tandem.controller.config import DEFAULT_MAX_CONCURRENT_PASSES, DEFAULT_SCRAPE_INTERVAL_S, OperatorConfig

REPO = Path(__file__).resolve().parents[2]


def _run_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main.register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


@pytest.mark.parametrize(
    ("environ", "want_passes", "want_scrape"),
    [
        pytest.param({}, DEFAULT_MAX_CONCURRENT_PASSES, DEFAULT_SCRAPE_INTERVAL_S, id="defaults"),
        pytest.param({"TANDEM_MAX_CONCURRENT_PASSES": "3", "TANDEM_SCRAPE_INTERVAL": "5"}, 3, 5.0, id="env"),
        pytest.param({"TANDEM_MAX_CONCURRENT_PASSES": ""}, DEFAULT_MAX_CONCURRENT_PASSES, 15.0, id="blank-env"),
    ],
)
def test_environment_overrides_the_class_defaults(
    environ: dict[str, str], want_passes: int, want_scrape: float
) -> None:
    config = OperatorConfig.from_env(environ)
    assert (config.max_concurrent_passes, config.scrape_interval_s) == (want_passes, want_scrape)


def test_flag_defaults_are_the_config_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TANDEM_MAX_CONCURRENT_PASSES", "TANDEM_SCRAPE_INTERVAL", "TANDEM_PROMETHEUS_URL"):
        monkeypatch.delenv(var, raising=False)
    config = main.config_from_args(_run_args(["--namespace", "a"]))
    default = OperatorConfig()
    assert config.max_concurrent_passes == default.max_concurrent_passes
    assert config.scrape_interval_s == default.scrape_interval_s
    assert config.namespaces == ["a"]


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_MAX_CONCURRENT_PASSES", "3")
    assert main.config_from_args(_run_args(["--namespace", "a"])).max_concurrent_passes == 3
    assert (
        main.config_from_args(_run_args(["--namespace", "a", "--max-concurrent-passes", "5"])).max_concurrent_passes
        == 5
    )


def test_the_chart_does_not_restate_the_operator_defaults() -> None:
    """The chart passes --max-concurrent-passes only when a value is set, so the operator's default is the
    only one (it used to be written in values.yaml and again in the template's `default`)."""
    values = yaml.safe_load((REPO / "charts/tandem/values.yaml").read_text())
    assert values["operator"].get("maxConcurrentPasses") is None
    template = (REPO / "charts/tandem/templates/deployment.yaml").read_text()
    assert "maxConcurrentPasses | default" not in template
