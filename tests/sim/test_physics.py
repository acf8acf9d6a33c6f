"""Roofline reproduces benchmarks.md §3.2's illustrative table; profile tables interpolate; M/D/1 cap."""

from __future__ import annotations

import pytest

from tandem.core.capacity import mdl_rho_max, ttft_budget
from tandem_lab.sim.config import load_params
from tandem_lab.sim.physics import ProfileTable, Roofline

CONTEXT = 120_000


@pytest.fixture(scope="module")
def roof() -> Roofline:
    return Roofline.from_params(load_params())


@pytest.mark.parametrize(
    ("batch", "want_touched", "want_gb", "want_tpot_ms", "want_user_tps"),
    [
        pytest.param(16, 0.29, 215, 8.9, 112, id="B=16"),
        pytest.param(32, 0.49, 380, 15.8, 63, id="B=32"),
        pytest.param(64, 0.74, 635, 26.5, 38, id="B=64"),
    ],
)
def test_decode_step_matches_the_illustrative_table(
    roof: Roofline, batch: int, want_touched: float, want_gb: float, want_tpot_ms: float, want_user_tps: float
) -> None:
    assert roof.touched_fraction(batch) == pytest.approx(want_touched, abs=0.006)
    step = roof.decode_step_time(batch, batch * CONTEXT)
    bytes_per_step = step * roof.bandwidth
    assert bytes_per_step / 1e9 == pytest.approx(want_gb, rel=0.03)
    assert step * 1000 == pytest.approx(want_tpot_ms, rel=0.03)
    assert 1 / step == pytest.approx(want_user_tps, rel=0.03)


def test_kv_residency_allows_about_100_sequences_at_120k(roof: Roofline) -> None:
    assert roof.max_batch_for_context(CONTEXT) == pytest.approx(100, abs=3)
    assert 32 <= roof.best_decode_batch(CONTEXT, 1 / 60, 64) <= 34  # 60 tok/s per user holds ~32 sequences


@pytest.mark.parametrize(
    ("context", "want_tps_per_gpu"),
    [
        pytest.param(8_000, 7_500, id="8k"),
        pytest.param(32_000, 3_200, id="32k"),
        pytest.param(120_000, 1_000, id="120k"),
    ],
)
def test_prefill_throughput_per_gpu_at_context(roof: Roofline, context: int, want_tps_per_gpu: float) -> None:
    # marginal cost of one more uncached token after `context` cached ones, overhead excluded
    lin, att = roof.prefill_flops(1.0, context)
    per_token = lin / roof.linear_flops + att / roof.attention_flops
    assert 1.0 / per_token / roof.gpus == pytest.approx(want_tps_per_gpu, rel=0.06)


def test_prefill_time_grows_with_the_attention_term(roof: Roofline) -> None:
    short = roof.prefill_time(4_000, 0)
    long = roof.prefill_time(4_000, 100_000)
    assert long > 3 * short  # same uncached tokens, longer cached prefix: attention dominates


def test_profile_table_interpolates_the_roofline(roof: Roofline) -> None:
    table = ProfileTable.from_model(roof, [1, 1_000, 10_000], [0, 50_000, 100_000], [1, 16, 32, 64], [0, 1e6, 4e6])
    assert table.prefill_time(1_000, 50_000) == pytest.approx(roof.prefill_time(1_000, 50_000))
    mid = table.prefill_time(5_500, 50_000)
    assert roof.prefill_time(1_000, 50_000) < mid < roof.prefill_time(10_000, 50_000)
    assert table.decode_step_time(32, 1e6) == pytest.approx(roof.decode_step_time(32, 1e6))
    assert table.load_time("cold") == 695.0


@pytest.mark.parametrize(
    ("budget", "service", "want"),
    [
        pytest.param(1.0, 0.25, 0.86, id="T=1 S=0.25"),
        pytest.param(1.0, 0.5, 0.67, id="T=1 S=0.5"),
        pytest.param(3.0, 1.0, 0.80, id="T=3 S=1"),
        pytest.param(3.0, 2.0, 0.50, id="T=3 S=2"),
    ],
)
def test_md1_utilization_cap_matches_the_worked_examples(budget: float, service: float, want: float) -> None:
    assert mdl_rho_max(budget, service, 0.1) == pytest.approx(want, abs=0.005)


def test_ttft_budget_is_linear_between_short_and_long() -> None:
    assert ttft_budget(1_000, 1.0, 3.0, 8_192, 131_072) == 1.0
    assert ttft_budget(200_000, 1.0, 3.0, 8_192, 131_072) == 3.0
    assert ttft_budget((8_192 + 131_072) / 2, 1.0, 3.0, 8_192, 131_072) == pytest.approx(2.0)
