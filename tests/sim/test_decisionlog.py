"""decision_log_summary: scale-ups ahead of load and stays at maxPairs, from a hand-written log."""

from __future__ import annotations

import pytest

from tandem_lab.sim.decisionlog import decision_log_summary


def entry(t: float, pairs: int, now: int, ahead: int, kept: int, reason: str = "HoldWorkCovered") -> dict[str, object]:
    return {
        "t": t,
        "pairs": pairs,
        "ready": pairs,
        "reason": reason,
        "metrics": {"pairsNeeded": f"{now} now, {ahead} ahead, {kept} kept"},
    }


def test_scale_up_ahead_confirmed_and_no_stay_at_max() -> None:
    log = [
        entry(0, 2, 2, 2, 2),
        entry(30, 4, 2, 4, 2, "ScaleUpAhead"),  # ahead: 4 asked, 2 needed now
        entry(60, 4, 3, 4, 3),
        entry(90, 4, 4, 4, 4),  # the need reached 4 within the lead time
        entry(120, 5, 5, 5, 5, "ScaleUpWork"),  # not ahead: the need now
    ]
    s = decision_log_summary(log, max_pairs=8, lead_s=240.0)
    assert (s["scale_ups"], s["scale_ups_ahead"], s["ahead_confirmed"]) == (2, 1, 1)
    assert s["at_max_while_model_needs_less"] == 0


@pytest.mark.parametrize(
    ("kept", "want_count", "want_stay"),
    [
        pytest.param(3, 3, 60.0, id="model would release: counted"),
        pytest.param(8, 0, 0.0, id="lead-time peak still at max: not counted"),
    ],
)
def test_stay_at_max_counts_only_when_the_model_needs_less(kept: int, want_count: int, want_stay: float) -> None:
    log = [entry(t, 8, 3, 3, kept, "AtMaxPairs") for t in (0.0, 30.0, 60.0)]
    s = decision_log_summary(log, max_pairs=8, lead_s=240.0)
    assert s["at_max_while_model_needs_less"] == want_count
    assert s["longest_such_stay_s"] == want_stay


def test_a_scale_down_asked_back_within_the_load_time_is_counted_undone() -> None:
    log = [
        entry(0, 6, 6, 6, 6),
        entry(30, 5, 4, 5, 5, "ScaleDownWork"),  # down to 5 ...
        entry(60, 6, 5, 6, 5, "ScaleUpAhead"),  # ... and 6 asked again 30 s later: undone
        entry(90, 4, 4, 4, 4, "ScaleDownWork"),  # down to 4 ...
        entry(300, 4, 4, 4, 4),
        entry(400, 5, 5, 5, 5, "ScaleUpWork"),  # ... asked back after the 240 s lead time: not counted
    ]
    s = decision_log_summary(log, max_pairs=8, lead_s=240.0)
    assert (s["scale_downs"], s["scale_downs_undone"]) == (2, 1)
