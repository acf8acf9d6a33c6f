"""Free ports for the test tiers come from outside the kernel's ephemeral range (stop 46's CI failure)."""

from __future__ import annotations

import socket

import pytest

from tandem_lab.dev import ports


def test_candidates_sit_below_the_ephemeral_range() -> None:
    candidates = ports.candidate_range((32768, 60999))
    assert candidates.start == ports.LOWEST
    assert candidates.stop == 32768


def test_candidates_move_above_an_ephemeral_range_that_starts_low() -> None:
    candidates = ports.candidate_range((ports.LOWEST + 100, 50000))
    assert candidates == range(50001, 65536)


@pytest.mark.component
def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    low, high = ports._ephemeral_range()
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    for port in got:
        assert not low <= port <= high
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.component
def test_a_held_port_is_skipped() -> None:
    """Two walkers of one process start at the same port; the second must step over the one held."""
    nxt = ports._Walker().next_free("127.0.0.1")
    with socket.socket() as held:
        held.bind(("127.0.0.1", nxt))
        assert ports._Walker().next_free("127.0.0.1") != nxt
