"""`tandem eval` (the eval Job's reference client) against a live engine double: score, misses, errors, the
termination message, and refused datasets (exit 2, never a traceback)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem import cli
from tandem.evalclient import DatasetError, load_dataset, parse_case, post
from tandem_lab.dev.enginedouble import EngineDouble

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    double = asyncio.run_coroutine_threadsafe(
        EngineDouble(name="e", host="127.0.0.1", port=0, model=MODEL).start(), loop
    ).result(30)
    yield f"http://127.0.0.1:{double.port}"
    asyncio.run_coroutine_threadsafe(double.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _answer(engine: str, prompt: str) -> str:
    out = post(f"{engine}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}, 30)
    return str(out["choices"][0]["text"])


def _dataset(tmp_path: Path, cases: list[dict[str, object]]) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


def test_scores_exact_matches_over_runs_and_writes_the_termination_message(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        {"prompt": "what is a canary?", "expected": _answer(engine, "what is a canary?"), "max_tokens": 8},
        {"prompt": "and a pair?", "expected": _answer(engine, "and a pair?"), "max_tokens": 8},
        {"prompt": "wrong on purpose", "expected": "not what the engine says", "max_tokens": 8},
        {"messages": [{"role": "user", "content": "hi"}], "expected": "no chat answer is this", "max_tokens": 8},
    ]
    log = tmp_path / "termination-log"
    rc = cli.main(
        [
            "eval",
            "--dataset",
            str(_dataset(tmp_path, cases)),
            "--runs",
            "3",
            "--target",
            engine,
            "--model",
            MODEL,
            "--termination-log",
            str(log),
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == {"score": 50.0, "total": 12, "matched": 6, "errors": 0}
    assert json.loads(log.read_text()) == {"score": 50.0}


def test_failed_requests_are_misses_not_skips(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target that refuses connections costs its share of the score: an erroring canary cannot pass."""
    expected = _answer(engine, "ping")
    monkeypatch.setenv("TANDEM_TARGET_URLS", f"{engine},http://127.0.0.1:9")
    monkeypatch.setenv("TANDEM_MODEL", MODEL)
    dataset = _dataset(tmp_path, [{"prompt": "ping", "expected": expected, "max_tokens": 8}])
    assert cli.main(["eval", "--dataset", str(dataset), "--runs", "4", "--termination-log", str(tmp_path / "t")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == {"score": 50.0, "total": 4, "matched": 2, "errors": 2}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("[1, 2]", "must be a JSON object", id="not an object"),
        pytest.param("{oops", "not JSON", id="not JSON"),
        pytest.param('{"expected": "x"}', "exactly one of prompt or messages", id="no prompt"),
        pytest.param('{"prompt": "p"}', "exactly one of expected", id="no expectation"),
        pytest.param('{"prompt": "p", "expected_tool_calls": []}', "needs messages", id="tool calls on a prompt"),
        pytest.param('{"prompt": "p", "expected": "x", "max_tokens": 0}', "max_tokens", id="zero tokens"),
        pytest.param('{"prompt": 3, "expected": "x"}', "prompt must be a string", id="prompt not a string"),
    ],
)
def test_malformed_cases_name_their_line(line: str, message: str) -> None:
    with pytest.raises(DatasetError, match=message) as err:
        parse_case(7, line)
    assert "line 7" in str(err.value)


def test_bad_input_exits_2_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe not utf-8")
    assert cli.main(["eval", "--dataset", str(bad), "--target", "http://x", "--model", MODEL]) == 2
    assert cli.main(["eval", "--dataset", str(tmp_path / "missing"), "--target", "http://x", "--model", MODEL]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="no cases"):
        load_dataset(empty)
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("tandem eval:") == 2


def test_tool_calls_match_by_name_and_json_arguments() -> None:
    from tandem.evalclient import matches  # noqa: PLC0415

    case = parse_case(
        1,
        json.dumps(
            {
                "messages": [{"role": "user", "content": "weather?"}],
                "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
            }
        ),
    )
    call = {"function": {"name": "get_weather", "arguments": '{"city":  "Paris"}'}}
    assert matches(case, {"choices": [{"message": {"tool_calls": [call]}}]})
    other = {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    assert not matches(case, {"choices": [{"message": {"tool_calls": [other]}}]})
    assert not matches(case, {"choices": [{"message": {"content": "sunny"}}]})
