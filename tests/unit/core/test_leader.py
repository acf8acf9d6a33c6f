"""Leader election: the pure decision (tandem.core.leader) and the elector loop over a fake Lease store.

The property that matters: two candidates never both act at once, whatever the interleaving of their
reads, writes, crashes and network failures, as long as each stops acting when its renew deadline passed.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.adapters.kube import Conflict, ServerError
from tandem.controller.election import HealthServer, LeaderElector
from tandem.core.leader import LeaseRecord, LeaseTimings, Observation, decide, must_stop, observe

T = LeaseTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)


def rec(holder: str, renew: str = "r1", rv: str = "1") -> LeaseRecord:
    return LeaseRecord(holder=holder, renew_time=renew, transitions=0, resource_version=rv)


@pytest.mark.parametrize(
    ("seen", "now", "want_verb", "want_holder"),
    [
        pytest.param(None, 0.0, "create", "me", id="no lease: create it"),
        pytest.param(Observation(rec("me"), 0.0), 100.0, "renew", "me", id="mine: renew (same identity restarted)"),
        pytest.param(Observation(rec(""), 0.0), 1.0, "take", "me", id="released: take at once"),
        pytest.param(Observation(rec("other"), 0.0), 14.9, "wait", "other", id="held and fresh: wait"),
        pytest.param(Observation(rec("other"), 0.0), 15.0, "take", "me", id="unchanged for a lease duration: take"),
    ],
)
def test_decide_table(seen: Observation | None, now: float, want_verb: str, want_holder: str) -> None:
    got = decide(seen, "me", now, T)
    assert (got.verb, got.holder) == (want_verb, want_holder)
    assert 0 < got.wait_s <= T.retry_period_s


def test_observe_keeps_the_clock_while_the_record_is_unchanged_and_restarts_it_on_a_renewal() -> None:
    first = observe(None, rec("other", "r1", "1"), now=5.0)
    same = observe(first, rec("other", "r1", "1"), now=9.0)
    renewed = observe(same, rec("other", "r2", "2"), now=11.0)
    assert (first.observed_at, same.observed_at, renewed.observed_at) == (5.0, 5.0, 11.0)


def test_the_lease_time_written_by_a_skewed_clock_is_never_read_as_a_time() -> None:
    """A renewTime from a node whose clock is an hour ahead changes nothing: only *change* counts."""
    seen = observe(None, rec("other", "2099-01-01T00:00:00.000000Z"), now=0.0)
    assert decide(seen, "me", 14.0, T).verb == "wait"
    assert decide(seen, "me", 15.0, T).verb == "take"


def test_must_stop_at_the_renew_deadline() -> None:
    assert not must_stop(last_renewed_at=100.0, now=109.9, timings=T)
    assert must_stop(last_renewed_at=100.0, now=110.0, timings=T)


@pytest.mark.parametrize(
    "timings",
    [
        pytest.param((15, 15, 2), id="deadline equal to duration"),
        pytest.param((15, 10, 10), id="retry equal to deadline"),
        pytest.param((15, 10, 0), id="zero retry"),
    ],
)
def test_timings_must_leave_a_gap_between_deadline_and_duration(timings: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseTimings(*timings)


# --- the elector over a fake store, simulated time ------------------------------------------------


@dataclass
class FakeLeaseStore:
    """An API server's Lease: resourceVersion-guarded create/replace; can be told to fail calls."""

    record: LeaseRecord | None = None
    down_for: set[str] = field(default_factory=set)  # identities whose calls fail (a network partition)
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _renewals: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def view(self, who: str) -> FakeView:
        return FakeView(self, who)


@dataclass
class FakeView:
    store: FakeLeaseStore
    who: str

    def _check(self) -> None:
        if self.who in self.store.down_for:
            raise ServerError(0, "Unreachable", "connection refused")

    def _new(self, holder: str, transitions: int) -> LeaseRecord:
        rv = str(next(self.store._rv))
        self.store.record = LeaseRecord(holder, f"t{next(self.store._renewals)}", transitions, rv)
        return self.store.record

    def get(self) -> LeaseRecord | None:
        self._check()
        return self.store.record

    def create(self, holder: str, duration_s: int) -> LeaseRecord:
        self._check()
        if self.store.record is not None:
            raise Conflict(409, "AlreadyExists", "exists")
        return self._new(holder, 0)

    def replace(self, seen: LeaseRecord, holder: str, duration_s: int, transitions: int) -> LeaseRecord:
        self._check()
        if self.store.record is None or self.store.record.resource_version != seen.resource_version:
            raise Conflict(409, "Conflict", "the object has been modified")
        return self._new(holder, transitions)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_second_candidate_waits_then_takes_over_a_dead_leader_after_the_lease_duration() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a = LeaderElector(store.view("a"), "a", T, clock=clock)
    b = LeaderElector(store.view("b"), "b", T, clock=clock)
    assert a.try_once().verb == "create" and a.leading
    assert b.try_once().verb == "wait" and not b.leading
    # a dies at t=0 (no more renewals); b looks every retry period
    took_at = None
    while took_at is None and clock.now < 60:
        clock.now += T.retry_period_s
        if b.try_once().verb == "take" and b.leading:
            took_at = clock.now
    assert took_at is not None and T.lease_duration_s <= took_at <= T.lease_duration_s + 2 * T.retry_period_s
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1


def test_a_released_lease_is_taken_within_one_retry_period() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a = LeaderElector(store.view("a"), "a", T, clock=clock)
    b = LeaderElector(store.view("b"), "b", T, clock=clock)
    a.try_once()
    b.try_once()
    a.release()
    clock.now += T.retry_period_s
    assert b.try_once().verb == "take" and b.leading


def test_two_candidates_taking_one_expired_lease_at_once_only_one_wins() -> None:
    store, clock = FakeLeaseStore(record=rec("dead", rv="7")), Clock()
    a = LeaderElector(store.view("a"), "a", T, clock=clock)
    b = LeaderElector(store.view("b"), "b", T, clock=clock)
    a.try_once()
    b.try_once()
    clock.now = 20.0
    # both read the same record, then both write: the second write carries a stale resourceVersion
    seen_a, seen_b = store.view("a").get(), store.view("b").get()
    assert seen_a == seen_b
    a.try_once()
    b.try_once()
    assert [a.leading, b.leading].count(True) == 1


def test_a_leader_that_cannot_renew_stops_acting_at_the_deadline_and_resumes_when_the_api_is_back() -> None:
    store, clock = FakeLeaseStore(), Clock()
    changes: list[str] = []
    a = LeaderElector(store.view("a"), "a", T, clock=clock)

    def tick(seconds: float) -> None:
        clock.now += seconds
        if clock.now >= 30:
            store.down_for.discard("a")  # the API server is back after a 30 s outage (API-01)
        if clock.now >= 40:
            a.stop()

    a._sleep = tick
    a.try_once()
    store.down_for.add("a")
    a.campaign(lambda: changes.append(f"lead@{clock.now:.0f}"), lambda why: changes.append(f"lose@{clock.now:.0f}"))
    lost_at, led_at = (float(c.split("@")[1]) for c in changes)
    assert changes[0].startswith("lose") and changes[1].startswith("lead"), changes
    assert T.renew_deadline_s <= lost_at <= T.renew_deadline_s + T.retry_period_s
    assert 30 <= led_at <= 30 + T.retry_period_s, "nobody took over: it renews its own Lease and resumes"
    assert a.is_leader()


def test_is_leader_turns_false_at_the_deadline_even_while_a_renewal_hangs() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a = LeaderElector(store.view("a"), "a", T, clock=clock)
    a.try_once()
    clock.now += T.renew_deadline_s - 0.1
    assert a.is_leader()
    clock.now += 0.1  # no thread ran: the verdict is computed from the clock, not set by the loop
    assert not a.is_leader()


def test_a_lease_taken_by_another_demotes_the_leader() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a = LeaderElector(store.view("a"), "a", T, clock=clock)
    a.try_once()
    assert store.record is not None
    store.record = LeaseRecord("b", "forced", 1, "99")  # e.g. an admin handed the Lease to b
    assert a.try_once().verb == "wait" and not a.is_leader()


def _simulate(script: list[tuple[str, str]]) -> None:
    """Replay a history of two candidates polling every retry period; each second one of them may crash
    (and restart as the same identity with a fresh memory), lose the API server, or get it back. A candidate
    acts from a successful take/renew until its renew deadline passes without a renewal (the runner exits
    it then). Asserts that the acting windows never overlap."""
    store, clock = FakeLeaseStore(), Clock()
    electors = {who: LeaderElector(store.view(who), who, T, clock=clock) for who in "ab"}
    last_poll = {"a": -1e9, "b": -1e9}
    for who, what in script:
        clock.now += 1.0
        if what == "crash":
            electors[who] = LeaderElector(store.view(who), who, T, clock=clock)  # a dead process acts no more
        elif what == "partition":
            store.down_for.add(who)
        elif what == "heal":
            store.down_for.discard(who)
        for c in "ab":
            elector = electors[c]
            if elector.leading and must_stop(elector.last_renewed_at, clock.now, T):
                electors[c] = LeaderElector(store.view(c), c, T, clock=clock)  # the runner exits the process
                continue
            if clock.now - last_poll[c] < T.retry_period_s:
                continue
            last_poll[c] = clock.now
            with contextlib.suppress(ServerError):
                elector.try_once()
        acting = [c for c in "ab" if electors[c].leading and not must_stop(electors[c].last_renewed_at, clock.now, T)]
        assert len(acting) <= 1, (acting, clock.now, store.record)


EVENTS = ["none", "none", "none", "crash", "partition", "heal"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(EVENTS)), min_size=1, max_size=150))
def test_two_candidates_never_act_at_once(script: list[tuple[str, str]]) -> None:
    _simulate(script)


def test_two_candidates_never_act_at_once_over_500_seeded_histories() -> None:
    """The same property over long seeded histories (hypothesis favours short ones)."""
    for seed in range(500):
        rnd = random.Random(seed)
        _simulate([(rnd.choice("ab"), rnd.choice(EVENTS)) for _ in range(200)])


@pytest.mark.component
def test_health_server_answers_liveness_always_and_readiness_from_its_callable() -> None:
    import json  # noqa: PLC0415
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    ready = {"value": False}
    server = HealthServer(0, lambda: ready["value"], lambda: {"role": "standby"}, address="127.0.0.1").start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
            assert resp.status == 200 and json.loads(resp.read())["role"] == "standby"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert err.value.code == 503
        ready["value"] = True
        with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.stop()
