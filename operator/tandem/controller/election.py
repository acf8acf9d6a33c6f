"""Leader election and health endpoints of the operator process (`tandem run`).

What it owns: the loop that takes and keeps the Lease (decisions from `tandem.core.leader`, I/O through
`tandem.adapters.lease`), and a small HTTP server with ``/healthz`` (liveness) and ``/readyz``
(readiness) that answers from the first second of the process, whether it leads or stands by.

Why its own thread and its own server: a standby operator runs no kopf at all (kopf would start its
watches and daemons), so kopf's liveness endpoint does not exist while it waits; and the renewal must
not depend on the event loop, which a burst of reconcile passes can keep busy for seconds.

Invariant: two processes never act at once. ``is_leader()`` turns False the moment the renew deadline
passes without a renewal, before any follower may take the Lease (core/leader.py has the timing
argument); the operator checks it before every pass and the Kubernetes adapter before every write (a
fence: a demoted operator's in-flight pass fails at its next write). A demoted leader keeps running and
campaigns again. A graceful stop releases the Lease so the standby takes over within one retry period.

Only requests already sent when the deadline passes can land later; each has a 10 s budget, the same
residual risk as client-go's leader election.

Readiness: ready means "this process is doing its job": the leader once its reconcile loop started,
a standby while it reaches the API server (so a rolling update of 2 replicas proceeds).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tandem.adapters.kube import Conflict
from tandem.adapters.lease import LeaseStore
from tandem.core.leader import LeaseDecision, LeaseTimings, Observation, decide, must_stop, observe

log = logging.getLogger("tandem.leader")


class LeaderElector:
    """One candidate: ``acquire()`` blocks until it holds the Lease; ``start_renewing()`` keeps it."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timings: LeaseTimings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
    ) -> None:
        self.store = store
        self.identity = identity
        self.timings = timings or LeaseTimings()
        self.clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.seen: Observation | None = None
        self.leading = False
        self.last_renewed_at = -1e18
        self.last_contact_at = -1e18
        self.acquired_at: float | None = None
        self._thread: threading.Thread | None = None

    @property
    def duration_s(self) -> int:
        return max(1, round(self.timings.lease_duration_s))

    def try_once(self) -> LeaseDecision:
        """Read the Lease, decide, write if the decision says so. Returns the decision taken.

        A write that loses (409 Conflict / AlreadyExists) leaves this candidate not leading; it reads
        again next time. Other API errors propagate to the caller's loop.
        """
        record = self.store.get()
        now = self.clock()
        self.last_contact_at = now
        self.seen = None if record is None else observe(self.seen, record, now)
        decision = decide(self.seen, self.identity, now, self.timings)
        if decision.verb == "wait":
            if self.leading:
                log.error("lease taken over by %s", decision.holder)
            self.leading = False
            return decision
        try:
            if decision.verb == "create":
                written = self.store.create(self.identity, self.duration_s)
            else:
                assert self.seen is not None
                transitions = self.seen.record.transitions + (0 if decision.verb == "renew" else 1)
                written = self.store.replace(self.seen.record, self.identity, self.duration_s, transitions)
        except Conflict:
            self.leading = False
            return LeaseDecision("wait", self.seen.record.holder if self.seen else "", self.timings.retry_period_s)
        now = self.clock()
        self.seen = Observation(record=written, observed_at=now)
        self.last_renewed_at = now
        self.last_contact_at = now
        self.leading = True
        return decision

    def acquire(self) -> bool:
        """Block until this candidate leads (True) or ``stop()`` was called (False)."""
        waiting_for = None
        while not self._stop.is_set():
            try:
                decision = self.try_once()
            except Exception as exc:  # any API or network error: keep standing by, never crash
                log.warning("leader election: %s (retrying in %.0f s)", exc, self.timings.retry_period_s)
                self._sleep(self.timings.retry_period_s)
                continue
            if self.leading:
                self.acquired_at = self.clock()
                log.info("leader election: %s now leads (%s)", self.identity, decision.verb)
                return True
            if decision.holder != waiting_for:
                waiting_for = decision.holder
                log.info("leader election: standing by; the lease is held by %s", waiting_for or "(nobody)")
            self._sleep(decision.wait_s)
        return False

    def is_leader(self) -> bool:
        """Whether this process may act *now*: it holds the Lease and renewed it within the deadline.

        Read on every write (the adapter's fence) and before every pass, so the deadline holds even
        when a renewal call hangs: acting stops at ``last_renewed_at + renew_deadline_s`` whatever the
        elector thread is doing, and a follower waits ``lease_duration_s`` (> the deadline) from the
        last change it saw.
        """
        return self.leading and not must_stop(self.last_renewed_at, self.clock(), self.timings)

    def campaign(self, on_lead: Callable[[], None], on_lose: Callable[[str], None]) -> None:
        """Keep the Lease while leading, campaign for it while not; report each change of role.

        A leader that loses the Lease (taken by another, or not renewed within the deadline, e.g. an
        API server outage) does not exit: it stops acting (``is_leader`` is False) and campaigns again;
        when nobody took over meanwhile it renews its own Lease and resumes (API-01: a 30 s control
        plane outage must not kill the operator).
        """
        was = self.is_leader()
        while not self._stop.is_set():
            wait = self.timings.retry_period_s
            try:
                wait = min(wait, self.try_once().wait_s)
            except Exception as exc:  # a network error must not end this thread: is_leader() keeps time
                log.warning("leader election: %s", exc)
            now = self.is_leader()
            if now != was:
                if now:
                    log.info("leader election: %s leads again", self.identity)
                    on_lead()
                else:
                    why = (
                        f"could not renew the lease for {self.timings.renew_deadline_s:.0f} s"
                        if self.leading
                        else "the lease is held by another operator"
                    )
                    self.leading = False
                    log.error("leader election: %s; no writes until this operator leads again", why)
                    on_lose(why)
                was = now
            self._sleep(wait)

    def start_campaign(self, on_lead: Callable[[], None], on_lose: Callable[[str], None]) -> None:
        self._thread = threading.Thread(
            target=self.campaign, args=(on_lead, on_lose), name="leader-election", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Give the Lease up (holder empty) so a standby takes over at once; best effort."""
        self.stop()
        if not self.leading or self.seen is None:
            return
        try:
            record = self.store.get()
            if record is not None and record.holder == self.identity:
                self.store.replace(record, "", 1, record.transitions)
                log.info("leader election: lease released")
        except Exception as exc:  # best effort: the Lease expires on its own anyway
            log.warning("leader election: could not release the lease: %s", exc)
        self.leading = False


class HealthServer:
    """``/healthz`` and ``/readyz`` on one port, in a daemon thread, from the start of the process.

    ``ready`` and ``details`` are callables so the server holds no state of its own: the operator
    decides what ready means (see the module docstring).
    """

    def __init__(
        self, port: int, ready: Callable[[], bool], details: Callable[[], dict[str, Any]], address: str = "0.0.0.0"
    ) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    code = 200
                elif path == "/readyz":
                    code = 200 if server.ready() else 503
                else:
                    code = 404
                body = json.dumps({"ok": code == 200, **server.details()}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no log line
                return

        self.ready = ready
        self.details = details
        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="health", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
