"""Metric gates end to end: the test exporter scraped by the cluster's real Prometheus, gates evaluated
through the real adapter (testing.md §5, R-01..R-04; the metric-gate half of issue 6).

One exporter serves six revisions of one pool: the stable one and a good canary behave alike; ``slow``
has TTFT × 1.5, ``errors`` ends 5 % of requests in errors, ``idle`` has no traffic (0/0 = NaN) and
``hidden`` is never registered with Prometheus (empty result). The series carry the label contract
as file_sd target labels.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from tandem.adapters.prometheus import GateTarget, MetricsProvider, PrometheusProvider, evaluate_metric_gates
from tandem.api.pool import AnalysisSpec, MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.core.promql import compute_rate_window, template_sample_queries
from tandem_lab.dev.exporter import Behaviour, Exporter, make_pair_pods
from tandem_lab.dev.ports import free_port
from tandem_lab.dev.prometheus import PrometheusServer

if TYPE_CHECKING:
    from conftest import ScrapeTarget


POOL = "speed"
STABLE, GOOD, SLOW, ERRORS, IDLE, HIDDEN = "stable1", "good2", "slow3", "errors4", "idle5", "hidden6"
WINDOW_S = 15.0  # rate window: ~300 decode requests per revision at 20 req/s
TIMEOUT_S = 5.0

TTFT = MetricGate(name="ttft-p90", template="TTFTP90", success_condition="result <= 0.5")
TTFT_VS_STABLE = MetricGate(name="ttft-vs-stable", template="TTFTP90", success_condition="result <= baseline * 1.2")
ERROR_RATE = MetricGate(name="errors", template="ErrorRate", failure_condition="result > 0.01")
MULTI = MetricGate(
    name="running",
    query='vllm:num_requests_running{namespace="${namespace}",pool="${pool}",revision="${revision}",role=~"${role}"}',
    success_condition="result < 1000.0",
)
SPEC = AnalysisSpec(interval="20s", timeout="5s", initial_delay="0s")
PREFILL_SEL = 'namespace="${namespace}",pool="${pool}",revision="${revision}",role="prefill"'


@pytest.fixture
def fleet(scrape_target: ScrapeTarget) -> Iterator[tuple[Exporter, str, datetime]]:
    """The exporter with six revisions (one pair each, two for stable); all but HIDDEN registered."""
    namespace = f"mg-{secrets.token_hex(4)}"  # unique: the session's Prometheus keeps earlier tests' series
    exporter = Exporter(seed=20260101, tick_s=0.25, default=Behaviour(request_rate=20.0))
    exporter.add_pods(make_pair_pods(namespace=namespace, pool=POOL, revision=STABLE, pairs=2))
    for i, revision in enumerate((GOOD, SLOW, ERRORS, IDLE, HIDDEN)):
        exporter.add_pods(make_pair_pods(namespace=namespace, pool=POOL, revision=revision, pairs=1, start=2 + i))
    exporter.set_revision(SLOW, ttft_multiplier=1.5)
    exporter.set_revision(ERRORS, error_rate=0.05)
    exporter.set_revision(IDLE, request_rate=0.0)
    exporter.start()
    try:
        for pod in exporter.pods:
            if pod.revision != HIDDEN:
                targets, labels = exporter.target(pod.name)
                scrape_target(targets, labels)
        yield exporter, namespace, datetime.now(UTC)
    finally:
        exporter.stop()


def _evaluate(
    provider: MetricsProvider, gate: MetricGate, *, namespace: str, canary: str, started: datetime, scrape_s: float
) -> GateVerdict:
    target = GateTarget(
        namespace=namespace,
        pool=POOL,
        canary_revision=canary,
        stable_revision=STABLE,
        interval=compute_rate_window(WINDOW_S, scrape_s),
        timeout_s=TIMEOUT_S,
        max_prompt_tokens=131_072,
    )
    (verdict,) = asyncio.run(
        evaluate_metric_gates(
            provider,
            [gate],
            target,
            analysis=SPEC,
            step_started_at=started,
            scrape_interval_s=scrape_s,
            clock=lambda: datetime.now(UTC),
        )
    )
    return verdict


def _wait_for_full_windows(
    provider: MetricsProvider, namespace: str, started: datetime, scrape_s: float, timeout_s: float = 90
) -> None:
    """Until every scraped revision's TTFT has a verdict: targets scraped and a whole rate window inside the
    step, judged by the samples' own times (a loaded Prometheus may scrape one target later than another)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        pending = []
        for revision in (STABLE, GOOD, SLOW, ERRORS):
            last = _evaluate(provider, TTFT, namespace=namespace, canary=revision, started=started, scrape_s=scrape_s)
            if last.verdict not in ("Success", "Failure"):
                pending.append(revision)
        if not pending:
            return
        time.sleep(1.0)
    pytest.fail(f"not every revision produced a verdict within {timeout_s:.0f} s; last verdict: {last}")


def test_gates_on_real_prometheus(prometheus: PrometheusServer, fleet: tuple[Exporter, str, datetime]) -> None:
    _, namespace, started = fleet
    scrape_s = prometheus.scrape_interval_s
    with PrometheusProvider(prometheus.url) as provider:
        # Before a whole window lies inside the step, no verdict can be a pass (TooEarly, or not scraped yet).
        early = _evaluate(provider, TTFT, namespace=namespace, canary=GOOD, started=started, scrape_s=scrape_s)
        assert early.verdict == "NoData", early

        _wait_for_full_windows(provider, namespace, started, scrape_s)
        cases = [
            (TTFT, GOOD, "Success", "SuccessConditionMet"),
            (TTFT, SLOW, "Failure", "SuccessConditionNotMet"),
            (TTFT_VS_STABLE, GOOD, "Success", "SuccessConditionMet"),
            (TTFT_VS_STABLE, SLOW, "Failure", "SuccessConditionNotMet"),
            (ERROR_RATE, GOOD, "Success", "FailureConditionNotMet"),
            (ERROR_RATE, ERRORS, "Failure", "FailureConditionMet"),
            (TTFT, IDLE, "NoData", "NaN"),
            (ERROR_RATE, IDLE, "NoData", "NaN"),
            (TTFT, HIDDEN, "NoData", "Empty"),
            (TTFT_VS_STABLE, HIDDEN, "NoData", "Empty"),
            (MULTI, GOOD, "NoData", "InvalidQueryResult"),
        ]
        got = {
            (gate.name, canary): _evaluate(
                provider, gate, namespace=namespace, canary=canary, started=started, scrape_s=scrape_s
            )
            for gate, canary, _, _ in cases
        }
    failures = [
        f"{gate.name} on {canary}: want {want_v}/{want_r}, got {v.verdict}/{v.reason} value={v.value!r} "
        f"baseline={v.baseline!r} query={v.query}"
        for gate, canary, want_v, want_r in cases
        if ((v := got[(gate.name, canary)]).verdict, v.reason) != (want_v, want_r)
    ]
    assert not failures, "\n".join(failures)

    good = got[(TTFT.name, GOOD)]
    slow = got[(TTFT.name, SLOW)]
    assert 0.25 < float(good.value) <= 0.5 < float(slow.value) <= 0.75  # vLLM buckets interpolate inside (0.5, 0.75]
    assert float(got[(ERROR_RATE.name, ERRORS)].value) == pytest.approx(0.05, abs=0.03)
    assert float(got[(ERROR_RATE.name, GOOD)].value) == 0.0
    # Every verdict is explained: value, baseline (when used), condition and the resolved query.
    vs_stable = got[(TTFT_VS_STABLE.name, SLOW)]
    assert vs_stable.baseline and vs_stable.condition == "success: result <= baseline * 1.2"
    assert f'namespace="{namespace}",pool="{POOL}",revision="{SLOW}",role=~"decode"' in vs_stable.query
    assert good.evaluated_at is not None and abs(good.evaluated_at - datetime.now(UTC)) < timedelta(seconds=60)


def test_unreachable_prometheus_is_an_error() -> None:
    """Prometheus stopped: nothing listens on its port (R-04 MetricsUnavailable)."""
    with PrometheusProvider(f"http://127.0.0.1:{free_port()}") as provider:
        start = time.monotonic()
        verdict = _evaluate(
            provider,
            TTFT,
            namespace="mg-none",
            canary=GOOD,
            started=datetime.now(UTC) - timedelta(minutes=5),
            scrape_s=1.0,
        )
        elapsed = time.monotonic() - start
    assert (verdict.verdict, verdict.reason) == ("Error", "MetricsUnavailable")
    assert elapsed < TIMEOUT_S


def test_uncached_and_fetched_work_on_real_prometheus(
    prometheus: PrometheusServer, scrape_target: ScrapeTarget
) -> None:
    """``compare.normalize``'s work queries on the real Prometheus: the local misses of the prefill instances and, of
    those, the tokens the KV connector fetched from the shared tier. With 2,000-token prompts, 60 % local hits and
    30 % fetched, a pair missed 800 tokens per request and fetched 600; an engine without the connector's counters
    missed 800 and has no fetched answer at all (the line then counts every miss as prefilled); per pair as per
    revision."""
    namespace = f"uw-{secrets.token_hex(4)}"
    exporter = Exporter(seed=20261205, tick_s=0.25, default=Behaviour(request_rate=20.0, prompt_tokens=2000))
    shared, plain = "shared1", "plain2"
    exporter.add_pods(make_pair_pods(namespace=namespace, pool=POOL, revision=shared, pairs=2))
    exporter.add_pods(make_pair_pods(namespace=namespace, pool=POOL, revision=plain, pairs=2, start=2))
    exporter.set_revision(shared, shared_hit_ratio=0.3)
    exporter.set_revision(plain, connector=False)
    exporter.start()
    queries = template_sample_queries("TTFTP95", "UncachedPromptTokens")
    assert queries.uncached and queries.pair_uncached and queries.fetched and queries.pair_fetched
    window = compute_rate_window(WINDOW_S, prometheus.scrape_interval_s)

    def render(query: str, revision: str) -> str:
        for key, value in (("namespace", namespace), ("pool", POOL), ("revision", revision), ("interval", window)):
            query = query.replace("${" + key + "}", value)
        return query

    def per_request(revision: str) -> dict[str, list[float]]:
        """Each query's answers per prompt token of the pair (or revision) it covers; {} until both pairs answer."""
        prompts = f"sum by (pair) (increase(vllm:prompt_tokens_total{{{PREFILL_SEL}}}[${{interval}}]))"
        with PrometheusProvider(prometheus.url) as provider:
            tokens = provider.query(render(prompts, revision), timeout_s=TIMEOUT_S)
            by_pair = {s.labels["pair"]: float(s.value) for s in tokens.series}
            if len(by_pair) != 2 or not all(by_pair.values()):
                return {}
            out: dict[str, list[float]] = {}
            for name, query in (("uncached", queries.uncached), ("fetched", queries.fetched)):
                answer = provider.query(render(query or "", revision), timeout_s=TIMEOUT_S)
                out[name] = [float(s.value) / sum(by_pair.values()) for s in answer.series]
            for name, query in (("pair_uncached", queries.pair_uncached), ("pair_fetched", queries.pair_fetched)):
                answer = provider.query(render(query or "", revision), timeout_s=TIMEOUT_S)
                out[name] = [float(s.value) / by_pair[s.labels["pair"]] for s in answer.series]
        return out

    deadline = time.monotonic() + 90
    got: dict[str, dict[str, list[float]]] = {}
    try:
        for pod in exporter.pods:
            scrape_target(*exporter.target(pod.name))
        while time.monotonic() < deadline:
            got = {revision: per_request(revision) for revision in (shared, plain)}
            if all(got.values()) and len(got[shared]["pair_fetched"]) == 2:
                break
            time.sleep(1.0)
    finally:
        exporter.stop()
    want = {
        shared: {"uncached": [0.4], "fetched": [0.3], "pair_uncached": [0.4, 0.4], "pair_fetched": [0.3, 0.3]},
        plain: {"uncached": [0.4], "fetched": [], "pair_uncached": [0.4, 0.4], "pair_fetched": []},
    }
    for revision, expected in want.items():
        assert got[revision].keys() == expected.keys(), got
        for name, values in expected.items():
            assert got[revision][name] == pytest.approx(values, abs=0.02), (revision, name, got)
