"""The real Prometheus adapter against a tiny local HTTP server (MP-01..MP-04, OP-07, S-SEC-02).

The server answers ``/api/v1/query`` according to the query text, so each test asks for the behaviour
it wants: ``nan``, ``empty``, ``multi``, ``warnings``, ``bad400``, ``bad422``, ``down503``, ``slow``,
``trickle``, ``notjson``, ``redirect``, ``huge``; anything else is one fresh series with value 0.4.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tandem.adapters.prometheus import (
    Credentials,
    CredentialsError,
    GateTarget,
    MetricsProvider,
    PrometheusProvider,
    evaluate_metric_gates,
    read_credentials,
)
from tandem.api.pool import AnalysisSpec, GateComparison, MetricGate
from tandem.core import gates as g
from tandem.core.promql import QueryStatus, freshness_of, parse_prom_duration
from tandem_lab.dev.ports import free_port
from tests.fakes import prometheus as fp

TIMEOUT_S = 0.5
ANSWER_TIMEOUT_S = 20.0
"""For calls that must get their answer: generous, so a loaded 2-core box never turns an answer into a timeout
(these tests are about the answer, not the deadline; the deadline has its own tests with TIMEOUT_S)."""
SLACK_S = 0.5  # scheduling slack on two shared cores; a plain requests timeout lets "trickle" take ~13 s


class _Server:
    """A fake Prometheus HTTP API on 127.0.0.1 that records what it received."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()  # ends slow/trickle replies when the test is done
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                params = {k: v[0] for k, v in parse_qs(parts.query).items()}
                outer.requests.append({"path": parts.path, "params": params, "headers": dict(self.headers)})
                q = params.get("query", "")
                now = time.time()

                def vector(*values: str, warnings: list[str] | None = None) -> bytes:
                    result = [{"metric": {"pod": f"p{i}"}, "value": [now, v]} for i, v in enumerate(values)]
                    doc: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
                    if warnings:
                        doc["warnings"] = warnings
                    return json.dumps(doc).encode()

                if parts.path != "/api/v1/query":
                    self._reply(404, b'{"status":"error","error":"not found"}')
                elif freshness_of(q):  # the answer stamps `now`; the samples of revision stale1 are 2 min old
                    self._reply(200, vector(repr(now - 120 if 'revision="stale1"' in q else now)))
                elif q == "nan":
                    self._reply(200, vector("NaN"))
                elif q == "empty":
                    self._reply(200, vector())
                elif q == "multi":
                    self._reply(200, vector("0.1", "0.2"))
                elif q == "inf":
                    self._reply(200, vector("+Inf"))
                elif q == "warnings":
                    self._reply(200, vector("0.4", warnings=["partial response: store down"]))
                elif q == "bad400":
                    self._reply(400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}')
                elif q == "bad422":
                    self._reply(422, b'{"status":"error","errorType":"execution","error":"many-to-many matching"}')
                elif q == "down503":
                    self._reply(503, b"Service Unavailable")
                elif q == "notjson":
                    self._reply(200, b"<html>login</html>")
                elif q == "redirect":
                    self._reply(302, b"", {"Location": "http://127.0.0.1:1/elsewhere"})
                elif q == "huge":
                    self._reply(200, b"[" + b" " * (9 * 1024 * 1024) + b"]")
                elif q == "slow":
                    outer.release.wait(5)
                    self._reply(200, vector("0.4"))
                elif q == "trickle":  # headers at once, then one byte every 0.1 s: no single read times out
                    body = vector("0.4")
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for b in body:
                        if outer.release.wait(0.1):
                            return
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                else:
                    self._reply(200, vector("0.4"))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.scheme = "https" if tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


@pytest.fixture
def provider(server: _Server) -> Iterator[PrometheusProvider]:
    with PrometheusProvider(server.url) as p:
        yield p


def test_provider_implements_the_protocol(provider: PrometheusProvider) -> None:
    assert isinstance(provider, MetricsProvider)
    assert isinstance(fp.FakePrometheus(), MetricsProvider)


@pytest.mark.parametrize(
    ("query", "want_result", "want_verdict"),
    [
        pytest.param("up", (QueryStatus.OK, 200, 1), ("Success", "SuccessConditionMet"), id="one fresh series"),
        pytest.param("nan", (QueryStatus.OK, 200, 1), ("NoData", "NaN"), id="MP-02 NaN"),
        pytest.param("empty", (QueryStatus.OK, 200, 0), ("NoData", "Empty"), id="MP-02 empty"),
        pytest.param("warnings", (QueryStatus.OK, 200, 1), ("NoData", "Partial"), id="MP-02 warnings"),
        pytest.param("multi", (QueryStatus.OK, 200, 2), ("NoData", "InvalidQueryResult"), id="MP-03 two series"),
        pytest.param("inf", (QueryStatus.OK, 200, 1), ("NoData", "InvalidQueryResult"), id="MP-03 +Inf"),
        pytest.param("bad400", (QueryStatus.HTTP_ERROR, 400, 0), ("Error", "InvalidQuery"), id="MP-04 400"),
        pytest.param("bad422", (QueryStatus.HTTP_ERROR, 422, 0), ("Error", "InvalidQuery"), id="MP-04 422"),
        pytest.param("down503", (QueryStatus.HTTP_ERROR, 503, 0), ("Error", "MetricsUnavailable"), id="MP-04 503"),
        pytest.param("notjson", (QueryStatus.UNPARSABLE, 200, 0), ("Error", "MetricsUnavailable"), id="unparsable"),
        pytest.param(
            "redirect", (QueryStatus.HTTP_ERROR, 302, 0), ("Error", "MetricsUnavailable"), id="redirect not followed"
        ),
        pytest.param(
            "huge", (QueryStatus.UNPARSABLE, None, 0), ("Error", "MetricsUnavailable"), id="body over the cap"
        ),
    ],
)
def test_query_answers(
    provider: PrometheusProvider,
    query: str,
    want_result: tuple[QueryStatus, int | None, int],
    want_verdict: tuple[str, str],
) -> None:
    result = provider.query(query, timeout_s=ANSWER_TIMEOUT_S)
    assert (result.status, result.http_status, len(result.series)) == want_result
    assert result.query == query and result.elapsed_s is not None
    now = datetime.now(UTC)
    window = g.SampleWindow(now=now, step_started_at=now - timedelta(minutes=5), max_age_s=30)
    gate = MetricGate(name="m", query="x", success_condition="result < 1.0")
    v = g.evaluate_gate(gate, result, None, window)
    assert (v.verdict, v.reason) == want_verdict


def test_query_sends_a_server_side_timeout_and_no_retries(server: _Server, provider: PrometheusProvider) -> None:
    provider.query("down503", timeout_s=2)
    assert len(server.requests) == 1  # a 503 is not retried by the client
    params = server.requests[0]["params"]
    assert params["query"] == "down503"
    assert 1.7 <= parse_prom_duration(params["timeout"]) <= 1.8  # 0.9 x what is left of the 2 s
    assert server.requests[0]["path"] == "/api/v1/query"


@pytest.mark.parametrize(
    "query", [pytest.param("slow", id="reply slower than the timeout"), pytest.param("trickle", id="trickling body")]
)
def test_each_call_is_bounded_by_its_timeout(provider: PrometheusProvider, query: str) -> None:
    start = time.monotonic()
    result = provider.query(query, timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert result.status is QueryStatus.TIMEOUT
    assert elapsed < TIMEOUT_S + SLACK_S


def test_refused_connection_is_an_error() -> None:
    with PrometheusProvider(f"http://127.0.0.1:{free_port()}") as p:
        result = p.query("up", timeout_s=2)
    assert result.status is QueryStatus.REFUSED
    assert "Connection" in result.error


def test_accepting_but_silent_server_is_bounded_by_the_timeout() -> None:
    """OP-07: Prometheus accepts TCP but never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # never accept(): the kernel completes handshakes, nobody answers
        with PrometheusProvider(f"http://127.0.0.1:{listener.getsockname()[1]}") as p:
            start = time.monotonic()
            result = p.query("up", timeout_s=TIMEOUT_S)
            elapsed = time.monotonic() - start
    assert result.status is QueryStatus.TIMEOUT
    assert elapsed < TIMEOUT_S + SLACK_S


async def test_aquery_runs_off_the_event_loop(provider: PrometheusProvider) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    result = await provider.aquery("slow", timeout_s=TIMEOUT_S)
    task.cancel()
    assert result.status is QueryStatus.TIMEOUT
    assert ticks >= 5  # the loop kept running while the query waited (~25 ticks when idle)


# --- credentials ----------------------------------------------------------------------------------


def test_credentials_are_re_read_on_every_request(server: _Server, tmp_path: Path) -> None:
    """S-SEC-02: a rotated token is used by the next request, without a restart."""
    (tmp_path / "token").write_text("token-one\n")
    with PrometheusProvider(server.url, credentials_dir=tmp_path) as p:
        p.query("up", timeout_s=ANSWER_TIMEOUT_S)
        (tmp_path / "token").write_text("token-two")
        p.query("up", timeout_s=ANSWER_TIMEOUT_S)
        (tmp_path / "token").unlink()
        (tmp_path / "username").write_text("alice")
        (tmp_path / "password").write_text("s3cret")
        p.query("up", timeout_s=ANSWER_TIMEOUT_S)
    auths = [r["headers"].get("Authorization") for r in server.requests]
    assert auths == ["Bearer token-one", "Bearer token-two", "Basic " + base64.b64encode(b"alice:s3cret").decode()]


@pytest.mark.parametrize(
    ("files", "want_error"),
    [
        pytest.param({"token": "abc\r\nX-Evil: 1"}, "control characters", id="header injection in a token"),
        pytest.param({"username": "alice"}, "both a username and a password", id="username without password"),
    ],
)
def test_unusable_credentials_fail_the_call_without_sending(
    server: _Server, tmp_path: Path, files: dict[str, str], want_error: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with PrometheusProvider(server.url, credentials_dir=tmp_path) as p:
        result = p.query("up", timeout_s=2)
    assert result.status is QueryStatus.REFUSED and want_error in result.error
    assert server.requests == []
    with pytest.raises(CredentialsError):
        read_credentials(tmp_path)


def test_credentials_never_appear_in_reprs(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("super-secret-token")
    creds = read_credentials(tmp_path)
    assert creds.bearer_token == "super-secret-token"
    assert "super-secret" not in repr(creds) and "bearer" in repr(creds)
    assert read_credentials(None) == Credentials()
    assert read_credentials(tmp_path / "missing") == Credentials()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return cert, key


def test_tls_is_verified_and_a_ca_file_in_the_credentials_directory_is_trusted(
    tls_files: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = tls_files
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    tls_server = _Server(tls=ctx)
    creds = tmp_path / "creds"
    creds.mkdir()
    try:
        with PrometheusProvider(tls_server.url, credentials_dir=creds) as p:
            untrusted = p.query("up", timeout_s=2)
            (creds / "ca.crt").write_bytes(cert.read_bytes())
            trusted = p.query("up", timeout_s=ANSWER_TIMEOUT_S)
    finally:
        tls_server.close()
    assert untrusted.status is QueryStatus.REFUSED and "SSL" in untrusted.error
    assert trusted.status is QueryStatus.OK


def test_provider_rejects_non_http_urls() -> None:
    with pytest.raises(ValueError, match="http"):
        PrometheusProvider("ftp://prometheus:9090")


# --- running a step's gates -----------------------------------------------------------------------

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TARGET = GateTarget(
    namespace="ml",
    pool="speed",
    canary_revision="new1",
    stable_revision="old1",
    interval="1m",
    timeout_s=5,
    max_prompt_tokens=131_072,
)
SPEC = AnalysisSpec(initial_delay="60s")


async def test_evaluate_metric_gates_with_the_fake() -> None:
    now = START + timedelta(minutes=5)
    fake = fp.FakePrometheus(now=lambda: now)
    fake.script(lambda q: "time_to_first_token_seconds_count" in q, fp.value("42"))  # minSamples 20 met
    fake.script(lambda q: 'revision="new1"' in q and "time_to_first_token" in q, fp.value("0.70"))
    fake.script(lambda q: 'revision="old1"' in q and "time_to_first_token" in q, fp.value("0.47"))
    fake.script(lambda q: "request_success_total" in q, fp.nan())
    gates = [
        MetricGate(name="ttft", template="TTFTP90", success_condition="result <= baseline * 1.2"),
        MetricGate(name="errors", template="ErrorRate", failure_condition="result > 0.01"),
        MetricGate(name="custom", query='up{pool="${nope}"}', success_condition="result > 0.0"),
    ]
    verdicts = await evaluate_metric_gates(
        fake, gates, TARGET, analysis=SPEC, step_started_at=START, scrape_interval_s=15, clock=lambda: now
    )
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [
        ("ttft", "Failure", "SuccessConditionNotMet"),
        ("errors", "NoData", "NaN"),
        ("custom", "Error", "InvalidQuery"),
    ]
    assert verdicts[0].value == "0.70" and verdicts[0].baseline == "0.47"
    # canary + baseline + canary request count for ttft, canary + its count for errors, each with its
    # freshness query; none for the broken query
    assert len(fake.calls) == 10
    assert sum(1 for q in fake.queries() if freshness_of(q)) == 5


@pytest.mark.parametrize(
    ("reply", "freshness", "want"),
    [
        pytest.param(fp.value("0.4"), None, ("Success", "SuccessConditionMet"), id="inputs scraped now"),
        pytest.param(fp.value("0.4", age_s=30), None, ("Success", "SuccessConditionMet"), id="2 x scrape old"),
        pytest.param(
            fp.stale(90), None, ("NoData", "Stale"), id="series stopped 90 s ago, answer stamped now is still stale"
        ),
        pytest.param(fp.stale(-90), None, ("NoData", "Stale"), id="sample from the future (clock skew)"),
        pytest.param(
            fp.value("0.4"), fp.empty(), ("NoData", "Stale"), id="no input has a current sample (rate window only)"
        ),
        pytest.param(
            fp.value("0.4"), fp.refused(), ("Error", "MetricsUnavailable"), id="freshness unknown is never fresh"
        ),
        pytest.param(
            fp.value("0.4"), fp.multi(), ("Error", "MetricsUnavailable"), id="freshness answer not one timestamp"
        ),
    ],
)
async def test_evaluate_metric_gates_staleness_comes_from_the_samples_not_the_answer(
    reply: fp.Reply, freshness: fp.Reply | None, want: tuple[str, str]
) -> None:
    """Issue 19 item 7: a real instant query stamps its answer with the evaluation time, so a series that
    stopped updating looks fresh; the gate asks for the inputs' own newest sample time and judges that."""
    now = START + timedelta(minutes=5)
    fake = fp.FakePrometheus(now=lambda: now, freshness=freshness)
    fake.always(reply)
    # min_samples=0: this test is about freshness; the sample floor has its own tests
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5", min_samples=0)
    verdicts = await evaluate_metric_gates(
        fake, [gate], TARGET, analysis=SPEC, step_started_at=START, scrape_interval_s=15, clock=lambda: now
    )
    data = [c for c in fake.calls if not freshness_of(c.query)]
    assert {c.result.series[0].timestamp for c in data if c.result.series} <= {now.timestamp()}
    assert [(v.verdict, v.reason) for v in verdicts] == [want]


def _revision(rev: str) -> str:
    return f'revision="{rev}"'


async def test_evaluate_metric_gates_compares_canary_with_stable() -> None:
    """The statistical path end to end: every sample query sent once, answers routed to the right arm."""
    now = START + timedelta(minutes=5)
    fake = fp.FakePrometheus(now=lambda: now)
    new, old = _revision("new1"), _revision("old1")
    tpot = "request_time_per_output_token_seconds"
    fake.script(lambda q: new in q and f"{tpot}_count" in q, fp.value(300))
    fake.script(lambda q: old in q and f"{tpot}_count" in q, fp.value(6000))
    fake.script(lambda q: new in q and f"{tpot}_sum" in q, fp.value(300 * 0.0091))
    fake.script(lambda q: old in q and f"{tpot}_sum" in q, fp.value(6000 * 0.007))
    fake.script(lambda q: new in q and "increase" in q and f"{tpot}_bucket" in q,
                fp.buckets([("0.01", 300), ("0.025", 300), ("+Inf", 300)]))  # fmt: skip
    fake.script(lambda q: old in q and "increase" in q and f"{tpot}_bucket" in q,
                fp.buckets([("0.01", 6000), ("0.025", 6000), ("+Inf", 6000)]))  # fmt: skip
    fake.script(lambda q: tpot in q, fp.value(0.009))  # the p90 itself: the same for both revisions
    fake.script(lambda q: new in q and q.startswith("(sum(increase") and "error" in q, fp.value(1))
    fake.script(lambda q: old in q and q.startswith("(sum(increase") and "error" in q, fp.value(30))
    fake.script(lambda q: new in q and q.startswith("sum(increase(vllm:request_success_total"), fp.value(40))
    fake.script(lambda q: old in q and q.startswith("sum(increase(vllm:request_success_total"), fp.value(6000))
    fake.script(lambda q: "request_success_total" in q, fp.value(0.025))
    gates = [
        MetricGate(name="tpot", template="TPOTP90", compare=GateComparison()),
        MetricGate(name="errors", template="ErrorRate", failure_condition="result > 0.01", compare=GateComparison()),
    ]
    verdicts = await evaluate_metric_gates(
        fake, gates, TARGET, analysis=SPEC, step_started_at=START, scrape_interval_s=15, clock=lambda: now
    )
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [
        ("tpot", "Failure", "SignificantlyWorse"),
        ("errors", "Success", "NotSignificantlyWorse"),
    ]
    assert "x1.3" in verdicts[0].condition and "errors 1/40" in verdicts[1].condition
    # tpot: value x2 + (count, buckets, sum, per-pair count, per-pair sum) x2; errors: value x2 + (count, errors) x2
    data = [c for c in fake.calls if not freshness_of(c.query)]
    assert len(data) == 18 and len({c.query for c in data}) == 18
    assert sum("sum by (pair)" in c.query for c in data) == 4


async def test_a_step_window_gate_queries_the_whole_step_and_runs_the_sequential_errors_test() -> None:
    """``compare.window: Step``: 5 min after the step started (delay 60 s) the errors gate reads ``[5m]`` — the whole
    step, its delay included — while the per-interval gate keeps ``[1m]``; the step gate's errors are judged by Wald's
    sequential test at the gate's own α (valid at every look), the interval gate's by Fisher's."""
    now = START + timedelta(minutes=5)
    fake = fp.FakePrometheus(now=lambda: now)
    new, old = _revision("new1"), _revision("old1")
    fake.script(lambda q: new in q and q.startswith("(sum(increase") and "error" in q, fp.value(9))
    fake.script(lambda q: old in q and q.startswith("(sum(increase") and "error" in q, fp.value(30))
    fake.script(lambda q: new in q and q.startswith("sum(increase(vllm:request_success_total"), fp.value(600))
    fake.script(lambda q: old in q and q.startswith("sum(increase(vllm:request_success_total"), fp.value(6000))
    fake.script(lambda q: "request_success_total" in q, fp.value(0.015))
    step = GateComparison(window="Step")
    gates = [
        MetricGate(name="errors-step", template="ErrorRate", compare=step),
        MetricGate(name="errors", template="ErrorRate", compare=GateComparison()),
    ]
    verdicts = await evaluate_metric_gates(
        fake, gates, TARGET, analysis=SPEC, step_started_at=START, scrape_interval_s=15, clock=lambda: now
    )
    data = [c.query for c in fake.calls if not freshness_of(c.query)]
    assert {q for q in data if "[5m]" in q} and {q for q in data if "[1m]" in q}
    assert not {q for q in data if "[5m]" in q and "[1m]" in q}
    # 9/600 vs 30/6000: Fisher p = 0.0070 < 0.01 fails a one-window gate; Wald's ln LR against +1 point is
    # 9·ln(3.0) − 591·0.0101 = 3.82, mixed with larger increases 3.16 ≤ ln 100: not yet evidence over a step
    # that is looked at every 30 s.
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [
        ("errors-step", "Success", "NotSignificantlyWorse"),
        ("errors", "Failure", "SignificantlyWorse"),
    ]
    assert "step look 9" in verdicts[0].condition and "sequential ln LR 3.16 ≤ 4.61" in verdicts[0].condition
    assert "step look" not in verdicts[1].condition and "sequential" not in verdicts[1].condition


async def test_evaluate_metric_gates_pass_is_bounded_when_prometheus_hangs() -> None:
    """OP-07 at the pass level: the whole pass ends within timeout + 1 s, hung queries count as errors."""
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5")

    class Hanging:
        def query(self, promql: str, *, timeout_s: float) -> Any:
            raise AssertionError("the async path must be used")

        async def aquery(self, promql: str, *, timeout_s: float) -> Any:
            await asyncio.sleep(3600)

    target = GateTarget("ml", "speed", "new1", "old1", "1m", timeout_s=0.2, max_prompt_tokens=131_072)
    start = time.monotonic()
    verdicts = await evaluate_metric_gates(
        Hanging(), [gate], target, analysis=SPEC, step_started_at=START, scrape_interval_s=15, clock=lambda: START
    )
    assert time.monotonic() - start < 0.2 + 1.0 + SLACK_S
    assert [(v.verdict, v.reason) for v in verdicts] == [("Error", "MetricsUnavailable")]


async def test_evaluate_metric_gates_against_the_real_adapter(provider: PrometheusProvider) -> None:
    # The test server answers 0.4 to every query, the request count included: no sample floor here.
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5", min_samples=0)
    started = datetime.now(UTC) - timedelta(minutes=5)
    verdicts = await evaluate_metric_gates(
        provider,
        [gate],
        TARGET,
        analysis=SPEC,
        step_started_at=started,
        scrape_interval_s=15,
        clock=lambda: datetime.now(UTC),
    )
    assert [(v.verdict, v.value) for v in verdicts] == [("Success", "0.4")]
    assert 'revision="new1"' in verdicts[0].query


async def test_evaluate_metric_gates_real_adapter_sees_a_stale_series(
    server: _Server, provider: PrometheusProvider
) -> None:
    """Item 7 over HTTP: the data answer is stamped now, the freshness query says 2 min: NoData Stale."""
    gate = MetricGate(name="ttft", template="TTFTP90", success_condition="result <= 0.5", min_samples=0)
    now = datetime.now(UTC)
    verdicts = await evaluate_metric_gates(
        provider,
        [gate],
        dataclasses.replace(TARGET, canary_revision="stale1"),
        analysis=SPEC,
        step_started_at=now - timedelta(minutes=5),
        scrape_interval_s=15,
        clock=lambda: now,
    )
    assert [(v.verdict, v.reason) for v in verdicts] == [("NoData", "Stale")]
    asked = [r["params"]["query"] for r in server.requests]
    assert len(asked) == 2 and sum(1 for q in asked if q.startswith("max(timestamp(")) == 1
