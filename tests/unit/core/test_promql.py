"""PromQL templates, variable rendering, and the exact parser of Prometheus query responses."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.api.pool import GATE_TEMPLATES
from tandem.core.promql import (
    SERIES_LABELS,
    TEMPLATES,
    QueryRenderError,
    QueryResult,
    QueryStatus,
    QueryVars,
    Series,
    attach_freshness,
    compute_rate_window,
    format_duration,
    freshness_of,
    freshness_query,
    gate_query_text,
    gate_role,
    parse_prom_duration,
    parse_query_response,
    parse_sample_value,
    query_digest,
    query_selectors,
    render_query,
)

VARS = QueryVars(namespace="ml", pool="speed", revision="7f3a9c2e1b", role="any", interval="1m")


def test_templates_cover_every_template_the_api_accepts() -> None:
    assert set(TEMPLATES) == set(GATE_TEMPLATES)


def test_series_label_contract_is_the_documented_six_labels() -> None:
    assert SERIES_LABELS == ("namespace", "pool", "revision", "role", "pair", "pod")


@pytest.mark.parametrize(
    ("template", "want_metric", "want_role", "want_prefix"),
    [
        pytest.param(
            "TTFTP90", "vllm:time_to_first_token_seconds_bucket", "decode", "histogram_quantile(0.9,", id="ttft p90"
        ),
        pytest.param(
            "TTFTP95", "vllm:time_to_first_token_seconds_bucket", "decode", "histogram_quantile(0.95,", id="ttft p95"
        ),
        pytest.param(
            "TPOTP90",
            "vllm:request_time_per_output_token_seconds_bucket",
            "decode",
            "histogram_quantile(0.9,",
            id="tpot p90",
        ),
        pytest.param(
            "TokensPerSecondPerUser",
            "vllm:request_time_per_output_token_seconds_bucket",
            "decode",
            "1 / histogram_quantile(0.9,",
            id="tok/s per user is 1/TPOT p90",
        ),
        pytest.param("ErrorRate", "vllm:request_success_total", "decode", "(sum(rate(", id="error rate"),
        pytest.param(
            "LocalKVHitRatio", "vllm:prefix_cache_hits_total", "prefill", "sum(rate(", id="local kv hit ratio"
        ),
    ],
)
def test_render_template_selects_the_revision_and_the_template_role(
    template: str, want_metric: str, want_role: str, want_prefix: str
) -> None:
    role = gate_role(template, "any")
    out = render_query(gate_query_text(template, None), QueryVars("ml", "speed", "7f3a9c2e1b", role, "1m"))
    assert role == want_role
    assert out.startswith(want_prefix)
    assert want_metric in out
    assert f'role=~"{want_role}"' in out
    assert 'namespace="ml",pool="speed",revision="7f3a9c2e1b"' in out
    assert "[1m]" in out
    assert "${" not in out


def test_error_rate_template_divides_error_finishes_by_all_finishes() -> None:
    out = render_query(TEMPLATES["ErrorRate"].query, VARS)
    numerator, denominator = out.split(" / ")
    assert 'finished_reason="error"' in numerator and "or vector(0)" in numerator
    assert "finished_reason" not in denominator


def test_local_kv_hit_ratio_divides_hits_by_queries() -> None:
    out = render_query(TEMPLATES["LocalKVHitRatio"].query, VARS)
    hits = r"sum\(rate\(vllm:prefix_cache_hits_total\{.*\}\[1m\]\)\)"
    queries = r"sum\(rate\(vllm:prefix_cache_queries_total\{.*\}\[1m\]\)\)"
    assert re.fullmatch(f"{hits} / {queries}", out)


@pytest.mark.parametrize(
    ("template", "role", "want"),
    [
        pytest.param("TTFTP90", "any", "decode", id="any on a template means the template's role"),
        pytest.param("TTFTP90", "prefill", "prefill", id="an explicit role wins over the template"),
        pytest.param(None, "any", "any", id="user query keeps any"),
        pytest.param(None, "decode", "decode", id="user query keeps decode"),
    ],
)
def test_gate_role(template: str | None, role: str, want: str) -> None:
    assert gate_role(template, role) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "want"),
    [
        pytest.param(
            'sum(rate(x{pool="${pool}",role=~"${role}"}[${interval}]))',
            'sum(rate(x{pool="speed",role=~"prefill|decode"}[1m]))',
            id="role any is a regex matching both roles",
        ),
        pytest.param(
            'x{namespace="${namespace}", revision="${revision}"}',
            'x{namespace="ml", revision="7f3a9c2e1b"}',
            id="equality matchers",
        ),
        pytest.param('x{pod=~"${pool}-p[0-9]+-decode-0"}', 'x{pod=~"speed-p[0-9]+-decode-0"}', id="inside a regex"),
        pytest.param("x{pool='${pool}'}", "x{pool='speed'}", id="single quotes"),
        pytest.param("x{pool=`${pool}`}", "x{pool=`speed`}", id="raw string"),
        pytest.param('x{a="\\"${pool}\\""}', 'x{a="\\"speed\\""}', id="escaped quotes keep the string open"),
        pytest.param(
            'x # ${anything} $pool\ny{p="${pool}"}', 'x # ${anything} $pool\ny{p="speed"}', id="comments untouched"
        ),
        pytest.param(
            'label_replace(x, "w", "${interval}", "", "")',
            'label_replace(x, "w", "1m", "", "")',
            id="interval in a string",
        ),
        pytest.param('x{a=~"foo$"}', 'x{a=~"foo$"}', id="a regex anchor is not a variable"),
    ],
)
def test_render_query(query: str, want: str) -> None:
    assert render_query(query, VARS) == want


def test_render_escapes_regex_metacharacters_only_inside_regex_matchers() -> None:
    v = QueryVars(namespace="ml", pool="speed", revision="v1.2", role="decode", interval="30s")
    assert render_query('x{revision="${revision}"}', v) == 'x{revision="v1.2"}'
    # In a regex the dot must be a literal: \. in RE2, written "\\." in a PromQL string.
    assert render_query('x{revision=~"${revision}"}', v) == 'x{revision=~"v1\\\\.2"}'
    assert render_query('x{revision!~ "${revision}"}', v) == 'x{revision!~ "v1\\\\.2"}'


@pytest.mark.parametrize(
    ("query", "variables", "want_message"),
    [
        pytest.param('x{a="${foo}"}', VARS, "unknown variable ${foo}", id="unknown variable"),
        pytest.param('x{a="${Pool}"}', VARS, "unknown variable ${Pool}", id="variables are case-sensitive"),
        pytest.param("x{pool=${pool}}", VARS, 'e.g. pool="${pool}"', id="unquoted pool"),
        pytest.param('x{role="${role}"}', VARS, 'role=~"${role}"', id="role outside a regex matcher"),
        pytest.param("x[${role}]", VARS, "inside a quoted label matcher", id="role outside any string"),
        pytest.param('x{pool="$pool"}', VARS, "write variables as ${name}", id="grafana-style variable"),
        pytest.param('x{pool="${pool"}', VARS, "malformed variable", id="unterminated placeholder"),
        pytest.param('x{pool="${pool}}', VARS, "unterminated string", id="unterminated string"),
        pytest.param("   ", VARS, "empty", id="blank query"),
        pytest.param(
            'x{pool="${pool}"}', QueryVars("ml", 'a"b', "r", "any", "1m"), "not a Kubernetes name", id="bad pool"
        ),
        pytest.param(
            'x{a="${namespace}"}', QueryVars("ML", "p", "r", "any", "1m"), "not a Kubernetes name", id="bad namespace"
        ),
        pytest.param(
            'x{a="${revision}"}', QueryVars("ml", "p", "r 1", "any", "1m"), "not a label value", id="bad revision"
        ),
        pytest.param(
            "rate(x[${interval}])", QueryVars("ml", "p", "r", "any", "30 s"), "Prometheus duration", id="bad interval"
        ),
        pytest.param(
            'x{a=~"${role}"}', QueryVars("ml", "p", "r", "both", "1m"), "prefill, decode or any", id="bad role"
        ),  # type: ignore[arg-type]
    ],
)
def test_render_query_rejects(query: str, variables: QueryVars, want_message: str) -> None:
    with pytest.raises(QueryRenderError) as err:
        render_query(query, variables)
    assert want_message in str(err.value)


def test_gate_query_text_needs_a_template_or_a_query() -> None:
    assert gate_query_text(None, "up") == "up"
    assert gate_query_text("TTFTP90", "ignored") == TEMPLATES["TTFTP90"].query
    with pytest.raises(QueryRenderError):
        gate_query_text(None, None)
    with pytest.raises(QueryRenderError):
        gate_query_text("NoSuchTemplate", None)


@pytest.mark.parametrize(
    ("seconds", "want"),
    [
        pytest.param(30, "30s", id="seconds"),
        pytest.param(90, "1m30s", id="minutes and seconds"),
        pytest.param(3600, "1h", id="hour"),
        pytest.param(1.5, "1500ms", id="milliseconds"),
        pytest.param(0.0004, "1ms", id="rounded up to a millisecond"),
    ],
)
def test_format_duration(seconds: float, want: str) -> None:
    assert format_duration(seconds) == want
    assert parse_prom_duration(want) == pytest.approx(max(seconds, 0.001))


@pytest.mark.parametrize(
    ("interval_s", "scrape_s", "want"),
    [
        pytest.param(30, 15, "1m", id="4 scrapes beat the interval"),
        pytest.param(30, 5, "30s", id="the interval beats 4 scrapes"),
        pytest.param(10, 1, "10s", id="test cluster"),
    ],
)
def test_compute_rate_window(interval_s: float, scrape_s: float, want: str) -> None:
    assert compute_rate_window(interval_s, scrape_s) == want


# --- sample values and responses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("0.25", 0.25, id="decimal"),
        pytest.param("-2", -2.0, id="negative"),
        pytest.param("1e-3", 0.001, id="exponent"),
        pytest.param("+Inf", math.inf, id="+Inf"),
        pytest.param("Inf", math.inf, id="Inf"),
        pytest.param("-Inf", -math.inf, id="-Inf"),
    ],
)
def test_parse_sample_value(text: str, want: float) -> None:
    assert parse_sample_value(text) == want


def test_parse_sample_value_nan() -> None:
    assert math.isnan(parse_sample_value("NaN"))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(" 1", id="leading space"),
        pytest.param("1_000", id="underscore"),
        pytest.param("infinity", id="infinity"),
        pytest.param("0x10", id="hex"),
        pytest.param("nan ", id="trailing space"),
        pytest.param("1.0.0", id="two dots"),
    ],
)
def test_parse_sample_value_rejects_what_prometheus_never_sends(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sample_value(text)


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("http_status", "body", "want_status", "want_series", "want_type"),
    [
        pytest.param(
            200,
            _body(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"metric": {"a": "b"}, "value": [1.5, "0.1"]}]},
                }
            ),
            QueryStatus.OK,
            1,
            "vector",
            id="one series",
        ),
        pytest.param(
            200,
            _body({"status": "success", "data": {"resultType": "vector", "result": []}}),
            QueryStatus.OK,
            0,
            "vector",
            id="empty",
        ),
        pytest.param(
            200,
            _body({"status": "success", "data": {"resultType": "scalar", "result": [1, "NaN"]}}),
            QueryStatus.OK,
            1,
            "scalar",
            id="scalar",
        ),
        pytest.param(
            200,
            _body(
                {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"], [2, "2"]]}]},
                }
            ),
            QueryStatus.OK,
            1,
            "matrix",
            id="matrix keeps the newest sample",
        ),
        pytest.param(
            200,
            _body({"status": "success", "data": {"resultType": "string", "result": [1, "hello"]}}),
            QueryStatus.OK,
            1,
            "string",
            id="string",
        ),
        pytest.param(200, b"<html>proxy</html>", QueryStatus.UNPARSABLE, 0, "", id="not json"),
        pytest.param(200, _body({"status": "error"}), QueryStatus.UNPARSABLE, 0, "", id="200 without success"),
        pytest.param(200, _body({"status": "success"}), QueryStatus.UNPARSABLE, 0, "", id="no data"),
        pytest.param(
            200,
            _body({"status": "success", "data": {"resultType": "blob", "result": []}}),
            QueryStatus.UNPARSABLE,
            0,
            "",
            id="unknown type",
        ),
        pytest.param(
            200,
            _body(
                {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, 0.5]}]}}
            ),
            QueryStatus.UNPARSABLE,
            0,
            "",
            id="value not a string",
        ),
        pytest.param(
            200,
            _body(
                {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "abc"]}]}}
            ),
            QueryStatus.UNPARSABLE,
            0,
            "",
            id="value not a number",
        ),
        pytest.param(
            200,
            _body(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"metric": {}, "histogram": [1, {}]}]},
                }
            ),
            QueryStatus.UNPARSABLE,
            0,
            "",
            id="native histogram sample",
        ),
        pytest.param(
            200,
            _body(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"metric": {}, "value": [True, "1"]}]},
                }
            ),
            QueryStatus.UNPARSABLE,
            0,
            "",
            id="boolean timestamp",
        ),
        pytest.param(
            400,
            _body({"status": "error", "errorType": "bad_data", "error": "parse error"}),
            QueryStatus.HTTP_ERROR,
            0,
            "",
            id="400",
        ),
        pytest.param(503, b"Service Unavailable", QueryStatus.HTTP_ERROR, 0, "", id="503 plain text"),
    ],
)
def test_parse_query_response(
    http_status: int, body: bytes, want_status: QueryStatus, want_series: int, want_type: str
) -> None:
    out = parse_query_response(http_status, body, query="q")
    assert out.status is want_status
    assert len(out.series) == want_series
    assert out.result_type == want_type
    assert out.query == "q"
    assert out.http_status == http_status


def test_parse_query_response_keeps_warnings_infos_and_error_text() -> None:
    ok = parse_query_response(
        200,
        _body(
            {
                "status": "success",
                "warnings": ["partial response"],
                "infos": ["metric might not be a counter"],
                "data": {"resultType": "vector", "result": []},
            }
        ),
    )
    assert ok.warnings == ("partial response",) and ok.infos == ("metric might not be a counter",)
    bad = parse_query_response(422, _body({"status": "error", "errorType": "execution", "error": "many-to-many"}))
    assert bad.error == "execution: many-to-many"
    assert parse_query_response(503, b"x" * 5000).error.endswith("…")


def test_parse_query_response_keeps_raw_value_strings() -> None:
    doc = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "+Inf"]}]}}
    assert parse_query_response(200, _body(doc)).series[0].value == "+Inf"


# --- fuzzing --------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    status=st.sampled_from([200, 200, 400, 422, 503]),
    body=st.binary(max_size=200) | _json.map(lambda d: json.dumps(d).encode()),
)
def test_parse_query_response_never_raises_on_garbage(status: int, body: bytes) -> None:
    out = parse_query_response(status, body)
    assert out.status in (QueryStatus.OK, QueryStatus.UNPARSABLE, QueryStatus.HTTP_ERROR)
    assert (out.status is QueryStatus.HTTP_ERROR) == (status != 200)


_envelope_result = st.fixed_dictionaries(
    {
        "metric": st.one_of(st.none(), _json, st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
        "value": _json,
    }
)


@settings(max_examples=300, deadline=None)
@given(result=st.lists(_envelope_result, max_size=3), rtype=st.sampled_from(["vector", "matrix", "scalar", "string"]))
def test_parse_query_response_is_ok_only_with_well_formed_samples(result: list[object], rtype: str) -> None:
    out = parse_query_response(200, _body({"status": "success", "data": {"resultType": rtype, "result": result}}))
    if out.status is QueryStatus.OK:
        for s in out.series:
            assert isinstance(s.value, str) and isinstance(s.timestamp, float)
            if rtype != "string":
                parse_sample_value(s.value)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_sample_values_round_trip_exactly(x: float) -> None:
    # Prometheus renders floats as Go's shortest repr: NaN, +Inf, -Inf or a decimal/exponent.
    text = "NaN" if math.isnan(x) else ("+Inf" if x == math.inf else "-Inf" if x == -math.inf else repr(x))
    doc = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, text]}]}}
    out = parse_query_response(200, _body(doc))
    assert out.status is QueryStatus.OK
    assert out.series[0].value == text
    back = parse_sample_value(text)
    assert (math.isnan(back) and math.isnan(x)) or back == x


# --- freshness (issue 19 item 7) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "want"),
    [
        pytest.param('up{pool="p"}', ('up{pool="p"}',), id="one selector"),
        pytest.param(
            'sum(rate(a{pool="p"}[1m])) / sum(rate(b:c{pool="p"}[1m]))',
            ('a{pool="p"}', 'b:c{pool="p"}'),
            id="two selectors, range stripped",
        ),
        pytest.param(
            'histogram_quantile(0.9, sum by (le) (rate(x_bucket{role=~"a|b"}[5m])))',
            ('x_bucket{role=~"a|b"}',),
            id="by (le) is not a selector",
        ),
        pytest.param('rate(x{v="}{"}[1m]) + rate(x{v="}{"}[1m])', ('x{v="}{"}',), id="braces in a value, repeated"),
        pytest.param('vector(0) or {__name__="m"}', ('{__name__="m"}',), id="no name before the braces"),
        pytest.param("# a{b}\nvector(1)", (), id="braces in a comment"),
        pytest.param("vector(1) + up", (), id="bare names are not found"),
        pytest.param('up{pool="p"', (), id="unbalanced"),
    ],
)
def test_query_selectors_finds_braced_selectors_outside_strings_and_comments(query: str, want: tuple[str, ...]) -> None:
    assert query_selectors(query) == want


def test_freshness_query_takes_the_oldest_newest_sample_of_each_selector() -> None:
    q = 'sum(rate(a{pool="p"}[1m])) / sum(rate(b{pool="p"}[1m]))'
    fresh = freshness_query(q)
    assert fresh is not None
    assert fresh.startswith(
        'min(label_replace(max(timestamp(a{pool="p"})), "tandem_selector", "0", "", "") or '
        'label_replace(max(timestamp(b{pool="p"})), "tandem_selector", "1", "", ""))\n'
    )
    assert freshness_of(fresh) == query_digest(q) and freshness_of(q) is None
    one = 'up{a="b"}'
    assert freshness_query(one) == f"max(timestamp({one}))\n# tandem: freshness of {query_digest(one)}"
    assert freshness_query("vector(1)") is None


def _ok(*values: str) -> QueryResult:
    return QueryResult(
        QueryStatus.OK, http_status=200, result_type="vector", series=tuple(Series({}, 100.0, v) for v in values)
    )


@pytest.mark.parametrize(
    ("data", "freshness", "want_status", "want_time"),
    [
        pytest.param(_ok("0.4"), None, QueryStatus.OK, None, id="no freshness query: unknown"),
        pytest.param(_ok("0.4"), _ok("70"), QueryStatus.OK, 70.0, id="newest sample time"),
        pytest.param(_ok("0.4"), _ok(), QueryStatus.OK, 0.0, id="no current sample: stale"),
        pytest.param(
            _ok("0.4"), QueryResult(QueryStatus.TIMEOUT), QueryStatus.TIMEOUT, None, id="freshness failed: data fails"
        ),
        pytest.param(_ok("0.4"), _ok("1", "2"), QueryStatus.UNPARSABLE, None, id="two timestamps"),
        pytest.param(_ok("0.4"), _ok("NaN"), QueryStatus.UNPARSABLE, None, id="NaN timestamp"),
        pytest.param(
            QueryResult(QueryStatus.REFUSED), _ok("70"), QueryStatus.REFUSED, None, id="failed data stays failed"
        ),
    ],
)
def test_attach_freshness(
    data: QueryResult, freshness: QueryResult | None, want_status: QueryStatus, want_time: float | None
) -> None:
    out = attach_freshness(data, freshness)
    assert (out.status, out.sample_time) == (want_status, want_time)
