"""`tandem eval` through `tandem router` pinned to the canary (the eval Job's path when the operator knows a
router): every case takes the P/D legs of a canary pair only, whatever the canary's weight, and a router that
does not honour the pin costs the eval its whole score instead of silently scoring the stable revision."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tandem import cli
from tandem.evalclient import DatasetError, parse_headers
from tandem.router.proxy import RouterConfig
from tandem.routing import HEADER_REVISION, PairState, Revisions, compute_pair_weights
from tests.component.test_router import Lab, make_table

PROMPTS = [f"eval case {i}" for i in range(6)]


async def _canary_at_zero(lab: Lab, config: RouterConfig) -> tuple[set[str], set[str]]:
    """Two stable pairs (r1) and two canary pairs (r2) at 0 %: no unpinned request reaches the canary."""
    stable = await lab.pairs(2)
    canary = await lab.pairs(2, revision="r2")
    weights = compute_pair_weights([*stable, *canary], "r2", 0)
    pairs = [p.model_copy(update={"weight": weights[p.id]}) for p in [*stable, *canary]]
    await lab.start(make_table(pairs, revisions=Revisions(stable="r1", canary="r2", canary_weight_percent=0)), config)
    return {p.id for p in stable}, {p.id for p in canary}


async def _expected(lab: Lab, prompt: str) -> str:
    """What the doubles answer (a pure function of the prompt), read from a decode double directly."""
    import aiohttp  # noqa: PLC0415

    any_decode = next(iter(lab.decode.values()))
    async with aiohttp.ClientSession() as session:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
        async with session.post(f"http://{any_decode.address}/v1/completions", json=body) as resp:
            return str((await resp.json())["choices"][0]["text"])


async def _run_eval(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pin: str) -> dict[str, object]:
    cases = [{"prompt": p, "expected": await _expected(lab, p), "max_tokens": 4} for p in PROMPTS]
    for double in lab.decode.values():
        double.requests.clear()
    dataset = tmp_path / "cases.jsonl"
    dataset.write_text("".join(json.dumps(c) + "\n" for c in cases))
    monkeypatch.setenv("TANDEM_TARGET_URLS", lab.url)
    monkeypatch.setenv("TANDEM_MODEL", "any")
    monkeypatch.setenv("TANDEM_TARGET_HEADERS", json.dumps({HEADER_REVISION: pin}))
    out = tmp_path / "termination-log"
    # The client is synchronous (urllib); the router runs on this test's loop, so the client gets a thread.
    argv = ["eval", "--dataset", str(dataset), "--runs", "2", "--termination-log", str(out)]
    assert await asyncio.to_thread(cli.main, argv) == 0
    return dict(json.loads(out.read_text()))


async def test_eval_through_the_router_reaches_only_the_canary_pairs(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stable, canary = await _canary_at_zero(lab, RouterConfig(prefill_timeout_s=5, allow_revision_pin=True))
    assert await _run_eval(lab, tmp_path, monkeypatch, "ml/speed/r2") == {"score": 100.0}
    decoded = {pid for pid, d in lab.decode.items() if d.requests}
    assert decoded and decoded <= canary
    assert all(not lab.prefill[pid].requests for pid in stable)
    # Every case went prefill then decode on a canary pair: kv_transfer_params reached the decode leg.
    legs = [r for pid in canary for r in lab.decode[pid].requests]
    assert len(legs) == 2 * len(PROMPTS)
    assert all((r.body.get("kv_transfer_params") or {}).get("do_remote_prefill") for r in legs)


async def test_eval_against_a_router_without_the_flag_scores_zero(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _canary_at_zero(lab, RouterConfig(prefill_timeout_s=5))
    assert await _run_eval(lab, tmp_path, monkeypatch, "ml/speed/r2") == {"score": 0.0}
    assert all(not d.requests for d in lab.decode.values())


async def test_eval_pinned_to_a_revision_without_serving_pairs_scores_zero(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stable = await lab.pairs(1)
    warming = await lab.pairs(1, revision="r2", state=PairState.WARMING)
    await lab.start(make_table([*stable, *warming]), RouterConfig(prefill_timeout_s=5, allow_revision_pin=True))
    assert await _run_eval(lab, tmp_path, monkeypatch, "ml/speed/r2") == {"score": 0.0}
    assert all(not d.requests for d in lab.decode.values())


@pytest.mark.parametrize(
    ("flags", "env", "want"),
    [
        pytest.param([], "", {}, id="nothing"),
        pytest.param([], '{"X-Tandem-Revision": "llm/speed/r2"}', {"X-Tandem-Revision": "llm/speed/r2"}, id="env"),
        pytest.param(["A: 1", "B:2"], '{"X": "y"}', {"A": "1", "B": "2"}, id="flags win over env"),
    ],
)
def test_parse_headers(flags: list[str], env: str, want: dict[str, str]) -> None:
    assert parse_headers(flags, env) == want


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        pytest.param(["no-colon"], "", id="flag without colon"),
        pytest.param([], "{oops", id="env not JSON"),
        pytest.param([], '["a"]', id="env not an object"),
        pytest.param([], '{"a": 1}', id="env value not a string"),
    ],
)
def test_parse_headers_refuses_malformed_input(flags: list[str], env: str) -> None:
    with pytest.raises(DatasetError):
        parse_headers(flags, env)
