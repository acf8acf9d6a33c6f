"""`tandem eval`: a reference client for the eval gate's Job — exact match over a dataset, N runs per case.

Why Tandem ships one: an eval gate runs any image that honours the Job's contract (``builders.evaljob``:
where to send requests in ``TANDEM_TARGET_URLS`` and the headers every request carries in
``TANDEM_TARGET_HEADERS``, the model in ``TANDEM_MODEL``, ``{"score": <percent>}`` as the termination message).
With a router the operator gives the router's URL and ``X-Tandem-Revision: <namespace>/<pool>/<revision>``, so
each case takes the real P/D path of the canary (``tandem router --allow-revision-header``); without one, the
canary's decode pods and no header. The write-up gates every release on a tool-calling eval with exact match ≥ 98 %
over N runs; this client is that gate's plain form, so a pool can use it as is (the operator image has it)
and the realengine tier can run it against real engines through the router.

Scoring: each case is sent ``--runs`` times with greedy decoding; a run matches when the answer equals the
case's expectation (text: after stripping surrounding whitespace; tool calls: the same function names and
JSON arguments, in order). A failed request (connection, HTTP error, unparsable body) is a miss, never a
skip: a canary that errors must not pass its eval. Targets are used round-robin.

Dataset: JSON Lines, one case per line, either ``{"prompt": str, "expected": str}`` (``/v1/completions``) or
``{"messages": [...], "expected": str}`` / ``{"messages": [...], "tools": [...], "expected_tool_calls":
[{"name": str, "arguments": {...}}]}`` (``/v1/chat/completions``); optional ``max_tokens`` per case.

Exit codes: 0 the eval ran and reported its score (whatever it is: the gate judges it), 2 usage or dataset
errors (no target, unreadable file, a malformed case, malformed headers), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

TERMINATION_LOG: Final = "/dev/termination-log"
DEFAULT_MAX_TOKENS: Final = 64
MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024


class DatasetError(ValueError):
    """A case the client cannot send (reported with its line number)."""


@dataclass(frozen=True)
class Case:
    line: int
    prompt: str | None = None
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    expected: str | None = None
    expected_tool_calls: list[dict[str, Any]] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass
class Score:
    total: int = 0
    matched: int = 0
    errors: int = 0
    misses: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return round(100.0 * self.matched / self.total, 2) if self.total else 0.0

    def report(self) -> dict[str, Any]:
        return {"score": self.percent, "total": self.total, "matched": self.matched, "errors": self.errors}


def parse_case(line_no: int, text: str) -> Case:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"line {line_no}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"line {line_no}: a case must be a JSON object")
    prompt, messages = raw.get("prompt"), raw.get("messages")
    if (prompt is None) == (messages is None):
        raise DatasetError(f"line {line_no}: give exactly one of prompt or messages")
    if prompt is not None and not isinstance(prompt, str):
        raise DatasetError(f"line {line_no}: prompt must be a string")
    if messages is not None and not isinstance(messages, list):
        raise DatasetError(f"line {line_no}: messages must be a list")
    expected, calls = raw.get("expected"), raw.get("expected_tool_calls")
    if (expected is None) == (calls is None):
        raise DatasetError(f"line {line_no}: give exactly one of expected or expected_tool_calls")
    if expected is not None and not isinstance(expected, str):
        raise DatasetError(f"line {line_no}: expected must be a string")
    if calls is not None and (messages is None or not isinstance(calls, list)):
        raise DatasetError(f"line {line_no}: expected_tool_calls needs messages and must be a list")
    max_tokens = raw.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 65_536:
        raise DatasetError(f"line {line_no}: max_tokens must be an integer in 1..65536")
    tools = raw.get("tools")
    return Case(line_no, prompt, messages, tools if isinstance(tools, list) else None, expected, calls, max_tokens)


def load_dataset(path: Path) -> list[Case]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: {exc}") from None
    cases = [parse_case(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not cases:
        raise DatasetError(f"{path}: no cases")
    return cases


def request_body(case: Case, model: str) -> tuple[str, dict[str, Any]]:
    """The endpoint path and the greedy request of one case."""
    body: dict[str, Any] = {"model": model, "max_tokens": case.max_tokens, "temperature": 0}
    if case.prompt is not None:
        return "/v1/completions", {**body, "prompt": case.prompt}
    body["messages"] = case.messages
    if case.tools is not None:
        body["tools"] = case.tools
    return "/v1/chat/completions", body


def _calls(message: dict[str, Any]) -> list[tuple[Any, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "null")
        except ValueError:
            arguments = function.get("arguments")
        out.append((function.get("name"), arguments))
    return out


def matches(case: Case, answer: dict[str, Any]) -> bool:
    """Whether an OpenAI-shaped answer is the case's expectation (module docstring)."""
    choice = (answer.get("choices") or [{}])[0]
    if case.prompt is not None:
        return str(choice.get("text", "")).strip() == (case.expected or "").strip()
    message = choice.get("message") or {}
    if case.expected_tool_calls is not None:
        want = [(c.get("name"), c.get("arguments")) for c in case.expected_tool_calls]
        return _calls(message) == want
    return str(message.get("content") or "").strip() == (case.expected or "").strip()


def parse_headers(flags: Sequence[str], env_json: str) -> dict[str, str]:
    """The request headers: ``--header NAME:VALUE`` flags, else the JSON object of ``TANDEM_TARGET_HEADERS``."""
    if flags:
        out = {}
        for flag in flags:
            name, sep, value = flag.partition(":")
            if not sep or not name.strip():
                raise DatasetError(f"--header {flag!r}: give NAME:VALUE")
            out[name.strip()] = value.strip()
        return out
    if not env_json.strip():
        return {}
    try:
        raw = json.loads(env_json)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"TANDEM_TARGET_HEADERS is not JSON ({exc.msg})") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise DatasetError("TANDEM_TARGET_HEADERS must be a JSON object of strings")
    return raw


def post(url: str, body: dict[str, Any], timeout_s: float, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode()
    sent = {**(headers or {}), "Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=sent, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        payload = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(payload) > MAX_RESPONSE_BYTES:
        raise ValueError("answer larger than 4 MiB")
    out = json.loads(payload)
    if not isinstance(out, dict):
        raise ValueError("answer is not a JSON object")
    return out


def run_eval(
    cases: Sequence[Case],
    targets: Sequence[str],
    model: str,
    runs: int,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Score:
    score = Score()
    turn = 0
    for case in cases:
        path, body = request_body(case, model)
        for _ in range(runs):
            target = targets[turn % len(targets)].rstrip("/")
            turn += 1
            score.total += 1
            try:
                answer = post(target + path, body, timeout_s, headers)
            except (OSError, ValueError, urllib.error.URLError) as exc:
                score.errors += 1
                score.misses.append(f"line {case.line}: {target}: {exc}")
                continue
            if matches(case, answer):
                score.matched += 1
            else:
                score.misses.append(f"line {case.line}: answer differs from the expectation")
    return score


def register(subparsers: Any) -> None:
    cmd = subparsers.add_parser(
        "eval",
        help="run an exact-match eval against the targets of an eval Job (TANDEM_TARGET_URLS) and report the score",
    )
    cmd.add_argument("--dataset", type=Path, required=True, help="JSON Lines cases (see `tandem eval --help`)")
    cmd.add_argument("--runs", type=int, default=1, help="times each case is sent (default 1)")
    cmd.add_argument(
        "--target", action="append", default=[], help="base URL (repeatable; default: $TANDEM_TARGET_URLS)"
    )
    cmd.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="header sent with every request (repeatable; default: the JSON object $TANDEM_TARGET_HEADERS, "
        "e.g. the X-Tandem-Revision pin to the canary when the targets are a router)",
    )
    cmd.add_argument("--model", default=os.environ.get("TANDEM_MODEL", ""), help="model name (default: $TANDEM_MODEL)")
    cmd.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    cmd.add_argument(
        "--termination-log",
        default=None,
        help=f'where to write {{"score": ...}} (default: {TERMINATION_LOG} when it exists)',
    )
    cmd.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    targets = list(args.target) or [u.strip() for u in os.environ.get("TANDEM_TARGET_URLS", "").split(",") if u.strip()]
    if not targets:
        print("tandem eval: no target (give --target or set TANDEM_TARGET_URLS)", file=sys.stderr)
        return 2
    if not args.model:
        print("tandem eval: no model (give --model or set TANDEM_MODEL)", file=sys.stderr)
        return 2
    if args.runs < 1:
        print("tandem eval: --runs must be at least 1", file=sys.stderr)
        return 2
    try:
        headers = parse_headers(args.header, os.environ.get("TANDEM_TARGET_HEADERS", ""))
        cases = load_dataset(args.dataset)
    except DatasetError as exc:
        print(f"tandem eval: {exc}", file=sys.stderr)
        return 2
    score = run_eval(cases, targets, args.model, args.runs, args.timeout, headers)
    for miss in score.misses[:20]:
        print(f"miss: {miss}", file=sys.stderr)
    report = score.report()
    print(json.dumps(report), flush=True)
    log = args.termination_log or (TERMINATION_LOG if Path(TERMINATION_LOG).exists() else None)
    if log:
        try:
            Path(log).write_text(json.dumps({"score": report["score"]}))
        except OSError as exc:
            print(f"tandem eval: cannot write the termination message to {log}: {exc}", file=sys.stderr)
            return 2
    return 0
