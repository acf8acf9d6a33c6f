"""The test metrics exporter: vLLM names and buckets, determinism, scripted behaviour, modes, HTTP API."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem_lab.dev.exporter import (
    FINISHED_REASONS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Behaviour,
    EnginePod,
    Exporter,
    make_pair_pods,
)

DECODE = "speed-p0-decode-0"
PREFILL = "speed-p0-prefill-0"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(seed: int = 1, **behaviour: float) -> tuple[Exporter, Clock]:
    clock = Clock()
    exp = Exporter(seed=seed, clock=clock, tick_s=0.5, default=Behaviour(**behaviour))  # type: ignore[arg-type]
    exp.add_pods(make_pair_pods(namespace="ml", pool="speed", revision="r1", pairs=1))
    return exp, clock


def samples(exp: Exporter, pod: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = exp.render(pod)
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def buckets(exp: Exporter, pod: str, metric: str) -> list[tuple[float, float]]:
    got = samples(exp, pod)
    return sorted((float(dict(labels)["le"]), v) for (name, labels), v in got.items() if name == f"{metric}_bucket")


def quantile(bs: list[tuple[float, float]], q: float) -> float:
    """histogram_quantile over cumulative buckets (linear inside the bucket, as Prometheus does)."""
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return math.nan


def test_vllm_names_labels_and_bucket_bounds() -> None:
    exp, clock = make()
    clock.t += 10
    got = samples(exp, DECODE)
    names = {name for name, _ in got}
    for want in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert want in names, want
    assert [le for le, _ in buckets(exp, DECODE, "vllm:time_to_first_token_seconds")] == [*TTFT_BUCKETS, math.inf]
    assert [le for le, _ in buckets(exp, DECODE, "vllm:request_time_per_output_token_seconds")] == [
        *TPOT_BUCKETS,
        math.inf,
    ]
    reasons = {dict(labels)["finished_reason"] for name, labels in got if name == "vllm:request_success_total"}
    assert reasons == set(FINISHED_REASONS)  # every reason exists from the start, errors included (at 0)
    assert all(dict(labels).keys() >= {"model_name", "engine"} for _, labels in got)


def test_same_seed_and_clock_give_the_same_metrics() -> None:
    a, ca = make(seed=7)
    b, cb = make(seed=7)
    c, cc = make(seed=8)
    for clock in (ca, cb, cc):
        clock.t += 20
    assert a.render(DECODE) == b.render(DECODE)
    assert a.render(DECODE) != c.render(DECODE)


def test_counters_grow_and_histograms_stay_cumulative() -> None:
    exp, clock = make(request_rate=20)
    before = samples(exp, DECODE)
    clock.t += 5
    after = samples(exp, DECODE)
    for key, v in after.items():
        if key[0].endswith(("_total", "_count", "_bucket", "_sum")):
            assert v >= before.get(key, 0.0), key
    counts = [c for _, c in buckets(exp, DECODE, "vllm:time_to_first_token_seconds")]
    assert counts == sorted(counts) and counts[-1] == pytest.approx(100, abs=1)


def test_ttft_multiplier_moves_p90_across_a_vllm_bucket_bound() -> None:
    exp, clock = make(request_rate=20)
    clock.t += 30
    good = quantile(buckets(exp, DECODE, "vllm:time_to_first_token_seconds"), 0.9)
    slow_exp, slow_clock = make(request_rate=20, ttft_multiplier=1.5)
    slow_clock.t += 30
    slow = quantile(buckets(slow_exp, DECODE, "vllm:time_to_first_token_seconds"), 0.9)
    assert 0.25 < good <= 0.5 < slow <= 0.75
    prefill = quantile(buckets(exp, PREFILL, "vllm:time_to_first_token_seconds"), 0.9)
    assert prefill <= good


def test_error_rate_and_idle_revision() -> None:
    exp, clock = make(request_rate=20, error_rate=0.05)
    clock.t += 60
    got = samples(exp, DECODE)
    errors = got[
        ("vllm:request_success_total", (("engine", "0"), ("finished_reason", "error"), ("model_name", "tandem-test")))
    ]
    total = sum(v for (name, _), v in got.items() if name == "vllm:request_success_total")
    assert total == pytest.approx(1200, abs=2) and errors / total == pytest.approx(0.05, abs=0.02)
    idle, idle_clock = make(request_rate=0)
    idle_clock.t += 60
    assert all(c == 0 for _, c in buckets(idle, DECODE, "vllm:time_to_first_token_seconds"))


def test_a_change_applies_from_now_on_and_never_rewrites_the_past() -> None:
    exp, clock = make(request_rate=20)
    clock.t += 10
    exp.set_revision("r1", request_rate=0)  # brings every pod up to now first
    clock.t += 10
    assert buckets(exp, DECODE, "vllm:time_to_first_token_seconds")[-1][1] == pytest.approx(200, abs=1)


@pytest.mark.parametrize(
    ("mode", "want_status", "want_body"),
    [
        pytest.param("empty", 200, b"", id="target up, no series"),
        pytest.param("down", 503, b"engine down\n", id="scrape fails"),
    ],
)
def test_pod_modes_without_samples(mode: str, want_status: int, want_body: bytes) -> None:
    exp, _ = make()
    exp.set_pod(DECODE, mode=mode)
    assert exp.render(DECODE) == (want_status, want_body)
    assert exp.render(PREFILL)[0] == 200  # the other pod is unaffected


def test_nan_mode_makes_every_value_nan() -> None:
    exp, clock = make()
    exp.set_pod(DECODE, mode="nan")
    clock.t += 5
    assert all(math.isnan(v) for v in samples(exp, DECODE).values())


@pytest.mark.parametrize(
    ("changes", "want_error"),
    [
        pytest.param({"ttft_multipler": 1.5}, "unknown behaviour fields", id="typo in a field"),
        pytest.param({"error_rate": 1.5}, "within 0..1", id="error rate above 1"),
        pytest.param({"mode": "broken"}, "mode must be one of", id="unknown mode"),
        pytest.param({"request_rate": -1}, "≥ 0", id="negative rate"),
        pytest.param({"prefix_hit_ratio": 0.8, "shared_hit_ratio": 0.3}, "≤ 1", id="more hits than prompt"),
    ],
)
def test_bad_behaviour_is_rejected(changes: dict[str, object], want_error: str) -> None:
    exp, _ = make()
    with pytest.raises(ValueError, match=want_error):
        exp.set_revision("r1", **changes)


@pytest.fixture
def served() -> Iterator[Exporter]:
    exp = Exporter(seed=3)
    exp.add_pods(make_pair_pods(namespace="ml", pool="speed", revision="r1", pairs=1))
    exp.start()
    yield exp
    exp.stop()


def _http(url: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_metrics_and_control_api(served: Exporter) -> None:
    status, body = _http(f"{served.url}/metrics/{DECODE}")
    assert status == 200 and b"vllm:time_to_first_token_seconds_bucket" in body
    assert _http(f"{served.url}/metrics/nope")[0] == 404
    status, body = _http(f"{served.url}/-/revisions/r1", {"ttft_multiplier": 1.5, "error_rate": 0.05})
    assert status == 200 and json.loads(body)["ttft_multiplier"] == 1.5
    assert served.behaviour(DECODE).error_rate == 0.05
    assert _http(f"{served.url}/-/pods/{DECODE}", {"mode": "down"})[0] == 200
    assert _http(f"{served.url}/metrics/{DECODE}")[0] == 503
    assert _http(f"{served.url}/-/pods/nope", {"mode": "down"})[0] == 404
    assert _http(f"{served.url}/-/revisions/r1", {"bogus": 1})[0] == 400
    pods = json.loads(_http(f"{served.url}/-/pods")[1])
    assert {p["name"] for p in pods} == {DECODE, PREFILL}


def test_file_sd_groups_carry_the_label_contract(served: Exporter, tmp_path: Path) -> None:
    groups = served.file_sd_groups()
    by_pod = {g["labels"]["pod"]: g for g in groups}
    assert by_pod[DECODE] == {
        "targets": [served.address],
        "labels": {
            "namespace": "ml",
            "pool": "speed",
            "revision": "r1",
            "role": "decode",
            "pair": "speed-p0",
            "pod": DECODE,
            "__metrics_path__": f"/metrics/{DECODE}",
        },
    }
    assert served.address.startswith("127.0.0.1:")
    path = served.write_file_sd(tmp_path / "exporter.json")
    assert json.loads(path.read_text()) == groups

    class Registry:
        def __init__(self) -> None:
            self.added: list[tuple[str, list[str], dict[str, str]]] = []

        def add_target(self, name: str, targets: list[str], labels: dict[str, str] | None = None) -> Path:
            self.added.append((name, list(targets), dict(labels or {})))
            return tmp_path / name

    reg = Registry()
    assert sorted(served.register(reg, prefix="t")) == sorted(f"t-{p}" for p in (DECODE, PREFILL))


def test_pod_names_with_a_slash_are_refused() -> None:
    exp, _ = make()
    with pytest.raises(ValueError, match="bad pod name"):
        exp.add_pods([EnginePod("a/b", "ml", "speed", "r1", "decode", "speed-p9")])
