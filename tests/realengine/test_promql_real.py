"""The gate and autoscaler queries return data from a real Prometheus scraping real engines (issue 16).

The engines' target labels are not written here: each engine is registered with the ``__meta_kubernetes_*``
labels Kubernetes SD would discover for the pod the builders produced (one target per container port, so
the NIXL side-channel port is offered too), and Prometheus runs the relabel rules the chart renders
(``metrics.engineScrapeConfig``, the same rules as the PodMonitor) on them. A chart rule, a builder label
or a metric name that drifted from what the gates and the autoscaler query turns a query into NoData.
Every built-in gate template and every autoscaling query must return finite data.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem.api.labels import LABEL_PAIR, LABEL_POOL, LABEL_REVISION, LABEL_ROLE
from tandem.core.promql import SERIES_LABELS, TEMPLATES, QueryVars, render_query
from tandem.core.scalemetrics import ITL_MEAN, PREFILL_BUSY, PREFILLS_RATE, scaling_queries, work_queries
from tandem_lab.dev.prometheus import PrometheusServer
from tests.chart.chartlib import ENGINE_SCRAPE_VALUES, MINIMAL_VALUES, engine_scrape_job, pod_sd_targets, render
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import LOOPBACK, post_json

SCRAPE_INTERVAL_S = 1.0
WINDOW = "2m"  # rate windows: long enough to hold every sample of the tier, short of any idle tail
DATA_TIMEOUT_S = 120.0
PROMPTS = [f"def handler_{i}(request):\n    return request.json()\n" * 8 for i in range(4)]


def chart_relabel_rules(namespace: str) -> list[dict[str, Any]]:
    """The relabel rules of the chart's plain scrape job, rendered to serve ``namespace``."""
    objects = render([MINIMAL_VALUES], {**ENGINE_SCRAPE_VALUES, "watchNamespaces": [namespace]})
    rules: list[dict[str, Any]] = engine_scrape_job(objects)["relabel_configs"]
    return rules


def sd_targets(built: BuiltEngine) -> dict[str, tuple[str, dict[str, str]]]:
    """Target name -> (loopback address, discovered labels) for each container port of the built pod: the
    OpenAI port is where this engine listens, the side-channel port its NIXL listener."""
    local = {"http": built.engine.port, "nixl": int(built.engine.env["VLLM_NIXL_SIDE_CHANNEL_PORT"])}
    out = {}
    for target in pod_sd_targets(built.pod):
        port_name = target["__meta_kubernetes_pod_container_port_name"]
        labels = {k: v for k, v in target.items() if k != "__address__"}
        out[f"{built.engine.name}-{port_name}"] = (f"{LOOPBACK}:{local[port_name]}", labels)
    return out


@pytest.fixture(scope="module")
def prometheus(prefill: BuiltEngine, decode: BuiltEngine, scratch: Path) -> Iterator[PrometheusServer]:
    binary = Path(os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus"))
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: tools/testenv/prometheus.sh installs it", pytrace=False)
    server = PrometheusServer(
        binary=binary,
        state_dir=scratch / "prometheus",
        scrape_interval_s=SCRAPE_INTERVAL_S,
        relabel_configs=chart_relabel_rules(prefill.pod["metadata"]["namespace"]),
        die_with_parent=True,
    )
    server.start()
    try:
        for built in (prefill, decode):
            for name, (address, labels) in sd_targets(built).items():
                server.add_target(name, [address], labels)
        yield server
    finally:
        server.stop()


def _finite(server: PrometheusServer, promql: str) -> list[float]:
    return [
        float(series["value"][1])
        for series in server.query(promql)["result"]
        if math.isfinite(float(series["value"][1]))
    ]


def _wait_for_data(server: PrometheusServer, queries: dict[str, str]) -> dict[str, list[float]]:
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while True:
        answers = {name: _finite(server, promql) for name, promql in queries.items()}
        if all(answers.values()) or time.monotonic() > deadline:
            return answers
        time.sleep(SCRAPE_INTERVAL_S)


def _wait_for_value(server: PrometheusServer, promql: str, want: float) -> list[float]:
    """Poll ``promql`` until its one answer is ``want`` (or the deadline passes; the caller asserts). `up` of
    a target is per scrape: under load a single scrape can time out, and the first scrapes of two targets do
    not land together, so "both up" is a state to reach, not one instant to sample."""
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while True:
        answer = _finite(server, promql)
        if answer == [want] or time.monotonic() > deadline:
            return answer
        time.sleep(SCRAPE_INTERVAL_S)


def test_chart_relabeling_gives_the_engines_the_contract_labels(
    prometheus: PrometheusServer, prefill: BuiltEngine, decode: BuiltEngine
) -> None:
    """Exactly the two OpenAI ports are scraped (the side-channel ports are dropped), up, and labelled
    from the pods' own metadata."""
    namespace = prefill.pod["metadata"]["namespace"]
    assert _wait_for_value(prometheus, f'count(up{{namespace="{namespace}"}} == 1)', 2.0) == [2.0]
    series = prometheus.query(f'up{{namespace="{namespace}"}}')["result"]
    got = sorted(tuple(s["metric"].get(label, "") for label in SERIES_LABELS) for s in series)
    want = sorted(
        (
            namespace,
            b.pod["metadata"]["labels"][LABEL_POOL],
            b.pod["metadata"]["labels"][LABEL_REVISION],
            b.pod["metadata"]["labels"][LABEL_ROLE],
            b.pod["metadata"]["labels"][LABEL_PAIR],
            b.pod["metadata"]["name"],
        )
        for b in (prefill, decode)
    )
    assert got == want


def test_gate_and_autoscaler_queries_return_data(
    prometheus: PrometheusServer, router: str, served_name: str, prefill: BuiltEngine
) -> None:
    meta = prefill.pod["metadata"]
    namespace, pool, revision = (
        meta["namespace"],
        meta["labels"][LABEL_POOL],
        meta["labels"][LABEL_REVISION],
    )
    up = f'up{{namespace="{namespace}",pool="{pool}"}}'
    assert _wait_for_value(prometheus, f"sum({up})", 2.0) == [2.0]
    time.sleep(2 * SCRAPE_INTERVAL_S)  # a sample of every counter before the traffic, so rate() sees it grow
    for prompt in [*PROMPTS, *PROMPTS]:  # each twice: the second pass hits the prefill's prefix cache
        body = {"model": served_name, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        post_json(f"{router}/v1/completions", body)
    queries = {
        f"gate {name}": render_query(template.query, QueryVars(namespace, pool, revision, template.role, WINDOW))
        for name, template in TEMPLATES.items()
    }
    queries |= {f"autoscaler {key}": q for key, q in scaling_queries(namespace, pool, WINDOW).items()}
    # what profile learning reads from the engines (the router-side work queries need the router scraped)
    work = work_queries(namespace, pool, WINDOW, learn=True)
    queries |= {f"autoscaler {key}": work[key] for key in (PREFILL_BUSY, PREFILLS_RATE, ITL_MEAN)}
    answers = _wait_for_data(prometheus, queries)
    assert {name for name, values in answers.items() if not values} == set(), answers
