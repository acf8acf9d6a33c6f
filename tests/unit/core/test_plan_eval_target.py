"""Where the eval Job of an analysis step sends its requests (plan step 7): through the router, pinned to
the canary revision, when the operator knows a router; the canary's decode pods otherwise. Either way an
EvalJobCreated event and the eval gate's verdict say which."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tandem.api.labels import ANNOTATION_EVAL_TARGET, EVAL_TARGET_DECODE_PODS, EVAL_TARGET_ROUTER
from tandem.core.analysisplan import eval_verdict
from tandem.core.observed import EvalJobView, parse_eval_job
from tandem.core.plan import REASON_EVAL_JOB_CREATED, EvalJobRequest, Plan
from tandem.routing import HEADER_REVISION, PairState
from tests.support.factories import T0, PoolBuilder, World, make_nodes, make_pool

ROUTER = "http://tandem-router.tandem-system.svc:8000"
GATE = {"image": "ghcr.io/example/tool-call-eval:1.4@sha256:" + "cd" * 32, "minScorePercent": 98, "deadline": "5m"}


def _builder(version: str = "v1") -> PoolBuilder:
    return (
        make_pool("speed")
        .pairs(3)
        .version(version)
        .steps({"setCanaryPairs": 1}, {"analysis": {"eval": True}}, {"setWeight": 100})
        .set("spec.rollout.analysis.eval", GATE)
    )


def _first_eval_plan(router_url: str) -> tuple[World, Plan]:
    """A converged v1 pool rolled to v2 until a pass asks for the eval Job."""
    world = World(pool=_builder().obj(), nodes=make_nodes(8), router_url=router_url)
    world.run_until(lambda w: w.ready_pairs() == 3)
    world.set_spec(_builder("v2"))
    for _ in range(40):
        plan = world.tick()
        if plan.eval_job is not None:
            return world, plan
    raise AssertionError("no eval Job was planned")


@pytest.mark.parametrize(
    ("router_url", "want_target"),
    [
        pytest.param(ROUTER, EVAL_TARGET_ROUTER, id="router configured: through the router, pinned"),
        pytest.param("", EVAL_TARGET_DECODE_PODS, id="no router: the canary's decode pods"),
    ],
)
def test_eval_job_targets_the_router_when_one_is_configured(router_url: str, want_target: str) -> None:
    _, plan = _first_eval_plan(router_url)
    job = plan.eval_job
    assert job is not None and job.target == want_target
    canary = [p for p in plan.routing.pairs if p.revision == job.revision]
    assert canary and all(p.state is PairState.SERVING for p in canary)  # only once the canary serves
    if want_target == EVAL_TARGET_ROUTER:
        assert job.target_urls == (ROUTER,)
        assert job.headers == ((HEADER_REVISION, f"ns/speed/{job.revision}"),)
    else:
        assert job.target_urls == tuple(f"http://{e.address}" for p in canary for e in p.decode)
        assert job.headers == ()
    events = [e for e in plan.events if e.reason == REASON_EVAL_JOB_CREATED]
    assert len(events) == 1
    assert ("through the router" in events[0].message) == (want_target == EVAL_TARGET_ROUTER)
    assert ("P/D path is not exercised" in events[0].message) == (want_target == EVAL_TARGET_DECODE_PODS)
    assert job.revision in events[0].message


def test_no_eval_job_while_the_published_table_has_no_serving_canary_pair() -> None:
    world = World(pool=_builder().obj(), nodes=make_nodes(8), router_url=ROUTER)
    world.run_until(lambda w: w.ready_pairs() == 3)
    world.set_spec(_builder("v2"))
    held = 0
    for _ in range(40):
        seen = world.routing  # what the pass reads as published
        plan = world.tick()
        canary_serving = any(p.revision == plan.desired_revision and p.state is PairState.SERVING for p in seen.pairs)
        if not canary_serving:
            assert plan.eval_job is None  # the router would answer revision_not_serving
            held += 1
        elif plan.eval_job is not None:
            break
    assert plan.eval_job is not None and held > 0


@pytest.mark.parametrize(
    ("target", "want_query"),
    [
        pytest.param(EVAL_TARGET_ROUTER, "job/speed-eval-x-s1 via router", id="router"),
        pytest.param(EVAL_TARGET_DECODE_PODS, "job/speed-eval-x-s1 via decode-pods", id="decode pods"),
        pytest.param("", "job/speed-eval-x-s1", id="job made before the annotation existed"),
    ],
)
def test_eval_verdict_names_what_the_score_measured(target: str, want_query: str) -> None:
    pool = _builder().obj()
    job = EvalJobView(
        name="speed-eval-x-s1",
        revision="x",
        step=1,
        active=False,
        succeeded=True,
        failed=False,
        score=None,
        started=T0,
        termination_message='{"score": 99}',
        target=target,
    )
    verdict = eval_verdict(pool, job, T0 + timedelta(seconds=30))
    assert (verdict.verdict, verdict.value, verdict.query) == ("Success", "99", want_query)


def test_eval_job_request_defaults_to_decode_pods() -> None:
    assert EvalJobRequest(step=1, revision="x", target_urls=("http://a",)).target == EVAL_TARGET_DECODE_PODS


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({ANNOTATION_EVAL_TARGET: "router"}, "router", id="router"),
        pytest.param({}, "", id="no annotation"),
    ],
)
def test_parse_eval_job_reads_the_target_annotation(annotations: dict[str, str], want: str) -> None:
    job = {"metadata": {"name": "speed-eval-x-s1", "annotations": annotations}, "status": {"active": 1}}
    assert parse_eval_job(job, []).target == want
