"""What `tandem get pools` and `tandem rollout status --watch` print, and the exit code a CI job gates on.

What it owns: pure functions of a pool object (the JSON the API server returns) and the current time:
the `get` table (kubectl's layout: upper-case headers, columns separated by three spaces, `-o wide` adds
columns, `-A` adds NAMESPACE), kubectl-style ages, and the rollout verdict with its exit code.

What it must not do: any I/O. The commands in `tandem.poolctl` and `tandem.rolloutctl` fetch and print.

Exit codes of `rollout status --watch` (kubectl and the Argo Rollouts plugin only tell 0 from 1; a CI job
needs to tell "failed" from "slow" from "waiting for a person", so those get codes of their own):

- 0 `EXIT_DONE`: the spec's version is the stable revision, no canary, phase Idle/Promoted, Ready, and no
  old pair still draining (as `kubectl rollout status` waits for old replicas to terminate);
- 1 `EXIT_FAILED`: the rollout failed: RollingBack (the verdict is in; waiting for the capacity restore
  would change nothing for CI) or RolledBack while the spec still asks for the rolled-back version;
- 2 usage error (argparse's code; also a command whose optional extra is not installed);
- 3 `EXIT_TIMEOUT`: `--timeout` passed while the rollout was still progressing;
- 4 `EXIT_PAUSED`: the rollout waits for a person: phase Paused (paused by a user, a gate with
  failureAction Pause, or analysis without data), or a `pause: {}` step without a duration. Nothing
  will change until someone runs `rollout promote|resume|abort`, so watching on would only burn the
  CI job's time until the timeout.

Done is judged against `metadata.generation`: a status whose `observedGeneration` is older describes a
previous spec (the operator has not seen the change yet), so it is never reported as done. A promote or
abort request is an annotation, which does not change the generation: until `status.rollout.handledAction`
shows the operator carried it out, the status is still the one before it (so `rollout promote` followed
at once by `rollout status --watch` waits instead of reporting the pause it just ended).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from tandem.api.labels import ANNOTATION_ABORT, ANNOTATION_PROMOTE

EXIT_DONE: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_TIMEOUT: Final = 3
EXIT_PAUSED: Final = 4

COLUMN_GAP = "   "  # kubectl's tabwriter pads columns with three spaces
NONE = "-"
ARROW = "→"
MIRRORED = " (mirrored: it gets copies of its pair-count keys and answers no user)"

State = Literal["Waiting", "Progressing", "Done", "Failed", "Paused"]
EXIT_CODES: Final[dict[State, int | None]] = {
    "Waiting": None,
    "Progressing": None,
    "Done": EXIT_DONE,
    "Failed": EXIT_FAILED,
    "Paused": EXIT_PAUSED,
}


@dataclass(frozen=True)
class Verdict:
    """Where a pool's rollout stands for `rollout status`: a state, its exit code and one line."""

    state: State
    message: str

    @property
    def exit_code(self) -> int | None:
        """The code to exit with, or None while the rollout is still moving."""
        return EXIT_CODES[self.state]


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in _status(obj).get("conditions") or [] if c.get("type") == kind), {})


def _spec_version(obj: dict[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("stack") or {}).get("version") or NONE)


def _pairs(obj: dict[str, Any]) -> str:
    pairs = _status(obj).get("pairs") or {}
    desired = pairs.get("desired", ((obj.get("spec") or {}).get("pairs") or {}).get("replicas", 0))
    return f"{pairs.get('ready', 0)}/{desired}"


def _indefinite_pause(obj: dict[str, Any], step_index: int) -> bool:
    steps = ((obj.get("spec") or {}).get("rollout") or {}).get("steps") or []
    if not 0 <= step_index < len(steps):
        return False
    pause = steps[step_index].get("pause")
    return pause is not None and not (pause or {}).get("duration")


def _request_order(request_id: str) -> str:
    """Request ids are `[full-]<UTC stamp>-<hex>` (`tandem rollout`): without the prefix they sort by time."""
    return request_id.removeprefix("full-")


def pending_request(obj: dict[str, Any]) -> str:
    """`promote` or `abort` when that request is newer than the last one the operator carried out, else ""."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    handled = str((_status(obj).get("rollout") or {}).get("handledAction") or "")
    for kind, key in (("promote", ANNOTATION_PROMOTE), ("abort", ANNOTATION_ABORT)):
        request = str(annotations.get(key) or "")
        if request and request != handled and _request_order(request) > _request_order(handled):
            return kind
    return ""


def rollout_verdict(obj: dict[str, Any]) -> Verdict:
    """The rollout verdict of a pool (rules and exit codes in the module docstring).

    Example: spec v2, status {phase: Progressing, step: "2/4", canary v2 1/1 ready at 25%} →
    Verdict("Progressing", "Progressing step 2/4: canary v2 1/1 pairs ready, 25% of traffic").
    """
    status = _status(obj)
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    if not status or observed < generation:
        return Verdict("Waiting", f"waiting for the operator to observe generation {generation}")
    pending = pending_request(obj)
    if pending:
        return Verdict("Waiting", f"waiting for the operator to carry out the {pending} request")
    rollout = status.get("rollout") or {}
    revisions = status.get("revisions") or {}
    stable, canary = revisions.get("stable") or {}, revisions.get("canary") or {}
    phase = str(rollout.get("phase") or "Idle")
    step = str(rollout.get("step") or NONE)
    message = str(rollout.get("message") or "")
    version = _spec_version(obj)
    if phase == "RollingBack":
        return Verdict("Failed", f"RollingBack: {message or 'restoring the stable revision'}")
    if phase == "RolledBack" and stable.get("version") != version:
        return Verdict("Failed", f"RolledBack: {version} failed, stable is {stable.get('version', NONE)}: {message}")
    if phase == "Paused":
        return Verdict("Paused", f"Paused at step {step}: {message or 'paused'}; run `rollout resume|promote|abort`")
    if phase == "Progressing":
        if _indefinite_pause(obj, int(rollout.get("stepIndex") or 0)):
            return Verdict("Paused", f"Paused at step {step}: a pause step without a duration; run `rollout promote`")
        detail = (
            f"canary {canary.get('version', NONE)} {canary.get('readyPairs', 0)}/{canary.get('pairs', 0)} pairs ready, "
            f"{canary.get('weightPercent', 0)}% of traffic{MIRRORED if canary.get('mirrored') else ''}"
            if canary
            else "starting the canary"
        )
        extra = f" ({message})" if message else ""
        return Verdict("Progressing", f"Progressing step {step}: {detail}{extra}")
    # Idle, Promoted, or RolledBack with the spec back on the stable version: done once it is all Ready.
    if stable.get("version") != version or canary:
        return Verdict("Waiting", f"waiting for the rollout of {version} to start")
    ready = _condition(obj, "Ready")
    if ready.get("status") != "True" and ready.get("reason") != "ScaledToZero":
        reason = ready.get("reason") or "no Ready condition yet"
        return Verdict("Waiting", f"{phase}: {_pairs(obj)} pairs ready ({reason})")
    draining = int((status.get("pairs") or {}).get("draining") or 0)
    if draining:  # like `kubectl rollout status`: done once the old replicas are gone, not just the new up
        return Verdict("Waiting", f"{phase}: {version} is stable, {draining} old pair(s) draining")
    return Verdict("Done", f"{phase}: {version} is stable, {_pairs(obj)} pairs ready")


def watch_line(previous: Verdict | None, current: Verdict) -> str | None:
    """The line to print while watching: only when what the verdict says changed (kubectl prints each
    new state once, so a CI log shows the rollout's steps, not one line per poll)."""
    if previous is not None and previous.message == current.message:
        return None
    return current.message


def human_age(seconds: float) -> str:
    """A duration the way `kubectl get` prints AGE: two units while they matter, then one.

    Examples: 45 → 45s, 150 → 2m30s, 1500 → 25m, 11_000 → 3h3m, 90_000 → 25h, 200_000 → 2d7h,
    2_000_000 → 23d, 80_000_000 → 2y195d.
    """
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def _age(obj: dict[str, Any], now: datetime) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return NONE
    return human_age((now - datetime.fromisoformat(str(created).replace("Z", "+00:00"))).total_seconds())


def pool_row(obj: dict[str, Any], now: datetime, wide: bool = False) -> dict[str, str]:
    """One table row: the columns of `tandem get pools` (and `-o wide`'s extra ones)."""
    status = _status(obj)
    rollout = status.get("rollout") or {}
    revisions = status.get("revisions") or {}
    stable, canary = revisions.get("stable") or {}, revisions.get("canary") or {}
    version = str(stable.get("version") or _spec_version(obj))
    if canary:
        version = f"{version}{ARROW}{canary.get('version', NONE)}"
    row = {
        "NAME": str((obj.get("metadata") or {}).get("name", "")),
        "VERSION": version,
        "PHASE": str(rollout.get("phase") or (NONE if not status else "Idle")),
        "STEP": str(rollout.get("step") or NONE),
        "PAIRS": _pairs(obj),
        "WEIGHT": (f"{canary.get('weightPercent', 0)}%" + (" mirror" if canary.get("mirrored") else ""))
        if canary
        else NONE,
        "AGE": _age(obj, now),
    }
    if wide:
        ready = _condition(obj, "Ready")
        row |= {
            "READY": str(ready.get("status") or NONE),
            "MODEL": str(((obj.get("spec") or {}).get("model") or {}).get("servedName") or NONE),
            "STABLE": str(stable.get("name") or NONE),
            "CANARY": str(canary.get("name") or NONE),
            "MESSAGE": str(rollout.get("message") or ready.get("message") or ""),
        }
    return row


def render_table(objs: list[dict[str, Any]], now: datetime, wide: bool = False, all_namespaces: bool = False) -> str:
    """The pools as kubectl prints a list: sorted by (namespace, name), padded columns, no trailing blanks."""
    ordered = sorted(objs, key=lambda o: ((o.get("metadata") or {}).get("namespace", ""), o["metadata"]["name"]))
    rows = []
    for obj in ordered:
        row = pool_row(obj, now, wide)
        if all_namespaces:
            row = {"NAMESPACE": str(obj["metadata"].get("namespace", "")), **row}
        rows.append(row)
    if not rows:
        return ""
    headers = list(rows[0])
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in headers}
    lines = [COLUMN_GAP.join(h.ljust(widths[h]) for h in headers).rstrip()]
    lines += [COLUMN_GAP.join(r[h].ljust(widths[h]) for h in headers).rstrip() for r in rows]
    return "\n".join(lines)


def as_document(objs: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    """What `-o json|yaml` prints: the object for `get pool NAME`, else a kubectl `List`."""
    if single and len(objs) == 1:
        return objs[0]
    return {"apiVersion": "v1", "kind": "List", "items": objs, "metadata": {"resourceVersion": ""}}


def watch_rollout(
    fetch: Callable[[], dict[str, Any] | None],
    *,
    timeout_s: float,
    interval_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    emit: Callable[[str], None],
) -> int:
    """Poll a pool until its rollout verdict has an exit code, or ``timeout_s`` passes (0: no limit).

    The I/O comes in as callables (``fetch`` returns the pool or None when it is gone, and raises
    `TransientError` for a failed poll, which is reported once and retried until the deadline), so the
    loop is tested with a fake clock and a scripted sequence of pool states.
    """
    deadline = clock() + timeout_s if timeout_s > 0 else None
    previous: Verdict | None = None
    last_error = ""
    while True:
        try:
            obj = fetch()
        except TransientError as exc:
            if str(exc) != last_error:
                emit(f"retrying: {exc}")
            last_error = str(exc)
        else:
            last_error = ""
            if obj is None:
                emit("the pool was deleted")
                return EXIT_FAILED
            verdict = rollout_verdict(obj)
            line = watch_line(previous, verdict)
            if line is not None:
                emit(line)
            previous = verdict
            if verdict.exit_code is not None:
                return verdict.exit_code
        now = clock()
        if deadline is not None and now >= deadline:
            where = previous.message if previous is not None else last_error
            emit(f"timed out after {human_age(timeout_s)} waiting for the rollout: {where}")
            return EXIT_TIMEOUT
        sleep(interval_s if deadline is None else min(interval_s, deadline - now))


class TransientError(Exception):
    """A poll that failed but may succeed on the next try (the API server blinked)."""
