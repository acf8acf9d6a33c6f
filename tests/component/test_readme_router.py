"""The README's "Try it with engine doubles" walkthrough, as a new user runs it (issue 15, must-show 1).

The same processes the README starts — four ``tandem_lab.dev.enginedouble`` servers and ``tandem router
--routing-table FILE`` on ``examples/router/speed-routing.json`` — as separate processes from their command lines,
and the same requests: ``/v1/models``, a completion, a streamed chat completion with ``X-Request-Id``, ``/ready``
and ``/metrics``; then one prefill double stops and every request is still answered. Only the ports differ: the
example's fixed ports are moved to free ones, so a busy port on the machine cannot fail the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem_lab.dev.ports import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "router" / "speed-routing.json"
START_TIMEOUT_S = 60.0


def _get(url: str, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _wait(url: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args} exited with {p.returncode}"
        try:
            if _get(url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} never answered 200")


@pytest.fixture
def walkthrough(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, subprocess.Popen[bytes]]]]:
    """The README's processes; yields (router URL, metrics URL, the doubles by name)."""
    table = json.loads(EXAMPLE.read_text())
    ports: dict[str, int] = {}
    for pair in table["pairs"]:
        for role in ("prefill", "decode"):
            for endpoint in pair[role]:
                port = free_port()
                ports[f"{pair['id'].removeprefix('speed-')}-{role}"] = port
                endpoint["address"] = f"127.0.0.1:{port}"
    path = tmp_path / "speed-routing.json"
    path.write_text(json.dumps(table))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, port in ports.items():
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tandem_lab.dev.enginedouble",
                    "--name",
                    name,
                    "--port",
                    str(port),
                    "--tokens-per-s",
                    "50",
                ],
                stdout=(logs / f"{name}.log").open("wb"),
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        port, metrics = free_port(), free_port()
        procs["router"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tandem.cli",
                "router",
                "--routing-table",
                str(path),
                "--port",
                str(port),
                "--metrics-port",
                str(metrics),
            ],
            stdout=(logs / "router.log").open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        for p in ports.values():
            _wait(f"http://127.0.0.1:{p}/v1/models", list(procs.values()))
        _wait(f"http://127.0.0.1:{metrics}/ready", list(procs.values()))
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}", procs
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_the_readme_router_walkthrough(walkthrough: tuple[str, str, dict[str, subprocess.Popen[bytes]]]) -> None:
    url, metrics, procs = walkthrough
    status, _, body = _get(f"{url}/v1/models")
    assert status == 200 and "double-model" in [m["id"] for m in json.loads(body)["data"]], body

    status, headers, body = _post(
        f"{url}/v1/completions", {"model": "double-model", "prompt": "Say hello", "max_tokens": 5}
    )
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"], body
    assert headers.get("X-Tandem-Pair") in {"speed-p0", "speed-p1"}, headers

    status, headers, body = _post(
        f"{url}/v1/chat/completions",
        {
            "model": "double-model",
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 3,
            "stream": True,
        },
        {"X-Request-Id": "demo-1"},
    )
    assert status == 200, body
    events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2, body
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["delta"] is not None

    assert _get(f"{metrics}/ready")[0] == 200
    text = _get(f"{metrics}/metrics")[2].decode()
    assert any(line.startswith("tandem_router_requests_total{") for line in text.splitlines()), text[:2000]

    # "Stop one prefill double and keep sending: every request is still answered."
    procs["p0-prefill"].terminate()
    procs["p0-prefill"].wait(timeout=10)
    served = []
    for i in range(20):
        status, headers, body = _post(
            f"{url}/v1/completions", {"model": "double-model", "prompt": f"conversation {i}: hi", "max_tokens": 2}
        )
        assert status == 200, body
        served.append(headers.get("X-Tandem-Pair"))
    assert set(served) == {"speed-p1"}, served
    text = _get(f"{metrics}/metrics")[2].decode()
    assert 'reason="PrefillConnectError"' in text, [line for line in text.splitlines() if "fast_rejects" in line]
