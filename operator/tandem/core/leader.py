"""Leader election on a coordination.k8s.io Lease: the pure decision of one candidate.

What it owns: given the Lease as last read, this candidate's identity and its own monotonic clock, say
what to write (take, renew, or nothing) and whether this candidate may act. No I/O: the adapter reads
and writes the Lease with its resourceVersion, so of two candidates that decide to take the same expired
Lease only one write succeeds (the other gets 409 and reads again).

Why a Lease and not kopf peering: kopf's peering pauses operators of lower priority, but operators of
equal priority all keep running (it only warns), and a restarted pod must first notice its peers. Two
operator processes acting on one pool raced every rollout step (CC-03: 5 live pairs where replicas 3 +
maxSurge 1 allow 4). A Lease gives one writer at a time with a bounded takeover, like every Go
controller (client-go's leaderelection), and the chart can run 2 replicas.

Timing rules (client-go's, with its defaults):

- A candidate trusts *its own* clock, never the Lease's ``renewTime`` (clocks of two nodes may differ):
  it remembers when it last saw the Lease's record change (``observed_at``), and takes the Lease only
  when the record has not changed for ``lease_duration_s`` on its own clock.
- The leader renews every ``retry_period_s``; if it has not renewed successfully for
  ``renew_deadline_s`` (< ``lease_duration_s``) it must stop acting at once (the runner exits the
  process). Since a follower waits the full ``lease_duration_s`` after the last change it saw, the old
  leader has stopped ``lease_duration_s - renew_deadline_s`` (5 s by default) before anyone else starts.
- A Lease whose holder is empty was released on purpose (a graceful shutdown): take it at once.
- A candidate that holds the Lease under its own identity (a container restarted in the same pod, so
  the same name) takes it back at once: the old process of that identity is gone.

Worked example (defaults 15/10/2 s): the leader A renews at t=100 and is SIGKILLed at t=101. B read the
changed record at t=100.5 (``observed_at``), and sees no change at 102.5, ..., 114.5; at t=115.5 ≥
100.5 + 15 it writes the Lease with itself as holder; the write carries the resourceVersion it read, so
it fails if A had renewed after all. Takeover ≈ 15 s + one retry period at most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


@dataclass(frozen=True)
class LeaseTimings:
    """How long a Lease is trusted, how long a leader may fail to renew, and how often it tries."""

    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.lease_duration_s} s"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that the decision reads (``spec`` plus ``metadata.resourceVersion``)."""

    holder: str
    """``spec.holderIdentity``; empty when the Lease was released."""
    renew_time: str
    """``spec.renewTime`` as written (compared for change only, never as a clock)."""
    transitions: int
    resource_version: str


@dataclass(frozen=True)
class Observation:
    """What a candidate remembers of the Lease: the record and when (its own clock) it last changed."""

    record: LeaseRecord
    observed_at: float


Verb = Literal["create", "take", "renew", "wait"]


@dataclass(frozen=True)
class LeaseDecision:
    verb: Verb
    """create: no Lease yet; take: become the holder; renew: stay the holder; wait: someone else holds it."""
    holder: str
    """Who holds the Lease after this decision (if the write succeeds)."""
    wait_s: float
    """Seconds until this candidate should look again."""


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """Remember ``record``; the clock restarts only when holder or renew time changed."""
    if previous is not None and (previous.record.holder, previous.record.renew_time) == (
        record.holder,
        record.renew_time,
    ):
        return Observation(record=record, observed_at=previous.observed_at)
    return Observation(record=record, observed_at=now)


def decide(seen: Observation | None, identity: str, now: float, timings: LeaseTimings) -> LeaseDecision:
    """The next write of candidate ``identity`` given the Lease it last observed (None: no Lease exists)."""
    if seen is None:
        return LeaseDecision("create", identity, timings.retry_period_s)
    holder = seen.record.holder
    if holder == identity:
        return LeaseDecision("renew", identity, timings.retry_period_s)
    if not holder:
        return LeaseDecision("take", identity, timings.retry_period_s)
    expires_in = seen.observed_at + timings.lease_duration_s - now
    if expires_in <= 0:
        return LeaseDecision("take", identity, timings.retry_period_s)
    return LeaseDecision("wait", holder, min(timings.retry_period_s, expires_in))


def must_stop(last_renewed_at: float, now: float, timings: LeaseTimings) -> bool:
    """A leader that has not renewed for ``renew_deadline_s`` must stop acting before anyone takes over."""
    return now - last_renewed_at >= timings.renew_deadline_s
