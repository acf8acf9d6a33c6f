"""Baseline policies follow their systems' rules; Tandem's policy is imported from tandem.core unchanged."""

from __future__ import annotations

import builtins
import sys
from dataclasses import replace
from typing import Any

import pytest

from tandem_lab.sim.config import load_params
from tandem_lab.sim.metrics import COUNTERS, InstanceGauge, Observation, RoleState, Scrape, ScrapeStore, observe
from tandem_lab.sim.physics import Roofline
from tandem_lab.sim.policies import make_policy
from tandem_lab.sim.policies.base import PolicyContext, unit_shape
from tandem_lab.sim.policies.baselines import HpaRole, KedaQueue, PlannerLike, RatioLocked, StaticPeak
from tandem_lab.sim.profile import planning_profile


def make_ctx(**changes: Any) -> PolicyContext:
    p = load_params()
    ctx = PolicyContext(
        params=p,
        capacity=Roofline.from_params(p),
        min_prefill=1,
        min_decode=1,
        max_instances=200,
        oracle_peak=(20, 5),
        profile_ratio=3.8,
        initial=(10, 3),
        mean_context=50_000.0,
    )
    return replace(ctx, **changes)


def role(current: int, ready: int | None = None) -> RoleState:
    r = current if ready is None else ready
    return RoleState(desired=current, pending=0, loading=current - r, ready=r, draining=0)


def obs(
    now: float = 100.0, prefill: RoleState | None = None, decode: RoleState | None = None, **fields: Any
) -> Observation:
    base = dict.fromkeys(
        (
            "running",
            "waiting",
            "kv_usage",
            "prefill_busy",
            "request_rate",
            "prompt_token_rate",
            "generation_token_rate",
            "isl_mean",
            "osl_mean",
            "ttft_p90",
            "ttft_p95",
            "tpot_p90",
            "tpot_mean",
            "ttft_mean",
            "error_rate",
            "local_hit_ratio",
            "external_hit_ratio",
        )
    )
    base.update(fields)
    return Observation(
        now=now,
        prefill=prefill or role(10),
        decode=decode or role(3),
        pairs=0,
        scrape_time=now - 30,
        ready_scraped=(10, 3),
        revisions={},
        **base,  # type: ignore[arg-type]
    )


def test_static_peak_is_110_percent_of_the_oracle_peak() -> None:
    t = StaticPeak(make_ctx()).initial_target()
    assert (t.prefill, t.decode) == (22, 6)


@pytest.mark.parametrize(
    ("ratio", "want"),
    [
        pytest.param(1.05, 10, id="within tolerance holds"),
        pytest.param(1.5, 15, id="proportional scale up"),
        pytest.param(4.0, 20, id="scale up limited to max(+4, +100 %)"),
        pytest.param(None, 10, id="no data holds"),
    ],
)
def test_hpa_recommendation(ratio: float | None, want: int) -> None:
    hpa = HpaRole(load_params().policies.hpa, 1, 100)
    assert hpa.recommend(0.0, role(10), ratio, average_value=False) == want


def test_hpa_scale_down_waits_for_the_stabilization_window() -> None:
    hpa = HpaRole(load_params().policies.hpa, 1, 100)
    assert hpa.recommend(0.0, role(10), 1.0, average_value=False) == 10
    assert hpa.recommend(15.0, role(10), 0.5, average_value=False) == 10  # the 300 s window remembers 10
    assert hpa.recommend(301.0, role(10), 0.5, average_value=False) == 5


def test_hpa_counts_unready_pods_as_idle_when_scaling_up() -> None:
    hpa = HpaRole(load_params().policies.hpa, 1, 100)
    # 10 desired, 5 ready at 1.5x target: (1.5 * 5) / 10 = 0.75 < 1 → hold at 10
    assert hpa.recommend(0.0, role(10, ready=5), 1.5, average_value=False) == 10


def test_keda_asks_for_total_queue_over_target() -> None:
    keda = KedaQueue(make_ctx())
    t = keda.decide(obs(prefill=role(4), decode=role(2), running=(4.0, 40.0), waiting=(26.0, 0.0)))
    assert t is not None
    assert t.prefill == 6  # (26 + 4) / 5
    assert t.decode == 6  # 40 / 5 = 8, but the HPA's scale-up limit from 2 is max(2 + 4, 2 × 2) = 6


def test_planner_sizes_prefill_from_the_profile_and_the_ttft_correction() -> None:
    ctx = make_ctx()
    planner = PlannerLike(ctx)
    cap = ctx.capacity
    isl, osl, lam = 8_000.0, 400.0, 10.0
    profile_ttft = cap.prefill_time(isl, 0.0)
    t = planner.decide(
        obs(
            request_rate=lam,
            isl_mean=isl,
            osl_mean=osl,
            ttft_mean=profile_ttft / 2,
            tpot_mean=None,
            running=(5.0, 30.0),
        )
    )
    assert t is not None
    thpt = isl / profile_ttft / cap.gpus
    assert t.prefill == max(1, -(-int(lam * isl * 0.5 / thpt / cap.gpus * 1000) // 1000))


def test_ratio_locked_scales_units_of_the_profile_ratio() -> None:
    ctx = make_ctx(profile_ratio=3.8)
    b4 = RatioLocked(ctx)
    assert b4.unit == unit_shape(3.8) == (4, 1)
    t = b4.decide(obs(generation_token_rate=b4.per_decode * 5.5))
    assert t is not None and (t.prefill, t.decode) == (24, 6)


def test_tandem_policy_calls_core_autoscale(monkeypatch: pytest.MonkeyPatch) -> None:
    import tandem.core.autoscale as core  # noqa: PLC0415

    calls: list[Any] = []
    real = core.compute_desired_pairs

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    import tandem_lab.sim.policies.tandem as adapter  # noqa: PLC0415

    monkeypatch.setattr(adapter, "compute_desired_pairs", spy)
    policy = make_policy("tandem", make_ctx(), 3000)
    assert policy.topology == "pairs"
    first = policy.initial_target()
    assert first.pairs is not None and first.shape == unit_shape(3.8)
    t = policy.decide(obs())
    assert t is not None and len(calls) == 1
    assert isinstance(calls[0][0], core.AutoscalePolicy)


def _work_decision(ttft_attainment: float, unserved: float | None) -> dict[str, str]:
    """The decision-log metrics of one work-planning evaluation (planning profile, 240 s lead, no engine queue)
    at ``ttft_attainment``, with ``unserved`` as the router's unserved share."""
    base = make_ctx()
    policy = make_policy(
        "tandem", replace(base, capacity_profile=planning_profile(base.capacity, base.params, 0.5, 240.0)), 3000
    )
    n = policy.initial_target().pairs
    assert n is not None
    gauges = tuple(InstanceGauge(f"p{i}", r, 1.0, 0.0, 0.1) for i in range(n) for r in (0, 1))
    policy.decide(
        obs(
            prefill=role(n),
            decode=role(n),
            request_rate=5.0,
            prompt_token_rate=50_000.0,
            generation_token_rate=500.0,
            cache_hit_ratio=0.5,
            running=(float(n), float(n)),
            waiting=(0.0, 0.0),
            instances=gauges,
            serving_pairs_scraped=n,
            serving_instances_scraped=(n, n),
            ttft_attainment=ttft_attainment,
            tpot_attainment=1.0,
            unserved_share=unserved,
        )
    )
    metrics: dict[str, str] = policy.log[-1]["metrics"]
    return metrics


def test_tandem_decision_log_names_the_work_need_and_the_lead_time() -> None:
    """The decision log is how a W3 flip-flop is read back: every work-planning entry carries the needs (now,
    ahead, kept) and the lead time they were planned over, which the core's decision reports."""
    logged = _work_decision(0.99, None)
    assert logged["leadTime"] == "240s declared"
    assert logged["pairsNeeded"].endswith("kept") and "ahead" in logged["pairsNeeded"]


def test_observe_reads_the_unserved_share_as_the_operator_queries_it() -> None:
    """Rejected over requests with an outcome in the window, like ``unserved_share`` over
    tandem_router_slo_requests_total (result=~"rejected|timeout" over every result)."""
    store = ScrapeStore()
    for t, outcomes, unserved in ((0.0, 100.0, 2.0), (60.0, 300.0, 22.0)):
        counters = dict.fromkeys(COUNTERS, 0.0) | {"slo_outcomes": outcomes, "unserved": unserved}
        store.add(Scrape(t, (1, 1), (0.0, 0.0), (0.0, 0.0), 0.0, counters, {}))
    seen = observe(store, 60.0, 0.0, 60.0, role(1), role(1), 1)
    assert seen.unserved_share == pytest.approx(0.1)  # 20 of the window's 200 outcomes


def test_tandem_adapter_passes_the_unserved_share_the_operator_reads() -> None:
    """Requests the router turned away are queueing the engines never show: with them the correction rises on
    a TTFT shortfall, without them (and no engine queue) it does not, as in the operator."""
    turned_away = _work_decision(0.9, 0.1)
    assert "unserved 0.1" in turned_away["attainment"]
    assert "x1.10)" in turned_away["prefillNeed"]
    quiet = _work_decision(0.9, None)
    assert "x1.00)" in quiet["prefillNeed"]


def test_tandem_policy_fails_loudly_without_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tandem_lab.sim.policies.tandem", raising=False)
    real_import = builtins.__import__

    def broken(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tandem.core.autoscale":
            raise ImportError("tandem.core.autoscale is broken")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ImportError):
        make_policy("tandem", make_ctx(), 3000)
