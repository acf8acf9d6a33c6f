"""The shared local-cluster kit (tandem_lab.dev.kit): the operator's command line and the node readiness rule
that the cluster tests, the controller benchmark and the demo all rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.kit import NOT_READY_TAINT, OperatorProcess, next_loopback_cidr, node_schedulable


def _node(ready: str | None, taints: list[str] | None = None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"spec": {"taints": [{"key": k} for k in taints or []]}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("node", "want"),
    [
        pytest.param(_node("True"), True, id="ready"),
        pytest.param(_node("True", [NOT_READY_TAINT]), False, id="ready but still tainted not-ready"),
        pytest.param(_node("False"), False, id="not ready"),
        pytest.param(_node(None), False, id="no condition yet"),
        pytest.param(_node("True", ["amd.com/other"]), True, id="another taint does not count"),
    ],
)
def test_node_schedulable(node: dict[str, Any], want: bool) -> None:
    assert node_schedulable(node) is want


def test_loopback_cidrs_are_distinct_and_outside_the_control_planes_range() -> None:
    cidrs = [next_loopback_cidr() for _ in range(300)]
    assert len(set(cidrs)) == 300
    assert all(c.startswith("127.") and not c.startswith("127.0.") and c.endswith(".0/24") for c in cidrs)


@pytest.mark.parametrize(
    ("kwargs", "present", "absent"),
    [
        pytest.param({}, ["--namespace=a", "--namespace=b"], ["--prometheus-url", "--scrape-interval"], id="minimal"),
        pytest.param(
            {"prometheus_url": "http://p:9090", "scrape_interval_s": 1.0, "extra_args": ["--x"]},
            ["--prometheus-url=http://p:9090", "--scrape-interval=1"],
            [],
            id="prometheus and extra args",
        ),
    ],
)
def test_operator_command_line(kwargs: dict[str, Any], present: list[str], absent: list[str]) -> None:
    op = OperatorProcess(kubeconfig=Path("/k"), namespaces=["a", "b"], log_path=Path("/tmp/x.log"), **kwargs)
    op.metrics_port, op.liveness_port = 9001, 9002
    cmd = op.command()
    assert cmd[1:4] == ["-m", "tandem.cli", "run"]
    assert "--kubeconfig=/k" in cmd and "--metrics-port=9001" in cmd and "--liveness-port=9002" in cmd
    for arg in present:
        assert arg in cmd
    for prefix in absent:
        assert not any(a.startswith(prefix) for a in cmd)
    if kwargs.get("extra_args"):
        assert cmd[-1] == "--x"


def test_an_operator_that_exits_at_once_fails_fast_with_its_log(tmp_path: Path) -> None:
    """A broken command line fails the start with the log's tail, not after the liveness timeout."""
    op = OperatorProcess(
        kubeconfig=tmp_path / "missing", namespaces=["a"], log_path=tmp_path / "op.log", extra_args=["--no-such"]
    )
    with pytest.raises(RuntimeError, match="exited early") as info:
        op.start(timeout_s=60)
    assert "--no-such" in str(info.value)
    assert op.starts == 1 and not op.running()
