"""Reading a work-planning decision log (issue 18's must-show): scale-ups ahead of load, stays at maxPairs,
scale-downs undone within the load time.

What it owns: :func:`decision_log_summary`, pure arithmetic over the log the Tandem policy adapter keeps
(:mod:`tandem_lab.sim.policies.tandem`). Used by the runner (results.json) and the reports.
"""

from __future__ import annotations

from typing import Any


def decision_log_summary(log: list[dict[str, Any]], max_pairs: int | None, lead_s: float) -> dict[str, Any]:
    """What a work-planning decision log shows (issue 18's must-show), from its entries (time ``t``, ``pairs``
    asked, ``ready``, ``reason``, ``metrics.pairsNeeded`` = "<now> now, <ahead> ahead, <kept> kept"):

    - scale-ups, and those *ahead of load*: the pairs asked exceed the pairs the model needs at that moment
      (the forecast or burst headroom asked), and the need reached them within the lead time
      (``ahead_confirmed``);
    - evaluations at ``maxPairs`` while the model needs fewer pairs — neither its forecast nor the need it keeps
      for the lead time reaches ``maxPairs`` (should be 0) — and the longest such stay in seconds;
    - scale-downs, and those *undone*: a later evaluation within the lead time asked for more pairs than the
      scale-down left. Capacity released and asked back within one load time pays a load for nothing (or drains
      a group still loading), so this counts the autoscaler's flip-flops, whatever caused them.
    """
    needs: list[tuple[float, int, int]] = []
    for e in log:
        text = str(e.get("metrics", {}).get("pairsNeeded", ""))
        parts = text.replace(",", "").split()
        if len(parts) >= 6:
            # the model's verdict: the forecast, and the lead-time peak it keeps before releasing capacity
            needs.append((float(e["t"]), int(parts[0]), max(int(parts[2]), int(parts[4]))))
    need_at = {t: (now, ahead) for t, now, ahead in needs}
    ups = ahead = confirmed = 0
    prev: int | None = None
    at_max_less = 0
    stay = longest = 0.0
    last_t: float | None = None
    downs: list[tuple[float, int]] = []
    for e in log:
        t, pairs = float(e["t"]), int(e["pairs"])
        if prev is not None and pairs < prev:
            downs.append((t, pairs))
        if prev is not None and pairs > prev and t in need_at:
            ups += 1
            now_need = need_at[t][0]
            if pairs > now_need:
                ahead += 1
                later = [n for tt, n, _ in needs if t < tt <= t + lead_s]
                if later and max(later) >= pairs:
                    confirmed += 1
        prev = pairs
        less = max_pairs is not None and pairs >= max_pairs and t in need_at and need_at[t][1] < max_pairs
        if less:
            at_max_less += 1
            stay += t - last_t if last_t is not None else 0.0
            longest = max(longest, stay)
        else:
            stay = 0.0
        last_t = t
    asked = [(float(e["t"]), int(e["pairs"])) for e in log]
    undone = sum(1 for t, left in downs if any(t < tt <= t + lead_s and n > left for tt, n in asked))
    return {
        "evaluations": len(log),
        "scale_ups": ups,
        "scale_ups_ahead": ahead,
        "ahead_confirmed": confirmed,
        "at_max_while_model_needs_less": at_max_less,
        "longest_such_stay_s": longest,
        "max_pairs": max_pairs,
        "scale_downs": len(downs),
        "scale_downs_undone": undone,
    }
