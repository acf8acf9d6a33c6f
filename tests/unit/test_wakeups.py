"""Spec-edit coalescing in the operator's wake-ups (CC-04), driven by an injected clock."""

from __future__ import annotations

import pytest

from tandem.controller.runtime import SETTLE_MAX_SECONDS, SETTLE_SECONDS, Wakeups


def test_first_sighting_and_unchanged_generation_never_delay() -> None:
    w = Wakeups()
    w.saw_generation("ns", "speed", 3, now=100.0)  # start-up list
    w.saw_generation("ns", "speed", 3, now=100.5)  # a status write: same generation
    assert w.settle_delay("ns", "speed", now=100.5) == 0.0


def test_a_burst_of_edits_waits_for_the_last_one() -> None:
    w = Wakeups()
    w.saw_generation("ns", "speed", 1, now=0.0)
    for i in range(10):  # ten edits, 0.5 s apart
        w.saw_generation("ns", "speed", 2 + i, now=10.0 + 0.5 * i)
        assert w.settle_delay("ns", "speed", now=10.0 + 0.5 * i) == pytest.approx(SETTLE_SECONDS)
    last = 10.0 + 0.5 * 9
    assert w.settle_delay("ns", "speed", now=last + SETTLE_SECONDS) == 0.0


def test_an_endless_stream_of_edits_is_acted_on_after_the_cap() -> None:
    w = Wakeups()
    w.saw_generation("ns", "speed", 1, now=0.0)
    t, gen = 100.0, 2
    while t < 100.0 + SETTLE_MAX_SECONDS + 5:
        w.saw_generation("ns", "speed", gen, now=t)
        t, gen = t + 0.5, gen + 1
    assert w.settle_delay("ns", "speed", now=t) == 0.0
    w.forget("ns", "speed")
    assert w.settle_delay("ns", "speed", now=t) == 0.0
