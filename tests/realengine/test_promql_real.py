"""The gate and autoscaler queries return data from a real Prometheus scraping real engines (issue 16).

The engines are scraped with the target labels of the series label contract (``core/promql.py``: the
chart's scrape config relabels them from the pod's ``tandem.dev/*`` labels), taken here from the pods the
builders produced, so a label or metric name that drifted from what vLLM and the builders emit turns a
query into NoData. Every built-in gate template and every autoscaling query must return finite data.
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
from tandem.core.promql import TEMPLATES, QueryVars, render_query
from tandem.core.scalemetrics import scaling_queries
from tandem.dev.prometheus import PrometheusServer
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import post_json

SCRAPE_INTERVAL_S = 1.0
WINDOW = "2m"  # rate windows: long enough to hold every sample of the tier, short of any idle tail
DATA_TIMEOUT_S = 120.0
PROMPTS = [f"def handler_{i}(request):\n    return request.json()\n" * 8 for i in range(4)]


def scrape_labels(pod: dict[str, Any]) -> dict[str, str]:
    """The target labels the series label contract gives an engine pod's series."""
    labels = pod["metadata"]["labels"]
    return {
        "namespace": pod["metadata"]["namespace"],
        "pool": labels[LABEL_POOL],
        "revision": labels[LABEL_REVISION],
        "role": labels[LABEL_ROLE],
        "pair": labels[LABEL_PAIR],
        "pod": pod["metadata"]["name"],
    }


@pytest.fixture(scope="module")
def prometheus(prefill: BuiltEngine, decode: BuiltEngine, scratch: Path) -> Iterator[PrometheusServer]:
    binary = Path(os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus"))
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: tools/testenv/prometheus.sh installs it", pytrace=False)
    server = PrometheusServer(binary=binary, state_dir=scratch / "prometheus", scrape_interval_s=SCRAPE_INTERVAL_S)
    server.start()
    try:
        for built in (prefill, decode):
            server.add_target(built.engine.name, [f"127.0.0.1:{built.engine.port}"], scrape_labels(built.pod))
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


def test_gate_and_autoscaler_queries_return_data(
    prometheus: PrometheusServer, router: str, served_name: str, prefill: BuiltEngine
) -> None:
    labels = scrape_labels(prefill.pod)
    up = f'up{{namespace="{labels["namespace"]}",pool="{labels["pool"]}"}}'
    assert _wait_for_data(prometheus, {"up": f"sum({up})"})["up"] == [2.0]
    time.sleep(2 * SCRAPE_INTERVAL_S)  # a sample of every counter before the traffic, so rate() sees it grow
    for prompt in [*PROMPTS, *PROMPTS]:  # each twice: the second pass hits the prefill's prefix cache
        body = {"model": served_name, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        post_json(f"{router}/v1/completions", body)
    queries = {
        f"gate {name}": render_query(
            template.query,
            QueryVars(labels["namespace"], labels["pool"], labels["revision"], template.role, WINDOW),
        )
        for name, template in TEMPLATES.items()
    }
    queries |= {
        f"autoscaler {key}": q for key, q in scaling_queries(labels["namespace"], labels["pool"], WINDOW).items()
    }
    answers = _wait_for_data(prometheus, queries)
    assert {name for name, values in answers.items() if not values} == set(), answers
