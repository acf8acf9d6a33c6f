"""The reusable chart fixtures (``chart_fixtures.py``) do what other cluster tests rely on: the chart is
installed, ``chart_ns`` is a namespace the operator's ServiceAccount may work in, and the kubeconfig it
yields authenticates as that ServiceAccount.
"""

from __future__ import annotations

import pytest

from tests.cluster.chart_fixtures import OPERATOR_USER, ChartInstall, chart_ns, tandem_chart

__all__ = ["chart_ns", "tandem_chart"]  # fixtures imported for pytest to register them here


def test_chart_ns_is_served_by_the_installed_operator(tandem_chart: ChartInstall, chart_ns: str) -> None:
    assert chart_ns in tandem_chart.serving
    assert tandem_chart.sa_kubeconfig is not None and tandem_chart.sa_kubeconfig.is_file()
    sa = tandem_chart.sa_kube()
    assert sa.json("auth", "whoami")["status"]["userInfo"]["username"] == OPERATOR_USER
    assert sa.run("auth", "can-i", "create", "pods", "-n", chart_ns, check=False).stdout.strip() == "yes"
    assert sa.run("auth", "can-i", "patch", "inferencepools.tandem.dev/status", "-n", chart_ns).stdout.strip() == "yes"
    assert sa.run("auth", "can-i", "create", "pods", "-n", "default", check=False).stdout.strip() == "no"
    args = tandem_chart.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={chart_ns}" in args


@pytest.mark.parametrize("round_", [1, 2], ids=["first", "second"])
def test_chart_ns_is_fresh_each_time(tandem_chart: ChartInstall, chart_ns: str, round_: int) -> None:
    pools = tandem_chart.kube.json("get", "inferencepools.tandem.dev", "-n", chart_ns)["items"]
    assert pools == []
    assert len([ns for ns in tandem_chart.serving if ns.startswith("t-serve-")]) == 1
