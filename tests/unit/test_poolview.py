"""`tandem.poolview`: the rollout verdict and its exit code, the watch lines, the `get` table, ages."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tandem.poolview import (
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_PAUSED,
    EXIT_TIMEOUT,
    TransientError,
    Verdict,
    as_document,
    human_age,
    render_table,
    rollout_verdict,
    watch_line,
    watch_rollout,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STEPS = [{"setCanaryPairs": 1}, {"pause": {"duration": "30s"}}, {"pause": {}}, {"setWeight": 100}]


def rev(version: str, ready: int, pairs: int, weight: int) -> dict[str, Any]:
    return {"name": f"r-{version}", "version": version, "pairs": pairs, "readyPairs": ready, "weightPercent": weight}


class Pool:
    """A pool object as the API server returns it, built fluently (spec v1, stable v1, 3/3 Ready, Idle)."""

    def __init__(self, name: str = "speed", namespace: str = "team-a") -> None:
        self.o: dict[str, Any] = {
            "apiVersion": "tandem.dev/v1alpha1",
            "kind": "InferencePool",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "generation": 2,
                "creationTimestamp": (NOW - timedelta(minutes=25)).isoformat().replace("+00:00", "Z"),
            },
            "spec": {
                "model": {"servedName": "qwen3-8b"},
                "stack": {"version": "v1"},
                "pairs": {"replicas": 3},
                "rollout": {"steps": STEPS},
            },
            "status": {
                "observedGeneration": 2,
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllPairsReady", "message": "ok"}],
                "pairs": {"desired": 3, "ready": 3, "summary": "3/3"},
                "revisions": {"stable": rev("v1", 3, 3, 100)},
                "rollout": {"phase": "Idle", "step": "-"},
            },
        }

    def spec_version(self, version: str) -> Pool:
        self.o["spec"]["stack"]["version"] = version
        return self

    def rollout(self, phase: str, step_index: int = 0, message: str = "") -> Pool:
        step = "-" if phase in ("Idle", "Promoted", "RolledBack") else f"{step_index + 1}/{len(STEPS)}"
        self.o["status"]["rollout"] = {"phase": phase, "stepIndex": step_index, "step": step, "message": message}
        return self

    def canary(self, version: str, ready: int, pairs: int, weight: int) -> Pool:
        self.o["status"]["revisions"]["canary"] = rev(version, ready, pairs, weight)
        return self

    def mirrored(self) -> Pool:
        self.o["status"]["revisions"]["canary"]["mirrored"] = True
        return self

    def stable(self, version: str) -> Pool:
        self.o["status"]["revisions"]["stable"] = rev(version, 3, 3, 100)
        return self

    def ready(self, status: str, reason: str, ready_pairs: int = 3) -> Pool:
        self.o["status"]["conditions"] = [{"type": "Ready", "status": status, "reason": reason, "message": ""}]
        self.o["status"]["pairs"].update(ready=ready_pairs, summary=f"{ready_pairs}/3")
        return self

    def draining(self, pairs: int) -> Pool:
        self.o["status"]["pairs"]["draining"] = pairs
        return self

    def annotate(self, key: str, request: str, handled: str = "") -> Pool:
        self.o["metadata"].setdefault("annotations", {})[key] = request
        self.o["status"]["rollout"]["handledAction"] = handled
        return self

    def generation(self, generation: int) -> Pool:
        self.o["metadata"]["generation"] = generation
        return self

    def no_status(self) -> Pool:
        self.o.pop("status")
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self.o)


@pytest.mark.parametrize(
    ("pool", "want_state", "want_code", "want_message"),
    [
        pytest.param(Pool(), "Done", EXIT_DONE, "Idle: v1 is stable, 3/3 pairs ready", id="idle and ready is done"),
        pytest.param(
            Pool().spec_version("v2").stable("v2").rollout("Promoted"),
            "Done",
            EXIT_DONE,
            "Promoted: v2 is stable, 3/3 pairs ready",
            id="promoted is done",
        ),
        pytest.param(
            Pool().spec_version("v2").stable("v2").rollout("Promoted").draining(1),
            "Waiting",
            None,
            "Promoted: v2 is stable, 1 old pair(s) draining",
            id="promoted but old pairs still draining waits",
        ),
        pytest.param(
            Pool().spec_version("v2").generation(3),
            "Waiting",
            None,
            "waiting for the operator to observe generation 3",
            id="a status of an older generation is never done",
        ),
        pytest.param(
            Pool()
            .spec_version("v2")
            .rollout("Progressing", 2)
            .canary("v2", 1, 1, 25)
            .annotate("tandem.dev/promote", "20261201T120000Z-aaaaaa", handled="20261201T110000Z-bbbbbb"),
            "Waiting",
            None,
            "waiting for the operator to carry out the promote request",
            id="a promote not yet carried out waits instead of reporting the pause it ends",
        ),
        pytest.param(
            Pool()
            .spec_version("v2")
            .rollout("Progressing", 2)
            .canary("v2", 1, 1, 25)
            .annotate("tandem.dev/promote", "full-20261201T100000Z-aaaaaa", handled="20261201T110000Z-bbbbbb"),
            "Paused",
            EXIT_PAUSED,
            "Paused at step 3/4: a pause step without a duration; run `rollout promote`",
            id="an older promote than the last handled request is not pending",
        ),
        pytest.param(
            Pool().annotate("tandem.dev/abort", "20261201T120000Z-aaaaaa", handled="20261201T120000Z-aaaaaa"),
            "Done",
            EXIT_DONE,
            "Idle: v1 is stable, 3/3 pairs ready",
            id="a handled request is not pending",
        ),
        pytest.param(
            Pool().no_status(), "Waiting", None, "waiting for the operator to observe generation 2", id="no status yet"
        ),
        pytest.param(
            Pool().spec_version("v2"),
            "Waiting",
            None,
            "waiting for the rollout of v2 to start",
            id="spec ahead of stable, no rollout yet",
        ),
        pytest.param(
            Pool().ready("False", "PairsNotReady", 2),
            "Waiting",
            None,
            "Idle: 2/3 pairs ready (PairsNotReady)",
            id="idle but not ready waits",
        ),
        pytest.param(
            Pool().ready("False", "ScaledToZero", 0),
            "Done",
            EXIT_DONE,
            "Idle: v1 is stable, 0/3 pairs ready",
            id="scaled to zero is done",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("Progressing", 0).canary("v2", 1, 1, 25),
            "Progressing",
            None,
            "Progressing step 1/4: canary v2 1/1 pairs ready, 25% of traffic",
            id="progressing",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("Progressing", 0).canary("v2", 1, 1, 0).mirrored(),
            "Progressing",
            None,
            "Progressing step 1/4: canary v2 1/1 pairs ready, 0% of traffic (mirrored: it gets copies of its pair-count"
            " keys and answers no user)",
            id="a mirrored canary says so",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("Progressing", 1).canary("v2", 1, 1, 25),
            "Progressing",
            None,
            "Progressing step 2/4: canary v2 1/1 pairs ready, 25% of traffic",
            id="a timed pause step is progress",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("Progressing", 2).canary("v2", 1, 1, 25),
            "Paused",
            EXIT_PAUSED,
            "Paused at step 3/4: a pause step without a duration; run `rollout promote`",
            id="a pause step without duration waits for a person",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("Paused", 0, "paused by user").canary("v2", 1, 1, 25),
            "Paused",
            EXIT_PAUSED,
            "Paused at step 1/4: paused by user; run `rollout resume|promote|abort`",
            id="paused by a user",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("RollingBack", 1, "gate ttft failed").canary("v2", 1, 1, 0),
            "Failed",
            EXIT_FAILED,
            "RollingBack: gate ttft failed",
            id="rolling back is a failure at once",
        ),
        pytest.param(
            Pool().spec_version("v2").rollout("RolledBack", 0, "gate ttft failed"),
            "Failed",
            EXIT_FAILED,
            "RolledBack: v2 failed, stable is v1: gate ttft failed",
            id="rolled back while the spec asks for it",
        ),
        pytest.param(
            Pool().rollout("RolledBack", 0, "gate ttft failed"),
            "Done",
            EXIT_DONE,
            "RolledBack: v1 is stable, 3/3 pairs ready",
            id="rolled back and the spec is back on stable is done",
        ),
    ],
)
def test_rollout_verdict(pool: Pool, want_state: str, want_code: int | None, want_message: str) -> None:
    verdict = rollout_verdict(pool.obj())
    assert (verdict.state, verdict.exit_code, verdict.message) == (want_state, want_code, want_message)


@pytest.mark.parametrize(
    ("previous", "current", "want"),
    [
        pytest.param(None, Verdict("Waiting", "a"), "a", id="first poll prints"),
        pytest.param(Verdict("Waiting", "a"), Verdict("Waiting", "a"), None, id="unchanged prints nothing"),
        pytest.param(Verdict("Waiting", "a"), Verdict("Progressing", "b"), "b", id="a change prints"),
    ],
)
def test_watch_line_only_on_change(previous: Verdict | None, current: Verdict, want: str | None) -> None:
    assert watch_line(previous, current) == want


class Script:
    """A scripted watch: the pool states returned by successive polls, and a fake clock that sleeps."""

    def __init__(self, *states: dict[str, Any] | Exception | None) -> None:
        self.states = list(states)
        self.now = 0.0
        self.lines: list[str] = []
        self.sleeps: list[float] = []

    def fetch(self) -> dict[str, Any] | None:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(state, Exception):
            raise state
        return state

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def run(self, timeout_s: float) -> int:
        return watch_rollout(
            self.fetch,
            timeout_s=timeout_s,
            interval_s=2.0,
            clock=lambda: self.now,
            sleep=self.sleep,
            emit=self.lines.append,
        )


progressing = Pool().spec_version("v2").rollout("Progressing", 0).canary("v2", 0, 1, 0).obj()
progressing_ready = Pool().spec_version("v2").rollout("Progressing", 0).canary("v2", 1, 1, 25).obj()
promoted = Pool().spec_version("v2").stable("v2").rollout("Promoted").obj()


@pytest.mark.parametrize(
    ("script", "timeout_s", "want_code", "want_lines"),
    [
        pytest.param(
            Script(progressing, progressing, progressing_ready, promoted),
            120,
            EXIT_DONE,
            [
                "Progressing step 1/4: canary v2 0/1 pairs ready, 0% of traffic",
                "Progressing step 1/4: canary v2 1/1 pairs ready, 25% of traffic",
                "Promoted: v2 is stable, 3/3 pairs ready",
            ],
            id="a line per change until done",
        ),
        pytest.param(
            Script(progressing),
            5,
            EXIT_TIMEOUT,
            [
                "Progressing step 1/4: canary v2 0/1 pairs ready, 0% of traffic",
                "timed out after 5s waiting for the rollout: Progressing step 1/4: canary v2 0/1 pairs ready, "
                "0% of traffic",
            ],
            id="timeout",
        ),
        pytest.param(
            Script(
                progressing,
                TransientError("cannot reach the cluster"),
                TransientError("cannot reach the cluster"),
                promoted,
            ),
            0,
            EXIT_DONE,
            [
                "Progressing step 1/4: canary v2 0/1 pairs ready, 0% of traffic",
                "retrying: cannot reach the cluster",
                "Promoted: v2 is stable, 3/3 pairs ready",
            ],
            id="a failed poll is reported once and retried",
        ),
        pytest.param(
            Script(progressing, None),
            0,
            EXIT_FAILED,
            ["Progressing step 1/4: canary v2 0/1 pairs ready, 0% of traffic", "the pool was deleted"],
            id="deleted pool fails",
        ),
    ],
)
def test_watch_rollout(script: Script, timeout_s: float, want_code: int, want_lines: list[str]) -> None:
    assert script.run(timeout_s) == want_code
    assert script.lines == want_lines
    assert all(0 < s <= 2.0 for s in script.sleeps)


def test_watch_never_sleeps_past_the_deadline() -> None:
    script = Script(progressing)
    assert script.run(timeout_s=5) == EXIT_TIMEOUT
    assert script.sleeps == [2.0, 2.0, 1.0] and script.now == 5.0


@pytest.mark.parametrize(
    ("seconds", "want"),
    [
        pytest.param(0, "0s", id="0s"),
        pytest.param(45, "45s", id="45s"),
        pytest.param(119, "119s", id="under 2m in seconds"),
        pytest.param(150, "2m30s", id="2m30s"),
        pytest.param(300, "5m", id="whole minutes"),
        pytest.param(1500, "25m", id="25m"),
        pytest.param(11_000, "3h3m", id="3h3m"),
        pytest.param(90_000, "25h", id="25h"),
        pytest.param(200_000, "2d7h", id="2d7h"),
        pytest.param(2_000_000, "23d", id="23d"),
        pytest.param(80_000_000, "2y195d", id="2y195d"),
        pytest.param(-5, "0s", id="clock skew"),
    ],
)
def test_human_age(seconds: float, want: str) -> None:
    assert human_age(seconds) == want


@pytest.mark.parametrize(
    ("objs", "wide", "all_namespaces", "want"),
    [
        pytest.param(
            [
                Pool("speed").spec_version("v2").rollout("Progressing", 0).canary("v2", 1, 1, 25).obj(),
                Pool("batch").obj(),
            ],
            False,
            False,
            "NAME    VERSION   PHASE         STEP   PAIRS   WEIGHT   AGE\n"
            "batch   v1        Idle          -      3/3     -        25m\n"
            "speed   v1→v2     Progressing   1/4    3/3     25%      25m",
            id="sorted by name, canary version and weight",
        ),
        pytest.param(
            [Pool("speed", "b").obj(), Pool("speed", "a").no_status().obj()],
            False,
            True,
            "NAMESPACE   NAME    VERSION   PHASE   STEP   PAIRS   WEIGHT   AGE\n"
            "a           speed   v1        -       -      0/3     -        25m\n"
            "b           speed   v1        Idle    -      3/3     -        25m",
            id="all namespaces; a pool without status",
        ),
        pytest.param(
            [Pool("speed").spec_version("v2").rollout("Paused", 0, "paused by user").canary("v2", 1, 1, 25).obj()],
            True,
            False,
            "NAME    VERSION   PHASE    STEP   PAIRS   WEIGHT   AGE   READY   MODEL      STABLE   CANARY   MESSAGE\n"
            "speed   v1→v2     Paused   1/4    3/3     25%      25m   True    qwen3-8b   r-v1     r-v2     "
            "paused by user",
            id="wide",
        ),
        pytest.param([], False, False, "", id="no pools"),
    ],
)
def test_render_table(objs: list[dict[str, Any]], wide: bool, all_namespaces: bool, want: str) -> None:
    assert render_table(objs, NOW, wide=wide, all_namespaces=all_namespaces) == want


def test_as_document_is_the_object_for_one_name_and_a_list_otherwise() -> None:
    obj = Pool().obj()
    assert as_document([obj], single=True) is obj
    listed = as_document([obj], single=False)
    assert (listed["kind"], listed["items"]) == ("List", [obj])
