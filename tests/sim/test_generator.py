"""Generator calibration (benchmarks.md §2.2): emitted statistics within ±10 % of the published targets;
the infinite-cache bound at or above the published cached share (within 5 points); the envelope's shape."""

from __future__ import annotations

import numpy as np
import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.generator import (
    GeneratorRun,
    check_bound_by_construction,
    generate,
    mean_rate,
    rate_at,
    summarize_generated,
)
from tandem_lab.sim.workload import Workload, infinite_cache_hits

TOLERANCE = 0.10


@pytest.fixture(scope="module")
def day() -> Workload:
    """One weekday at a peak of 24 req/s (~600 k requests; ~3,000 Claude Code sessions, TraceLab has 4,265)."""
    p = load_params()
    run = GeneratorRun(days=1.0, peak_rps=24.0, max_context_tokens=p.model.max_context_tokens)
    return generate(p.generator, run, np.random.default_rng(1), p.slo.tpot_s)


@pytest.fixture(scope="module")
def stats(day: Workload) -> dict[str, dict[str, float]]:
    return summarize_generated(day)


PROFILE_TARGETS = [
    pytest.param(profile, key, id=f"{profile} {key}")
    for profile, keys in (
        (
            "claude-code",
            ("prefix_p50", "prefix_p99", "append_p50", "output_p50", "steps_per_session", "user_requests_per_session"),
        ),
        ("codex", ("prefix_p50", "prefix_p99", "append_p50", "output_p50", "steps_per_session")),
        ("copilot-agent", ("prompt_mean", "output_mean", "steps_per_session")),
    )
    for key in keys
]


@pytest.mark.parametrize(("profile", "key"), PROFILE_TARGETS)
def test_emitted_statistics_match_published_targets(stats: dict[str, dict[str, float]], profile: str, key: str) -> None:
    target = getattr(load_params().generator.profiles[profile].targets, key)
    got = stats[profile][key]
    assert abs(got / target - 1.0) <= TOLERANCE, f"{profile} {key}: {got:.0f} vs {target:.0f}"


def test_tracelab_output_mean_matches(stats: dict[str, dict[str, float]], day: Workload) -> None:
    # TraceLab publishes one output mean (523) for Claude Code and Codex together.
    names = list(day.meta["profiles"])  # type: ignore[call-overload]
    assert day.session is not None
    profile = np.asarray(day.meta["session_profile"])[day.session]
    mask = np.isin(profile, [names.index("claude-code"), names.index("codex")])
    assert abs(day.output_tokens[mask].mean() / 523.0 - 1.0) <= TOLERANCE


@pytest.mark.parametrize(
    ("profiles", "published"),
    [
        pytest.param(("claude-code", "codex"), 0.958, id="TraceLab 95.8 %"),
        pytest.param(("copilot-agent",), 0.857, id="Copilot 85.7 %"),
    ],
)
def test_infinite_cache_bound_is_at_or_above_published_cached_share(
    day: Workload, profiles: tuple[str, ...], published: float
) -> None:
    _, hits = infinite_cache_hits(day)
    names = list(day.meta["profiles"])  # type: ignore[call-overload]
    assert day.session is not None
    profile = np.asarray(day.meta["session_profile"])[day.session]
    mask = np.isin(profile, [names.index(n) for n in profiles])
    bound = hits[mask].sum() / day.input_tokens[mask].sum()
    assert published <= bound <= published + 0.05


def test_bound_by_construction_equals_an_explicit_replay() -> None:
    p = load_params()
    run = GeneratorRun(days=0.5, peak_rps=2.0, max_context_tokens=p.model.max_context_tokens)
    wl = generate(p.generator, run, np.random.default_rng(5), p.slo.tpot_s)
    assert len(wl) > 5_000
    assert check_bound_by_construction(wl)


def test_generated_prompts_extend_the_previous_step_and_share_family_blocks(day: Workload) -> None:
    assert day.session is not None
    first = int(day.session[0])
    rows = np.flatnonzero(day.session == first)[:3]
    a, b = (day.hash_ids(int(r)) for r in rows[:2])
    full_a = int(day.block_count[rows[0]])
    assert b[:full_a] == a[:full_a]  # step k−1's full blocks are step k's prefix
    # every request of a family starts with the family's system-prompt block
    heads = {day.hash_ids(i)[0] for i in range(0, len(day), 997)}
    assert len(heads) <= sum(pr.families for pr in load_params().generator.profiles.values())


def test_envelope_peak_over_mean_matches_worked_example() -> None:
    gen = load_params().generator
    weekday = mean_rate(gen, 1.0, 1.0)
    week = mean_rate(gen, 1.0, 7.0)
    assert 1.0 / weekday == pytest.approx(2.89, abs=0.01)
    assert 1.0 / week == pytest.approx(3.71, abs=0.02)
    assert 550.0 * week == pytest.approx(148.0, abs=1.0)
    t = np.array([gen.peak_hour * 3600.0, (5 * 24 + gen.peak_hour) * 3600.0])
    assert rate_at(t, gen, 550.0, 1.0).tolist() == pytest.approx([550.0, 550.0 * gen.weekend_factor])


def test_emitted_rate_follows_the_envelope() -> None:
    p = load_params()
    run = GeneratorRun(days=1.0, peak_rps=6.0, compress=4.0, max_context_tokens=p.model.max_context_tokens)
    wl = generate(p.generator, run, np.random.default_rng(2), p.slo.tpot_s)
    hours = np.bincount((wl.arrival_s // 900).astype(np.int64))  # 15 min bins = 1 envelope hour each
    peak_bin = int(np.argmax(hours))
    assert abs(peak_bin - p.generator.peak_hour) <= 2
    assert hours.max() / 900.0 == pytest.approx(6.0, rel=0.25)


def test_generation_is_deterministic_in_the_seed() -> None:
    p = load_params()
    run = GeneratorRun(days=0.2, peak_rps=2.0, max_context_tokens=p.model.max_context_tokens)
    a = generate(p.generator, run, np.random.default_rng(9), p.slo.tpot_s)
    b = generate(p.generator, run, np.random.default_rng(9), p.slo.tpot_s)
    c = generate(p.generator, run, np.random.default_rng(10), p.slo.tpot_s)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.blocks, b.blocks)
    assert not np.array_equal(a.arrival_s[:100], c.arrival_s[:100])
