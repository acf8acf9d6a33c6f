"""Measured model load time per revision (tandem.core.loadtime) and the lead time work planning takes from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tandem.api.labels import LABEL_INSTANCE, LABEL_PAIR, LABEL_POOL, LABEL_REVISION, LABEL_ROLE
from tandem.api.pool import CapacityProfileSpec
from tandem.core.autoscale import WorkPlanning, lead_time
from tandem.core.loadtime import MAX_LOAD_SECONDS, instance_load_seconds, measure_load_seconds, pair_load_seconds
from tandem.core.observed import ObservedPod, parse_pod
from tandem.core.pairs import PairView

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def pod(
    index: int, role: str, load_s: float | None, *, revision: str = "r1", restarts: int = 0, deleting: bool = False
) -> ObservedPod:
    """An instance bound at T0 + index minutes and Ready ``load_s`` later (None: not Ready)."""
    bound = T0 + timedelta(minutes=index)
    return ObservedPod(
        name=f"speed-p{index}-{role}-0",
        uid=f"u{index}{role}",
        labels={
            LABEL_POOL: "speed",
            LABEL_PAIR: f"speed-p{index}",
            LABEL_ROLE: role,
            LABEL_INSTANCE: "0",
            LABEL_REVISION: revision,
        },
        node="n0",
        phase="Running",
        ready=load_s is not None,
        deleting=deleting,
        created=bound - timedelta(seconds=30),
        restarts=restarts,
        scheduled_at=bound,
        ready_at=None if load_s is None else bound + timedelta(seconds=load_s),
    )


def pair(index: int, prefill: float | None, decode: float | None, **kw: Any) -> PairView:
    pods = (pod(index, "prefill", prefill, **kw), pod(index, "decode", decode, **kw))
    return PairView("speed", index, kw.get("revision", "r1"), pods, (("prefill", 1), ("decode", 1)))


@pytest.mark.parametrize(
    ("p", "want"),
    [
        pytest.param(pod(0, "prefill", 95.5), 95.5, id="bind to Ready"),
        pytest.param(pod(0, "prefill", None), None, id="not Ready: no load yet"),
        pytest.param(pod(0, "prefill", 95.0, restarts=1), None, id="restarted: Ready moved, not a first load"),
        pytest.param(pod(0, "prefill", 95.0, deleting=True), None, id="being deleted"),
        pytest.param(pod(0, "prefill", -5.0), None, id="Ready before bound (clock skew): not a load"),
    ],
)
def test_instance_load_seconds_is_a_first_load_only(p: ObservedPod, want: float | None) -> None:
    assert instance_load_seconds(p) == want


def test_pair_load_is_its_slowest_instance() -> None:
    assert pair_load_seconds(pair(0, 95.0, 102.0)) == 102.0
    assert pair_load_seconds(pair(0, 95.0, None)) is None  # a pair is not loaded until all its instances are
    half = pair(0, 95.0, 102.0)
    assert pair_load_seconds(PairView("speed", 0, "r1", half.pods[:1], half.shape)) is None  # an instance missing


@pytest.mark.parametrize(
    ("pairs", "want"),
    [
        pytest.param([pair(0, 95, 102), pair(1, 110, 98), pair(2, 300, 97)], 110, id="median of 102, 110, 300"),
        pytest.param([pair(0, 95, 102), pair(1, 110, 98)], 102, id="even count: the lower median"),
        pytest.param([pair(0, 95.2, 20)], 96, id="whole seconds, rounded up"),
        pytest.param([pair(0, 95, None), pair(1, 90, 80, restarts=2)], None, id="nothing measurable"),
        pytest.param([pair(0, 95, 102, revision="r2"), pair(1, 50, 60)], 60, id="only the revision's own pairs"),
        pytest.param([pair(0, 200_000, 1)], MAX_LOAD_SECONDS, id="bounded to the status field's day"),
    ],
)
def test_measure_load_seconds_per_revision(pairs: list[PairView], want: int | None) -> None:
    assert measure_load_seconds(pairs, "r1") == want


def test_parse_pod_reads_bind_and_ready_times() -> None:
    obj = {
        "metadata": {"name": "speed-p0-prefill-0", "creationTimestamp": "2026-12-01T11:59:00Z"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T12:00:00Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T12:01:42Z"},
            ],
        },
    }
    parsed = parse_pod(obj)
    assert (parsed.scheduled_at, parsed.ready_at) == (T0, T0 + timedelta(seconds=102))
    obj["status"]["conditions"][1] |= {"status": "False"}
    obj["status"]["conditions"][0] |= {"lastTransitionTime": "garbage"}
    parsed = parse_pod(obj)
    assert (parsed.scheduled_at, parsed.ready_at) == (None, None)


WORK = WorkPlanning.from_spec(
    CapacityProfileSpec.model_validate(
        {
            "prefill": [{"promptTokens": 8192, "uncachedTokensPerSecond": 16000}],
            "decode": [{"contextTokens": 10000, "streams": 32, "tokensPerSecond": 2000}],
            "loadTime": "300s",
        }
    )
)


@pytest.mark.parametrize(
    ("measured", "want_s", "want_source"),
    [
        pytest.param(None, 300.0, "300s declared", id="not measured: declared"),
        pytest.param(110.0, 110.0, "110s measured (declared 300s)", id="measured shorter: measured"),
        pytest.param(695.0, 300.0, "300s declared (measured 695s)", id="measured longer: bounded by declared"),
        pytest.param(float("nan"), 300.0, "300s declared", id="NaN is not a measurement"),
    ],
)
def test_lead_time_is_the_measured_load_bounded_by_the_declared(
    measured: float | None, want_s: float, want_source: str
) -> None:
    assert lead_time(WORK, measured) == (want_s, want_source)
