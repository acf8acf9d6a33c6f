"""A scriptable fake :class:`~tandem.adapters.prometheus.MetricsProvider` (tests only).

Script replies per query (exact text, a compiled regex searched in the query, or a predicate); each
script is a queue whose last reply repeats (unless ``repeat_last=False``). Unmatched queries get the
default reply (an empty vector: "not scraped"). Like a real Prometheus, every answer is stamped with
the evaluation time (the injected clock); the *age* of a reply (``stale(age_s=90)``, ``value(v,
age_s=...)``) is the age of the newest raw sample behind it, and the fake reveals it only to the
freshness query of that data query (``core.promql.freshness_query``), answered from the reply it last
gave to the data query. A ``slow`` reply longer than the call's timeout is a timeout, and the fake
reports the time it "took" through ``advance`` (no real sleeps).

    fake = FakePrometheus(now=clock.now, advance=clock.advance)
    fake.script(re.compile('revision="canary"'), value("0.7"), nan(), refused())
    fake.query(q, timeout_s=5)     # 0.7, then NaN, then refused for ever
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from tandem.core.promql import (
    QueryResult,
    QueryStatus,
    Series,
    attach_freshness,
    freshness_of,
    freshness_query,
    query_digest,
)

Matcher = str | re.Pattern[str] | Callable[[str], bool]
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Reply:
    """One scripted answer: ``build(now_unix_s, query) -> QueryResult``, after ``delay_s`` of "work"."""

    build: Callable[[float, str], QueryResult]
    delay_s: float = 0.0
    label: str = ""
    sample_age_s: float | None = None
    """Age of the newest raw sample behind the answer (None: no series, the freshness answer is empty)."""


def _ok(
    series: Sequence[tuple[Mapping[str, str], float, str]], *, result_type: str = "vector", warnings: Sequence[str] = ()
) -> Reply:
    def build(now: float, query: str) -> QueryResult:
        # A real instant query stamps every series with the evaluation time, whatever the samples' age.
        return QueryResult(
            QueryStatus.OK,
            query=query,
            http_status=200,
            warnings=tuple(warnings),
            result_type=result_type,
            series=tuple(Series(dict(labels), now, v) for labels, _age, v in series),
        )

    return Reply(build, sample_age_s=min((age for _, age, _ in series), default=None))


def freshness_answer(reply: Reply, now: float, query: str) -> QueryResult:
    """What Prometheus answers to the freshness query of a data query that got ``reply``."""
    series = () if reply.sample_age_s is None else (Series({}, now, repr(now - reply.sample_age_s)),)
    return QueryResult(QueryStatus.OK, query=query, http_status=200, result_type="vector", series=series)


def answer(reply: Reply, now: float, query: str = 'q{pool="speed"}') -> QueryResult:
    """The data answer to ``query`` with its freshness attached, as the adapter combines them (pure tests)."""
    data = reply.build(now, query)
    fresh = freshness_query(query)
    return attach_freshness(data, None if fresh is None else freshness_answer(reply, now, fresh))


def _fmt(v: str | float) -> str:
    if isinstance(v, str):
        return v
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def value(v: str | float, *, age_s: float = 0.0, labels: Mapping[str, str] | None = None) -> Reply:
    """One fresh series with value ``v`` (a float, or the raw string Prometheus would send)."""
    return replace(_ok([(labels or {}, age_s, _fmt(v))]), label=f"value({_fmt(v)})")


def scalar(v: str | float, *, age_s: float = 0.0) -> Reply:
    return replace(_ok([({}, age_s, _fmt(v))], result_type="scalar"), label=f"scalar({_fmt(v)})")


def nan() -> Reply:
    return replace(value("NaN"), label="nan")


def inf(sign: int = 1) -> Reply:
    return replace(value("+Inf" if sign > 0 else "-Inf"), label="inf")


def empty() -> Reply:
    return replace(_ok([]), label="empty")


def multi(*values: str | float) -> Reply:
    """Several series where one is expected (e.g. a missing ``sum``)."""
    vals = values or ("0.1", "0.2")
    return replace(_ok([({"pod": f"pod-{i}"}, 0.0, _fmt(v)) for i, v in enumerate(vals)]), label="multi")


def buckets(cumulative: Sequence[tuple[str, str | float]], *, age_s: float = 0.0) -> Reply:
    """A ``sum by (le)`` answer: one series per ``(le, cumulative count)``, e.g. ``[("0.01", 40), ("+Inf", 40)]``."""
    return replace(_ok([({"le": le}, age_s, _fmt(v)) for le, v in cumulative]), label="buckets")


def by_pair(values: Mapping[str, str | float], *, age_s: float = 0.0) -> Reply:
    """A ``sum by (pair)`` answer: one series per ``pair`` label, e.g. ``{"speed-p1": 900, "speed-p2": 880}``."""
    return replace(_ok([({"pair": p}, age_s, _fmt(v)) for p, v in values.items()]), label="by_pair")


def matrix(v: str | float = "0.1") -> Reply:
    return replace(_ok([({}, 0.0, _fmt(v))], result_type="matrix"), label="matrix")


def stale(age_s: float, v: str | float = "0.1") -> Reply:
    return replace(value(v, age_s=age_s), label=f"stale({age_s})")


def partial(*warnings: str, v: str | float = "0.1") -> Reply:
    """A value with Prometheus ``warnings`` (partial data)."""
    w = warnings or ("partial response: store unavailable",)
    return replace(_ok([({}, 0.0, _fmt(v))], warnings=w), label="partial")


def http(status: int, error: str = "", error_type: str = "") -> Reply:
    def build(now: float, query: str) -> QueryResult:
        return QueryResult(
            QueryStatus.HTTP_ERROR,
            query=query,
            http_status=status,
            error=f"{error_type or 'error'}: {error or f'HTTP {status}'}",
        )

    return Reply(build, label=f"http({status})")


def _status(status: QueryStatus, error: str) -> Reply:
    return Reply(lambda now, query: QueryResult(status, query=query, error=error), label=status.value)


def refused() -> Reply:
    return _status(QueryStatus.REFUSED, "ConnectionError: [Errno 111] Connection refused")


def timeout() -> Reply:
    return _status(QueryStatus.TIMEOUT, "timed out")


def unparsable() -> Reply:
    return _status(QueryStatus.UNPARSABLE, "body is not JSON")


def slow(delay_s: float, then: Reply | None = None) -> Reply:
    """``then`` (default: a value 0.1) after ``delay_s``; a timeout when ``delay_s`` ≥ the call's timeout."""
    inner = then or value("0.1")
    return replace(inner, delay_s=delay_s, label=f"slow({delay_s}, {inner.label})")


def raw(result: QueryResult) -> Reply:
    """A prepared result, returned as is (its query replaced by the one asked)."""
    return Reply(lambda now, query: replace(result, query=query), label="raw")


@dataclass
class FakeCall:
    query: str
    timeout_s: float
    reply: str
    elapsed_s: float
    result: QueryResult


@dataclass
class _Script:
    matcher: Matcher
    replies: list[Reply]
    repeat_last: bool

    def matches(self, query: str) -> bool:
        if isinstance(self.matcher, str):
            return self.matcher == query
        if isinstance(self.matcher, re.Pattern):
            return self.matcher.search(query) is not None
        return bool(self.matcher(query))


@dataclass
class FakePrometheus:
    """The fake provider. ``now`` gives the sample clock; ``advance`` is told how long each call took."""

    now: Callable[[], datetime] = lambda: EPOCH
    advance: Callable[[float], None] | None = None
    default: Reply = field(default_factory=empty)
    calls: list[FakeCall] = field(default_factory=list)
    freshness: Reply | None = None
    """A fixed reply to every freshness query (e.g. ``refused()``); None: answered from the data reply."""
    _scripts: list[_Script] = field(default_factory=list)
    _answered: dict[str, Reply] = field(default_factory=dict)

    def script(self, matcher: Matcher, *replies: Reply, repeat_last: bool = True) -> FakePrometheus:
        """Queue ``replies`` for queries that ``matcher`` selects (earlier scripts are tried first)."""
        if not replies:
            raise ValueError("script at least one reply")
        self._scripts.append(_Script(matcher, list(replies), repeat_last))
        return self

    def always(self, reply: Reply) -> FakePrometheus:
        """Reply ``reply`` to every query no script matches."""
        self.default = reply
        return self

    def _next(self, query: str) -> Reply:
        for s in self._scripts:
            if s.matches(query) and s.replies:
                if len(s.replies) > 1 or not s.repeat_last:
                    return s.replies.pop(0)
                return s.replies[0]
        return self.default

    def query(self, promql: str, *, timeout_s: float) -> QueryResult:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        source = freshness_of(promql)
        if source is not None:  # before the scripts: a regex on a label would match its selectors too
            data = self._answered.get(source, empty())
            reply = self.freshness or Reply(
                lambda now, q: freshness_answer(data, now, q), delay_s=data.delay_s, label="freshness"
            )
        else:
            reply = self._next(promql)
            self._answered[query_digest(promql)] = reply
        if reply.delay_s >= timeout_s:
            elapsed = timeout_s
            result = QueryResult(QueryStatus.TIMEOUT, query=promql, error=f"no answer within {timeout_s:g}s")
        else:
            elapsed = reply.delay_s
            result = reply.build(self.now().timestamp() + elapsed, promql)
        if self.advance is not None and elapsed > 0:
            self.advance(elapsed)
        result = replace(result, elapsed_s=elapsed)
        self.calls.append(FakeCall(promql, timeout_s, reply.label, elapsed, result))
        return result

    async def aquery(self, promql: str, *, timeout_s: float) -> QueryResult:
        # Nothing blocks in the fake, so no thread is needed.
        return self.query(promql, timeout_s=timeout_s)

    def queries(self) -> list[str]:
        return [c.query for c in self.calls]


__all__ = [
    "EPOCH",
    "FakeCall",
    "FakePrometheus",
    "Reply",
    "answer",
    "empty",
    "freshness_answer",
    "http",
    "inf",
    "matrix",
    "multi",
    "nan",
    "partial",
    "raw",
    "refused",
    "scalar",
    "slow",
    "stale",
    "timeout",
    "unparsable",
    "value",
]
