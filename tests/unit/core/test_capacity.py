"""Unit tests of tandem.core.capacity: budgets, profile lookups, queue models, forecast, correction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core.capacity import (
    CapacityProfile,
    DecodePoint,
    ForecastState,
    PrefillPoint,
    WorkDemand,
    decode_need,
    erlang_c,
    groups_for,
    instances_for,
    mdc_attainment,
    pairs_for,
    prefill_need,
    ttft_budget,
    update_correction,
    update_forecast,
)

PROFILE = CapacityProfile(
    version="v1",
    prefill=(PrefillPoint(32_768, 8_000), PrefillPoint(8_192, 16_000)),
    decode=(DecodePoint(10_000, 32, 2_000), DecodePoint(100_000, 16, 1_000)),
    load_time_s=240.0,
)


@pytest.mark.parametrize(
    ("tokens", "want"),
    [
        pytest.param(100, 1.0, id="short prompt 1 s"),
        pytest.param(8_192, 1.0, id="at 8k still 1 s"),
        pytest.param(135_168, 2.0, id="half-way 2 s"),
        pytest.param(262_144, 3.0, id="at max context 3 s"),
        pytest.param(1_000_000, 3.0, id="beyond max context 3 s"),
    ],
)
def test_ttft_budget_by_prompt_size(tokens: int, want: float) -> None:
    assert ttft_budget(tokens) == pytest.approx(want)


@pytest.mark.parametrize(
    ("servers", "load", "want"),
    [
        pytest.param(3, 2.0, 4 / 9, id="C(3,2)"),
        pytest.param(4, 2.0, 4 / 23, id="C(4,2)"),
        pytest.param(1, 0.5, 0.5, id="M/M/1 is rho"),
        pytest.param(2, 2.0, 1.0, id="saturated"),
        pytest.param(5, 0.0, 0.0, id="no load"),
    ],
)
def test_erlang_c_table(servers: int, load: float, want: float) -> None:
    assert erlang_c(servers, load) == pytest.approx(want)


def test_mdc_attainment_worked_example() -> None:
    # module docstring: lambda 4/s, S 0.5 s, slack 0.6 s -> 96.0 % on 3, 99.86 % on 4
    assert mdc_attainment(3, 2.0, 0.5, 0.6) == pytest.approx(0.9597, abs=1e-3)
    assert mdc_attainment(4, 2.0, 0.5, 0.6) == pytest.approx(0.9986, abs=1e-3)


@given(
    load=st.floats(0.1, 200.0),
    service=st.floats(0.01, 5.0),
    slack=st.floats(0.0, 5.0),
    servers=st.integers(1, 400),
)
@settings(max_examples=200, deadline=None)
def test_mdc_attainment_grows_with_servers_and_stays_in_unit_interval(
    load: float, service: float, slack: float, servers: int
) -> None:
    a = mdc_attainment(servers, load, service, slack)
    b = mdc_attainment(servers + 1, load, service, slack)
    assert 0.0 <= a <= 1.0
    assert b >= a - 1e-12


def test_profile_interpolates_and_clamps() -> None:
    assert PROFILE.prefill_rate(1_000) == 16_000  # clamped below the first point (points get sorted)
    assert PROFILE.prefill_rate(20_480) == pytest.approx(12_000)
    assert PROFILE.prefill_rate(1_000_000) == 8_000
    assert PROFILE.decode_capacity(55_000) == pytest.approx((24.0, 1_500.0))


def test_learned_profile_is_bounded_by_declared() -> None:
    learned = CapacityProfile(
        "v1", (PrefillPoint(8_192, 99_000), PrefillPoint(32_768, 4_000)), (DecodePoint(10_000, 64, 500),), 100.0
    )
    bounded = learned.bounded_by(PROFILE)
    assert [p.uncached_tokens_per_s for p in bounded.prefill] == [16_000, 4_000]
    assert bounded.decode[0] == DecodePoint(10_000, 32, 500)


def test_profile_rejects_empty_or_zero_points() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CapacityProfile("v", (), (DecodePoint(1, 1, 1),), 1.0)
    with pytest.raises(ValueError, match="> 0"):
        CapacityProfile("v", (PrefillPoint(1, 0),), (DecodePoint(1, 1, 1),), 1.0)


def demand(
    rate: float = 4.0, prompt: float = 8_000.0, hit: float = 0.0, out: float = 100.0, streams: float = 10.0
) -> WorkDemand:
    return WorkDemand(rate, rate * prompt, hit, rate * out, streams)


@pytest.mark.parametrize(
    ("d", "target", "want_instances", "want_feasible"),
    [
        pytest.param(demand(), 0.99, 4, True, id="a=2, S=0.5 s, slack 0.4 s -> 4"),
        pytest.param(demand(), 0.90, 3, True, id="looser target needs fewer"),
        pytest.param(demand(hit=0.5), 0.99, 2, True, id="hits halve the work and the wait"),
        pytest.param(demand(rate=0.0), 0.99, 0, True, id="no requests no need"),
        pytest.param(demand(rate=0.1, prompt=30_000), 0.99, 1, False, id="a prompt slower than its budget"),
    ],
)
def test_prefill_need_table(d: WorkDemand, target: float, want_instances: int, want_feasible: bool) -> None:
    need = prefill_need(d, PROFILE, target, overhead_s=0.1)
    assert math.ceil(need.instances - 1e-9) == want_instances
    assert need.feasible is want_feasible
    if want_feasible and want_instances:
        assert need.predicted_attainment >= target


@given(rate=st.floats(0.01, 500.0), prompt=st.floats(100.0, 8_000.0), hit=st.floats(0.0, 0.95))
@settings(max_examples=100, deadline=None)
def test_prefill_need_covers_load_and_meets_target(rate: float, prompt: float, hit: float) -> None:
    d = WorkDemand(rate, rate * prompt, hit, rate * 100, 10.0)
    need = prefill_need(d, PROFILE, 0.99, overhead_s=0.05)
    assert need.instances >= need.load
    more = prefill_need(d.scaled(2.0), PROFILE, 0.99, overhead_s=0.05)
    assert more.instances >= need.instances


@pytest.mark.parametrize(
    ("d", "want"),
    [
        pytest.param(demand(streams=200, out=0.0), (200 + 2.3263 * math.sqrt(200)) / 32, id="streams side"),
        pytest.param(demand(rate=40.0, out=100.0, streams=1), (64 + 2.3263 * 8) / 32, id="tokens side"),
        pytest.param(demand(streams=0, out=0.0), 0.0, id="idle"),
    ],
)
def test_decode_need_table(d: WorkDemand, want: float) -> None:
    # mean context 8,050 tokens: the first decode point (32 streams, 2,000 tok/s)
    assert decode_need(d, PROFILE, 0.99).instances == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize(
    ("p", "d", "shape", "want"),
    [
        pytest.param(3.2, 1.0, (1, 1), 4, id="prefill bound 1:1"),
        pytest.param(3.2, 1.0, (4, 1), 1, id="4:1 group holds both"),
        pytest.param(3.0, 3.0, (2, 1), 3, id="decode bound 2:1"),
        pytest.param(0.0, 0.0, (1, 1), 0, id="nothing"),
    ],
)
def test_pairs_for_table(p: float, d: float, shape: tuple[int, int], want: int) -> None:
    assert pairs_for(p, d, shape) == want


@pytest.mark.parametrize(
    ("p", "d", "shape", "kept", "want"),
    [
        pytest.param(6.0, 2.0, (2, 1), (), 3, id="no groups yet: as pairs_for"),
        pytest.param(6.0, 2.0, (2, 1), ((2, 1),) * 5, 3, id="all in the target shape: as pairs_for"),
        pytest.param(6.0, 2.0, (2, 1), ((1, 1),) * 4, 5, id="four old groups give 4P, one new adds 2P"),
        pytest.param(6.0, 2.0, (2, 1), ((2, 1),) * 2 + ((1, 1),) * 2, 4, id="half replaced"),
        pytest.param(2.0, 2.0, (2, 1), ((1, 1),) * 4, 2, id="fewer kept groups hold it"),
        pytest.param(2.0, 6.0, (1, 1), ((1, 3),) * 2, 2, id="decode-heavy old groups hold it"),
        pytest.param(2.0, 6.0, (1, 1), ((1, 1), (1, 3)), 4, id="one replaced: short on decode, two more"),
        pytest.param(0.0, 0.0, (2, 1), ((1, 1),) * 3, 0, id="nothing"),
    ],
)
def test_groups_for_counts_the_groups_a_scale_down_keeps(
    p: float, d: float, shape: tuple[int, int], kept: tuple[tuple[int, int], ...], want: int
) -> None:
    assert groups_for(p, d, shape, kept) == want


@pytest.mark.parametrize(
    ("p", "d", "shape", "kept", "want"),
    [
        pytest.param(4.0, 4.0, (2, 1), ((1, 1),) * 4, 8, id="the four kept groups"),
        pytest.param(4.0, 4.0, (2, 1), (), 12, id="target shape alone: four 2P:1D for 4 decode"),
        pytest.param(6.0, 2.0, (2, 1), ((1, 1),) * 4, 11, id="four kept plus one 2P:1D"),
        pytest.param(2.0, 2.0, (2, 1), ((1, 1),) * 4, 4, id="only the kept groups it counts"),
        pytest.param(0.0, 0.0, (2, 1), ((1, 1),) * 3, 0, id="nothing"),
    ],
)
def test_instances_for_counts_the_instances_of_the_groups_groups_for_counts(
    p: float, d: float, shape: tuple[int, int], kept: tuple[tuple[int, int], ...], want: int
) -> None:
    assert instances_for(p, d, shape, kept) == want


def test_forecast_leads_a_ramp_and_keeps_the_lead_time_peak() -> None:
    state = ForecastState()
    fc = None
    for i in range(40):  # need rises 0.01 instances/s, evaluated every 30 s
        fc, state = update_forecast(state, i * 30.0, 1.0 + 0.3 * i, lead_s=240.0)
    assert fc is not None
    assert fc.ahead > fc.now + 1.0  # ahead of the load: the slope is extrapolated over the lead time
    # the need drops: the forecast no longer leads, but the lead-time peak holds
    fc, state = update_forecast(state, 40 * 30.0, 2.0, lead_s=240.0)
    assert fc.recent_peak == pytest.approx(1.0 + 0.3 * 39)
    assert fc.ahead >= fc.now
    for i in range(41, 60):
        fc, state = update_forecast(state, i * 30.0, 2.0, lead_s=240.0)
    assert fc.recent_peak == pytest.approx(2.0)  # forgotten after the lead time


@given(needs=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=50))
@settings(max_examples=100, deadline=None)
def test_forecast_ahead_and_peak_never_below_now(needs: list[float]) -> None:
    state = ForecastState()
    for i, n in enumerate(needs):
        fc, state = update_forecast(state, i * 15.0, n, lead_s=120.0)
        assert fc.ahead >= fc.now
        assert fc.recent_peak >= fc.now


@pytest.mark.parametrize(
    ("corr", "att", "queued", "want"),
    [
        pytest.param(1.0, 0.95, True, 1.08, id="shortfall with a queue raises"),
        pytest.param(1.0, 0.5, True, 1.1, id="raise capped per step"),
        pytest.param(2.95, 0.5, True, 3.0, id="capped overall"),
        pytest.param(1.0, 0.95, False, 1.0, id="miss without a queue is not capacity"),
        pytest.param(2.0, 0.999, True, 1.94, id="above target decays"),
        pytest.param(1.0, 1.0, False, 1.0, id="never below 1"),
        pytest.param(1.7, None, True, 1.7, id="no data unchanged"),
    ],
)
def test_update_correction_table(corr: float, att: float | None, queued: bool, want: float) -> None:
    assert update_correction(corr, att, 0.99, queued) == pytest.approx(want)
