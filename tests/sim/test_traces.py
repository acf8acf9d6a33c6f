"""Trace loading is exact; tick jitter and prefix-root multiplication keep counts, totals and hit bounds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tandem_lab.sim.traces import CONVERSATION, SYNTHETIC, TICK_S, jitter_ticks, load_trace, multiply_prefix_roots
from tandem_lab.sim.workload import COPY_ID_STRIDE, infinite_cache_hits
from tests.sim.simhelpers import trace_file


def _file_totals(name: str) -> tuple[int, int, int, list[int]]:
    rows = [json.loads(line) for line in trace_file(name).open()]
    return (
        len(rows),
        sum(r["input_length"] for r in rows),
        sum(r["output_length"] for r in rows),
        [r["timestamp"] for r in rows],
    )


@pytest.mark.parametrize(
    ("name", "want_requests"),
    [pytest.param(CONVERSATION, 12_031, id="conversation"), pytest.param(SYNTHETIC, 3_993, id="synthetic")],
)
def test_load_trace_reproduces_counts_and_token_totals_exactly(name: str, want_requests: int) -> None:
    n, inp, out, ts = _file_totals(name)
    wl = load_trace(trace_file(name))
    assert n == want_requests
    assert wl.totals() == {"requests": n, "input_tokens": inp, "output_tokens": out}
    assert np.array_equal(np.sort(wl.arrival_s), np.sort(np.asarray(ts) / 1000.0))
    # every prompt's block list is the file's
    rows = [json.loads(line) for line in trace_file(name).open()]
    order = np.argsort(np.asarray(ts, dtype=np.float64), kind="stable")
    for k in (0, 1, n // 2, n - 1):
        assert wl.hash_ids(k) == rows[int(order[k])]["hash_ids"]


def test_jitter_ticks_spreads_within_a_tick_and_keeps_totals() -> None:
    wl = load_trace(trace_file(CONVERSATION))
    moved = jitter_ticks(wl, np.random.default_rng(7))
    assert moved.totals() == wl.totals()
    base = np.sort(wl.arrival_s)
    shifted = np.sort(moved.arrival_s)
    assert np.all(shifted >= base[0]) and shifted[-1] < base[-1] + TICK_S
    # the 3 s ticks are gone: many more distinct timestamps than the 1,180 ticks
    assert len(np.unique(moved.arrival_s)) > 10 * len(np.unique(wl.arrival_s))
    again = jitter_ticks(wl, np.random.default_rng(7))
    assert np.array_equal(again.arrival_s, moved.arrival_s)


def test_multiply_prefix_roots_scales_rate_not_hit_rates() -> None:
    wl = load_trace(trace_file(CONVERSATION))
    k = 3
    many = multiply_prefix_roots(wl, k, np.random.default_rng(1))
    t = wl.totals()
    assert many.totals() == {key: v * k for key, v in t.items()}
    # disjoint id spaces: copy j's ids are offset by j * stride
    assert set(np.unique(many.id_offset).tolist()) == {j * COPY_ID_STRIDE for j in range(k)}
    _, one_hits = infinite_cache_hits(wl)
    _, many_hits = infinite_cache_hits(many)
    one = one_hits.sum() / wl.input_tokens.sum()
    assert many_hits.sum() / many.input_tokens.sum() == pytest.approx(one, abs=0.002)
    assert many.arrival_s[-1] - many.arrival_s[0] < wl.arrival_s[-1] - wl.arrival_s[0] + 2 * TICK_S
