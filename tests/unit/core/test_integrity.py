"""Issue 19 item 6: forged or foreign runtime data leads to a hold and a condition, never a destructive action."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tandem.api.labels import LABEL_COMPONENT, LABEL_INSTANCE, LABEL_PAIR, LABEL_POOL, LABEL_REVISION, LABEL_ROLE
from tandem.core import conditions as c
from tandem.core import integrity as i
from tandem.core.observed import ObservedPod, parse_pod
from tandem.core.plan import plan_pool
from tandem.routing.table import PairState
from tests.support.factories import World, make_nodes, make_pool

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POOL_UID = "uid-speed"


def untrusted(world: World) -> tuple[str, str, str] | None:
    assert world.pool.status is not None
    cond = c.find(world.pool.status.conditions, c.CONDITION_UNTRUSTED_INPUT)
    return (cond.status, cond.reason, cond.message) if cond is not None else None


def uids(world: World) -> dict[str, str]:
    return {p.name: p.uid for p in world.pods.values()}


# --- 1. look-alike pods ---------------------------------------------------------------------------


def raw_pod(name: str, owners: list[dict[str, Any]] | None, revision: str = "forged") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "labels": {
            LABEL_POOL: "speed",
            LABEL_PAIR: "speed-p0",
            LABEL_ROLE: "decode",
            LABEL_INSTANCE: "1",
            LABEL_REVISION: revision,
            LABEL_COMPONENT: "engine",
        },
        "creationTimestamp": "2026-11-30T11:00:00Z",
    }
    if owners is not None:
        meta["ownerReferences"] = owners
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "gpu-000",
            "containers": [{"name": "engine", "resources": {"limits": {"amd.com/gpu": 4}}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def ref(uid: str, controller: bool | None = True) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "tandem.dev/v1alpha1", "kind": "InferencePool", "name": "speed", "uid": uid}
    if controller is not None:
        out["controller"] = controller
    return out


@pytest.mark.parametrize(
    ("owners", "want_controller"),
    [
        pytest.param(None, None, id="no owner references"),
        pytest.param([ref("uid-other")], "uid-other", id="controlled by another object"),
        pytest.param([ref(POOL_UID, controller=False)], None, id="pool named as owner but not as controller"),
        pytest.param([ref(POOL_UID, controller=None)], None, id="controller field missing"),
        pytest.param([ref("uid-x", controller=False), ref(POOL_UID)], POOL_UID, id="the pool is the controller"),
    ],
)
def test_parse_pod_reads_only_the_controller_owner_reference(
    owners: list[dict[str, Any]] | None, want_controller: str | None
) -> None:
    assert parse_pod(raw_pod("x", owners)).controller_uid == want_controller


@pytest.mark.parametrize(
    "owners",
    [
        pytest.param(None, id="no owner references"),
        pytest.param([ref("uid-other")], id="controlled by another object"),
        pytest.param([ref(POOL_UID, controller=False)], id="non-controller reference to the pool"),
    ],
)
def test_look_alike_pod_never_makes_the_operator_delete_a_real_pair(owners: list[dict[str, Any]] | None) -> None:
    """A pod with the pool's labels (pair p0, a second decode slot, another revision: a real member would make
    the pair "mixed" and replaced) is ignored: never counted, never deleted; status and an Event say so."""
    world = World(make_pool().pairs(2).obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 2)
    real = uids(world)
    look_alike = parse_pod(raw_pod("speed-p0-decode-1", owners))
    world.pods[look_alike.name] = look_alike
    plans = [world.tick() for _ in range(12)]  # > drainTimeout and any repair window
    assert all(p.deletes == () and p.creates == () for p in plans)
    assert {n: u for n, u in uids(world).items() if n != look_alike.name} == real
    assert world.ready_pairs() == 2
    cond = untrusted(world)
    assert cond is not None and cond[:2] == ("True", c.REASON_FOREIGN_PODS_IGNORED)
    assert "1 pod(s)" in cond[2] and "speed-p0-decode-1" in cond[2]
    warnings = [e for p in plans for e in p.events if e.reason == c.REASON_FOREIGN_PODS_IGNORED]
    assert len(warnings) == 1 and warnings[0].type == "Warning"  # once, not once per pass


def test_look_alike_steady_state_plans_nothing_and_keeps_the_status() -> None:
    world = World(make_pool().pairs(1).obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 1)
    world.pods["speed-p0-decode-1"] = parse_pod(raw_pod("speed-p0-decode-1", None))
    world.tick()
    before = world.pool.status
    plan = plan_pool(world.snapshot())
    assert (plan.creates, plan.deletes, plan.events, plan.rollout_first) == ((), (), (), None)
    assert plan.status == before


def test_look_alike_still_counts_as_gpus_in_use() -> None:
    """Ignored by planning, but it holds GPUs: a new pair is not placed onto them."""
    builder = make_pool().pairs(1)
    world = World(builder.obj(), make_nodes(1))  # one 8-GPU node: one pair (2 x 4 GPUs)
    world.pods["intruder"] = replace(parse_pod(raw_pod("intruder", None)), node="gpu-000")
    plan = world.tick()
    assert all(create.node is None for create in plan.creates)  # nothing fits next to the look-alike


def test_split_owned_and_bounded_names() -> None:
    pods = [
        ObservedPod(f"p{n}", f"u{n}", {}, None, "Running", True, False, None, controller_uid=uid)
        for n, uid in enumerate([POOL_UID, None, "x", "", *["y"] * 6])
    ]
    owned, foreign = i.split_owned(pods, POOL_UID)
    assert [p.name for p in owned] == ["p0"]
    finding = i.foreign_pods_finding(foreign)
    assert finding is not None and finding.message.startswith("9 pod(s)") and finding.message.endswith("(+4 more)")
    assert i.split_owned(pods, "") == ((), tuple(pods))  # a pool without a uid owns nothing


# --- 2. drain records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("since", "ready", "own", "want_since", "want_changed"),
    [
        pytest.param(NOW - timedelta(seconds=10), True, True, NOW - timedelta(seconds=10), False, id="own record kept"),
        pytest.param(
            NOW - timedelta(hours=1), False, True, NOW - timedelta(hours=1), False, id="own, pair went unready"
        ),
        pytest.param(NOW + timedelta(seconds=30), True, True, NOW + timedelta(seconds=30), False, id="within skew"),
        pytest.param(NOW + timedelta(days=365), True, True, NOW, True, id="own, far future: restarts now"),
        pytest.param(NOW - timedelta(hours=1), False, False, None, True, id="foreign, loading pair: ignored"),
        pytest.param(NOW + timedelta(days=365), False, False, None, True, id="foreign future, loading pair: ignored"),
        pytest.param(NOW - timedelta(hours=1), True, False, NOW, True, id="foreign, Ready pair: restarts now"),
        pytest.param(NOW + timedelta(days=365), True, False, NOW, True, id="foreign future, Ready: restarts now"),
    ],
)
def test_vet_drain(since: datetime, ready: bool, own: bool, want_since: datetime | None, want_changed: bool) -> None:
    got, why = i.vet_drain(i.DrainRecord("speed-p1", since, ready), own_table=own, now=NOW)
    assert (got, bool(why)) == (want_since, want_changed)


def _forge_drain(world: World, index: int, since: str) -> None:
    table = world.routing
    pairs = tuple(
        p.model_copy(update={"state": PairState.DRAINING, "draining_since": since}) if p.index == index else p
        for p in table.pairs
    )
    world.routing = table.model_copy(update={"pairs": pairs})


def test_forged_drain_on_a_loading_pair_does_not_delete_it() -> None:
    """A drain record dated long ago on a pair that is loading (not Ready): it would be deleted at once."""
    world = World(make_pool().pairs(2).obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 2)
    for name, pod in list(world.pods.items()):
        if pod.pair_index == 1:  # restarted: loading the model again
            world.pods[name] = replace(pod, ready=False)
    world.never_ready.add(world.pods["speed-p1-prefill-0"].revision or "")
    real = uids(world)
    _forge_drain(world, 1, "2026-01-01T00:00:00Z")
    plan = world.tick()
    assert plan.deletes == () and plan.creates == ()
    assert [p.state for p in plan.routing.pairs] == [PairState.SERVING, PairState.WARMING]
    assert uids(world) == real
    cond = untrusted(world)
    assert cond is not None and cond[:2] == ("True", c.REASON_DRAIN_RECORD_REJECTED) and "speed-p1" in cond[2]
    assert any(e.reason == c.REASON_DRAIN_RECORD_REJECTED for e in plan.events)


def test_far_future_drain_does_not_hold_gpus_for_ever() -> None:
    """An excess pair draining "since next year" is drained from now: deleted after drainTimeout (30 s)."""
    builder = make_pool().pairs(2)
    world = World(builder.obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 2)
    world.set_spec(builder.pairs(1))
    world.tick()  # p1 drains
    _forge_drain(world, 1, "2027-11-30T12:00:00Z")
    forged_at = world.now
    deleted_at = None
    for _ in range(20):
        plan = world.tick()
        if any(d.name.startswith("speed-p1-") for d in plan.deletes):
            deleted_at = world.now
            break
    assert deleted_at is not None
    assert timedelta(seconds=30) <= deleted_at - forged_at <= timedelta(seconds=45)


def test_operator_own_drain_is_not_restarted() -> None:
    """The operator's own table (fingerprint recorded in status) is trusted: the drain ends on time."""
    builder = make_pool().pairs(2)
    world = World(builder.obj(), make_nodes(3))
    world.run_until(lambda w: w.ready_pairs() == 2)
    world.set_spec(builder.pairs(1))
    started = world.now + timedelta(seconds=5)
    world.tick()
    plans = [world.tick() for _ in range(6)]
    deleted = [n for n, p in enumerate(plans) if p.deletes]
    assert deleted and started + timedelta(seconds=5 * (deleted[0] + 1)) - started <= timedelta(seconds=30)
    assert untrusted(world) is None


# --- 3. revision snapshots ------------------------------------------------------------------------


def mid_rollout(allowed: tuple[str, ...] = ()) -> tuple[World, str]:
    """2 stable v1 pairs, a v2 canary paused at 1 pair: stable pods are built from the v1 snapshot."""
    builder = make_pool().pairs(2).steps({"setCanaryPairs": 1}, {"pause": {}})
    world = World(builder.obj(), make_nodes(4), allowed_registries=allowed)
    world.run_until(lambda w: w.ready_pairs() == 2)
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    stable = world.pool.status.revisions.stable.name
    world.set_spec(builder.version("v2"))
    world.run_until(
        lambda w: (
            w.pool.status is not None and w.pool.status.rollout.step_index == 1 and w.pool.status.pairs.draining == 0
        )
    )
    world.tick(60)  # drained stable pods are gone
    return world, stable


def test_status_records_the_snapshot_digest() -> None:
    world, stable = mid_rollout()
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    assert world.pool.status.revisions.stable.digest == i.snapshot_digest(world.revisions[stable])
    assert world.pool.status.revisions.stable.digest.startswith("sha256:")


@pytest.mark.parametrize(
    ("tamper", "allowed", "want_reason"),
    [
        pytest.param("evil.example/x@sha256:" + "b" * 64, (), c.REASON_SNAPSHOT_TAMPERED, id="image swapped"),
        pytest.param(None, ("docker.io/rocm",), c.REASON_IMAGE_NOT_ALLOWED, id="genuine, registry not allowed"),
    ],
)
def test_untrusted_snapshot_never_builds_pods(tamper: str | None, allowed: tuple[str, ...], want_reason: str) -> None:
    world, stable = mid_rollout(allowed)
    if tamper is not None:
        spec = world.revisions[stable]
        world.revisions[stable] = spec.model_copy(update={"stack": spec.stack.model_copy(update={"image": tamper})})
    victim = next(p for p in world.pods.values() if p.revision == stable)
    world.delete_pod(victim.name)
    plans = [world.tick() for _ in range(5)]
    assert all(cr.revision != stable for p in plans for cr in p.creates)
    assert all(p.deletes == () for p in plans)  # a hold: the rest of the pool is untouched
    assert all(p.snapshots == () for p in plans)  # and no rewrite loop of the existing ConfigMap
    cond = untrusted(world)
    assert cond is not None and cond[:2] == ("True", want_reason) and stable in cond[2]
    assert world.pool.status is not None
    degraded = c.find(world.pool.status.conditions, c.CONDITION_DEGRADED)
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", c.REASON_SNAPSHOT_TAMPERED)
    assert any(e.type == "Warning" and e.reason == want_reason for p in world.plans for e in p.events)
    assert all(p.events == () for p in plans[-2:])  # an Event when it changes, not one per pass


@pytest.mark.parametrize(
    ("forge", "want_trusted"),
    [
        pytest.param(False, True, id="genuine snapshot, no digest recorded yet: adopted by its content hash"),
        pytest.param(True, False, id="forged snapshot, no digest recorded yet: its content is not its id"),
    ],
)
def test_snapshot_without_recorded_digest_falls_back_to_the_revision_id(forge: bool, want_trusted: bool) -> None:
    world, stable = mid_rollout()
    assert world.pool.status is not None and world.pool.status.revisions.stable is not None
    bare = world.pool.status.revisions.stable.model_copy(update={"digest": ""})
    revs = world.pool.status.revisions.model_copy(update={"stable": bare})
    world.pool = world.pool.model_copy(update={"status": world.pool.status.model_copy(update={"revisions": revs})})
    if forge:
        spec = world.revisions[stable]
        world.revisions[stable] = spec.model_copy(
            update={"stack": spec.stack.model_copy(update={"image": "evil.example/x@sha256:" + "c" * 64})}
        )
    plan = world.tick()
    assert (stable in plan.revisions) is want_trusted
    recorded = plan.status.revisions.stable.digest if plan.status.revisions.stable else ""
    assert recorded == (i.snapshot_digest(world.revisions[stable]) if want_trusted else "")


@pytest.mark.parametrize(
    ("image", "allowed", "want"),
    [
        pytest.param("docker.io/vllm/x@sha256:" + "a" * 64, (), True, id="pinned, no list"),
        pytest.param("docker.io/vllm/x:latest", (), False, id="tag only"),
        pytest.param("docker.io/vllm/x@sha256:" + "a" * 64, ("docker.io/vllm",), True, id="under an entry"),
        pytest.param("docker.io/vllmevil/x@sha256:" + "a" * 64, ("docker.io/vllm",), False, id="prefix is not a path"),
        pytest.param("ghcr.io/x@sha256:" + "a" * 64, ("docker.io/vllm/",), False, id="other registry"),
    ],
)
def test_image_allowed(image: str, allowed: tuple[str, ...], want: bool) -> None:
    assert i.image_allowed(image, allowed) is want


# --- 4. Prometheus credentials --------------------------------------------------------------------

OWN = "http://prometheus.monitoring:9090"


@pytest.mark.parametrize(
    ("address", "allowed", "want_problem"),
    [
        pytest.param(OWN, (), "", id="the operator's own Prometheus"),
        pytest.param(OWN + "/", (), "", id="own, trailing slash"),
        pytest.param("http://evil.example:9090", (), "not https", id="plain http elsewhere"),
        pytest.param("https://evil.example", (), "allow-list", id="https but not allowed"),
        pytest.param("https://thanos.example/q", ("https://thanos.example",), "", id="https under an allowed address"),
        pytest.param("https://thanos.example:444", ("https://thanos.example",), "allow-list", id="other port"),
        pytest.param("https://thanos.example.evil.io", ("https://thanos.example",), "allow-list", id="host suffix"),
        pytest.param("https://thanos.example/qq", ("https://thanos.example/q",), "allow-list", id="path prefix only"),
        pytest.param("http://thanos.example", ("http://thanos.example",), "not https", id="allow-listed but http"),
        pytest.param("https://h:notaport", (), "valid URL", id="garbage port"),
    ],
)
def test_credentials_problem(address: str, allowed: tuple[str, ...], want_problem: str) -> None:
    problem = i.credentials_problem(address, OWN, allowed)
    assert (want_problem in problem) if want_problem else problem == ""


# --- the condition ---------------------------------------------------------------------------------


def test_untrusted_condition_is_held_then_cleared() -> None:
    from tandem.core.plan import untrusted_input_condition  # noqa: PLC0415

    finding = i.Finding(c.REASON_FOREIGN_PODS_IGNORED, "1 pod(s)")
    conds, hold = untrusted_input_condition([], [finding], NOW, 1)
    assert (conds[0].status, conds[0].reason, hold) == ("True", c.REASON_FOREIGN_PODS_IGNORED, None)
    kept, hold = untrusted_input_condition(conds, [], NOW + timedelta(minutes=1), 1)
    assert kept == conds and hold == pytest.approx(540)
    cleared, hold = untrusted_input_condition(conds, [], NOW + timedelta(minutes=11), 1)
    assert (cleared[0].status, cleared[0].reason, hold) == ("False", c.REASON_NO_UNTRUSTED_INPUT, None)
    assert untrusted_input_condition([], [], NOW, 1) == ([], None)  # never had one: none added


def test_withheld_prometheus_credentials_are_reported() -> None:
    builder = make_pool().pairs(1).set("spec.rollout.analysis", {"prometheusAddress": "http://attacker.example"})
    world = World(builder.obj(), make_nodes(2))
    world.run_until(lambda w: w.ready_pairs() == 1)
    plan = plan_pool(replace(world.snapshot(), prometheus_problem="not https"))
    cond = c.find(plan.status.conditions, c.CONDITION_UNTRUSTED_INPUT)
    assert cond is not None and (cond.status, cond.reason) == ("True", c.REASON_PROMETHEUS_CREDENTIALS_WITHHELD)
    assert "http://attacker.example is not https" in cond.message
    assert [e.reason for e in plan.events] == [c.REASON_PROMETHEUS_CREDENTIALS_WITHHELD]
    assert plan.creates == () and plan.deletes == ()


def test_deleted_stable_snapshot_is_reported_missing_not_rewritten() -> None:
    """Deleting a held (or any) stable snapshot: nothing to rebuild it from; a hold, not a crash."""
    world, stable = mid_rollout()
    del world.revisions[stable]
    victim = next(p for p in world.pods.values() if p.revision == stable)
    world.delete_pod(victim.name)
    plan = world.tick()
    assert plan.snapshots == () and all(cr.revision != stable for cr in plan.creates) and plan.deletes == ()
    degraded = c.find(plan.status.conditions, c.CONDITION_DEGRADED)
    assert degraded is not None and degraded.reason == c.REASON_REVISION_MISSING
