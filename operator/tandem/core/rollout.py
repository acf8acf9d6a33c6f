"""The rollout state machine: which revisions should have how many pairs, and when a step advances.

What it owns: the pure transition `plan_rollout(inputs) -> RolloutDecision`. It decides the phase,
the step, the per-revision pair targets and the canary's traffic share; it never creates anything
(the pair planner turns targets into capacity-first actions) and never reads the clock.

Phases: Idle (stable only) → Progressing (canary at step k) ⇄ Paused → Promoted (canary became
stable) | RollingBack (stable restored to full Ready capacity, then canary drained; meanwhile the
canary keeps at most the weight of the step it failed at) → RolledBack
(the failed revision is parked until spec.stack changes).

Canary capacity is **surge** by default (issue 17 item 3): while a step's canary pairs fit in the surge
room (`surge_room`: within `maxSurge`, `placement.gpuBudget` and the free GPUs, computed by the pair
planner), the stable revision keeps all `replicas` pairs and the canary comes up beside them. A rollback
then finds stable at full Ready capacity: the canary's weight goes to 0 in the same pass and its pairs
drain — no stable pair has to load again first (W5 measured 700 s of that). When a step's canary pairs
do not fit, that step runs **capacity-first** (the canary replaces stable pairs, as before) and the
Progressing condition says so (`CanaryCapacityFirst`, with the reason in the status message).

Step semantics (Argo vocabulary):
- `setWeight: w` → the canary gets ⌈replicas·w/100⌉ pairs and w % of traffic (capped by its Ready
  share); `setCanaryPairs: n` → n pairs, traffic by pair count; `setMirrorPairs: n` → n pairs at 0 %
  that get a copy of the keys they would own by pair count (`canary_mirror`; the router discards the
  copies' answers, so gates measure the canary while no user is exposed). Under surge the previous step's weight
  (0 before the first) stays published until all the step's pairs are Ready (`published_index`), so
  the canary serves no traffic that its analysis step has not started to watch. Both persist through later pause and
  analysis steps. A set step completes when the canary has that many Ready pairs and the stable
  revision has drained down to the rest; it must do so within `progressDeadline`.
- `pause` completes after its duration, or on `tandem rollout promote` when it has none.
- `analysis` completes when the gate evaluation reports Passed; Failed → failure action; the NoData
  deadline → `onNoData`.
- No step advances (and nothing is promoted) while Ready pairs of all revisions are below the capacity
  floor `replicas − maxUnavailable`: the status message says so and the step resumes once they are back.
- After the last step the canary is promoted: it becomes stable and old pairs are drained
  capacity-first.
- A new revision mid-rollout, or changed steps, restarts at step 0; the intermediate canary is never
  promoted (its target drops to 0). At most one step advance per pass (INV-3).

Worked example (replicas 8, steps [setCanaryPairs 1, analysis, setWeight 50, setWeight 100]):
step 0 targets {stable 7, canary 1} (the canary pair comes up first: maxSurge ≥ 1) → step 1 holds
those targets until gates pass → step 2 {stable 4, canary 4}, 50 % traffic → step 3 {canary 8} →
promoted: stable := canary.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal

from tandem.api.pool import InferencePoolSpec, RolloutStep
from tandem.api.pool_status import AnalysisProgress, GateVerdict, RolloutStatus
from tandem.api.quantity import parse_duration
from tandem.core import conditions as c
from tandem.core.analysis import next_evaluation_at
from tandem.core.gates import REASON_INVALID_QUERY
from tandem.core.reasons import (
    REASON_ABORT_IGNORED,
    REASON_ABORT_REQUESTED,
    REASON_ANALYSIS_NO_DATA,
    REASON_ANALYSIS_PASSED,
    REASON_GATE_FAILED,
    REASON_PROMOTE_REQUESTED,
    REASON_ROLL_FORWARD,
    REASON_ROLLOUT_CANCELLED,
    REASON_ROLLOUT_RESUMED,
    REASON_ROLLOUT_STARTED,
    REASON_STEP_COMPLETED,
)

AnalysisOutcome = Literal["Continue", "Passed", "Failed", "NoDataDeadline", "Paused"]

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"


@dataclass(frozen=True)
class RevisionCounts:
    """Pairs of one revision: live = not draining (complete or not), ready = every instance Ready."""

    live: int = 0
    ready: int = 0


@dataclass(frozen=True)
class AnalysisResult:
    """One evaluation pass of the current analysis step (from tandem.core.analysis)."""

    progress: AnalysisProgress
    outcome: AnalysisOutcome
    verdicts: tuple[GateVerdict, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class RolloutInputs:
    spec: InferencePoolSpec
    status: RolloutStatus
    stable: str
    desired: str
    counts: Mapping[str, RevisionCounts]
    now: datetime
    analysis: AnalysisResult | None = None
    promote_request: str = ""
    abort_request: str = ""
    previous_canary_ready: int = 0
    """Ready canary pairs the last pass reported: more now is progress (resets the progress deadline)."""
    surge_room: int | None = None
    """Canary pairs that may run above ``replicas`` (:func:`surge_room`); None = not computed: capacity-first
    without the ``CanaryCapacityFirst`` report (callers that do not place pairs)."""


REASON_CAPACITY_FIRST: Final = c.REASON_CANARY_CAPACITY_FIRST


def surge_room(
    *,
    max_surge: int,
    replicas: int,
    live_canary: int,
    free_pairs: int,
    gpus_per_pair: int,
    gpu_budget: int | None,
    live_stable: int | None = None,
) -> int:
    """How many canary pairs can run beside all ``replicas`` stable pairs.

    The canary pairs already placed count (they hold their GPUs: a surge canary must not flip to
    capacity-first once it has taken the free GPUs), plus the whole pairs the free GPUs still take, less
    the stable pairs missing from ``replicas`` (``live_stable``: their GPUs went to the canary, so a
    capacity-first canary stays capacity-first), capped by ``maxSurge`` (the planner never keeps more than
    ``replicas + maxSurge`` live pairs) and by the GPU budget (``gpuBudget // gpusPerPair − replicas``).

    Example: replicas 8, maxSurge 2, one canary pair placed, free GPUs for 5 more, no budget → 2.
    With ``gpuBudget`` 72 and 8 GPUs per pair → min(2, 6, 9 − 8) = 1. No free GPUs, no canary → 0.
    One canary pair placed where a stable pair was drained (7 stable live), nothing free → 0.
    """
    missing = 0 if live_stable is None else max(0, replicas - live_stable)
    room = min(max_surge, live_canary + max(0, free_pairs) - missing)
    if gpu_budget is not None and gpus_per_pair > 0:
        room = min(room, gpu_budget // gpus_per_pair - replicas)
    return max(0, room)


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class RolloutDecision:
    status: RolloutStatus
    stable: str
    canary: str | None
    targets: dict[str, int]
    canary_weight_percent: int | None
    events: tuple[Event, ...] = ()
    canary_mirror: bool = False
    """The routing table mirrors requests to the canary (a ``setMirrorPairs`` step; its weight is then 0)."""
    persist_first: bool = False
    requeue_after: float | None = None
    progressing_reason: str = c.REASON_STEADY
    message: str = ""
    analysis_verdicts: tuple[GateVerdict, ...] = field(default_factory=tuple)


def steps_hash(steps: list[RolloutStep]) -> str:
    payload = [s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in steps]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def canary_target(steps: list[RolloutStep], index: int, replicas: int) -> tuple[int, int | None]:
    """(canary pairs, canary weight percent or None for by-count) in force at step ``index``."""
    for step in reversed(steps[: index + 1]):
        if step.set_weight is not None:
            if replicas == 0:
                return 0, step.set_weight
            return min(replicas, math.ceil(replicas * step.set_weight / 100)), step.set_weight
        if step.set_canary_pairs is not None:
            return min(replicas, step.set_canary_pairs), None
        if step.set_mirror_pairs is not None:
            return min(replicas, step.set_mirror_pairs), 0
    return 0, 0


def is_set_step(step: RolloutStep) -> bool:
    """Whether ``step`` sets the canary's pairs (setWeight, setCanaryPairs or setMirrorPairs)."""
    return step.set_weight is not None or step.set_canary_pairs is not None or step.set_mirror_pairs is not None


def mirrors(steps: list[RolloutStep], index: int) -> bool:
    """Whether the set step in force at ``index`` is a ``setMirrorPairs`` one: the canary's pairs get copies of
    their pair-count keys and serve none."""
    for step in reversed(steps[: index + 1]):
        if is_set_step(step):
            return step.set_mirror_pairs is not None
    return False


LIKE_LOAD_RATIO: Final = 0.9
"""A canary pair carrying less than this share of a stable pair's keys (or more than its inverse) is analysed at
another load: a decode instance with fewer streams runs faster (W5, 75 pairs, ``setWeight: 2`` on 2 canary pairs:
×0.76 of a stable pair's keys, a good canary's TPOT read ×0.80–0.85 of stable's, and TPOT × 1.3 read about ×1.1)."""


def like_load(load: float) -> bool:
    """Whether a canary pair at ``load`` (:func:`canary_pair_load`) is analysed at a stable pair's load, within
    ``LIKE_LOAD_RATIO`` either way."""
    return LIKE_LOAD_RATIO <= load <= 1 / LIKE_LOAD_RATIO


def fits_surge(canary: int, replicas: int, room: int | None, *, mirror: bool = False) -> bool:
    """Whether ``canary`` pairs run beside every stable pair: the canary fits the surge ``room`` and leaves stable at
    least one pair (a mirrored canary serves no key, so it may have as many pairs as stable). ``room`` None = not
    computed (a caller that does not place pairs): capacity-first. The planner passes the measured
    :func:`surge_room`; ``tandem plan``, which cannot see free GPUs, passes ``maxSurge``."""
    return room is not None and 0 < canary <= room and (mirror or canary < replicas)


def stable_beside(canary: int, replicas: int, room: int | None, *, mirror: bool = False) -> int:
    """Stable pairs serving beside ``canary`` canary pairs: all ``replicas`` with surge (:func:`fits_surge`), else
    ``replicas`` minus the canary's (capacity-first); 0 once the canary has them all."""
    if fits_surge(canary, replicas, room, mirror=mirror):
        return replicas
    if canary >= replicas:
        return 0
    return replicas - canary


def step_pairs(steps: list[RolloutStep], index: int, replicas: int, room: int | None) -> tuple[int, int]:
    """(canary, stable) pairs at step ``index`` for the surge ``room``: the one rule for the planner's targets, the
    step's completion and ``tandem plan``'s preview.

    :func:`canary_target`'s count, except a mirror step that does not fit the surge room: its pairs answer no user,
    so capacity-first it may take at most ``replicas − 1`` of stable's. Taking them all left a mirrored canary the
    only pairs in the table, and the router sent it every request (the simulator's 1 % W5 with ``setMirrorPairs: 2``
    on 2 pairs: the erroring canary served all 1,168 users' requests and its gates saw no stable baseline). With one
    replica a mirror step without surge room gets no pair: its analysis sees no data and ``onNoData`` decides.
    Example: replicas 8, ``setMirrorPairs: 2``: room 2 → (2, 8); room 1 → (2, 6), capacity-first; replicas 2,
    room 2 → (2, 2); replicas 2, room 0 → (1, 1)."""
    canary, _ = canary_target(steps, index, replicas)
    mirror = mirrors(steps, index)
    if mirror and not fits_surge(canary, replicas, room, mirror=True):
        canary = min(canary, replicas - 1)
    return canary, stable_beside(canary, replicas, room, mirror=mirror)


def canary_pair_load(steps: list[RolloutStep], index: int, replicas: int, max_surge: int) -> float | None:
    """A canary pair's share of keys over a stable pair's at step ``index`` (1.0 = like with like on load), or None
    when one side has no pairs (before the first set step, or at 100 %).

    Latency gates compare means, and a pair's TPOT and queueing grow with its streams: a canary pair with fewer keys
    than a stable pair reads faster than the same code would under stable's load. ``setCanaryPairs`` gives each canary
    pair a stable pair's share (traffic by pair count: 1.0); ``setWeight: w`` gives its ⌈replicas·w/100⌉ pairs w %
    together, capped by their share of serving pairs as the routing table caps it; stable's pairs are
    :func:`stable_beside`'s; a ``setMirrorPairs`` pair gets a copy of a stable pair's share (1.0). Example:
    replicas 8, maxSurge 2,
    ``setWeight: 5`` → 1 canary pair with 5 % of keys beside 8 stable pairs with 11.9 % each: ×0.42;
    ``setWeight: 50`` → 4 canary pairs, capacity-first against 4 stable: ×1.0; ``setCanaryPairs: 1``: ×1.0."""
    _, weight = canary_target(steps, index, replicas)
    canary, stable = step_pairs(steps, index, replicas, max_surge)
    if canary <= 0 or stable <= 0:
        return None
    if weight is None or mirrors(steps, index):
        return 1.0
    share = min(float(weight), 100.0 * canary / (canary + stable))
    if share >= 100.0:
        return None
    return (share / canary) / ((100.0 - share) / stable)


def _step_label(index: int, count: int) -> str:
    return f"{index + 1}/{count}"


def _kind(step: RolloutStep) -> str:
    if step.set_weight is not None:
        return f"setWeight {step.set_weight}"
    if step.set_canary_pairs is not None:
        return f"setCanaryPairs {step.set_canary_pairs}"
    if step.set_mirror_pairs is not None:
        return f"setMirrorPairs {step.set_mirror_pairs}"
    if step.pause is not None:
        return f"pause {step.pause.duration or 'until promoted'}"
    return "analysis"


def _start(
    status: RolloutStatus, revision: str, steps: list[RolloutStep], now: datetime, message: str
) -> RolloutStatus:
    return status.model_copy(
        update={
            "phase": "Progressing",
            "revision": revision,
            "step_index": 0,
            "step_count": len(steps),
            "step": _step_label(0, len(steps)),
            "steps_hash": steps_hash(steps),
            "step_started_at": now,
            "progress_at": now,
            "analysis": AnalysisProgress(),
            "gates": [],
            "message": message,
        }
    )


def _advance(status: RolloutStatus, steps: list[RolloutStep], now: datetime) -> RolloutStatus:
    index = status.step_index + 1
    return status.model_copy(
        update={
            "step_index": index,
            "step": _step_label(min(index, len(steps) - 1), len(steps)),
            "step_started_at": now,
            "progress_at": now,
            "analysis": AnalysisProgress(),
            "gates": [],
        }
    )


def plan_rollout(inp: RolloutInputs) -> RolloutDecision:
    """One pure transition of the rollout state machine (see module docstring)."""
    spec, now = inp.spec, inp.now
    steps = list(spec.rollout.steps)
    replicas = spec.pairs.replicas
    status = inp.status
    events: list[Event] = []
    handled = status.handled_action

    def counts(rev: str | None) -> RevisionCounts:
        return inp.counts.get(rev or "", RevisionCounts())

    stable = inp.stable
    desired = inp.desired
    in_rollout = status.phase in ("Progressing", "Paused", "RollingBack")

    # 1. Abort requests: a no-op without a rollout (DP-08); otherwise roll back.
    abort = is_new_request(inp.abort_request, handled)
    if abort:
        handled = inp.abort_request
        if status.phase in ("Progressing", "Paused"):
            events.append(
                Event(EVENT_WARNING, REASON_ABORT_REQUESTED, f"rollout of {status.revision} aborted by request")
            )
            status = status.model_copy(
                update={
                    "phase": "RollingBack",
                    "failed_revision": status.revision,
                    "message": "aborted by request: restoring stable capacity",
                    "handled_action": handled,
                }
            )
            in_rollout = True
        else:
            events.append(
                Event(EVENT_NORMAL, REASON_ABORT_IGNORED, "abort requested with no rollout in progress: nothing to do")
            )
            status = status.model_copy(update={"handled_action": handled})

    # 2. The spec went back to the stable revision mid-rollout: drop the canary.
    if desired == stable:
        canary = status.revision if in_rollout and status.revision and status.revision != stable else None
        targets = {stable: replicas}
        if canary:
            targets[canary] = 0
        live_canary = counts(canary).live if canary else 0
        if in_rollout and status.phase != "RollingBack":
            events.append(Event(EVENT_NORMAL, REASON_ROLLOUT_CANCELLED, f"spec is back on stable revision {stable}"))
        phase = status.phase
        if live_canary == 0 and in_rollout:
            phase = "RolledBack" if status.phase == "RollingBack" else "Idle"
        elif not in_rollout and phase not in ("Promoted", "RolledBack"):
            phase = "Idle"
        new = status.model_copy(
            update={
                "phase": phase,
                "step": "-" if phase in ("Idle", "Promoted", "RolledBack") else status.step,
                "handled_action": handled,
                "message": status.message if phase != "Idle" else "",
                "failed_revision": status.failed_revision if status.failed_revision != stable else "",
            }
        )
        reason = c.REASON_STEADY if phase in ("Idle", "Promoted") else c.REASON_ROLLING_BACK
        if phase == "RolledBack":
            reason = c.REASON_ROLLED_BACK
        return RolloutDecision(
            status=new,
            stable=stable,
            canary=canary if live_canary else None,
            targets=targets,
            canary_weight_percent=0 if live_canary else None,
            events=tuple(events),
            persist_first=new.phase != inp.status.phase,
            progressing_reason=reason,
        )

    # 3. The desired revision failed before: stay on stable until the spec changes again.
    if desired == status.failed_revision and status.phase in ("RolledBack", "RollingBack"):
        return _rolling_back(inp, status, stable, desired, events)

    # 4. Start or restart a rollout for the desired revision.
    current_hash = steps_hash(steps)
    if (
        not in_rollout
        or status.revision != desired
        or (status.phase != "RollingBack" and status.steps_hash != current_hash)
    ):
        previous = status.revision if in_rollout and status.revision not in ("", desired) else None
        restarted = in_rollout and (previous is not None or status.steps_hash != current_hash)
        reason = c.REASON_ROLLOUT_RESTARTED if restarted else REASON_ROLLOUT_STARTED
        message = f"rolling out {spec.stack.version} (revision {desired}) from stable {stable}"
        events.append(Event(EVENT_NORMAL, reason, message))
        status = _start(status, desired, steps, now, message).model_copy(
            update={"handled_action": handled, "failed_revision": ""}
        )
        decision = _progressing(inp, status, stable, desired, events, extra_zero=previous)
        return _with(
            decision,
            persist_first=True,
            progressing_reason=c.REASON_ROLLOUT_RESTARTED if restarted else decision.progressing_reason,
        )

    if status.phase == "RollingBack":
        return _rolling_back(inp, status, stable, desired, events)

    # 5. Promote requests skip the current step (or, with a "full-" prefix, every step).
    promote = is_new_request(inp.promote_request, handled)
    if promote:
        handled = inp.promote_request
        full = inp.promote_request.startswith("full")
        status = status.model_copy(update={"handled_action": handled})
        if full:
            events.append(
                Event(EVENT_WARNING, REASON_ROLL_FORWARD, f"full promotion of {desired} requested: gates skipped")
            )
            status = status.model_copy(
                update={"step_index": len(steps), "phase": "Progressing", "step_started_at": now}
            )
            return _promote(inp, status, stable, desired, events)
        events.append(
            Event(
                EVENT_NORMAL,
                REASON_PROMOTE_REQUESTED,
                f"step {status.step} ({_kind(steps[status.step_index])}) skipped by request",
            )
        )
        status = _advance(status, steps, now).model_copy(update={"phase": "Progressing"})
        if status.step_index >= len(steps):
            return _promote(inp, status, stable, desired, events)
        return _with(_progressing(inp, status, stable, desired, events), persist_first=True)

    # 6. Paused by the user (spec.rollout.paused) or by a failed gate with failureAction Pause.
    if spec.rollout.paused:
        if status.phase != "Paused":
            events.append(Event(EVENT_NORMAL, c.REASON_ROLLOUT_PAUSED, "rollout paused (spec.rollout.paused)"))
            status = status.model_copy(update={"phase": "Paused", "message": "paused by user"})
        return _with(
            _progressing(inp, status, stable, desired, events),
            persist_first=status.phase != inp.status.phase,
            progressing_reason=c.REASON_ROLLOUT_PAUSED,
        )
    if status.phase == "Paused":
        if status.message.startswith("paused by user"):
            events.append(Event(EVENT_NORMAL, REASON_ROLLOUT_RESUMED, "rollout resumed"))
            status = status.model_copy(
                update={"phase": "Progressing", "message": "", "step_started_at": now, "progress_at": now}
            )
        else:
            return _with(_progressing(inp, status, stable, desired, events), progressing_reason=c.REASON_ROLLOUT_PAUSED)

    # 7. Evaluate the current step.
    index = status.step_index
    if index >= len(steps):
        return _promote(inp, status, stable, desired, events)
    step = steps[index]
    want_canary, want_stable = step_pairs(steps, index, replicas, inp.surge_room)
    started = status.step_started_at or now
    done = False
    failed_reason = ""
    requeue: float | None = None
    analysis_progress = status.analysis
    gates = list(status.gates)
    if is_set_step(step):
        cc, sc = counts(desired), counts(stable)
        done = cc.ready >= want_canary and sc.live <= want_stable
        if cc.ready > inp.previous_canary_ready or status.progress_at is None:
            status = status.model_copy(update={"progress_at": now})
        last_progress = max(started, status.progress_at or started)
        deadline = last_progress + timedelta(seconds=parse_duration(spec.rollout.progress_deadline))
        if not done and now >= deadline:
            failed_reason = c.REASON_PROGRESS_DEADLINE
        elif not done:
            requeue = max(1.0, (deadline - now).total_seconds())
    elif step.pause is not None:
        if step.pause.duration is not None:
            until = started + timedelta(seconds=parse_duration(step.pause.duration))
            done = now >= until
            requeue = None if done else max(1.0, (until - now).total_seconds())
    elif step.analysis is not None:
        result = inp.analysis
        if result is not None:
            analysis_progress = result.progress
            gates = list(result.verdicts)
            if result.outcome == "Passed":
                done = True
                events.append(
                    Event(
                        EVENT_NORMAL,
                        REASON_ANALYSIS_PASSED,
                        f"step {status.step}: analysis passed: {result.message}".rstrip(": "),
                    )
                )
            elif result.outcome == "Failed":
                failed_reason = REASON_GATE_FAILED
            elif result.outcome == "NoDataDeadline":
                if spec.rollout.analysis.on_no_data == "Rollback":
                    failed_reason = REASON_ANALYSIS_NO_DATA
                else:
                    events.append(
                        Event(
                            EVENT_WARNING,
                            REASON_ANALYSIS_NO_DATA,
                            f"step {status.step}: no data until the deadline; paused",
                        )
                    )
                    status = status.model_copy(
                        update={"phase": "Paused", "message": "paused: analysis had no data until noDataDeadline"}
                    )
            elif result.outcome == "Paused":
                events.append(Event(EVENT_WARNING, REASON_INVALID_QUERY, f"step {status.step}: {result.message}"))
                status = status.model_copy(update={"phase": "Paused", "message": f"paused: {result.message}"[:1024]})
        # Requeue when the next evaluation is due, not a full interval after this pass: a pass that was
        # not due (a pod event, a status write) must not postpone the evaluation (controller bench C6).
        due = next_evaluation_at(analysis_progress, spec.rollout.analysis, started)
        requeue = min(parse_duration(spec.rollout.analysis.interval), max(1.0, (due - now).total_seconds()))
    status = status.model_copy(update={"analysis": analysis_progress, "gates": gates})

    if failed_reason:
        return _fail(inp, status, stable, desired, events, failed_reason)
    held = _below_floor(inp)
    if done and held:
        # A step never advances while Ready pairs are below the capacity floor (a node lost, an eviction):
        # the next step would move more traffic or drain more stable pairs onto a fleet already short.
        done = False
        requeue = min(requeue or 5.0, 5.0)
        status = status.model_copy(update={"message": f"holding step {status.step}: {held}"[:1024]})
    elif status.message.startswith("holding step "):
        status = status.model_copy(update={"message": ""})
    if done:
        status = _advance(status, steps, now)
        events.append(
            Event(EVENT_NORMAL, REASON_STEP_COMPLETED, f"step {index + 1}/{len(steps)} ({_kind(step)}) completed")
        )
        if status.step_index >= len(steps):
            return _promote(inp, status, stable, desired, events)
        return _with(_progressing(inp, status, stable, desired, events), persist_first=True)
    decision = _progressing(inp, status, stable, desired, events)
    persist = status.phase != inp.status.phase or status.handled_action != inp.status.handled_action
    return _with(
        decision,
        persist_first=persist,
        requeue_after=requeue,
        progressing_reason=c.REASON_ROLLOUT_PAUSED if status.phase == "Paused" else decision.progressing_reason,
    )


def _below_floor(inp: RolloutInputs) -> str:
    """Why the pool is below its capacity floor (Ready pairs < replicas − maxUnavailable), or "" when not."""
    floor = max(0, inp.spec.pairs.replicas - inp.spec.rollout.max_unavailable)
    ready = sum(c.ready for c in inp.counts.values())
    if ready >= floor:
        return ""
    return f"{ready} Ready pair(s), below the capacity floor {floor} (replicas − maxUnavailable)"


def _with(decision: RolloutDecision, **changes: object) -> RolloutDecision:
    from dataclasses import replace  # noqa: PLC0415 - local to keep the public surface small

    return replace(decision, **changes)  # type: ignore[arg-type]


def _progressing(
    inp: RolloutInputs,
    status: RolloutStatus,
    stable: str,
    desired: str,
    events: list[Event],
    extra_zero: str | None = None,
) -> RolloutDecision:
    steps = list(inp.spec.rollout.steps)
    replicas = inp.spec.pairs.replicas
    index = min(status.step_index, len(steps) - 1)
    want, want_stable = step_pairs(steps, index, replicas, inp.surge_room)
    mirror = mirrors(steps, index)
    note = capacity_note(inp, want, mirror)
    if note and (not status.message or status.message.startswith(("rolling out ", "canary capacity-first"))):
        status = status.model_copy(update={"message": note})
    elif not note and status.message.startswith("canary capacity-first"):
        status = status.model_copy(update={"message": ""})
    targets = {stable: want_stable, desired: want}
    if extra_zero and extra_zero not in targets:
        targets[extra_zero] = 0
    at = published_index(inp, steps, index, desired, want)
    return RolloutDecision(
        status=status,
        stable=stable,
        canary=desired,
        targets=targets,
        canary_weight_percent=canary_target(steps, at, replicas)[1],  # at -1: no set step yet, 0 %
        canary_mirror=mirrors(steps, at),
        events=tuple(events),
        progressing_reason=progress_reason(inp, want, mirror),
        message=status.message,
    )


def published_index(inp: RolloutInputs, steps: list[RolloutStep], index: int, desired: str, want: int) -> int:
    """The step whose canary share the routing table gets at step ``index``: ``index`` itself, except while a
    surge set step is still bringing its pairs up, when the previous step's weight (and mirror) stays in force;
    -1 before the first step (0 %, no mirror).

    Why: analysis (and its ``initialDelay``) starts only when the set step completes, that is when *all* its
    canary pairs are Ready. Publishing the new weight earlier let the first Ready pair serve its share for
    as long as the others took to load — W5 at the full rate measured 664 s of a bad canary's traffic
    before its first evaluation on 2 of 6 seeds, against 60 s on the rest (bench/results/w5-full-rate-
    fetched.md). Under surge stable keeps every pair, so holding the canary back costs no capacity.
    Capacity-first steps publish at once: there the Ready canary pairs replaced stable ones and must serve.
    Example: W5's ``setWeight: 2`` on 70 pairs wants 2 surge pairs; with 1 Ready the table keeps 0 %, with
    both Ready the step completes, the analysis step starts and the table gets 2 % in the same pass.
    """
    step = steps[index] if steps else None
    if step is None or not is_set_step(step) or not surges(inp, want, mirrors(steps, index)):
        return index
    if inp.counts.get(desired, RevisionCounts()).ready >= want:
        return index
    return index - 1


def surges(inp: RolloutInputs, want: int, mirror: bool) -> bool:
    """Whether ``want`` canary pairs run beside every stable pair (module docstring)."""
    return fits_surge(want, inp.spec.pairs.replicas, inp.surge_room, mirror=mirror)


def progress_reason(inp: RolloutInputs, want: int, mirror: bool) -> str:
    """``CanaryCapacityFirst`` when the planner computed the surge room and the step's canary did not fit."""
    if inp.surge_room is not None and want > 0 and not surges(inp, want, mirror):
        return REASON_CAPACITY_FIRST
    return c.REASON_ROLLOUT_IN_PROGRESS


def capacity_note(inp: RolloutInputs, want: int, mirror: bool) -> str:
    """The status message's reason for a capacity-first step ("" with surge or when not computed)."""
    if progress_reason(inp, want, mirror) != REASON_CAPACITY_FIRST:
        return ""
    if mirror:
        return (
            f"canary capacity-first: {want} mirrored canary pair(s) do not fit the surge room ({inp.surge_room}: "
            "maxSurge, gpuBudget, free GPUs); stable drains as they come up and serves every user on the pairs it "
            "keeps (at least one)"
        )
    return (
        f"canary capacity-first: {want} canary pair(s) do not fit the surge room ({inp.surge_room}: maxSurge, "
        "gpuBudget, free GPUs); stable drains as the canary comes up and a rollback must reload it"
    )


_REQUEST_TIME = re.compile(r"^(?:full-)?(\d{8}T\d{6}Z)-")


def is_new_request(request: str, handled: str) -> bool:
    """Whether a promote or abort request still has to be carried out.

    One field, ``status.rollout.handledAction``, records the last request of *either* kind carried out,
    and both annotations stay on the pool. Comparing for inequality alone re-ran old requests: after a
    promote P and then an abort A, P differs from A, so P skipped a step of the *next* rollout with
    nobody asking. Request ids from `tandem rollout` start with their UTC time (``[full-]YYYYMMDDTHHMMSSZ-
    <hex>``), so a request older than the one handled last is not new. Ids without that shape (written
    by hand) fall back to inequality.

    Example: handled ``20261201T100500Z-a1`` (an abort); the pool still carries promote
    ``20261201T100000Z-b2``: older, not new. A promote ``20261201T101000Z-c3`` is new.
    """
    if not request or request == handled:
        return False
    got, seen = _REQUEST_TIME.match(request), _REQUEST_TIME.match(handled)
    if got and seen:
        return got.group(1) >= seen.group(1)
    return True


def _promote(
    inp: RolloutInputs, status: RolloutStatus, stable: str, desired: str, events: list[Event]
) -> RolloutDecision:
    replicas = inp.spec.pairs.replicas
    events.append(
        Event(EVENT_NORMAL, c.REASON_PROMOTED, f"{inp.spec.stack.version} (revision {desired}) promoted to stable")
    )
    new = status.model_copy(
        update={
            "phase": "Promoted",
            "step": "-",
            "step_index": len(inp.spec.rollout.steps),
            "message": f"promoted {inp.spec.stack.version}",
            "analysis": AnalysisProgress(),
            "gates": [],
        }
    )
    return RolloutDecision(
        status=new,
        stable=desired,
        canary=None,
        targets={desired: replicas, stable: 0},
        canary_weight_percent=None,
        events=tuple(events),
        persist_first=True,
        progressing_reason=c.REASON_PROMOTED,
    )


def _fail(
    inp: RolloutInputs, status: RolloutStatus, stable: str, desired: str, events: list[Event], reason: str
) -> RolloutDecision:
    spec = inp.spec
    if spec.rollout.failure_action == "Pause" and reason != REASON_ANALYSIS_NO_DATA:
        events.append(
            Event(EVENT_WARNING, reason, f"step {status.step} failed ({reason}); rollout paused (failureAction Pause)")
        )
        paused = status.model_copy(update={"phase": "Paused", "message": f"paused after {reason}"})
        return _with(
            _progressing(inp, paused, stable, desired, events),
            persist_first=True,
            progressing_reason=c.REASON_ROLLOUT_PAUSED,
        )
    events.append(
        Event(EVENT_WARNING, reason, f"step {status.step} failed ({reason}): rolling back to stable {stable}")
    )
    rolling = status.model_copy(
        update={"phase": "RollingBack", "failed_revision": desired, "message": f"rolling back after {reason}"}
    )
    return _with(_rolling_back(inp, rolling, stable, desired, events), persist_first=True)


def _rolling_back(
    inp: RolloutInputs, status: RolloutStatus, stable: str, desired: str, events: list[Event]
) -> RolloutDecision:
    """Capacity-safe rollback: stable back to full Ready capacity, then traffic, then drain the canary."""
    replicas = inp.spec.pairs.replicas
    canary = status.revision or desired
    stable_counts = inp.counts.get(stable, RevisionCounts())
    canary_counts = inp.counts.get(canary, RevisionCounts())
    floor_met = stable_counts.ready >= replicas
    targets = {stable: replicas, canary: 0 if floor_met else canary_counts.live}
    # Until stable is back at full Ready capacity the canary keeps serving, but never more than the
    # weight of the step it failed at: "by pair count" would raise a 5 % canary to its pair share.
    steps = list(inp.spec.rollout.steps)
    _, step_weight = canary_target(steps, min(status.step_index, len(steps) - 1), replicas) if steps else (0, 0)
    weight = 0 if floor_met else step_weight
    phase = status.phase
    if floor_met and canary_counts.live == 0:
        if phase != "RolledBack":
            events.append(
                Event(EVENT_WARNING, c.REASON_ROLLED_BACK, f"revision {canary} rolled back; stable {stable} serving")
            )
        phase = "RolledBack"
    new = status.model_copy(update={"phase": phase, "step": "-" if phase == "RolledBack" else status.step})
    return RolloutDecision(
        status=new,
        stable=stable,
        canary=canary if canary_counts.live else None,
        targets=targets,
        canary_weight_percent=weight,
        events=tuple(events),
        persist_first=new.phase != inp.status.phase,
        progressing_reason=c.REASON_ROLLED_BACK if phase == "RolledBack" else c.REASON_ROLLING_BACK,
        message=new.message,
    )
