"""PromQL for metric gates: built-in templates, variable rendering, and the shape of a query result.

What it owns:

- the **series label contract** below (the chart's scrape config, ``tandem sim`` and the test exporter
  ``tandem_lab.dev.exporter`` follow it, and every template relies on it);
- the built-in gate templates on vLLM metric names (``TEMPLATES``);
- rendering a gate's query with the fixed variable set ``${pool}``, ``${namespace}``, ``${revision}``,
  ``${role}``, ``${interval}`` (:func:`render_query`);
- the pure data a Prometheus instant query returns (:class:`QueryResult`) and the exact parser of the
  HTTP API's JSON envelope (:func:`parse_query_response`), shared by the real adapter and the fake.

What it must not do: any I/O, or import an HTTP or Kubernetes client. Values stay the raw strings
Prometheus sent (``"NaN"``, ``"+Inf"``, ``"-Inf"``, ``"0.25"``); only :func:`parse_sample_value`
turns one into a float, so the verdict rules in ``core.gates`` see exactly what Prometheus said.

Series label contract
---------------------
Every engine series Tandem queries carries these **target labels**, attached by the scrape config
(relabelled from the pod labels ``tandem.dev/*`` and the pod metadata), never by the engine itself:

=============  ============================================================
``namespace``  namespace of the pool (and of the pod)
``pool``       InferencePool name (pod label ``tandem.dev/pool``)
``revision``   stack revision id (pod label ``tandem.dev/revision``)
``role``       ``prefill`` or ``decode`` (pod label ``tandem.dev/role``)
``pair``       pair id, e.g. ``speed-p3`` (pod label ``tandem.dev/pair``)
``pod``        pod name
=============  ============================================================

vLLM's own labels (``model_name``, ``engine``, ``finished_reason``...) come on top. Templates
aggregate over everything but ``le``, so a template always returns at most one series per revision.

Variables
---------
``${pool}``, ``${namespace}``, ``${revision}`` must appear inside a quoted label-matcher value
(``pool="${pool}"``); their values are checked against the Kubernetes name/label syntax and escaped
for the string (and, inside ``=~``/``!~``, for the regex). ``${role}`` is a regex (``prefill``,
``decode``, or ``prefill|decode`` for ``any``) and must appear inside a regex matcher
(``role=~"${role}"``). ``${interval}`` is a Prometheus duration (``30s``) written bare
(``rate(x[${interval}])``). Any other ``${...}`` is an error, and so is a Grafana-style ``$pool``.

Worked example::

    render_query('sum(rate(vllm:request_success_total{pool="${pool}",role=~"${role}"}[${interval}]))',
                 QueryVars(namespace="ml", pool="speed", revision="7f3a", role="any", interval="1m"))
    == 'sum(rate(vllm:request_success_total{pool="speed",role=~"prefill|decode"}[1m]))'
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Final

# Re-exported: the rendering rules moved to the API package (tandem validate runs them at admission).
from tandem import enginemetrics as em
from tandem.api.gatequery import (
    PROM_DURATION,
    ROLE_REGEX,
    VARIABLES,
    GateRole,
    QueryRenderError,
    QueryVars,
    render_query,
)
from tandem.api.pool import NORMALIZABLE_TEMPLATES

# --- series label contract ------------------------------------------------------------------------

LABEL_NAMESPACE: Final = em.LABEL_NAMESPACE
LABEL_POOL: Final = em.LABEL_POOL
LABEL_REVISION: Final = em.LABEL_REVISION
LABEL_ROLE: Final = em.LABEL_ROLE
LABEL_PAIR: Final = em.LABEL_PAIR
LABEL_POD: Final = em.LABEL_POD
SERIES_LABELS: Final[tuple[str, ...]] = em.TARGET_LABELS


# --- vLLM metric names (integration.md §4, benchmarks.md §9) ---------------------------------------

METRIC_TTFT: Final = em.TTFT
METRIC_TPOT: Final = em.TPOT
METRIC_TTFT_BUCKET: Final = em.bucket(em.TTFT)
METRIC_TPOT_BUCKET: Final = em.bucket(em.TPOT)
METRIC_REQUEST_SUCCESS: Final = em.total(em.REQUEST_SUCCESS)
METRIC_PREFIX_CACHE_HITS: Final = em.total(em.PREFIX_HITS)
METRIC_PREFIX_CACHE_QUERIES: Final = em.total(em.PREFIX_QUERIES)
METRIC_EXTERNAL_PREFIX_CACHE_HITS: Final = em.total(em.EXTERNAL_HITS)

# --- templates ------------------------------------------------------------------------------------

_SEL = 'namespace="${namespace}",pool="${pool}",revision="${revision}",role=~"${role}"'


def _quantile(q: str, bucket: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({bucket}{{{_SEL}}}[${{interval}}])))"


@dataclass(frozen=True)
class GateTemplate:
    """A built-in gate query. ``query`` still holds its ``${...}`` variables."""

    name: str
    query: str
    role: GateRole
    """Role the template reads when the gate's ``role`` is ``any`` (a gate's explicit prefill/decode wins)."""
    unit: str
    description: str


TEMPLATES: Final[Mapping[str, GateTemplate]] = {
    t.name: t
    for t in (
        GateTemplate(
            "TTFTP90",
            _quantile("0.9", METRIC_TTFT_BUCKET),
            "decode",
            "seconds",
            "Time to first token, p90, on decode instances: in Mooncake P/D the router sends the decode request "
            "with the prefill one, so the decode side's TTFT is close to what the user sees.",
        ),
        GateTemplate(
            "TTFTP95",
            _quantile("0.95", METRIC_TTFT_BUCKET),
            "decode",
            "seconds",
            "Time to first token, p95, on decode instances.",
        ),
        GateTemplate(
            "TPOTP90",
            _quantile("0.9", METRIC_TPOT_BUCKET),
            "decode",
            "seconds",
            "Per-request time per output token, p90 (16.7 ms ≈ 60 tokens/s for 90 % of users).",
        ),
        GateTemplate(
            "TokensPerSecondPerUser",
            f"1 / {_quantile('0.9', METRIC_TPOT_BUCKET)}",
            "decode",
            "tokens/s",
            "Decode speed per user: 1 / TPOT p90 (the speed 90 % of users get at least).",
        ),
        GateTemplate(
            "ErrorRate",
            # `or vector(0)`: a revision whose error series was never created (older vLLM) reads 0 errors,
            # while an unscraped revision still gives an empty result (the denominator is empty).
            f'(sum(rate({METRIC_REQUEST_SUCCESS}{{{_SEL},finished_reason="error"}}[${{interval}}])) or vector(0))'
            f" / sum(rate({METRIC_REQUEST_SUCCESS}{{{_SEL}}}[${{interval}}]))",
            "decode",
            "ratio",
            "Share of finished requests with finished_reason=error (engine-side errors; 0-1). Decode instances "
            "finish every user request; a failed prefill shows up there as a KV load failure.",
        ),
        GateTemplate(
            "LocalKVHitRatio",
            f"sum(rate({METRIC_PREFIX_CACHE_HITS}{{{_SEL}}}[${{interval}}]))"
            f" / sum(rate({METRIC_PREFIX_CACHE_QUERIES}{{{_SEL}}}[${{interval}}]))",
            "prefill",
            "ratio",
            "Prompt tokens served from the prefill instance's own prefix cache (0-1).",
        ),
    )
}

# --- sample queries: the counts behind a template ---------------------------------------------------

TEMPLATE_HISTOGRAMS: Final[Mapping[str, str]] = {
    "TTFTP90": METRIC_TTFT,
    "TTFTP95": METRIC_TTFT,
    "TPOTP90": METRIC_TPOT,
    "TokensPerSecondPerUser": METRIC_TPOT,
}
"""The histogram a latency template reads; its ``_count`` is the gate's sample size."""
ERROR_TEMPLATE: Final = "ErrorRate"
HIT_RATIO_TEMPLATE: Final = "LocalKVHitRatio"
_ERRORS_ONLY: Final = ',finished_reason="error"'


@dataclass(frozen=True)
class SampleQueries:
    """Unrendered queries for the counts behind a template, over ``${interval}`` (``increase``, not ``rate``).

    ``count`` is the sample size (requests) for ``minSamples``; ``errors`` (ErrorRate) or ``buckets`` and
    ``sum`` (latency templates) feed the statistical comparison. ``buckets`` returns one series per ``le``.
    """

    count: str
    errors: str | None = None
    buckets: str | None = None
    sum: str | None = None
    uncached: str | None = None
    """Prompt tokens the revision's prefill instances did *not* find in their own prefix cache over the window
    (``prefix_cache_queries − prefix_cache_hits``): the prefill work behind a TTFT gate's requests, for
    ``compare.normalize: UncachedPromptTokens`` (:data:`UNCACHED_TOKENS_QUERY`)."""
    prompt_tokens: str | None = None
    """LocalKVHitRatio: prompt tokens the revision's instances looked up in their prefix cache over the window
    (``vllm:prefix_cache_queries_total``), the denominator of the hit ratio and its sample size in tokens."""
    hit_tokens: str | None = None
    """LocalKVHitRatio: of those, the tokens found (``vllm:prefix_cache_hits_total``)."""
    pair_counts: str | None = None
    """Latency templates: ``count`` per pair (``sum by (pair)``), one series per pair that has the histogram."""
    pair_sums: str | None = None
    """Latency templates: ``sum`` per pair. With ``pair_counts``, each pair's mean: the pairs are the independent
    units of the mean test (``core.stats.pair_mean_variance``)."""

    pair_uncached: str | None = None
    """With ``uncached``: the same per pair (``sum by (pair)`` of both counters), so a TTFT gate can fit stable's
    pairs' mean TTFT on their own prefill work (``core.pairfit``, :data:`PAIR_UNCACHED_TOKENS_QUERY`)."""
    fetched: str | None = None
    """With ``uncached``: of those tokens, the ones fetched from the shared tier (:data:`FETCHED_TOKENS_QUERY`)."""
    pair_fetched: str | None = None
    """With ``pair_uncached``: the same per pair (:data:`PAIR_FETCHED_TOKENS_QUERY`)."""

    def texts(self) -> tuple[str, ...]:
        """The queries that are set, in field order."""
        return tuple(q for q in (getattr(self, f.name) for f in fields(self)) if q is not None)


_SEL_PREFILL = 'namespace="${namespace}",pool="${pool}",revision="${revision}",role="prefill"'


def _prefill_increase(metric: str) -> str:
    return f"increase({metric}{{{_SEL_PREFILL}}}[${{interval}}])"


UNCACHED_TOKENS_QUERY: Final = (
    f"sum({_prefill_increase(METRIC_PREFIX_CACHE_QUERIES)}) - sum({_prefill_increase(METRIC_PREFIX_CACHE_HITS)})"
)
"""Uncached prompt tokens in the window (local misses), read on prefill instances whatever the gate's role (the decode
side's TTFT histogram counts the same requests). Both counters are vLLM's, in tokens (integration.md §4)."""
PAIR_UNCACHED_TOKENS_QUERY: Final = (
    f"sum by ({LABEL_PAIR}) ({_prefill_increase(METRIC_PREFIX_CACHE_QUERIES)})"
    f" - sum by ({LABEL_PAIR}) ({_prefill_increase(METRIC_PREFIX_CACHE_HITS)})"
)
""":data:`UNCACHED_TOKENS_QUERY` per pair: both sides carry only ``pair``, so PromQL matches them one to one."""
FETCHED_TOKENS_QUERY: Final = f"sum({_prefill_increase(METRIC_EXTERNAL_PREFIX_CACHE_HITS)})"
"""Of the uncached tokens, those the prefill instances fetched through the KV connector (the shared Mooncake tier,
``external_prefix_cache_hits``) instead of computing them. A cold canary misses locally what the shared tier mostly
holds, and fetching a block costs a fraction of computing it (W5: with local misses as the work, a good canary's
TTFT sat at ×0.8 of stable's line). An engine without a connector has no such counter: the answer is empty, and the
line counts every local miss as prefilled, as without this query. On prefill instances only: a decode instance's
external hits are the P→D transfer."""
PAIR_FETCHED_TOKENS_QUERY: Final = f"sum by ({LABEL_PAIR}) ({_prefill_increase(METRIC_EXTERNAL_PREFIX_CACHE_HITS)})"
""":data:`FETCHED_TOKENS_QUERY` per pair (a pair without the counter is missing from the answer, which then leaves
the line on local misses: ``core.gates.pair_uncached_tokens`` wants every pair)."""


def _increase(metric: str, extra: str = "") -> str:
    return f"increase({metric}{{{_SEL}{extra}}}[${{interval}}])"


def template_sample_queries(template: str, normalize: str = "None") -> SampleQueries:
    """The sample queries of a built-in template (raises :class:`QueryRenderError` for an unknown one).

    Example: ``TPOTP90`` →
    ``count = sum(increase(vllm:request_time_per_output_token_seconds_count{...}[${interval}]))``,
    ``buckets = sum by (le) (increase(..._bucket{...}[${interval}]))``, ``sum = sum(increase(..._sum{...}[...]))``.
    With ``normalize="UncachedPromptTokens"`` a TTFT template also gets ``uncached`` (:data:`UNCACHED_TOKENS_QUERY`),
    ``pair_uncached`` (:data:`PAIR_UNCACHED_TOKENS_QUERY`), ``fetched`` and ``pair_fetched``
    (:data:`FETCHED_TOKENS_QUERY`, :data:`PAIR_FETCHED_TOKENS_QUERY`).
    Every latency template also gets ``pair_counts`` and ``pair_sums`` (``sum by (pair)`` of ``_count`` and ``_sum``).
    """
    if template not in TEMPLATES:
        raise QueryRenderError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")
    histogram = TEMPLATE_HISTOGRAMS.get(template)
    if histogram is not None:
        normalized = normalize == "UncachedPromptTokens" and template in NORMALIZABLE_TEMPLATES
        return SampleQueries(
            count=f"sum({_increase(histogram + '_count')})",
            buckets=f"sum by (le) ({_increase(histogram + '_bucket')})",
            sum=f"sum({_increase(histogram + '_sum')})",
            uncached=UNCACHED_TOKENS_QUERY if normalized else None,
            pair_counts=f"sum by ({LABEL_PAIR}) ({_increase(histogram + '_count')})",
            pair_sums=f"sum by ({LABEL_PAIR}) ({_increase(histogram + '_sum')})",
            pair_uncached=PAIR_UNCACHED_TOKENS_QUERY if normalized else None,
            fetched=FETCHED_TOKENS_QUERY if normalized else None,
            pair_fetched=PAIR_FETCHED_TOKENS_QUERY if normalized else None,
        )
    requests = f"sum({_increase(METRIC_REQUEST_SUCCESS)})"
    if template == HIT_RATIO_TEMPLATE:
        return SampleQueries(
            count=requests,
            prompt_tokens=f"sum({_increase(METRIC_PREFIX_CACHE_QUERIES)})",
            hit_tokens=f"sum({_increase(METRIC_PREFIX_CACHE_HITS)})",
        )
    if template == ERROR_TEMPLATE:
        # `or vector(0)` as in the ErrorRate template: no error series yet means 0 errors.
        errors = f"(sum({_increase(METRIC_REQUEST_SUCCESS, _ERRORS_ONLY)}) or vector(0))"
        return SampleQueries(count=requests, errors=errors)
    return SampleQueries(count=requests)


# --- rendering ------------------------------------------------------------------------------------
# The variable rules live in tandem.api.gatequery, so `tandem validate` refuses a query that cannot render.


def gate_query_text(template: str | None, query: str | None) -> str:
    """The unrendered query of a gate: its template's text, else its own query."""
    if template:
        if template not in TEMPLATES:
            raise QueryRenderError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")
        return TEMPLATES[template].query
    if query is None or not query.strip():
        raise QueryRenderError("the gate has neither a template nor a query")
    return query


def gate_role(template: str | None, role: GateRole) -> GateRole:
    """Role a gate reads: an explicit prefill/decode wins, ``any`` on a template means the template's role."""
    if template and role == "any" and template in TEMPLATES:
        return TEMPLATES[template].role
    return role


def format_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration, rounded up to whole milliseconds (``90`` → ``1m30s``)."""
    ms = math.ceil(seconds * 1000 - 1e-6)
    if ms <= 0:
        raise ValueError("a duration must be > 0")
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts)


_PROM_UNITS: Final[Mapping[str, float]] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}
_PROM_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")


def parse_prom_duration(text: str) -> float:
    """A Prometheus duration (``1m30s``, ``500ms``, ``2d``) in seconds; raises ``ValueError``."""
    if not PROM_DURATION.match(text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _PROM_UNITS[unit] for n, unit in _PROM_PART.findall(text))


def compute_rate_window(interval_s: float, scrape_interval_s: float) -> str:
    """The ``${interval}`` for rate windows: the analysis interval, but at least 4 scrape intervals.

    ``rate()`` needs two samples inside its window; four scrapes leave room for one missed scrape and
    the alignment of the window. Example: interval 30 s, scrape 15 s → ``1m``; scrape 5 s → ``30s``.
    Set ``initialDelay`` at least this long, or the first samples are refused as too early
    (``core.gates``: a sample's whole window must lie inside the step).
    """
    return format_duration(max(interval_s, 4 * scrape_interval_s))


# --- query results --------------------------------------------------------------------------------


class QueryStatus(StrEnum):
    """How a query ended, before any judgement of its values."""

    OK = "ok"
    """HTTP 200 with a well-formed success envelope."""
    HTTP_ERROR = "http_error"
    """Any other HTTP status (``http_status`` says which)."""
    TIMEOUT = "timeout"
    """No complete answer within the client timeout."""
    REFUSED = "refused"
    """No HTTP answer at all: connection refused or reset, DNS failure, TLS failure, unreadable credentials."""
    UNPARSABLE = "unparsable"
    """HTTP 200, but the body is not the Prometheus JSON envelope (or a value is not a number)."""


@dataclass(frozen=True)
class Series:
    """One series of an instant query result."""

    labels: Mapping[str, str]
    timestamp: float
    """Unix seconds of the sample (for an instant vector, the evaluation time Prometheus used)."""
    value: str
    """The value exactly as Prometheus returned it: ``"0.25"``, ``"NaN"``, ``"+Inf"``, ``"-Inf"``."""


@dataclass(frozen=True)
class QueryResult:
    """The outcome of one instant query (pure data; filled by an adapter or a fake)."""

    status: QueryStatus
    query: str = ""
    """The query as sent (resolved variables)."""
    http_status: int | None = None
    warnings: tuple[str, ...] = ()
    """Prometheus ``warnings`` (partial data); any warning makes the result NoData."""
    infos: tuple[str, ...] = ()
    """Prometheus ``infos`` annotations (informational, newer servers); never affect a verdict."""
    result_type: str = ""
    """``vector``, ``scalar``, ``matrix`` or ``string``."""
    series: tuple[Series, ...] = ()
    error: str = ""
    """Why it failed: Prometheus ``errorType: error`` or the client's exception, at most 512 characters."""
    elapsed_s: float | None = None
    """Wall time of the call, when the adapter measured it."""
    sample_time: float | None = None
    """Unix seconds of the newest raw sample behind the result (:func:`freshness_query`); ``0.0`` when the
    series it reads have no current sample; None when unknown (no selector to ask about)."""


MAX_ERROR_CHARS: Final = 512
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")


def parse_sample_value(text: str) -> float:
    """A Prometheus sample value string as a float, exactly: ``NaN``, ``+Inf``/``Inf``, ``-Inf`` or a decimal.

    Stricter than ``float()``: no whitespace, underscores, ``infinity`` or hex. Raises ``ValueError``.
    """
    if not isinstance(text, str):
        raise ValueError(f"sample value must be a string, got {type(text).__name__}")
    lowered = text.lower()
    if lowered == "nan":
        return math.nan
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if not _NUMBER.match(text):
        raise ValueError(f"not a Prometheus sample value: {text[:40]!r}")
    return float(text)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _sample(pair: Any) -> tuple[float, str]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError("a sample must be [timestamp, value]")
    ts, value = pair
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise ValueError("a sample timestamp must be a finite number")
    parse_sample_value(value)
    return float(ts), value


def _labels(metric: Any) -> dict[str, str]:
    if metric is None:
        return {}
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ValueError("series labels must be a map of strings")
    return dict(metric)


def _series(result_type: str, result: Any) -> tuple[Series, ...]:
    if result_type in ("scalar", "string"):
        if result_type == "string":
            if not isinstance(result, list) or len(result) != 2 or not isinstance(result[1], str):
                raise ValueError("a string result must be [timestamp, string]")
            return (Series({}, float(result[0]), result[1]),)
        ts, value = _sample(result)
        return (Series({}, ts, value),)
    if not isinstance(result, list):
        raise ValueError("result must be a list")
    out: list[Series] = []
    for item in result:
        if not isinstance(item, dict):
            raise ValueError("each series must be an object")
        labels = _labels(item.get("metric"))
        if result_type == "vector":
            if "value" not in item:
                raise ValueError("a vector series without a float value (native histogram?) is not supported")
            ts, value = _sample(item["value"])
        else:  # matrix: keep the newest sample
            values = item.get("values")
            if not isinstance(values, list) or not values:
                raise ValueError("a matrix series must have values")
            ts, value = _sample(values[-1])
        out.append(Series(labels, ts, value))
    return tuple(out)


def parse_query_response(http_status: int, body: bytes | str, *, query: str = "") -> QueryResult:
    """Parse the answer of ``GET /api/v1/query`` (pure). Never raises.

    HTTP 200 must carry ``{"status": "success", "data": {"resultType", "result"}}`` with well-formed
    samples, else the result is ``UNPARSABLE``. Any other HTTP status is ``HTTP_ERROR`` with the
    Prometheus ``error`` text when the body has one.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        doc = None
        decode_error = str(exc)
    else:
        decode_error = ""
    if http_status != 200:
        error = ""
        warnings: tuple[str, ...] = ()
        if isinstance(doc, dict):
            error = f"{doc.get('errorType', '')}: {doc.get('error', '')}".strip(": ")
            try:
                warnings = _strings(doc.get("warnings"), "warnings")
            except ValueError:
                warnings = ()
        elif isinstance(body, bytes | str):
            error = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip()
        return QueryResult(
            QueryStatus.HTTP_ERROR,
            query=query,
            http_status=http_status,
            warnings=warnings,
            error=_bounded(error or f"HTTP {http_status}"),
        )
    try:
        if doc is None:
            raise ValueError(f"body is not JSON: {decode_error}")
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise ValueError("HTTP 200 without status=success")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise ValueError("no data object")
        result_type = data.get("resultType")
        if result_type not in ("vector", "scalar", "matrix", "string"):
            raise ValueError(f"unknown resultType {result_type!r}")
        series = _series(result_type, data.get("result"))
        warnings = _strings(doc.get("warnings"), "warnings")
        infos = _strings(doc.get("infos"), "infos")
    except (ValueError, TypeError) as exc:
        return QueryResult(QueryStatus.UNPARSABLE, query=query, http_status=200, error=_bounded(str(exc)))
    return QueryResult(
        QueryStatus.OK,
        query=query,
        http_status=200,
        warnings=warnings,
        infos=infos,
        result_type=result_type,
        series=series,
    )


# --- freshness -------------------------------------------------------------------------------------
#
# Why: an instant query answers every series stamped with the *evaluation* time, so the timestamp of
# ``histogram_quantile(0.9, sum by (le) (rate(x[1m])))`` says nothing about when ``x`` was last scraped:
# a series that stopped updating looks fresh until it leaves the rate window. ``timestamp()`` applied
# directly to a vector selector is the one PromQL form that returns the samples' own timestamps, so
# freshness is asked separately: for every selector the query reads, the newest sample time
# (``max(timestamp(sel))``), and of those the oldest (``min``): "every input of this query was
# scraped at or after T". Selectors with no current sample drop out (a never-created error series must
# not make ``ErrorRate`` stale); if none has one, the answer is empty and the result is stale.
#
# Worked example: ``sum(rate(a{pool="p"}[1m])) / sum(rate(b{pool="p"}[1m]))`` →
#   min(label_replace(max(timestamp(a{pool="p"})), "tandem_selector", "0", "", "")
#    or label_replace(max(timestamp(b{pool="p"})), "tandem_selector", "1", "", ""))
#   # tandem: freshness of <sha256 of the query, 16 hex>
# If ``b`` was last scraped at 1700000000 and ``a`` at 1700000090, the answer is 1700000000.

FRESHNESS_MARK: Final = "# tandem: freshness of "
_IDENT_TAIL = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\s*$")
_KEYWORDS: Final = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "atan2"}
)


def query_selectors(query: str) -> tuple[str, ...]:
    """The vector selectors written with braces (``name{...}`` or ``{...}``) in ``query``, in order, distinct.

    A small scanner skips strings and ``#`` comments, so a brace inside a label value is not a selector.
    Bare names without braces (``up``) are not found: their freshness stays unknown.
    """
    found: list[str] = []
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch == "#":
            end = query.find("\n", i)
            i = n if end < 0 else end
            continue
        if ch in "\"'`":
            i = _skip_string(query, i)
            continue
        if ch == "{":
            end = i + 1
            while end < n and query[end] != "}":
                end = _skip_string(query, end) if query[end] in "\"'`" else end + 1
            if end >= n:
                return tuple(found)  # unbalanced: Prometheus will refuse the query itself
            head = _IDENT_TAIL.search(query, 0, i)
            name = head.group(0).strip() if head and head.group(0).strip() not in _KEYWORDS else ""
            selector = name + query[i : end + 1]
            if selector not in found:
                found.append(selector)
            i = end + 1
            continue
        i += 1
    return tuple(found)


def _skip_string(text: str, start: int) -> int:
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


def query_digest(query: str) -> str:
    """16 hex characters of sha256(query): ties a freshness query to the query it describes (logs, fakes)."""
    return hashlib.sha256(query.encode("utf-8")).hexdigest()[:16]


def freshness_query(query: str) -> str | None:
    """The query answering "when were the inputs of ``query`` last scraped" (see above), or None if it has none."""
    selectors = query_selectors(query)
    if not selectors:
        return None
    parts = [f"max(timestamp({sel}))" for sel in selectors]
    if len(parts) == 1:
        body = parts[0]
    else:
        body = (
            "min("
            + " or ".join(f'label_replace({part}, "tandem_selector", "{i}", "", "")' for i, part in enumerate(parts))
            + ")"
        )
    return f"{body}\n{FRESHNESS_MARK}{query_digest(query)}"


def freshness_of(query: str) -> str | None:
    """The digest a freshness query names (:func:`query_digest` of its data query), or None for other queries."""
    at = query.rfind(FRESHNESS_MARK)
    return query[at + len(FRESHNESS_MARK) :].strip() or None if at >= 0 else None


def attach_freshness(data: QueryResult, freshness: QueryResult | None) -> QueryResult:
    """``data`` with :attr:`QueryResult.sample_time` from the answer of its :func:`freshness_query`.

    No freshness query (None) leaves the data as it is. A freshness query that failed turns a good data
    result into the same failure (freshness unknown is never fresh). An empty answer means no input has a
    current sample: ``sample_time = 0.0`` (stale). Anything but one finite value is unusable.
    """
    if freshness is None or data.status is not QueryStatus.OK:
        return data
    if freshness.status is not QueryStatus.OK or freshness.http_status not in (None, 200):
        return replace(
            data,
            status=freshness.status,
            http_status=freshness.http_status,
            error=_bounded(f"freshness query: {freshness.error or freshness.status.value}"),
        )
    if not freshness.series:
        return replace(data, sample_time=0.0)
    try:
        newest = parse_sample_value(freshness.series[0].value)
    except ValueError:
        newest = math.nan
    if len(freshness.series) != 1 or not math.isfinite(newest):
        return replace(data, status=QueryStatus.UNPARSABLE, error="freshness query: not one finite timestamp")
    return replace(data, sample_time=newest)


__all__ = [
    "ERROR_TEMPLATE",
    "FRESHNESS_MARK",
    "LABEL_NAMESPACE",
    "LABEL_PAIR",
    "LABEL_POD",
    "LABEL_POOL",
    "LABEL_REVISION",
    "LABEL_ROLE",
    "METRIC_PREFIX_CACHE_HITS",
    "METRIC_PREFIX_CACHE_QUERIES",
    "METRIC_REQUEST_SUCCESS",
    "METRIC_TPOT",
    "METRIC_TPOT_BUCKET",
    "METRIC_TTFT",
    "METRIC_TTFT_BUCKET",
    "ROLE_REGEX",
    "SERIES_LABELS",
    "TEMPLATES",
    "TEMPLATE_HISTOGRAMS",
    "VARIABLES",
    "GateRole",
    "GateTemplate",
    "QueryRenderError",
    "QueryResult",
    "QueryStatus",
    "QueryVars",
    "SampleQueries",
    "Series",
    "attach_freshness",
    "compute_rate_window",
    "format_duration",
    "freshness_of",
    "freshness_query",
    "gate_query_text",
    "gate_role",
    "parse_prom_duration",
    "parse_query_response",
    "parse_sample_value",
    "query_digest",
    "query_selectors",
    "render_query",
    "template_sample_queries",
]
