"""tandem router admission by engine metrics, and its observability, on loopback with engine doubles.

The router scrapes each serving pair's engines (``/metrics``: running, waiting, KV usage) and a pair is
full when its own counts or its engines say so. Each test drives scrape rounds by hand
(``scraper.scrape_once()``) and, where freshness matters, the scraper's clock: no test waits for a timer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import urllib.request

import aiohttp
import pytest

from tandem.router.proxy import HEADER_PAIR, RequestIdFilter, RouterConfig
from tandem.router.scrape import parse_engine_metrics
from tandem.router.server import start_router
from tandem.router.tables import FileSource
from tandem.routing import Admission, PairLoad, Revisions, RoutingTable, candidates, routing_key
from tandem_lab.dev.enginedouble import Behaviour, EngineDouble
from tests.component.test_router import Lab, _samples, make_table


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def first_choice(table: RoutingTable, prompt: str) -> tuple[str, str]:
    """(first, second) candidate pair ids for ``prompt``."""
    order = candidates(routing_key(prompt, table.hash.prefix_chars), table.pairs)
    return order[0].id, order[1].id


async def metrics_text(lab: Lab, client: aiohttp.ClientSession) -> str:
    assert lab.router is not None and lab.router.metrics_port is not None
    return await (await client.get(f"http://127.0.0.1:{lab.router.metrics_port}/metrics")).text()


ADMISSION = Admission(max_in_flight=4, max_queued=2, max_kv_utilization_percent=90)


@pytest.mark.parametrize(
    ("role", "behaviour", "max_num_seqs", "want_reason"),
    [
        pytest.param("decode", Behaviour(kv_usage=0.95), None, "KvLimit", id="decode KV at 95 % of 90 % limit"),
        pytest.param("prefill", Behaviour(kv_usage=0.9), None, "KvLimit", id="prefill KV at the limit"),
        pytest.param("decode", Behaviour(), 0, "QueueLimit", id="decode with requests waiting"),
    ],
)
async def test_router_walks_past_a_pair_its_engines_report_full(
    lab: Lab,
    client: aiohttp.ClientSession,
    role: str,
    behaviour: Behaviour,
    max_num_seqs: int | None,
    want_reason: str,
) -> None:
    pairs = await lab.pairs(3)
    table = make_table(pairs, admission=ADMISSION)
    router = await lab.start(table)
    prompt = "engine full"
    full, second = first_choice(table, prompt)
    engine = (lab.decode if role == "decode" else lab.prefill)[full]
    engine.behaviour = behaviour
    blocked: list[asyncio.Task[None]] = []
    if max_num_seqs is not None:  # no slot at all: two completions sent straight to the engine wait
        engine.max_num_seqs = max_num_seqs
        blocked = [asyncio.create_task(_post_direct(client, engine)) for _ in range(2)]
        for _ in range(200):
            if engine.waiting == 2:
                break
            await asyncio.sleep(0.01)
        assert engine.waiting == 2
    await router.router.scraper.scrape_once()
    assert router.router.scraper.view("ml/speed")[full].queued == (2 if max_num_seqs is not None else 0)

    async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as resp:
        assert resp.status == 200
        assert resp.headers[HEADER_PAIR] == second
    assert not lab.prefill[full].requests
    assert not [r for r in lab.decode[full].requests if r.kv_transfer_params]  # no decode leg went there
    rejects = _samples(await metrics_text(lab, client), "tandem_router_fast_rejects_total")
    assert rejects == {(("pair", full), ("pool", "ml/speed"), ("reason", want_reason)): 1.0}
    for task in blocked:
        task.cancel()


async def _post_direct(client: aiohttp.ClientSession, engine: EngineDouble) -> None:
    async with client.post(f"http://{engine.address}/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
        await r.read()


async def test_router_stale_engine_view_falls_back_to_own_counts_and_shows_its_age(
    lab: Lab, client: aiohttp.ClientSession
) -> None:
    pairs = await lab.pairs(2)
    table = make_table(pairs, admission=ADMISSION)
    router = await lab.start(table, RouterConfig(prefill_timeout_s=5))
    scraper = router.router.scraper
    clock = FakeClock()
    scraper.clock = clock
    prompt = "stale view"
    full, second = first_choice(table, prompt)
    lab.decode[full].behaviour = Behaviour(kv_usage=1.0)
    await scraper.scrape_once()
    clock.now += 2.0
    age = _samples(await metrics_text(lab, client), "tandem_router_engine_scrape_age_seconds")
    assert sorted(age.values()) == [2.0] * 4  # two pairs x (prefill, decode)
    async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as resp:
        assert resp.headers[HEADER_PAIR] == second  # fresh view: the engine says full

    # Older than scrape_stale_intervals x interval (3 x 3600 s in the lab): own counts only.
    clock.now += 3 * 3600
    assert scraper.view("ml/speed") == {}
    async with client.post(lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as resp:
        assert resp.headers[HEADER_PAIR] == full
    age = _samples(await metrics_text(lab, client), "tandem_router_engine_scrape_age_seconds")
    assert min(age.values()) > 3 * 3600


@pytest.mark.parametrize(
    ("behaviour", "want_reason"),
    [
        pytest.param(Behaviour(metrics_status=500), "HttpStatus", id="metrics page answers 500"),
        pytest.param(Behaviour(metrics_stall_s=5), "Timeout", id="metrics page stalls past the timeout"),
    ],
)
async def test_router_failed_scrape_is_counted_and_keeps_admission_on_own_counts(
    lab: Lab, client: aiohttp.ClientSession, behaviour: Behaviour, want_reason: str
) -> None:
    pairs = await lab.pairs(1)
    table = make_table(pairs, admission=ADMISSION)
    router = await lab.start(table, RouterConfig(prefill_timeout_s=5, scrape_timeout_s=0.2))
    scraper = router.router.scraper
    clock = FakeClock()
    scraper.clock = clock
    decode = lab.decode["speed-p0"]
    decode.behaviour = Behaviour(kv_usage=1.0)
    await scraper.scrape_once()  # full by KV
    assert scraper.view("ml/speed")["speed-p0"].kv_utilization_percent == 100.0
    decode.behaviour = behaviour
    clock.now += 3 * 3600 + 1  # the good sample is now stale, and the next reads fail
    await scraper.scrape_once()
    assert scraper.view("ml/speed") == {"speed-p0": PairLoad()}  # only the prefill's fresh (idle) sample
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as resp:
        assert resp.status == 200
    errors = _samples(await metrics_text(lab, client), "tandem_router_engine_scrape_errors_total")
    assert errors == {
        (("pair", "speed-p0"), ("pod", "speed-p0-decode-0"), ("pool", "ml/speed"), ("reason", want_reason)): 1.0
    }


async def test_router_without_scraping_has_no_engine_view(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(1)
    lab.decode["speed-p0"].behaviour = Behaviour(kv_usage=1.0)
    lab.write(make_table(pairs, admission=ADMISSION))
    lab.router = await start_router([FileSource([lab.path])], config=RouterConfig(scrape_interval_s=0))
    assert lab.router.router.scraper.view("ml/speed") == {}
    async with client.post(lab.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as resp:
        assert resp.status == 200  # KV "full" is not seen: own counts only
    age = _samples(await metrics_text(lab, client), "tandem_router_engine_scrape_age_seconds")
    assert age == {}


# --- the engine double's metrics page ---------------------------------------------------------------


async def test_engine_double_metrics_follow_running_waiting_and_kv(client: aiohttp.ClientSession) -> None:
    double = await EngineDouble(name="d", max_num_seqs=2, behaviour=Behaviour(tokens_per_s=20)).start()
    try:

        async def stream() -> None:
            body = {"prompt": "slow", "max_tokens": 40, "stream": True}
            async with client.post(f"http://{double.address}/v1/completions", json=body) as resp:
                await resp.read()

        tasks = [asyncio.create_task(stream()) for _ in range(3)]
        for _ in range(200):
            if (double.running, double.waiting) == (2, 1):
                break
            await asyncio.sleep(0.01)
        text = await (await client.get(f"http://{double.address}/metrics")).text()
        sample = parse_engine_metrics(text)
        assert (sample.running, sample.waiting, sample.kv_usage) == (2.0, 1.0, 1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await double.stop()


# --- observability -------------------------------------------------------------------------------


async def test_router_health_answers_while_the_request_loop_is_blocked(lab: Lab) -> None:
    pairs = await lab.pairs(1)
    router = await lab.start(make_table(pairs))
    answered = threading.Event()
    got: list[int] = []

    def probe() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/health", timeout=10) as resp:
            got.append(resp.status)
        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10) as resp:
            got.append(resp.status)
        answered.set()

    thread = threading.Thread(target=probe)
    thread.start()
    # Block the request loop (as a request storm would) until the probe has its answers: the health
    # listener runs on its own loop, so it answers while this loop cannot run anything.
    assert answered.wait(timeout=10)
    thread.join()
    assert got == [200, 200]


async def test_router_logs_carry_the_request_id(
    lab: Lab, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    pairs = await lab.pairs(2)
    table = make_table(pairs)
    await lab.start(table, RouterConfig(prefill_timeout_s=5))
    prompt = "logged"
    first, _ = first_choice(table, prompt)
    lab.prefill[first].behaviour = Behaviour(status=503)  # one walk line
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.DEBUG, logger="tandem.router"):
        async with client.post(
            lab.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers={"X-Request-Id": "req-7"}
        ) as resp:
            assert resp.status == 200
    lines = [r for r in caplog.records if r.name.startswith("tandem.router.proxy")]
    assert len(lines) >= 2  # the walk and the result
    assert {getattr(r, "request_id", None) for r in lines} == {"req-7"}
    assert all("req-7" in r.getMessage() for r in lines)


def test_parse_engine_metrics_reads_vllm_032_lines() -> None:
    # Shaped as /work/shared/reference/vllm-0.32-cpu-metrics.txt, plus a second data-parallel engine.
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="tiny"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 9.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="2",model_name="tiny"} NaN\n'
    )
    sample = parse_engine_metrics(text)
    assert (sample.running, sample.waiting, sample.kv_usage) == (5.0, 1.0, 0.5)
    assert not math.isnan(sample.kv_usage)


async def test_router_metrics_per_pool_pair_and_revision(lab: Lab, client: aiohttp.ClientSession) -> None:
    pairs = await lab.pairs(2, revision="r7")
    table = make_table(pairs, revisions=Revisions(stable="r7"))
    router = await lab.start(table, RouterConfig(prefill_timeout_s=5))
    prompt = "observed"
    first, second = first_choice(table, prompt)
    lab.prefill[first].behaviour = Behaviour(status=503)
    body = {"prompt": prompt, "max_tokens": 3, "stream": True}
    async with client.post(lab.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers[HEADER_PAIR] == second
        await resp.read()
    text = await metrics_text(lab, client)
    labels = (("pair", second), ("pool", "ml/speed"), ("revision", "r7"))
    assert _samples(text, "tandem_router_requests_total") == {(("outcome", "ok"), *labels): 1.0}
    assert _samples(text, "tandem_router_ttft_seconds_count") == {labels: 1.0}
    assert _samples(text, "tandem_router_request_duration_seconds_count") == {labels: 1.0}
    legs = _samples(text, "tandem_router_leg_duration_seconds_count")
    assert legs == {(("leg", "decode"), *labels): 1.0, (("leg", "prefill"), *labels): 1.0}
    assert _samples(text, "tandem_router_walk_length_count") == {(("pool", "ml/speed"),): 1.0}
    assert _samples(text, "tandem_router_walk_length_sum") == {(("pool", "ml/speed"),): 2.0}
    rejects = _samples(text, "tandem_router_fast_rejects_total")
    assert rejects == {(("pair", first), ("pool", "ml/speed"), ("reason", "Prefill503")): 1.0}
    info = _samples(text, "tandem_router_table_info")
    assert [dict(k)["fingerprint"] for k in info] == [router.store.snapshot[0].fingerprint]
    assert list(_samples(text, "tandem_router_table_age_seconds")) == [(("pool", "ml/speed"),)]
