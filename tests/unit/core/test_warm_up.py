"""Cold-cache warm-up (issue 17 item 2): a cold canary's TTFT and hit-ratio Failures are held as NoData
``WarmingUp`` until its hit ratio nears stable's, or ``maxDuration`` has passed; other gates are judged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tandem.api.pool import AnalysisSpec, MetricGate
from tandem.api.pool_status import AnalysisProgress, GateVerdict
from tandem.core import analysis as a
from tandem.core import gates as g

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GATES = [
    MetricGate.model_validate({"name": "ttft", "template": "TTFTP95", "compare": {}}),
    MetricGate.model_validate({"name": "tpu", "template": "TokensPerSecondPerUser", "compare": {}}),
    MetricGate.model_validate({"name": "errors", "template": "ErrorRate", "compare": {}}),
    MetricGate.model_validate(
        {"name": "hits", "template": "LocalKVHitRatio", "successCondition": "result >= baseline * 0.9"}
    ),
]
WARM = AnalysisSpec.model_validate({"warmUp": {"hitRatioPercent": 90, "maxDuration": "5m"}})


def verdicts(hits: tuple[str, str] | None, failing: tuple[str, ...] = ("ttft", "tpu", "errors")) -> list[GateVerdict]:
    out = [
        GateVerdict(name=n, verdict=g.VERDICT_FAILURE if n in failing else g.VERDICT_SUCCESS)
        for n in ("ttft", "tpu", "errors")
    ]
    if hits is not None:
        value, baseline = hits
        cold = float(value) < 0.9 * float(baseline)
        out.append(
            GateVerdict(
                name="hits",
                verdict=g.VERDICT_FAILURE if cold else g.VERDICT_SUCCESS,
                value=value,
                baseline=baseline,
            )
        )
    return out


def kinds(vs: list[GateVerdict]) -> dict[str, str]:
    return {v.name: v.verdict if v.reason != a.REASON_WARMING_UP else "WarmingUp" for v in vs}


@pytest.mark.parametrize(
    ("spec", "hits", "elapsed_s", "want"),
    [
        pytest.param(
            WARM,
            ("0.46", "0.83"),
            60,
            {"ttft": "WarmingUp", "tpu": "Failure", "errors": "Failure", "hits": "WarmingUp"},
            id="cold: ttft and hits held, decode speed and errors judged",
        ),
        pytest.param(
            WARM,
            ("0.78", "0.83"),
            60,
            {"ttft": "Failure", "tpu": "Failure", "errors": "Failure", "hits": "Success"},
            id="warm at >= 90 % of stable: the ttft failure stands",
        ),
        pytest.param(
            WARM,
            ("0.46", "0.83"),
            300,
            {"ttft": "Failure", "tpu": "Failure", "errors": "Failure", "hits": "Failure"},
            id="maxDuration passed: judged anyway",
        ),
        pytest.param(
            WARM,
            None,
            60,
            {"ttft": "WarmingUp", "tpu": "Failure", "errors": "Failure"},
            id="no hit-ratio gate: cold until maxDuration",
        ),
        pytest.param(
            WARM,
            ("NaN", "0.83"),
            60,
            {"ttft": "WarmingUp", "tpu": "Failure", "errors": "Failure", "hits": "WarmingUp"},
            id="hit ratio unknown: cold",
        ),
        pytest.param(
            AnalysisSpec(),
            ("0.46", "0.83"),
            60,
            {"ttft": "Failure", "tpu": "Failure", "errors": "Failure", "hits": "Failure"},
            id="no warmUp: unchanged",
        ),
    ],
)
def test_warm_up_verdicts(
    spec: AnalysisSpec, hits: tuple[str, str] | None, elapsed_s: float, want: dict[str, str]
) -> None:
    vs = verdicts(hits)
    if hits is not None and hits[0] == "NaN":
        vs[-1] = GateVerdict(name="hits", verdict=g.VERDICT_FAILURE, value="NaN", baseline="0.83")
    got = a.warm_up_verdicts(vs, GATES, spec, T0, T0 + timedelta(seconds=elapsed_s))
    assert kinds(got) == want


def test_held_failures_never_count_toward_the_failure_limit() -> None:
    """Two evaluations with a cold canary failing TTFT: failureLimit 0 would fail on the first Failure."""
    spec = AnalysisSpec.model_validate(
        {"warmUp": {"maxDuration": "5m"}, "failureLimit": 0, "initialDelay": "0s", "noDataDeadline": "10m"}
    )
    progress = AnalysisProgress()
    for t in (30, 60):
        vs = a.warm_up_verdicts(verdicts(("0.2", "0.8"), failing=("ttft",)), GATES, spec, T0, T0 + timedelta(seconds=t))
        result = a.evaluate_step(progress, vs, spec, T0, T0 + timedelta(seconds=t))
        progress = result.progress
        assert result.outcome is a.Outcome.CONTINUE
    assert progress.failures == 0 and progress.success_streak == 0
