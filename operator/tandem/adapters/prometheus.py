"""Prometheus I/O: the one metrics interface (:class:`MetricsProvider`) and its real implementation.

What it owns: sending instant queries to Prometheus and returning a pure
:class:`~tandem.core.promql.QueryResult`; reading the Prometheus credentials; running the gates of an
analysis step against a provider (:func:`evaluate_metric_gates`: the I/O between
``core.gaterun.gate_queries`` and ``core.gaterun.judge``).

What it must not do: judge values (``core.gates`` does), log or return credentials, run a blocking
call on the event loop, or retry on its own (the analysis retries once per interval).

Invariants:

- **Every call is bounded by its timeout**, end to end: the HTTP request runs on a worker thread of
  the provider and the caller waits at most ``timeout_s`` for it (a server that accepts the connection
  and then trickles bytes cannot stretch the call); Prometheus also gets a server-side ``timeout``
  slightly shorter, so it usually answers 503 itself first. No client retries.
- **TLS verification is always on** (there is no option to turn it off); a CA file in the credentials
  directory replaces the system trust store. Proxy and CA settings from the environment and
  ``~/.netrc`` are ignored (``trust_env = False``), so nothing outside the credentials directory can
  change where the token goes or what is trusted.
- **Credentials are re-read on every request** from files in one directory (the Secret
  ``tandem-prometheus`` mounted read-only, security.md S-SEC-01/02), so a rotated Secret is used
  without a restart: ``token`` (bearer), else ``username`` + ``password`` (basic auth), optional
  ``ca.crt``. An unreadable or malformed file makes the call fail (``refused``), never fall back to
  sending nothing.
- Redirects are not followed (a 3xx is an HTTP error); the response body is capped (8 MiB).

Why not ``PrometheusConnect.custom_query``: it returns only ``data.result`` (dropping ``warnings``,
``resultType`` and the HTTP status, which the verdict rules need) and, by default, retries 5xx with
backoff (which breaks the timeout bound). We use the client's session set-up with retries off and
call ``/api/v1/query`` on that session ourselves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol, Self, runtime_checkable
from urllib.parse import urlsplit

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from requests.auth import HTTPBasicAuth
from urllib3.util.retry import Retry

from tandem.api.pool import AnalysisSpec, MetricGate
from tandem.api.pool_status import GateVerdict
from tandem.core.gaterun import gate_queries, judge, step_range
from tandem.core.gates import SampleWindow
from tandem.core.promql import (
    QueryResult,
    QueryStatus,
    format_duration,
    parse_prom_duration,
    parse_query_response,
)

log = logging.getLogger(__name__)

TOKEN_FILE: Final = "token"
USERNAME_FILE: Final = "username"
PASSWORD_FILE: Final = "password"
CA_FILE: Final = "ca.crt"
MAX_RESPONSE_BYTES: Final = 8 * 1024 * 1024
QUERY_PATH: Final = "/api/v1/query"
USER_AGENT: Final = "tandem-operator"


@runtime_checkable
class MetricsProvider(Protocol):
    """Instant PromQL queries. Implementations never raise for a failed query: they return a result."""

    def query(self, promql: str, *, timeout_s: float) -> QueryResult:
        """Run ``promql`` as an instant query; return within ``timeout_s``. Blocking: never call it on the loop."""
        ...

    async def aquery(self, promql: str, *, timeout_s: float) -> QueryResult:
        """:meth:`query` off the event loop (``asyncio.to_thread``)."""
        ...


# --- credentials ----------------------------------------------------------------------------------


class CredentialsError(ValueError):
    """The credentials directory holds something unusable (the message never contains a secret)."""


@dataclass(frozen=True, repr=False)
class Credentials:
    """Credentials read from files for one request."""

    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None

    def __repr__(self) -> str:  # never print secrets
        kind = "bearer" if self.bearer_token else "basic" if self.username else "none"
        return f"Credentials(auth={kind}, ca_file={self.ca_file})"


def _secret(path: Path, what: str) -> str | None:
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        return None
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise CredentialsError(f"{what} file {path.name} contains control characters")
    return text


def read_credentials(directory: Path | None) -> Credentials:
    """Read the credential files in ``directory`` (None or missing directory → no credentials).

    A ``token`` wins over ``username``/``password``; a username without a password (or the reverse) is
    an error. Raises :class:`CredentialsError` or ``OSError``.
    """
    if directory is None or not directory.is_dir():
        return Credentials()
    token = _secret(directory / TOKEN_FILE, "token")
    username = _secret(directory / USERNAME_FILE, "username")
    password = _secret(directory / PASSWORD_FILE, "password")
    ca = directory / CA_FILE
    ca_file = ca if ca.is_file() else None
    if token:
        return Credentials(bearer_token=token, ca_file=ca_file)
    if bool(username) != bool(password):
        raise CredentialsError("basic auth needs both a username and a password file")
    return Credentials(username=username, password=password, ca_file=ca_file)


# --- the real provider ----------------------------------------------------------------------------


class _ResponseTooLargeError(Exception):
    pass


class _DeadlinePassedError(Exception):
    pass


class PrometheusProvider:
    """:class:`MetricsProvider` over Prometheus's HTTP API (``GET /api/v1/query``)."""

    def __init__(
        self,
        url: str,
        *,
        credentials_dir: Path | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_workers: int = 8,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"Prometheus address must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self._credentials_dir = credentials_dir
        self._max_bytes = max_response_bytes
        session = requests.Session()
        session.trust_env = False
        session.verify = True
        # The client mounts its HTTP adapter on our session; retries off: one try per call.
        self._client = PrometheusConnect(
            url=self.url, session=session, retry=Retry(total=0, connect=0, read=0, status=0, raise_on_status=False)
        )
        self._session = session
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tandem-prom")

    def __repr__(self) -> str:
        return f"PrometheusProvider(url={self.url!r}, credentials_dir={self._credentials_dir})"

    def query(self, promql: str, *, timeout_s: float) -> QueryResult:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        start = time.monotonic()
        future = self._pool.submit(self._request, promql, start + timeout_s)
        try:
            result = future.result(timeout=max(0.0, start + timeout_s - time.monotonic()))
        except concurrent.futures.TimeoutError:
            future.cancel()  # the worker's own socket timeouts end it soon after
            result = QueryResult(QueryStatus.TIMEOUT, query=promql, error=f"no complete answer within {timeout_s:g}s")
        return replace(result, elapsed_s=time.monotonic() - start)

    async def aquery(self, promql: str, *, timeout_s: float) -> QueryResult:
        return await asyncio.to_thread(self.query, promql, timeout_s=timeout_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _request(self, promql: str, deadline: float) -> QueryResult:
        """The blocking HTTP exchange (on a worker thread)."""

        def failed(status: QueryStatus, error: str) -> QueryResult:
            return QueryResult(status, query=promql, error=error[:512])

        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return failed(QueryStatus.TIMEOUT, "deadline passed before the request was sent")
        try:
            creds = read_credentials(self._credentials_dir)
        except (OSError, CredentialsError) as exc:
            return failed(QueryStatus.REFUSED, f"credentials unusable: {exc}")
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        auth: HTTPBasicAuth | None = None
        if creds.bearer_token:
            headers["Authorization"] = f"Bearer {creds.bearer_token}"
        elif creds.username and creds.password:
            auth = HTTPBasicAuth(creds.username, creds.password)
        verify: bool | str = str(creds.ca_file) if creds.ca_file else True
        params = {"query": promql, "timeout": format_duration(max(0.001, remaining * 0.9))}
        try:
            with self._session.get(
                self.url + QUERY_PATH,
                params=params,
                headers=headers,
                auth=auth,
                verify=verify,
                timeout=(remaining, remaining),
                stream=True,
                allow_redirects=False,
            ) as resp:
                body = self._read_body(resp, deadline)
                status_code = resp.status_code
        except (requests.exceptions.Timeout, _DeadlinePassedError) as exc:
            return failed(QueryStatus.TIMEOUT, f"timed out: {type(exc).__name__}")
        except _ResponseTooLargeError:
            return failed(QueryStatus.UNPARSABLE, f"response larger than {self._max_bytes} bytes")
        except requests.exceptions.RequestException as exc:
            if _is_read_timeout(exc):
                return failed(QueryStatus.TIMEOUT, f"timed out: {type(exc).__name__}")
            # Refused, reset, DNS, TLS verification... The message names the host, never the headers.
            return failed(QueryStatus.REFUSED, f"{type(exc).__name__}: {_first_line(exc)}")
        return parse_query_response(status_code, body, query=promql)

    def _read_body(self, resp: requests.Response, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in resp.iter_content(chunk_size=65536):
            size += len(chunk)
            if size > self._max_bytes:
                raise _ResponseTooLargeError
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise _DeadlinePassedError
        return b"".join(chunks)


def _is_read_timeout(exc: BaseException) -> bool:
    """requests raises a read timeout met while streaming the body as a ConnectionError wrapping urllib3's
    ReadTimeoutError (not as requests' Timeout): it is still a timeout, not a refused connection."""
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args) or (
        isinstance(exc, requests.exceptions.ConnectionError) and "Read timed out" in str(exc)
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:300]


# --- running the gates of a step ------------------------------------------------------------------


@dataclass(frozen=True)
class GateTarget:
    """What the gates of one analysis pass query."""

    namespace: str
    pool: str
    canary_revision: str
    stable_revision: str | None
    interval: str
    """The rendered ``${interval}`` (``core.promql.compute_rate_window``)."""
    timeout_s: float
    """Per-query timeout (``analysis.timeout``)."""
    max_prompt_tokens: int
    """The longest prompt the pool admits (``InferencePoolSpec.longest_prompt``): a ``LocalKVHitRatio``
    comparison needs it, so a target without it cannot be built (no silent default for a statistical bound)."""


async def evaluate_metric_gates(
    provider: MetricsProvider,
    gates: Sequence[MetricGate],
    target: GateTarget,
    *,
    analysis: AnalysisSpec,
    step_started_at: datetime,
    scrape_interval_s: float,
    clock: Callable[[], datetime],
) -> list[GateVerdict]:
    """Query every gate (canary, baseline, and the sample counts it needs) concurrently; return verdicts.

    What to ask and the judgement are ``tandem.core.gaterun`` (:func:`gate_queries`, :func:`judge`, which
    the simulator calls too); this function only sends the queries. The whole pass is bounded by
    ``timeout_s`` (+1 s of slack): a query still running then counts as a timeout (Error
    ``MetricsUnavailable``). A query that cannot be rendered is Error ``InvalidQuery``. The sample window
    is taken from ``clock()`` after the answers arrive.
    """
    started = clock()
    try:
        rate_window_s = parse_prom_duration(target.interval)
    except ValueError:
        rate_window_s = 0.0  # every gate is an InvalidQuery verdict (gate_queries cannot render it)
    plan = gate_queries(
        gates,
        namespace=target.namespace,
        pool=target.pool,
        canary_revision=target.canary_revision,
        stable_revision=target.stable_revision,
        interval=target.interval,
        now=started,
        step_interval=step_range(
            now=started,
            step_started_at=step_started_at,
            rate_window_s=rate_window_s,
        ),
        max_prompt_tokens=target.max_prompt_tokens,
    )
    for p in plan.gates:
        if p.invalid is not None:
            log.warning("gate %s: query not renderable: %s", p.gate.name, p.error)
    # Each query goes with its freshness query (core.promql.freshness_query), concurrently: the answer's
    # own timestamp is the evaluation time, so only the freshness query can say a series went stale.
    tasks = {q: asyncio.ensure_future(provider.aquery(q, timeout_s=target.timeout_s)) for q in plan.asked()}
    answers: dict[str, QueryResult] = {}
    if tasks:
        done, pending = await asyncio.wait(tasks.values(), timeout=target.timeout_s + 1.0)
        for text, task in tasks.items():
            if task in done and task.exception() is None:
                answers[text] = task.result()
            else:
                task.cancel()
                error = "no answer within the analysis timeout" if task in pending else repr(task.exception())
                answers[text] = QueryResult(QueryStatus.TIMEOUT, query=text, error=error[:512])

    window = SampleWindow.for_analysis(
        analysis,
        now=clock(),
        step_started_at=step_started_at,
        scrape_interval_s=scrape_interval_s,
        rate_window_s=rate_window_s,
    )
    return judge(plan, answers, window)


__all__ = [
    "CA_FILE",
    "PASSWORD_FILE",
    "TOKEN_FILE",
    "USERNAME_FILE",
    "Credentials",
    "CredentialsError",
    "GateTarget",
    "MetricsProvider",
    "PrometheusProvider",
    "evaluate_metric_gates",
    "read_credentials",
]
