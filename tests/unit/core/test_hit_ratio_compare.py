"""The local prefix-hit ratio compared with stable's (``compare`` on ``LocalKVHitRatio``, docs/design/009).

The threshold ``result >= baseline * 0.9`` reads the noise of a token-weighted ratio as a regression: a window's
ratio is dominated by its few longest prompts (measured through the router: a good canary's 30-s ratios ranged
0.12-0.37). The comparison tests ``r_c ≥ ρ r_s`` with a variance bounded by ``r(1 − r) q_max / Q``.
"""

from __future__ import annotations

import math
import random

import pytest

from tandem.api.pool import InferencePoolSpec, MetricGate
from tandem.api.validate import validate_object
from tandem.core import gaterun
from tandem.core import gates as g
from tandem.core.comparison import HitCounts, compare_hit_ratios
from tandem.core.promql import QueryResult, template_sample_queries
from tandem.core.stats import ratio_below, ratio_below_power, token_ratio_variance
from tests.fakes import prometheus as fp
from tests.unit.core.test_gate_statistics import NOW, WINDOW, _pool, res

SPEED_POOL = 131_072  # the speed pool admits prompts up to its context length
SHORT_POOL = 8_192


def _window(n: int, rng: random.Random, hit_mean: float, q_max: int) -> tuple[float, float]:
    """Tokens looked up and found in one window of ``n`` requests: heavy-tailed prompt lengths up to ``q_max``,
    each request's hit fraction 0 (a first turn) or near 1 (a follow-up), as conversations give."""
    queried = hits = 0.0
    for _ in range(n):
        q = min(q_max, max(16, int(rng.lognormvariate(math.log(4_000), 1.2))))
        x = rng.uniform(0.8, 1.0) if rng.random() < hit_mean / 0.9 else 0.0
        queried += q
        hits += q * x
    return queried, hits


def test_the_variance_bound_holds_for_token_weighted_ratios() -> None:
    """Over many windows the ratio's real variance stays under ``r(1 − r) q_max / Q`` (Bhatia–Davis plus
    ``Σq² ≤ q_max Q``) — even with the heavy tail that makes the threshold misfire."""
    rng = random.Random(7)
    windows = [_window(60, rng, 0.3, SHORT_POOL) for _ in range(2_000)]
    ratios = [h / q for q, h in windows]
    mean = sum(ratios) / len(ratios)
    real = sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1)
    typical_q = sorted(q for q, _ in windows)[len(windows) // 2]
    bound = token_ratio_variance(mean, typical_q, SHORT_POOL)
    assert real <= bound, (real, bound)
    assert token_ratio_variance(0.3, 1.0, SPEED_POOL) == pytest.approx(0.21)  # never above r(1 − r)
    assert token_ratio_variance(0.3, 0.0, SPEED_POOL) == pytest.approx(0.21)
    assert token_ratio_variance(1.4, 1e6, SPEED_POOL) == 0.0  # clamped into [0, 1]


def test_the_docstring_examples() -> None:
    assert ratio_below(0.0, 1.65e6, 0.3, 16.5e6, 0.9, SPEED_POOL) == pytest.approx(0.0192, abs=1e-4)
    assert ratio_below_power(0.3, 1.65e6, 16.5e6, 0.9, SPEED_POOL, 0.01) == pytest.approx(0.182, abs=1e-3)
    noisy = compare_hit_ratios(
        HitCounts(400e3, 48e3),
        HitCounts(900e3, 270e3),
        confidence_percent=99,
        min_ratio_percent=90,
        max_prompt_tokens=SPEED_POOL,
    )
    assert not noisy.worse and noisy.p_value == pytest.approx(0.308, abs=1e-3)


def test_one_request_without_hits_is_not_certain() -> None:
    """The canary's variance is taken at the null boundary: at its own estimate (0) a single 2 k-token request
    with no hits would be 'certainly' below stable."""
    p = ratio_below(0.0, 2_000, 0.3, 5e6, 0.9, SPEED_POOL)
    assert p > 0.2


@pytest.mark.parametrize("q_max", [SHORT_POOL, SPEED_POOL])
def test_identical_revisions_fail_no_more_often_than_alpha(q_max: int) -> None:
    """A canary drawn from stable's own traffic, tested at the strictest null (ρ = 1, no tolerated drop): false
    alarms at 99 % stay at or under 1 % (the bound is conservative), over 2,000 windows of 60 canary and 600 stable
    requests."""
    rng = random.Random(11)
    alarms = 0
    for _ in range(2_000):
        c = _window(60, rng, 0.3, q_max)
        s = _window(600, rng, 0.3, q_max)
        verdict = compare_hit_ratios(
            HitCounts(*c), HitCounts(*s), confidence_percent=99, min_ratio_percent=100, max_prompt_tokens=q_max
        )
        alarms += verdict.worse
    assert alarms <= 20, alarms


def test_a_broken_cache_fails_once_the_tokens_say_so() -> None:
    """No hits against stable's 0.3: 40 requests of 8 k tokens are enough in a pool of 8 k prompts; in the speed
    pool (131 k) the same window is too small to tell, and its power says so."""
    canary, stable = HitCounts(320e3, 0.0), HitCounts(5.6e6, 1.68e6)
    short = compare_hit_ratios(
        canary, stable, confidence_percent=99, min_ratio_percent=90, max_prompt_tokens=SHORT_POOL
    )
    speed = compare_hit_ratios(
        canary, stable, confidence_percent=99, min_ratio_percent=90, max_prompt_tokens=SPEED_POOL
    )
    assert short.worse and short.p_value < 1e-3 and short.power is not None and short.power > 0.99
    assert not speed.worse and speed.power is not None and speed.power < 0.05
    assert "power" in speed.summary and "prompts ≤ 131072 tokens" in speed.summary
    # the same ratio, the same pool, a whole step's tokens (window: Step): caught
    step = compare_hit_ratios(
        HitCounts(8e6, 0.0),
        HitCounts(80e6, 24e6),
        confidence_percent=99,
        min_ratio_percent=90,
        max_prompt_tokens=SPEED_POOL,
    )
    assert step.worse


def test_the_tolerated_share_is_the_null() -> None:
    """A canary at 85 % of stable's ratio with plenty of tokens: worse at ρ = 0.9, not at ρ = 0.8."""
    canary, stable = HitCounts(50e6, 0.255 * 50e6), HitCounts(500e6, 0.3 * 500e6)
    assert compare_hit_ratios(
        canary, stable, confidence_percent=99, min_ratio_percent=90, max_prompt_tokens=SHORT_POOL
    ).worse
    assert not compare_hit_ratios(
        canary, stable, confidence_percent=99, min_ratio_percent=80, max_prompt_tokens=SHORT_POOL
    ).worse


# --- the gate ------------------------------------------------------------------------------------


def hit_gate(**compare: object) -> MetricGate:
    return MetricGate.model_validate({"name": "local-kv-hits", "template": "LocalKVHitRatio", "compare": compare})


def arm(requests: float, queried: fp.Reply | float, hits: fp.Reply | float) -> g.SampleResults:
    def one(x: fp.Reply | float, name: str) -> QueryResult:
        return res(x if isinstance(x, fp.Reply) else fp.value(x), name)

    return g.SampleResults(one(requests, "count"), prompt_tokens=one(queried, "queried"), hit_tokens=one(hits, "hits"))


def verdict(canary: g.SampleResults, stable: g.SampleResults, q_max: int | None = SHORT_POOL) -> tuple[str, str, str]:
    v = g.evaluate_gate(
        hit_gate(),
        res(fp.value(0.0)),
        res(fp.value(0.3)),
        WINDOW,
        g.GateSamples(canary, stable),
        max_prompt_tokens=q_max,
    )
    return v.verdict, v.reason, v.condition


STABLE = arm(700, 5.6e6, 1.68e6)


def test_the_gate_fails_a_broken_cache_and_passes_noise() -> None:
    assert verdict(arm(40, 320e3, 0.0), STABLE)[:2] == ("Failure", "SignificantlyWorse")
    # 0.12 against 0.3: the threshold's Failure, here within the noise of 40 requests
    assert verdict(arm(40, 320e3, 0.12 * 320e3), STABLE)[:2] == ("Success", "NotSignificantlyWorse")
    assert "hit ratio 0.12 of 3.2e+05 tokens vs stable 0.3" in verdict(arm(40, 320e3, 38_400.0), STABLE)[2]


@pytest.mark.parametrize(
    ("canary", "stable", "want"),
    [
        pytest.param(arm(40, 0.0, 0.0), STABLE, ("NoData", "InvalidQueryResult"), id="no tokens looked up"),
        pytest.param(arm(40, 320e3, -5.0), STABLE, ("NoData", "InvalidQueryResult"), id="negative hits"),
        pytest.param(arm(40, 320e3, 0.0), arm(700, -1.0, 0.0), ("NoData", "BaselineInvalidQueryResult"), id="stable's"),
        pytest.param(arm(40, fp.empty(), 0.0), STABLE, ("NoData", "Empty"), id="no series"),
        pytest.param(arm(40, 320e3, fp.value(float("nan"))), STABLE, ("NoData", "NaN"), id="NaN"),
        pytest.param(arm(40, 320e3, fp.http(503)), STABLE, ("Error", "MetricsUnavailable"), id="Prometheus down"),
    ],
)
def test_bad_counts_hold_the_step(canary: g.SampleResults, stable: g.SampleResults, want: tuple[str, str]) -> None:
    """A forged or broken answer never passes as 'not significantly worse' and never fails the canary."""
    assert verdict(canary, stable)[:2] == want


@pytest.mark.parametrize(
    ("canary", "stable", "shown"),
    [
        pytest.param(arm(40, 0.0, 0.0), STABLE, "canary 0 hits of 0 tokens", id="no tokens looked up"),
        pytest.param(arm(40, 320e3, -5.0), STABLE, "canary -5 hits of 320000 tokens", id="negative hits"),
        pytest.param(arm(40, 320e3, 0.0), arm(700, -1.0, 0.0), "stable 0 hits of -1 tokens", id="stable's"),
    ],
)
def test_bad_counts_are_shown_in_the_condition(canary: g.SampleResults, stable: g.SampleResults, shown: str) -> None:
    """The held verdict says which arm's counts stopped it, and what they were (the gate's value columns cannot)."""
    assert shown in verdict(canary, stable)[2]


def test_the_comparison_needs_the_pools_longest_prompt() -> None:
    with pytest.raises(ValueError, match="longest prompt"):
        verdict(arm(40, 320e3, 0.0), STABLE, q_max=None)


def test_the_sample_queries_read_the_prefix_cache_counters() -> None:
    q = template_sample_queries("LocalKVHitRatio")
    assert q.prompt_tokens is not None and q.prompt_tokens.startswith("sum(increase(vllm:prefix_cache_queries_total{")
    assert q.hit_tokens is not None and q.hit_tokens.startswith("sum(increase(vllm:prefix_cache_hits_total{")
    assert q.texts() == (q.count, q.prompt_tokens, q.hit_tokens)
    resolved = g.resolve_gate_queries(
        hit_gate(), namespace="ml", pool="speed", canary_revision="new1", stable_revision="old1", interval="1m"
    )
    assert resolved.canary_samples is not None and resolved.stable_samples is not None
    assert resolved.canary_samples.prompt_tokens == (
        'sum(increase(vllm:prefix_cache_queries_total{namespace="ml",pool="speed",revision="new1",role=~"prefill"}'
        "[1m]))"
    )
    assert resolved.stable_samples.hit_tokens is not None and 'revision="old1"' in resolved.stable_samples.hit_tokens
    assert set(resolved.canary_samples.texts()) | set(resolved.stable_samples.texts()) <= set(resolved.texts())


def test_judge_hands_the_plans_bound_to_the_gate() -> None:
    gate = hit_gate()
    plan = gaterun.gate_queries(
        [gate],
        namespace="ml",
        pool="speed",
        canary_revision="new1",
        stable_revision="old1",
        interval="1m",
        now=NOW,
        max_prompt_tokens=SHORT_POOL,
    )
    q = plan.gates[0].queries
    assert q is not None and q.canary_samples is not None and q.stable_samples is not None
    values = {
        q.canary: 0.0,
        q.baseline: 0.3,
        q.canary_samples.count: 40,
        q.canary_samples.prompt_tokens: 320e3,
        q.canary_samples.hit_tokens: 0.0,
        q.stable_samples.count: 700,
        q.stable_samples.prompt_tokens: 5.6e6,
        q.stable_samples.hit_tokens: 1.68e6,
    }
    answers = {text: res(fp.value(float(v)), text) for text, v in values.items() if text is not None}
    [v] = gaterun.judge(plan, answers, WINDOW)
    assert (v.verdict, v.reason) == ("Failure", "SignificantlyWorse"), v.condition
    assert "prompts ≤ 8192 tokens" in v.condition


# --- the API -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "want_error"),
    [
        pytest.param({"template": "LocalKVHitRatio", "compare": {"minRatioPercent": 80}}, None, id="accepted"),
        pytest.param({"preset": "local-kv-hits", "compare": {}}, None, id="on the preset"),
        pytest.param({"preset": "ttft-p95", "compare": {"confidencePercent": 95}}, None, id="a preset's compare"),
        pytest.param({"preset": "ttft-p95", "compare": {"normalize": "UncachedPromptTokens"}}, None, id="ttft preset"),
        pytest.param(
            {"template": "LocalKVHitRatio", "compare": {"normalize": "UncachedPromptTokens"}},
            "applies to TTFT templates only",
            id="normalize",
        ),
        pytest.param(
            {"preset": "local-kv-hits", "compare": {"normalize": "UncachedPromptTokens"}},
            "applies to TTFT templates only",
            id="normalize on the preset",
        ),
        pytest.param(
            {"preset": "local-kv-hits", "query": "up", "successCondition": "result > 0.0", "compare": {}},
            "compare needs a template",
            id="a query replaces the preset's template",
        ),
        pytest.param({"template": "LocalKVHitRatio", "compare": {"minRatioPercent": 0}}, "minRatioPercent", id="0 %"),
        pytest.param(
            {"template": "LocalKVHitRatio", "compare": {"minRatioPercent": 101}}, "minRatioPercent", id="101 %"
        ),
    ],
)
def test_validate_hit_ratio_compare(metric: dict[str, object], want_error: str | None) -> None:
    errors = [str(e) for e in validate_object(_pool(metric))]
    if want_error is None:
        assert errors == []
    else:
        assert any(want_error in e for e in errors), errors


def test_the_longest_prompt_the_pool_admits() -> None:
    base = {
        "model": {"servedName": "m", "source": "hf://m/m", "quantization": "bf16", "maxContextTokens": 32_768},
        "stack": {"version": "v1", "image": "docker.io/vllm/vllm-openai-rocm:v0.33.0@sha256:" + "3f" * 32},
    }
    assert InferencePoolSpec.model_validate(base).longest_prompt == 32_768
    capped = {**base, "traffic": {"match": {"maxPromptTokens": 8_192}}}
    assert InferencePoolSpec.model_validate(capped).longest_prompt == 8_192
    above = {**base, "traffic": {"match": {"maxPromptTokens": 100_000}}}
    assert InferencePoolSpec.model_validate(above).longest_prompt == 32_768
