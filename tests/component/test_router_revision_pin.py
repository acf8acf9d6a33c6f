"""`X-Tandem-Revision` end to end on loopback: the router, engine doubles and routing-table files.

A pinned request is served only by the named revision's serving pairs (walking on inside them), whatever
the canary weight; a router started without ``--allow-revision-header`` refuses the header instead of
ignoring it. See docs/design/005-routing.md, *Pinning a revision*.
"""

from __future__ import annotations

import aiohttp
import pytest

from tandem.router.proxy import HEADER_PAIR, RouterConfig
from tandem.router.server import start_router
from tandem.router.tables import FileSource
from tandem.routing import HEADER_REVISION, Match, Pair, PairState, Revisions, RoutingTable, compute_pair_weights
from tandem_lab.dev.enginedouble import Behaviour
from tests.component.test_router import Lab, make_table, winner

PINNING = RouterConfig(prefill_timeout_s=5, allow_revision_pin=True)
PROMPTS = [f"pinned {i}" for i in range(16)]


async def _rollout(lab: Lab, percent: int) -> tuple[RoutingTable, list[Pair], list[Pair]]:
    """Two stable pairs (r1), two canary pairs (r2) at ``percent``, a warming r2 pair and a draining r1 pair."""
    stable = await lab.pairs(2)
    canary = await lab.pairs(2, revision="r2")
    warming = await lab.pairs(1, revision="r2", state=PairState.WARMING)
    draining = await lab.pairs(1, state=PairState.DRAINING)
    weights = compute_pair_weights([*stable, *canary], "r2", percent)
    weighted = [p.model_copy(update={"weight": weights[p.id]}) for p in [*stable, *canary]]
    table = make_table(
        [*weighted, *warming, *draining],
        revisions=Revisions(stable="r1", canary="r2", canary_weight_percent=percent),
    )
    return table, weighted[:2], weighted[2:]


async def _post(
    client: aiohttp.ClientSession, lab: Lab, prompt: str, pin: str | None
) -> tuple[int, str | None, dict[str, object]]:
    headers = {} if pin is None else {HEADER_REVISION: pin}
    async with client.post(
        lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers=headers
    ) as resp:
        return resp.status, resp.headers.get(HEADER_PAIR), await resp.json()


@pytest.mark.parametrize(
    ("percent", "pin"),
    [
        pytest.param(0, "r2", id="canary at 0 percent, bare revision"),
        pytest.param(10, "ml/speed/r2", id="canary at 10 percent, pool and revision"),
    ],
)
async def test_router_pinned_requests_reach_only_the_canary_pairs(
    lab: Lab, client: aiohttp.ClientSession, percent: int, pin: str
) -> None:
    table, stable, canary = await _rollout(lab, percent)
    await lab.start(table, PINNING)
    if percent == 0:  # no unpinned key reaches the canary: only the pin can
        assert {winner(table, prompt) for prompt in PROMPTS} <= {p.id for p in stable}
    served = set()
    for prompt in PROMPTS:
        status, pair, _ = await _post(client, lab, prompt, pin)
        assert status == 200
        served.add(pair)
    assert served == {p.id for p in canary}  # both canary pairs take keys, nothing else does
    others = [p.id for p in stable] + ["speed-p4", "speed-p5"]  # stable, warming, draining
    assert all(not lab.prefill[pid].requests and not lab.decode[pid].requests for pid in others)


async def test_router_pinned_request_walks_on_inside_the_revision(lab: Lab, client: aiohttp.ClientSession) -> None:
    table, stable, canary = await _rollout(lab, 50)
    await lab.start(table, PINNING)
    bad, good = canary[0].id, canary[1].id
    lab.prefill[bad].behaviour = Behaviour(status=429)
    for prompt in PROMPTS[:6]:
        status, pair, _ = await _post(client, lab, prompt, "r2")
        assert (status, pair) == (200, good)
    assert lab.prefill[bad].requests and not lab.decode[bad].requests
    lab.prefill[good].behaviour = Behaviour(status=503)
    status, pair, body = await _post(client, lab, "both canary pairs full", "r2")
    assert status == table.admission.reject_status
    assert body["error"]["code"] == "all_pairs_full"  # type: ignore[index]
    # Never spilled to a stable pair, although both were idle.
    assert all(not lab.prefill[p.id].requests for p in stable)


@pytest.mark.parametrize(
    ("pin", "want_status", "want_code"),
    [
        pytest.param("r9", 503, "revision_not_serving", id="unknown revision"),
        pytest.param("ml/speed/r3", 503, "revision_not_serving", id="revision with only a warming pair"),
        pytest.param("ml/other/r1", 404, "pool_not_found", id="pool not routed here"),
        pytest.param("a/b", 400, "invalid_revision_pin", id="malformed value"),
        pytest.param("ml/speed/r 1", 400, "invalid_revision_pin", id="revision with a space"),
    ],
)
async def test_router_pinned_request_errors_are_openai_shaped(
    lab: Lab, client: aiohttp.ClientSession, pin: str, want_status: int, want_code: str
) -> None:
    serving = await lab.pairs(2)
    warming = await lab.pairs(1, revision="r3", state=PairState.WARMING)
    await lab.start(make_table([*serving, *warming]), PINNING)
    status, _, body = await _post(client, lab, "x", pin)
    assert status == want_status
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == want_code and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert lab.all_requests() == 0


async def test_router_without_the_flag_refuses_the_header(lab: Lab, client: aiohttp.ClientSession) -> None:
    table, _, _ = await _rollout(lab, 50)
    await lab.start(table)  # RouterConfig default: pinning off
    status, _, body = await _post(client, lab, "x", "r2")
    assert status == 403
    assert body["error"] == {
        "message": "X-Tandem-Revision is not honoured by this router (start it with --allow-revision-header)",
        "type": "permission_error",
        "param": None,
        "code": "revision_pin_disabled",
    }
    assert lab.all_requests() == 0
    status, _, _ = await _post(client, lab, "x", None)
    assert status == 200  # requests without the header are untouched


async def test_router_pool_in_the_pin_overrides_classification(lab: Lab, client: aiohttp.ClientSession) -> None:
    short_pair, long_pair = await lab.pairs(2)
    short = make_table([short_pair], match=Match(max_prompt_tokens=100))
    long = make_table(
        [long_pair.model_copy(update={"id": "long-p0", "index": 0})],
        pool="long",
        traffic_class="long",
        match=Match(min_prompt_tokens=101),
    )
    (lab.tmp / "short.json").write_text(short.to_json())
    (lab.tmp / "long.json").write_text(long.to_json())
    lab.router = await start_router([FileSource([lab.tmp / "short.json", lab.tmp / "long.json"])], config=PINNING)
    # A short prompt classifies into `speed`; pinned to ml/long/r1 it goes to the long pool's pair.
    assert (await _post(client, lab, "short", None))[:2] == (200, "speed-p0")
    assert (await _post(client, lab, "short", "ml/long/r1"))[:2] == (200, "long-p0")
    assert (await _post(client, lab, "short", "r1"))[:2] == (200, "speed-p0")  # bare: classified as usual
