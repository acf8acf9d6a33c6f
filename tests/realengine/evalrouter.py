"""Realengine fixture: `tandem router --allow-revision-header` in front of a two-revision rollout in which only
the canary is real (the eval Job's path when the operator knows a router, issue 16).

The table is examples/router/speed-routing.json with two pairs: the stable revision's ``speed-p0`` points at
a loopback port nothing listens on, and the canary revision's ``speed-p1`` at the session's real prefill and
decode engines (NixlConnector) with canary weight 0 %. So an unpinned request can only reach the stable pair
(and fails), and only the ``X-Tandem-Revision`` pin reaches the real engines: a score from them proves the
pin took the request through the router's P/D legs. The engines are conftest.py's session engines; no engine
is started here (kept in its own module beside conftest.py, which another change edits).
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tandem.evalclient import post
from tandem.routing import HEADER_REVISION
from tandem_lab.dev.ports import free_port
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import REPO
from tests.realengine.routerproc import example_pair, router_on

STABLE = "v32"
CANARY = "v33"


@dataclass(frozen=True)
class PinnedRouter:
    url: str
    pin: str
    """The ``X-Tandem-Revision`` value of the canary, as the operator writes it (``namespace/pool/revision``)."""
    log: Path


def _table(prefill: BuiltEngine, decode: BuiltEngine, served_name: str) -> dict[str, object]:
    table = json.loads((REPO / "examples" / "router" / "speed-routing.json").read_text())
    dead = f"127.0.0.1:{free_port()}"  # bound and released by free_port: nothing listens there
    stable = example_pair(0, STABLE, 100, dead, dead)
    # weight 0: compute_pair_weights at 0 %, no unpinned key
    canary = example_pair(1, CANARY, 0, f"127.0.0.1:{prefill.engine.port}", f"127.0.0.1:{decode.engine.port}")
    table.update(
        pairs=[stable, canary],
        servedModelName=served_name,
        revisions={"stable": STABLE, "canary": CANARY, "canaryWeightPercent": 0},
    )
    return table


@pytest.fixture(scope="module")
def pinned_router(
    prefill: BuiltEngine, decode: BuiltEngine, served_name: str, scratch: Path, logs: Path
) -> Iterator[PinnedRouter]:
    table = _table(prefill, decode, served_name)
    with router_on(table, "router-pinned", scratch, logs, "--allow-revision-header") as (url, _):
        pinned = PinnedRouter(url, f"{table['namespace']}/{table['pool']}/{CANARY}", logs / "router-pinned.log")
        _warm(pinned, served_name, prefill, decode)
        yield pinned


def _warm(router: PinnedRouter, served_name: str, prefill: BuiltEngine, decode: BuiltEngine) -> None:
    """One pinned P/D request before the tests (the NIXL handshake, if conftest's router has not run it yet),
    with nothing else in flight. No retry: a failure fails the tests with both engines' log tails."""
    body = {"model": served_name, "prompt": "def warm(self):", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    try:
        out = post(f"{router.url}/v1/completions", body, 120, {HEADER_REVISION: router.pin})
    except (OSError, ValueError, urllib.error.HTTPError) as exc:
        pytest.fail(
            f"the first pinned P/D request through the router failed: {exc}\n"
            f"--- router log ---\n{router.log.read_text()[-4000:]}\n"
            f"--- prefill log ---\n{prefill.engine.tail()}\n--- decode log ---\n{decode.engine.tail()}",
            pytrace=False,
        )
    assert out["usage"]["completion_tokens"] == body["max_tokens"], out
