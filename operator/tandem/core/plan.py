"""The pool planner: from one observed snapshot to the actions, routing table and status of one pass.

What it owns: `plan_pool(snapshot) -> Plan`, the pure heart of the reconcile loop (observe → **plan**
→ act → report). It never performs I/O and never reads the clock (`snapshot.now`); the same snapshot
always gives the same plan, and a plan on a converged snapshot has no actions and an unchanged
status, so a quiet pass makes zero API writes.

The rules, in order:
1. Revisions: the desired revision is the hash of the pod-shaping spec, except that a spec differing
   from the running revision only in P:D keeps the running one (`tandem.core.reshape`); the stable one
   comes from status (or, with no status, from the pods already there). `tandem.core.rollout` turns them
   into per-revision pair targets and a canary traffic share; groups off the pool's P:D add one surge
   group at a time while nothing else moves.
2. Finished drains are deleted (drain started + `drainTimeout` passed).
3. Broken pairs: missing instances are recreated on their partner's node (same revision, the group's own
   shape); a pair that stayed incomplete longer than `orphanTimeout`, or mixes revisions, is deleted whole
   (it carries no traffic, so there is nothing to drain).
4. Per revision, toward its target, **capacity first**: new pairs are created while live pairs stay
   within `replicas + maxSurge`; pairs that cannot be placed are created only up to `maxSurge`
   (Pending, so a cluster autoscaler can react) and `InsufficientGPU` is reported; excess pairs are
   removed not-Ready first (deleted at once) then Ready (marked draining, groups off the pool's P:D first,
   then highest index first), and a Ready pair is drained only while the Ready pairs left stay
   ≥ `replicas − maxUnavailable` (INV-1).
   How many of each is `tandem.core.converge.next_moves` (the simulator runs it too); this module picks
   the pairs (by index) and the nodes (`tandem.core.placement`).
5. The routing table lists every pair in ring order: `serving` only while all instances are Ready
   (INV-6), `warming` before, `draining` after; pair weights give the canary its share, capped by its
   Ready share. Its admission limits are per pair: the pool's per-instance ones times the instances of the
   smallest group listed (`tandem.routing.Admission.for_groups`).
6. Status: counts, revisions, rollout, conditions (lastTransitionTime only moves on a flip).

Worked example: replicas 8 → 10 on 10 empty 8-GPU nodes, 1P+1D at 4 GPUs, maxSurge 1: pass 1 creates
pairs p8 and p9 (4 pods, one node each); they show `warming`; once Ready a later pass marks them
`serving` and Ready becomes 10/10. Scaling back to 8 drains p9 and p8 (highest first) while 8 Ready
pairs remain; their pods are deleted `drainTimeout` later.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final

from tandem.api.common import Condition
from tandem.api.labels import (
    ANNOTATION_ABORT,
    ANNOTATION_PROMOTE,
    EVAL_TARGET_DECODE_PODS,
    EVAL_TARGET_ROUTER,
    Role,
    eval_job_name,
    pod_name,
    pool_selector,
    routing_configmap_name,
    selector_string,
)
from tandem.api.pool_status import (
    GateVerdict,
    InferencePoolStatus,
    PairCounts,
    RevisionsStatus,
    RevisionStatus,
    RolloutStatus,
    RoutingTableStatus,
)
from tandem.api.quantity import parse_duration
from tandem.api.revision import RevisionSpec, revision_id, revision_spec, same_stack
from tandem.core import conditions as c
from tandem.core.analysisplan import analysis_request, eval_verdict, fold_analysis, update_scorecard
from tandem.core.autoscale import (
    AutoscaleState,
    RatioState,
    ScaleContext,
    compute_desired_pairs,
    compute_role_ratio,
    last_work_need,
    ratio_pairs,
)
from tandem.core.converge import Bounds, highest_first, next_moves
from tandem.core.drains import DRAIN_POLL_SECONDS, streams_closed
from tandem.core.integrity import (
    CONDITION_HOLD,
    DrainRecord,
    Finding,
    drain_finding,
    foreign_pods_finding,
    prometheus_finding,
    snapshot_digest,
    split_owned,
    table_is_own,
    vet_drain,
    vet_revisions,
)
from tandem.core.loadtime import measure_load_seconds
from tandem.core.observed import ObservedPod, Snapshot, parse_time
from tandem.core.pairs import PairView, cancel_unneeded_drains, group_pairs
from tandem.core.placement import NodePool, build_node_pool, domain_of, place_instance, place_pair
from tandem.core.reasons import REASON_PAIRS_CREATED, REASON_PAIRS_DRAINING, REASON_RESHAPING
from tandem.core.reshape import ReshapeDecision, drain_order, off_shape, reshape_surge
from tandem.core.rollout import (
    EVENT_NORMAL,
    EVENT_WARNING,
    AnalysisResult,
    Event,
    RevisionCounts,
    RolloutDecision,
    RolloutInputs,
    plan_rollout,
    surge_room,
)
from tandem.routing.algorithm import compute_pair_weights
from tandem.routing.pin import HEADER_REVISION, RevisionPin
from tandem.routing.table import (
    Admission,
    Endpoint,
    HashSpec,
    HeaderMatch,
    ImagesMatch,
    KvTransfer,
    Match,
    Pair,
    PairState,
    Revisions,
    RoutingTable,
)

ENGINE_PORT = 8000
REASON_EVAL_JOB_CREATED = "EvalJobCreated"
STEADY_RESYNC_SECONDS = 300.0
BUSY_REQUEUE_SECONDS = 5.0


NEED_MAX_AGE_EVALUATIONS: Final = 3
"""A reshape reads work planning's last need (to keep a Ready replacement while a drain would leave a role short,
or to skip a replacement that would not pay) only while that need is at most this many autoscaling intervals old
(``tandem.core.reshape``)."""


@dataclass(frozen=True)
class CreatePod:
    """Create one instance pod of a pair, from a revision snapshot, optionally pinned to a node."""

    pair: int
    role: Role
    instance: int
    revision: str
    node: str | None
    shape: tuple[int, int] | None = None
    """The pair group's (prefill, decode) instances, written into the pod (None: the revision's)."""


TableRow = tuple[int, str, str, tuple[ObservedPod, ...], datetime | None, tuple[int, int]]
"""One pair of the routing table: (index, revision, state, pods, draining since, (prefill, decode) instances)."""


@dataclass(frozen=True)
class RelabelPod:
    """Put a pod's revision label back to the revision it was built from (a foreign writer changed it)."""

    name: str
    revision: str


@dataclass(frozen=True)
class DeletePod:
    """Delete one pod (with its uid as a precondition: never a look-alike created meanwhile)."""

    name: str
    uid: str
    reason: str


@dataclass(frozen=True)
class EvalJobRequest:
    """Create the eval Job of an analysis step against the canary's serving pairs.

    Through the router when the operator knows one (``target`` :data:`EVAL_TARGET_ROUTER`: one URL, and
    ``headers`` pin the requests to this pool's canary revision, so they take the real P/D path: prefill
    leg, KV transfer, decode leg, admission); otherwise the canary's decode pods directly
    (:data:`EVAL_TARGET_DECODE_PODS`, no headers: each decode engine then prefills for itself).
    """

    step: int
    revision: str
    target_urls: tuple[str, ...]
    target: str = EVAL_TARGET_DECODE_PODS
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    """Everything one pass wants done; the reconcile applies it, in this order."""

    rollout_first: RolloutStatus | None
    snapshots: tuple[str, ...]
    creates: tuple[CreatePod, ...]
    deletes: tuple[DeletePod, ...]
    routing: RoutingTable
    status: InferencePoolStatus
    events: tuple[Event, ...] = ()
    requeue_after: float = STEADY_RESYNC_SECONDS
    revisions: dict[str, RevisionSpec] = field(default_factory=dict)
    desired_revision: str = ""
    eval_job: EvalJobRequest | None = None
    scale_to: int | None = None
    reshape_to: tuple[int, int] | None = None
    """New (prefill, decode) instances per pair group (written to spec.pairs; groups take it as they cycle)."""
    autoscale_state: AutoscaleState | None = None
    ratio_state: RatioState | None = None
    relabels: tuple[RelabelPod, ...] = ()


def _previous_canary_ready(status: InferencePoolStatus, desired: str) -> int:
    canary = status.revisions.canary
    return canary.ready_pairs if canary is not None and canary.name == desired else 0


def infer_stable(pairs: Iterable[PairView], fallback: str) -> str:
    """With no status, the stable revision is the one most Ready pairs run (else the desired one)."""
    ready = Counter(p.revision for p in pairs if p.ready and p.revision)
    if ready:
        return sorted(ready.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return fallback


def plan_pool(snapshot: Snapshot) -> Plan:
    """One pure planning pass for one pool (module docstring lists the rules)."""
    pool = snapshot.pool
    spec = pool.spec
    name = pool.metadata.name
    now = snapshot.now
    old_status = pool.status or InferencePoolStatus()
    generation = pool.metadata.generation

    # 0. integrity (tandem.core.integrity): only pods the pool controls, genuine snapshots with allowed
    # images and the operator's own drain records are acted on; everything else is a finding, never a delete.
    findings: list[Finding] = []
    owned, foreign = split_owned(snapshot.pods, pool.metadata.uid)
    if (found := foreign_pods_finding(foreign)) is not None:
        findings.append(found)
    raw_revisions = snapshot.revisions

    # 1. revisions and the rollout
    desired_spec = revision_spec(spec, snapshot.cache)
    desired = revision_id(desired_spec)
    vetted = vet_revisions(
        raw_revisions, _recorded_digests(old_status), desired, desired_spec, snapshot.allowed_registries
    )
    findings.extend(vetted.findings)
    if snapshot.prometheus_problem and (
        found := prometheus_finding(spec.rollout.analysis.prometheus_address or "", snapshot.prometheus_problem)
    ):
        findings.append(found)
    # Look-alikes still hold GPUs: the placement ledger counts them like any other workload.
    snapshot = replace(
        snapshot, pods=owned, other_pods=(*snapshot.other_pods, *foreign), revisions=dict(vetted.trusted)
    )
    revisions = dict(vetted.trusted)
    # 1a. a P:D change alone is not a new revision: the running one stays desired and new groups take the new
    # shape (tandem.core.reshape). Only a snapshot that passed vetting can stand in for the live spec.
    running = _same_stack_running(revisions, old_status, desired, desired_spec)
    if running is not None:
        desired, desired_spec = running, revisions[running]
    revisions[desired] = desired_spec
    pairs = group_pairs(name, snapshot.pods, revisions, snapshot.routing)
    published = snapshot.routing.fingerprint() if snapshot.routing is not None else None
    own_table = table_is_own(published, old_status.routing.fingerprint)
    pairs, changed_drains = _vet_drains(pairs, own_table, now)
    if (found := drain_finding(changed_drains)) is not None:
        findings.append(found)
    stable = _stable_revision(old_status, pairs, desired, revisions)
    counts = _revision_counts(pairs)
    # 1b. the analysis step: this pass's gate verdicts (observed by the reconcile) folded into its progress
    analysis: AnalysisResult | None = None
    all_verdicts: list[GateVerdict] = []
    request = analysis_request(pool, desired, stable, now, snapshot.scrape_interval_s)
    if request is not None and snapshot.gate_verdicts is not None:
        all_verdicts = list(snapshot.gate_verdicts)
        if request.eval:
            all_verdicts.append(eval_verdict(pool, snapshot.eval_job, now))
        analysis = fold_analysis(pool, request, all_verdicts, now)
    inputs = RolloutInputs(
        spec=spec,
        status=old_status.rollout,
        stable=stable,
        desired=desired,
        counts=counts,
        now=now,
        analysis=analysis,
        promote_request=pool.metadata.annotations.get(ANNOTATION_PROMOTE, ""),
        abort_request=pool.metadata.annotations.get(ANNOTATION_ABORT, ""),
        previous_canary_ready=_previous_canary_ready(old_status, desired),
        surge_room=_surge_room(
            snapshot,
            desired_spec,
            sum(1 for p in pairs if p.live and p.revision == desired and not p.pending),
            counts.get(stable, RevisionCounts()).live,
        ),
    )
    decision = plan_rollout(inputs)
    # 1c. drain records the targets do not justify (forged in the table, or overtaken) are dropped and the
    # rollout decided again on the corrected counts (pure, so deciding twice is safe).
    kept = cancel_unneeded_drains(pairs, decision.targets)
    if kept != pairs:
        pairs = kept
        decision = plan_rollout(replace(inputs, counts=_revision_counts(pairs)))
    events = list(decision.events)
    targets = dict(decision.targets)
    # 1d. groups off the pool's P:D: one more stable group while one is replaced, surge first
    reshape = _reshape(snapshot, pairs, decision, targets, desired_spec)
    if reshape.extra:
        targets[decision.stable] = targets.get(decision.stable, 0) + reshape.extra

    # 2.-4. pair actions
    actions = _PairActions(snapshot, pairs, revisions, targets, now)
    actions.held = vetted.held
    actions.finish_drains(own_table)
    actions.repair()
    actions.converge()
    events.extend(actions.events)
    if reshape.extra and actions.new_pairs:
        events.append(
            Event(
                EVENT_NORMAL,
                REASON_RESHAPING,
                f"replacing a pair group built as {_shape_name(_off_counts(pairs, decision.stable, actions))} with "
                f"one of {_shape_name(actions.target_shape)}, surge first ({reshape.off_shape} off the pool's P:D)",
            )
        )

    # 5. routing table
    table = build_table(snapshot, actions.final_pairs(), decision, now)

    # 6. status, and an Event whenever Ready or Degraded flips (never one per pass)
    status = summarize(snapshot, actions, decision, table, revisions, generation, reshape)
    if all_verdicts:
        stable_key = (revisions[stable].stack.version, stable) if stable in revisions else None
        status = status.model_copy(
            update={
                "scorecard": update_scorecard(
                    status.scorecard,
                    spec.rollout.analysis.metrics,
                    all_verdicts,
                    (spec.stack.version, desired),
                    stable_key,
                    now,
                )
            }
        )
    conditions, hold_s = untrusted_input_condition(status.conditions, findings, now, generation)
    status = status.model_copy(update={"conditions": conditions})
    events.extend(transition_events(old_status, status))
    requeue = actions.requeue_after(decision)
    if hold_s is not None:
        requeue = min(requeue, max(1.0, hold_s))

    # 7. the eval Job of the current step, created once per (revision, step)
    eval_job = _eval_job_needed(snapshot, desired, decision)
    if eval_job is not None:
        events.append(Event(EVENT_NORMAL, REASON_EVAL_JOB_CREATED, _eval_job_message(snapshot, eval_job)))

    # 8. autoscaling: the total pair count (the rollout splits it), only when an evaluation was due
    scale_to: int | None = None
    reshape_to: tuple[int, int] | None = None
    autoscale_state = snapshot.autoscale_state
    ratio_state = snapshot.ratio_state
    if spec.autoscaling.enabled:  # come back for the next evaluation even when nothing else happens
        requeue = min(requeue, max(1.0, parse_duration(spec.autoscaling.interval)))
    if spec.autoscaling.enabled and snapshot.scaling_metrics is not None:
        serving = sum(1 for p in table.pairs if p.state is PairState.SERVING)
        context = ScaleContext(
            current_pairs=spec.pairs.replicas,
            ready_pairs=serving,
            max_placeable_pairs=actions.max_placeable(),
            surge_pairs=spec.rollout.max_surge,
            hold_scale_down=decision.status.phase == "RollingBack"
            or bool(actions.creates)
            or serving < status.pairs.current,
            shape=spec.pairs.shape,
            group_shapes=_kept_shapes(actions),
            measured_load_s=_measured_load(status),
        )
        scaled, autoscale_state = compute_desired_pairs(
            spec.autoscaling,
            context,
            snapshot.scaling_metrics,
            snapshot.autoscale_state or AutoscaleState(),
            now.timestamp(),
        )
        if scaled.changed:
            scale_to = scaled.desired_pairs
        last = old_status.last_scaling
        if last is None or (last.from_pairs, last.to_pairs, last.reason) != scaled.key:
            status = status.model_copy(update={"last_scaling": scaled.to_status(now)})
            if scaled.changed or scaled.warning:
                events.append(Event(EVENT_WARNING if scaled.warning else EVENT_NORMAL, scaled.reason, scaled.message))
        requeue = min(requeue, max(1.0, scaled.requeue_after_s))
        # 8b. optional P:D adjustment: the new shape is written to spec.pairs; it is not a new revision, so the
        # groups take it as they cycle, one surge replacement at a time (step 1d), and no new ratio is chosen
        # while groups are still off the last one. With work planning the ratio follows the work's per-role need
        # (this evaluation's), not the latency pressures
        shape = spec.pairs.shape
        work_need = last_work_need(autoscale_state, now.timestamp(), parse_duration(spec.autoscaling.interval))
        ratio, ratio_state = compute_role_ratio(
            spec.autoscaling,
            shape,
            snapshot.scaling_metrics,
            snapshot.ratio_state or RatioState(),
            now.timestamp(),
            hold=decision.status.phase in ("Progressing", "Paused", "RollingBack")
            or bool(actions.creates)
            or (reshape.off_shape > 0 and not reshape.settled),
            need=work_need,
        )
        if ratio.changed:
            reshape_to = ratio.shape
            scale_to = ratio_pairs(scale_to or spec.pairs.replicas, shape, ratio.shape, work_need)
            events.append(
                Event(
                    EVENT_NORMAL,
                    ratio.reason,
                    f"pair shape {shape[0]}P:{shape[1]}D → {ratio.shape[0]}P:{ratio.shape[1]}D, "
                    f"{scale_to} pairs: {ratio.message}",
                )
            )
    # Snapshots to write: only revisions the planner holds a spec for (the live spec's); a snapshot that is
    # gone cannot be re-derived from anything trustworthy, and one that is held is never overwritten.
    missing = tuple(sorted(r for r, n in targets.items() if n > 0 and r not in raw_revisions and r in revisions))
    return Plan(
        rollout_first=decision.status if decision.persist_first else None,
        snapshots=missing,
        creates=tuple(actions.creates),
        deletes=tuple(actions.deletes),
        routing=table,
        status=status,
        events=tuple(events),
        requeue_after=requeue,
        revisions=revisions,
        desired_revision=desired,
        eval_job=eval_job,
        scale_to=scale_to,
        reshape_to=reshape_to,
        autoscale_state=autoscale_state,
        ratio_state=ratio_state,
        relabels=tuple(
            RelabelPod(pod.name, pod.built_revision)
            for pod in snapshot.pods
            if pod.pool == name and pod.label_drift and pod.built_revision and not pod.deleting
        ),
    )


def _stable_revision(
    status: InferencePoolStatus, pairs: list[PairView], desired: str, trusted: dict[str, RevisionSpec]
) -> str:
    """The stable revision: a Promoted rollout's revision, else the one status records, else inferred from pairs.

    Why: a promotion is persisted first (the rollout status alone, before any pod moves), and the full status
    with ``revisions.stable`` follows after the pass's actions. An operator killed between the two writes
    leaves a Promoted rollout whose revision is not yet the recorded stable; read literally, the next pass
    would see the desired revision differ from stable and start the whole rollout again (OP-01). A Promoted
    rollout's revision is stable by definition, so the promotion is finished instead. Only a snapshot that
    passed vetting stands in (status is the operator's own, but a revision it cannot vouch for is not adopted).
    """
    rollout = status.rollout
    if rollout.phase == "Promoted" and rollout.revision and rollout.revision in trusted:
        return rollout.revision
    if status.revisions.stable is not None:
        return status.revisions.stable.name
    return infer_stable(pairs, desired)


def _same_stack_running(
    trusted: dict[str, RevisionSpec], status: InferencePoolStatus, desired: str, desired_spec: RevisionSpec
) -> str | None:
    """The running revision (the rollout's canary, else stable, from status) that the live spec differs from
    only in pair shape (``tandem.api.revision.same_stack``), when the live spec's own id is neither; else None."""
    running = [r.name for r in (status.revisions.canary, status.revisions.stable) if r is not None]
    if desired in running:
        return None
    for name in running:
        spec = trusted.get(name)
        if spec is not None and same_stack(spec, desired_spec):
            return name
    return None


def _reshape(
    snapshot: Snapshot,
    pairs: list[PairView],
    decision: RolloutDecision,
    targets: dict[str, int],
    desired_spec: RevisionSpec,
) -> ReshapeDecision:
    """``tandem.core.reshape.reshape_surge`` for the stable revision, steady only when no canary or other revision
    has pairs or targets (a rollout replaces groups on its own, in the target shape)."""
    spec = snapshot.pool.spec
    stable = decision.stable
    target = spec.pairs.shape
    others = any(n > 0 for r, n in targets.items() if r != stable) or any(
        p.live and p.revision != stable for p in pairs
    )
    steady = (decision.canary in (None, stable)) and not others and targets.get(stable, 0) == spec.pairs.replicas
    live = sum(1 for p in pairs if p.live and p.revision == stable)
    room = _surge_room(snapshot, desired_spec, 0, live) if steady else 0
    need = None
    if spec.autoscaling.enabled:
        # a need older than a few evaluations is no reason to keep a group (the autoscaler stopped answering)
        max_age_s = NEED_MAX_AGE_EVALUATIONS * parse_duration(spec.autoscaling.interval)
        need = last_work_need(snapshot.autoscale_state, snapshot.now.timestamp(), max_age_s)
    return reshape_surge(
        pairs,
        revision=stable,
        target=target,
        replicas=spec.pairs.replicas,
        steady=steady,
        room=room,
        need=need,
        at_max_pairs=spec.pairs.replicas >= spec.autoscaling.max_pairs,
    )


def _off_counts(pairs: list[PairView], stable: str, actions: _PairActions) -> tuple[int, int]:
    """The shape of the off-target group the replacement is for (the one the next scale-down drains)."""
    target = actions.target_shape
    off = [p for p in pairs if p.live and p.revision == stable and p.counts != target]
    return max(off, key=lambda p: drain_order(p, target)).counts if off else target


def _kept_shapes(actions: _PairActions) -> tuple[tuple[int, int], ...]:
    """The P:D of every group live after this pass (new ones in the pool's), in the order a scale-down keeps
    them (the reverse of ``tandem.core.reshape.drain_order``): work planning counts groups as they are while
    some are off the pool's P:D (``tandem.core.capacity.groups_for``)."""
    target = actions.target_shape
    keys = [
        (drain_order(p, target), p.counts)
        for p in actions.pairs
        if p.live and p.index not in actions.deleted_pairs and p.index not in actions.new_drains
    ]
    keys += [((False, index), target) for index in actions.new_pairs]
    return tuple(shape for _, shape in sorted(keys))


def _off_shape_note(reshape: ReshapeDecision | None, actions: _PairActions) -> str:
    """``; N pair group(s) off the pool's P:D (xP:yD): <why>`` for the Progressing message, or "".

    Level-based: the text depends only on this pass's state (the groups, room, the autoscaler's last need), so
    an unchanged pool writes an unchanged condition."""
    if reshape is None or reshape.off_shape == 0 or not reshape.reason:
        return ""
    shape = _shape_name(actions.target_shape)
    return f"; {reshape.off_shape} pair group(s) off the pool's P:D ({shape}): {reshape.reason}"


def _shape_name(shape: tuple[int, int]) -> str:
    return f"{shape[0]}P:{shape[1]}D"


def _measured_load(status: InferencePoolStatus) -> float | None:
    """The stable revision's measured load time (the capacity a scale-up orders is mostly stable pairs; a
    rollout's canary share is small), else the canary's, else None (work planning uses the declared one)."""
    for rev in (status.revisions.stable, status.revisions.canary):
        if rev is not None and rev.measured_load_seconds is not None:
            return float(rev.measured_load_seconds)
    return None


def _recorded_digests(status: InferencePoolStatus) -> dict[str, str]:
    """Snapshot digests the operator recorded in status, by revision (status is written only by the operator)."""
    revs = (status.revisions.stable, status.revisions.canary)
    return {r.name: r.digest for r in revs if r is not None and r.digest}


def _vet_drains(pairs: list[PairView], own_table: bool, now: datetime) -> tuple[list[PairView], dict[str, str]]:
    """Pairs with their drain records vetted (`tandem.core.integrity.vet_drain`), and why each changed."""
    out: list[PairView] = []
    changed: dict[str, str] = {}
    for pair in pairs:
        if pair.draining_since is None:
            out.append(pair)
            continue
        since, why = vet_drain(DrainRecord(pair.id, pair.draining_since, pair.ready), own_table=own_table, now=now)
        if why:
            changed[pair.id] = why
        out.append(replace(pair, draining_since=since))
    return out, changed


def untrusted_input_condition(
    conditions: list[Condition], findings: list[Finding], now: datetime, generation: int
) -> tuple[list[Condition], float | None]:
    """The `UntrustedInput` condition for this pass's findings, and seconds until a held True may clear.

    True (first finding's reason, every message) while something is refused; kept True for
    `CONDITION_HOLD` after the last finding so a one-pass repair is still visible; then False. A pool
    that never had a finding gets no such condition at all.
    """
    old = c.find(conditions, c.CONDITION_UNTRUSTED_INPUT)
    if findings:
        message = "; ".join(f.message for f in findings)
        return (
            c.set_condition(
                conditions, c.CONDITION_UNTRUSTED_INPUT, "True", findings[0].reason, message, now, generation
            ),
            None,
        )
    if old is None or old.status != "True":
        return conditions, None
    clear_at = old.last_transition_time + CONDITION_HOLD
    if now < clear_at:
        return conditions, (clear_at - now).total_seconds()
    return (
        c.set_condition(
            conditions,
            c.CONDITION_UNTRUSTED_INPUT,
            "False",
            c.REASON_NO_UNTRUSTED_INPUT,
            "nothing untrusted observed",
            now,
            generation,
        ),
        None,
    )


def canary_share(weight_percent: int | None, ready_canary: int, serving: int) -> int:
    """The canary's share of keys in the routing table (the simulator publishes the same one).

    ``weight_percent`` (a ``setWeight`` step) capped by the canary's share of serving pairs — a weight the
    Ready pairs cannot carry is not published — and 100 when only canary pairs serve; None (by pair count)
    is the canary's share of serving pairs. Example: weight 5, 1 of 9 serving pairs → min(5, 11) = 5;
    weight 50, 1 of 9 → 11; None, 1 of 9 → 11.
    """
    if weight_percent is None:
        return round(100 * ready_canary / serving) if serving else 0
    percent = min(weight_percent, (100 * ready_canary) // serving if serving else 0)
    return 100 if ready_canary and serving == ready_canary else percent


def _surge_room(snapshot: Snapshot, desired: RevisionSpec, placed_canary: int, live_stable: int) -> int:
    """Canary pairs that fit beside every stable pair (``tandem.core.rollout.surge_room``). Free GPUs are
    counted as this pass's placement would use them: whole pairs of the desired revision on the free GPUs of
    eligible nodes, every bound pod (ours or not) holding its GPUs. Only *placed* canary pairs count as
    room already taken: a Pending one holds no GPUs, and counting it would flip a pool without room back to
    surge and cancel the stable drain that capacity-first needs."""
    spec = snapshot.pool.spec
    gpus = group_gpus(desired, spec.pairs.shape)
    ledger = build_node_pool(snapshot.nodes, [*snapshot.pods, *snapshot.other_pods], desired.placement)
    free = 0
    while free <= spec.rollout.max_surge and place_pair(ledger, gpus, desired.placement) is not None:
        free += 1
    return surge_room(
        max_surge=spec.rollout.max_surge,
        replicas=spec.pairs.replicas,
        live_canary=placed_canary,
        live_stable=live_stable,
        free_pairs=free,
        gpus_per_pair=sum(gpus),
        gpu_budget=spec.placement.gpu_budget,
    )


def _revision_counts(pairs: list[PairView]) -> dict[str, RevisionCounts]:
    """Live and Ready pairs per revision (draining pairs are on their way out and not counted)."""
    counts: dict[str, RevisionCounts] = {}
    for pair in pairs:
        if pair.live:
            prev = counts.get(pair.revision, RevisionCounts())
            counts[pair.revision] = RevisionCounts(prev.live + 1, prev.ready + int(pair.ready))
    return counts


def group_gpus(rev: RevisionSpec, shape: tuple[int, int]) -> list[int]:
    """GPUs of each pod of a group of ``shape`` built from ``rev`` (prefill pods first)."""
    return [rev.prefill.gpus_per_instance] * shape[0] + [rev.decode.gpus_per_instance] * shape[1]


def _eval_job_needed(snapshot: Snapshot, desired: str, decision: RolloutDecision) -> EvalJobRequest | None:
    """The current step's eval Job when the step asks for one and it does not exist yet."""
    spec = snapshot.pool.spec
    status = decision.status
    if status.phase != "Progressing" or status.revision != desired or spec.rollout.analysis.eval is None:
        return None
    if status.step_index >= len(spec.rollout.steps):
        return None
    step = spec.rollout.steps[status.step_index]
    if step.analysis is None or not step.analysis.eval or snapshot.eval_job is not None:
        return None
    urls: list[str] = []
    if snapshot.routing is not None:
        for pair in snapshot.routing.pairs:
            if pair.revision == desired and pair.state is PairState.SERVING:
                urls.extend(f"http://{e.address}" for e in pair.decode if e.address)
    if not urls:
        # No canary pair is published as serving yet (the table lags the pass that made the pair Ready):
        # an eval without a target would measure nothing (through the router it would get
        # `revision_not_serving`). The next pass starts it; the gate's deadline still bounds the step.
        return None
    if snapshot.router_url:
        meta = snapshot.pool.metadata
        pin = RevisionPin(desired, meta.namespace, meta.name)
        return EvalJobRequest(
            step=status.step_index,
            revision=desired,
            target_urls=(snapshot.router_url,),
            target=EVAL_TARGET_ROUTER,
            headers=((HEADER_REVISION, pin.header_value()),),
        )
    return EvalJobRequest(step=status.step_index, revision=desired, target_urls=tuple(urls))


def _eval_job_message(snapshot: Snapshot, job: EvalJobRequest) -> str:
    """The EvalJobCreated event: which path the eval measures, so a direct-to-decode eval is never silent."""
    name = eval_job_name(snapshot.pool.metadata.name, job.revision, job.step)
    if job.target == EVAL_TARGET_ROUTER:
        return f"eval Job {name}: through the router {job.target_urls[0]}, pinned to revision {job.revision}"
    return (
        f"eval Job {name}: directly against {len(job.target_urls)} decode pod(s) of revision {job.revision} "
        "(no router configured: the P/D path is not exercised)"
    )


class _PairActions:
    """Working state of steps 2-4 for one pass (not shared, not persisted)."""

    def __init__(
        self,
        snapshot: Snapshot,
        pairs: list[PairView],
        revisions: dict[str, RevisionSpec],
        targets: dict[str, int],
        now: datetime,
    ) -> None:
        spec = snapshot.pool.spec
        self.snapshot = snapshot
        self.spec = spec
        self.pool = snapshot.pool.metadata.name
        self.pairs = pairs
        self.revisions = revisions
        self.targets = targets
        self.now = now
        self.target_shape = spec.pairs.shape
        """New groups of any revision are built in the pool's P:D (``tandem.core.reshape``)."""
        self.creates: list[CreatePod] = []
        self.deletes: list[DeletePod] = []
        self.events: list[Event] = []
        self.new_drains: dict[int, datetime] = {}
        self.deleted_pairs: set[int] = set()
        self.new_pairs: dict[int, str] = {}
        self.insufficient_gpu = 0
        self.waiting_for_drain = False
        self.missing_snapshot: set[str] = set()
        self.held: frozenset[str] = frozenset()
        """Revisions whose snapshot exists but is not trusted (tampered, or an image not allowed)."""
        self.recreated: set[str] = set()
        self.drain_timeout = parse_duration(spec.pairs.drain_timeout)
        self.orphan_timeout = parse_duration(spec.pairs.orphan_timeout)
        self.bounds = Bounds(spec.pairs.replicas, spec.rollout.max_surge, spec.rollout.max_unavailable)
        placement = spec.placement
        domains = [
            domain_of(n, placement.spread_topology_key)
            for p in pairs
            if p.live
            for n in snapshot.nodes
            if p.nodes and n.name == p.nodes[0]
        ]
        self.ledger = build_node_pool(snapshot.nodes, [*snapshot.pods, *snapshot.other_pods], placement, domains)
        self.used_indexes = {p.index for p in pairs}
        self.next_wake: list[float] = []

    # -- step 2: finished drains
    def finish_drains(self, own_table: bool) -> None:
        """Delete a draining pair when ``drainTimeout`` passed, or earlier when every router replica reports
        no open stream on it (`tandem.core.drains.streams_closed`: unknown never counts as closed)."""
        streams = self.snapshot.router_streams
        pool_key = f"{self.snapshot.pool.metadata.namespace}/{self.pool}"
        for pair in self.pairs:
            if pair.draining_since is None:
                continue
            due = pair.draining_since + timedelta(seconds=self.drain_timeout)
            if self.now >= due:
                self._delete_pair(pair, "drain finished (drainTimeout passed)")
                continue
            closed, _why = streams_closed(
                streams,
                pool_key=pool_key,
                pair_id=pair.id,
                table=self.snapshot.routing,
                own_table=own_table,
                draining_since=pair.draining_since,
            )
            if closed:
                self._delete_pair(pair, "drain finished (routers report no open stream)")
                continue
            self.next_wake.append((due - self.now).total_seconds())
            if streams is not None:  # the routers report: look again soon rather than at the deadline
                self.next_wake.append(DRAIN_POLL_SECONDS)

    # -- step 3: broken pairs
    def repair(self) -> None:
        for pair in self.pairs:
            if not pair.live or pair.index in self.deleted_pairs:
                continue
            if pair.mixed:
                self._delete_pair(pair, "pair mixes revisions")
                continue
            if pair.ready:
                continue
            rev = self.revisions.get(pair.revision)
            stuck = self._stuck_since(pair)
            if stuck is not None and self.now >= stuck + timedelta(seconds=self.orphan_timeout):
                self.events.append(
                    Event(
                        EVENT_WARNING,
                        c.REASON_PAIR_INCOMPLETE,
                        f"pair {pair.id} incomplete for {self.spec.pairs.orphan_timeout}: replacing it",
                    )
                )
                self._delete_pair(pair, "incomplete past orphanTimeout")
                continue
            if stuck is not None:
                self.next_wake.append((stuck + timedelta(seconds=self.orphan_timeout) - self.now).total_seconds())
            if rev is None:
                self.missing_snapshot.add(pair.revision)
                continue
            for role, instance in pair.missing:
                partners = [p.node for p in pair.pods if p.node and not p.deleting]
                gpus = rev.prefill.gpus_per_instance if role == "prefill" else rev.decode.gpus_per_instance
                node = place_instance(self.ledger, gpus, partners, rev.placement)
                if node is None and partners:
                    self.insufficient_gpu += 1
                    continue
                self.creates.append(CreatePod(pair.index, role, instance, pair.revision, node, pair.counts))
                self.recreated.add(pair.id)

    def _stuck_since(self, pair: PairView) -> datetime | None:
        """When the pair's current incompleteness started, as far as observable (newest pod's creation)."""
        if pair.ready:
            return None
        newest = pair.newest_pod
        return newest

    # -- step 4: converge revisions toward their targets
    def converge(self) -> None:
        """Step 4: :func:`tandem.core.converge.next_moves` decides the counts; here they become pods (which
        pairs by index, which nodes by placement)."""
        live = {p.index: p for p in self.pairs if p.live and p.index not in self.deleted_pairs}
        by_rev: dict[str, list[PairView]] = {}
        for pair in live.values():
            by_rev.setdefault(pair.revision, []).append(pair)
        # Revisions that are not targeted at all (old canaries, unknown) go to zero.
        for rev in by_rev:
            self.targets.setdefault(rev, 0)
        moves = next_moves(self.targets, _revision_counts(list(live.values())), self.bounds)
        # 4a. excess not-Ready pairs go first: they carry no traffic.
        for rev, n in moves.delete_unready:
            for pair in highest_first((p for p in by_rev[rev] if not p.ready), n, self._drain_order):
                self._delete_pair(pair, "scale down (not ready)")
                live.pop(pair.index, None)
        # 4b. create toward the targets, within replicas + maxSurge live pairs; a create placement refuses
        # leaves its room to the next revision.
        pending_pairs = sum(1 for p in live.values() if p.pending)
        room = moves.create_room
        for rev, wanted in moves.wanted:
            spec = self.revisions.get(rev)
            made = 0
            while made < wanted and room > 0:
                if spec is None:
                    self.missing_snapshot.add(rev)
                    break
                gpus = group_gpus(spec, self.target_shape)
                nodes = place_pair(self.ledger, gpus, spec.placement)
                if nodes is None and self._draining_gpus() >= sum(gpus):
                    # GPUs come back when current drains finish: wait for them instead of queueing Pending
                    # pods that the scheduler could split across nodes.
                    self.waiting_for_drain = True
                    break
                if nodes is None:
                    if pending_pairs >= self.bounds.max_surge:
                        self.insufficient_gpu += wanted - made
                        break
                    pending_pairs += 1
                    self.insufficient_gpu += 1
                    nodes_opt: list[str | None] = [None] * len(gpus)
                else:
                    nodes_opt = list(nodes)
                index = self._free_index()
                prefill, decode = self.target_shape
                slots = [("prefill", i) for i in range(prefill)] + [("decode", i) for i in range(decode)]
                for (role, i), node in zip(slots, nodes_opt, strict=True):
                    self.creates.append(
                        CreatePod(index, role, i, rev, node, self.target_shape)  # type: ignore[arg-type]
                    )
                self.new_pairs[index] = rev
                made += 1
                room -= 1
        created = Counter(self.new_pairs.values())
        for rev, n in sorted(created.items()):
            version = self.revisions[rev].stack.version
            self.events.append(
                Event(EVENT_NORMAL, REASON_PAIRS_CREATED, f"creating {n} pair(s) of {version} (revision {rev})")
            )
        # 4c. excess Ready pairs drain, highest index first, never below the floor.
        drained = 0
        for rev, n in moves.drain_ready:
            for pair in highest_first((p for p in by_rev[rev] if p.index in live and p.ready), n, self._drain_order):
                self.new_drains[pair.index] = self.now
                self.next_wake.append(self.drain_timeout)
                drained += 1
        if drained:
            self.events.append(
                Event(
                    EVENT_NORMAL,
                    REASON_PAIRS_DRAINING,
                    f"draining {drained} pair(s): no new requests, deleted after in-flight streams end",
                )
            )

    def max_placeable(self) -> int:
        """Live pairs plus how many more whole pairs the free GPUs left after this pass could take."""
        live = sum(1 for p in self.pairs if p.live and p.index not in self.deleted_pairs) + len(self.new_pairs)
        rev = self.revisions.get(max(self.targets, key=lambda r: (self.targets[r], r))) if self.targets else None
        if rev is None:
            return live
        ledger = NodePool(
            self.ledger.resource, dict(self.ledger.free), self.ledger.nodes, Counter(self.ledger.pairs_per_domain)
        )
        gpus = group_gpus(rev, self.target_shape)
        extra = 0
        while extra < 1024 and place_pair(ledger, gpus, rev.placement) is not None:
            extra += 1
        return live + extra

    def _drain_order(self, pair: PairView) -> tuple[bool, int]:
        return drain_order(pair, self.target_shape)

    def _draining_gpus(self) -> int:
        return sum(
            pod.gpus
            for pair in self.pairs
            if pair.draining_since is not None or pair.index in self.deleted_pairs
            for pod in pair.pods
            if pod.holds_gpus
        )

    def _free_index(self) -> int:
        index = 0
        while index in self.used_indexes:
            index += 1
        self.used_indexes.add(index)
        return index

    def _delete_pair(self, pair: PairView, reason: str) -> None:
        self.deleted_pairs.add(pair.index)
        for pod in pair.pods:
            if not pod.deleting:
                self.deletes.append(DeletePod(pod.name, pod.uid, reason))

    # -- outputs
    def final_pairs(self) -> list[TableRow]:
        """(index, revision, state, pods, draining_since, shape) of every pair the table lists."""
        rows = []
        for pair in self.pairs:
            since = pair.draining_since or self.new_drains.get(pair.index)
            if pair.index in self.deleted_pairs and since is None:
                continue
            if since is not None:
                state = PairState.DRAINING.value
            elif pair.ready:
                state = PairState.SERVING.value
            else:
                state = PairState.WARMING.value
            rows.append((pair.index, pair.revision, state, pair.pods, since, pair.counts))
        for index, rev in sorted(self.new_pairs.items()):
            rows.append((index, rev, PairState.WARMING.value, (), None, self.target_shape))
        return sorted(rows, key=lambda r: r[0])

    def requeue_after(self, decision: RolloutDecision) -> float:
        waits = [w for w in self.next_wake if w > 0]
        if decision.requeue_after:
            waits.append(decision.requeue_after)
        busy = self.creates or self.deletes or self.new_drains or any(not p.ready for p in self.pairs if p.live)
        if busy:
            waits.append(BUSY_REQUEUE_SECONDS)
        return max(1.0, min(waits)) if waits else STEADY_RESYNC_SECONDS


def transition_events(old: InferencePoolStatus, new: InferencePoolStatus) -> list[Event]:
    """Events for conditions whose status or reason changed this pass (Degraded, Ready, KVCacheDegraded), and
    a Warning whenever `UntrustedInput` is True with a new reason or message (what was refused changed)."""
    out = []
    was = c.find(old.conditions, c.CONDITION_UNTRUSTED_INPUT)
    now_ = c.find(new.conditions, c.CONDITION_UNTRUSTED_INPUT)
    key = (now_.status, now_.reason, now_.message) if now_ is not None else None
    if now_ is not None and now_.status == "True" and (was is None or (was.status, was.reason, was.message) != key):
        out.append(Event(EVENT_WARNING, now_.reason, now_.message))
    for kind in (c.CONDITION_DEGRADED, c.CONDITION_KV_CACHE_DEGRADED, c.CONDITION_READY):
        before, after = c.find(old.conditions, kind), c.find(new.conditions, kind)
        if after is None or (before is not None and (before.status, before.reason) == (after.status, after.reason)):
            continue
        bad = (after.status == "True") != (kind == c.CONDITION_READY)
        if before is None and not bad:
            continue
        out.append(
            Event(EVENT_WARNING if bad else EVENT_NORMAL, after.reason, f"{kind}={after.status}: {after.message}")
        )
    return out


def _endpoints(pool: str, index: int, pods: tuple[ObservedPod, ...], role: Role, count: int) -> tuple[Endpoint, ...]:
    out = []
    for i in range(count):
        pod = next((p for p in pods if p.role == role and p.instance == i), None)
        name = pod.name if pod else pod_name(pool, index, role, i)
        address = f"{pod.pod_ip}:{ENGINE_PORT}" if pod and pod.pod_ip else None
        out.append(Endpoint(pod=name, address=address))
    return tuple(out)


def _kv_transfer(rev_spec: RevisionSpec) -> KvTransfer:
    """The pair's legs as the router must drive them. The ports are the contract defaults, which are the ports
    the pod builder configures; MoRIIO's mode is published only for MoRIIO pairs (others ignore it)."""
    kv = rev_spec.stack.kv_transfer
    if kv.connector == "MoRIIOConnector":
        return KvTransfer(connector=kv.connector, moriio_mode=kv.moriio_mode)
    return KvTransfer(connector=kv.connector)


def build_table(
    snapshot: Snapshot,
    rows: list[TableRow],
    decision: RolloutDecision,
    now: datetime,
) -> RoutingTable:
    """The routing table for this pass (pure; see rule 5 of the module docstring)."""
    spec = snapshot.pool.spec
    pool = snapshot.pool.metadata.name
    previous = {p.index: p for p in snapshot.routing.pairs} if snapshot.routing else {}
    pairs: list[Pair] = []
    for index, rev, state, pods, since, shape in rows:
        rev_spec = _revision(snapshot, rev)
        known = previous.get(index)
        kv_transfer = (
            _kv_transfer(rev_spec)
            if rev_spec is not None
            else (known.kv_transfer if known is not None and known.revision == rev else None)
        )
        drain_text = None
        if since is not None:
            old = previous.get(index)
            # Keep the published text when it says the same instant (a stable fingerprint); a vetted
            # (restarted) drain record is rewritten with the start the planner used.
            kept = (
                old.draining_since if old and old.draining_since and _same_instant(old.draining_since, since) else None
            )
            drain_text = kept or since.isoformat().replace("+00:00", "Z")
        pairs.append(
            Pair(
                id=f"{pool}-p{index}",
                index=index,
                revision=rev,
                state=PairState(state),
                prefill=_endpoints(pool, index, pods, "prefill", shape[0]),
                decode=_endpoints(pool, index, pods, "decode", shape[1]),
                draining_since=drain_text,
                # The legs the router drives follow the revision's connector (the bootstrap port is the
                # contract default, which is the port the pod builder opens); a revision whose spec is
                # not at hand keeps what was published for the pair.
                kv_transfer=kv_transfer,
            )
        )
    canary = decision.canary
    serving = [p for p in pairs if p.state is PairState.SERVING]
    percent: int | None = None
    if canary is not None:
        ready_c = sum(1 for p in serving if p.revision == canary)
        percent = canary_share(decision.canary_weight_percent, ready_c, len(serving))
        if decision.canary_weight_percent is not None and serving:
            weights = compute_pair_weights(serving, canary, percent)
            pairs = [p.model_copy(update={"weight": weights.get(p.id, p.weight)}) for p in pairs]
        if canary == decision.stable:
            canary = None
    match = spec.traffic.match
    return RoutingTable(
        pool=pool,
        namespace=snapshot.pool.metadata.namespace,
        traffic_class=spec.traffic.traffic_class,
        priority=spec.traffic.priority,
        match=Match(
            min_prompt_tokens=match.min_prompt_tokens,
            max_prompt_tokens=match.max_prompt_tokens,
            images=ImagesMatch(match.images),
            headers=tuple(HeaderMatch(name=h.name, value=h.value) for h in match.headers),
        ),
        hash=HashSpec(
            prefix_chars=spec.routing.prefix_chars,
            load_bound_percent=spec.routing.load_bound_percent,
            max_walk=spec.routing.max_walk,
        ),
        admission=Admission(
            max_in_flight=spec.admission.max_in_flight,
            max_queued=spec.admission.max_queued,
            max_kv_utilization_percent=spec.admission.max_kv_cache_utilization_percent,
            reject_status=spec.admission.reject_status,
        ).for_groups([row[5] for row in rows] or [spec.pairs.shape]),
        revisions=Revisions(
            stable=decision.stable,
            canary=canary,
            canary_weight_percent=percent if canary is not None else None,
            canary_mirror=decision.canary_mirror and canary is not None and percent == 0,
        ),
        pairs=tuple(pairs),
        served_model_name=spec.model.served_name,
    )


def _same_instant(text: str, when: datetime) -> bool:
    try:
        return parse_time(text) == when
    except ValueError:
        return False


def _revision(snapshot: Snapshot, rev: str) -> RevisionSpec | None:
    """The spec of revision ``rev``: its snapshot, or the pool's current spec when that is ``rev``."""
    spec = snapshot.revisions.get(rev)
    if spec is None:
        from tandem.api.revision import revision_spec as _rs  # noqa: PLC0415

        current = _rs(snapshot.pool.spec, snapshot.cache)
        if revision_id(current) == rev:
            spec = current
    return spec


def summarize(
    snapshot: Snapshot,
    actions: _PairActions,
    decision: RolloutDecision,
    table: RoutingTable,
    revisions: dict[str, RevisionSpec],
    generation: int,
    reshape: ReshapeDecision | None = None,
) -> InferencePoolStatus:
    """The status this pass reports (pure). ``reshape``: step 1d's answer, whose reason the Progressing
    condition carries while groups are off the pool's P:D (``status.pairs.offShape`` alone does not say whether
    a replacement is coming, waiting for room, or not coming because the mix is within the tax bound)."""
    pool = snapshot.pool
    spec = pool.spec
    now = snapshot.now
    old = pool.status or InferencePoolStatus()
    live = [p for p in table.pairs if p.state is not PairState.DRAINING]
    ready = [p for p in table.pairs if p.state is PairState.SERVING]
    draining = [p for p in table.pairs if p.state is PairState.DRAINING]
    desired_rev = decision.canary or decision.stable
    pending_pods = sum(1 for p in snapshot.pods if p.node is None and not p.deleting) + sum(
        1 for a in actions.creates if a.node is None
    )
    replicas = spec.pairs.replicas

    recorded = _recorded_digests(old)
    previous_load = {
        r.name: r.measured_load_seconds
        for r in (old.revisions.stable, old.revisions.canary)
        if r is not None and r.measured_load_seconds is not None
    }

    def rev_status(rev: str | None) -> RevisionStatus | None:
        if not rev:
            return None
        rspec = revisions.get(rev)
        # The digest of the snapshot pods of this revision are built from; a held (untrusted) snapshot keeps
        # the digest recorded before, so a forged one is never adopted.
        digest = snapshot_digest(rspec) if rspec is not None else recorded.get(rev, "")
        members = [p for p in live if p.revision == rev]
        serving = [p for p in ready if p.revision == rev]
        if decision.canary and table.revisions.canary_weight_percent is not None:
            weight = (
                table.revisions.canary_weight_percent
                if rev == decision.canary
                else 100 - table.revisions.canary_weight_percent
            )
        else:
            weight = 100 if rev == decision.stable else 0
        # Measured on this pass's pods; the last measurement is kept while none is measurable (pods replaced
        # or restarted since), as it cannot be re-derived from anything else.
        measured = measure_load_seconds(actions.pairs, rev)
        if measured is None:
            measured = previous_load.get(rev)
        return RevisionStatus(
            name=rev,
            version=rspec.stack.version if rspec else "",
            image=rspec.stack.image if rspec else "",
            digest=digest,
            pairs=len(members),
            ready_pairs=len(serving),
            weight_percent=max(0, min(100, weight)),
            mirrored=rev == decision.canary and table.revisions.canary_mirror,
            measured_load_seconds=measured,
        )

    conditions = list(old.conditions)
    gen = generation
    if replicas == 0:
        conditions = c.set_condition(
            conditions, c.CONDITION_READY, "True", c.REASON_SCALED_TO_ZERO, "pairs.replicas is 0", now, gen
        )
    elif len(ready) >= replicas:
        conditions = c.set_condition(
            conditions,
            c.CONDITION_READY,
            "True",
            c.REASON_ALL_PAIRS_READY,
            f"{len(ready)}/{replicas} pairs ready",
            now,
            gen,
        )
    else:
        floor = max(0, replicas - spec.rollout.max_unavailable)
        reason = c.REASON_BELOW_FLOOR if len(ready) < floor else c.REASON_PAIRS_NOT_READY
        conditions = c.set_condition(
            conditions, c.CONDITION_READY, "False", reason, f"{len(ready)}/{replicas} pairs ready", now, gen
        )

    rollout_active = decision.status.phase in ("Progressing", "Paused", "RollingBack")
    if rollout_active:
        conditions = c.set_condition(
            conditions,
            c.CONDITION_PROGRESSING,
            "True",
            decision.progressing_reason,
            decision.status.message or f"step {decision.status.step}",
            now,
            gen,
        )
    elif (
        actions.creates
        or actions.deletes
        or actions.new_drains
        or len(live) != replicas
        or len(ready) < replicas
        or draining
    ):
        conditions = c.set_condition(
            conditions,
            c.CONDITION_PROGRESSING,
            "True",
            c.REASON_SCALING,
            f"{len(ready)}/{replicas} pairs ready, {len(draining)} draining" + _off_shape_note(reshape, actions),
            now,
            gen,
        )
    else:
        reason = c.REASON_ROLLED_BACK if decision.status.phase == "RolledBack" else c.REASON_STEADY
        message = decision.status.message if decision.status.phase == "RolledBack" else "pool at its declared size"
        message += _off_shape_note(reshape, actions)
        conditions = c.set_condition(conditions, c.CONDITION_PROGRESSING, "False", reason, message, now, gen)

    problems: list[tuple[str, str]] = []
    unbound = sum(1 for p in snapshot.pods if p.node is None and not p.deleting)
    if actions.insufficient_gpu or unbound:
        waiting = max(actions.insufficient_gpu, unbound)
        problems.append(
            (
                c.REASON_INSUFFICIENT_GPU,
                f"{waiting} pair(s) or instance(s) waiting for free {spec.placement.gpu_resource}",
            )
        )
    held = actions.missing_snapshot & actions.held
    if held:
        problems.append(
            (
                c.REASON_SNAPSHOT_TAMPERED,
                f"revision(s) {', '.join(sorted(held))} held: their snapshot is not trusted (see UntrustedInput); "
                "their pods are not recreated",
            )
        )
    if actions.missing_snapshot - held:
        problems.append(
            (
                c.REASON_REVISION_MISSING,
                f"no snapshot for revision(s) {', '.join(sorted(actions.missing_snapshot - held))}: "
                "their pods cannot be recreated",
            )
        )
    crash = [p.name for p in snapshot.pods if p.crash_looping]
    if crash:
        problems.append((c.REASON_CRASH_LOOPING, f"{len(crash)} instance(s) crash-looping, e.g. {crash[0]}"))
    incomplete = [
        p.id for p in actions.pairs if p.live and p.pods and not p.complete and p.index not in actions.deleted_pairs
    ]
    if incomplete:
        problems.append((c.REASON_PAIR_INCOMPLETE, f"{len(incomplete)} pair(s) incomplete, e.g. {incomplete[0]}"))
    if problems:
        conditions = c.set_condition(
            conditions, c.CONDITION_DEGRADED, "True", problems[0][0], "; ".join(m for _, m in problems), now, gen
        )
    else:
        conditions = c.set_condition(
            conditions, c.CONDITION_DEGRADED, "False", c.REASON_HEALTHY, "no problems observed", now, gen
        )

    if spec.kv_cache.mooncake_ref is not None:
        if snapshot.cache_problem:
            conditions = c.set_condition(
                conditions,
                c.CONDITION_KV_CACHE_DEGRADED,
                "True",
                c.REASON_CACHE_DEGRADED,
                snapshot.cache_problem + "; serving from local prefix caches",
                now,
                gen,
            )
        else:
            conditions = c.set_condition(
                conditions,
                c.CONDITION_KV_CACHE_DEGRADED,
                "False",
                c.REASON_CACHE_OK,
                f"MooncakeCache {spec.kv_cache.mooncake_ref.name} healthy",
                now,
                gen,
            )
    else:
        conditions = [cond for cond in conditions if cond.type != c.CONDITION_KV_CACHE_DEGRADED]

    updated = sum(1 for p in ready if p.revision == desired_rev)
    return old.model_copy(
        update={
            "observed_generation": generation,
            "conditions": conditions,
            "replicas": len(live),
            "selector": selector_string(pool_selector(pool.metadata.name)),
            "pairs": PairCounts(
                desired=replicas,
                current=len(live),
                ready=len(ready),
                updated=updated,
                draining=len(draining),
                pending=pending_pods,
                off_shape=off_shape(
                    [p for p in actions.pairs if p.index not in actions.deleted_pairs | actions.new_drains.keys()],
                    decision.stable,
                    actions.target_shape,
                ),
                summary=f"{len(ready)}/{replicas}",
            ),
            "revisions": RevisionsStatus(stable=rev_status(decision.stable), canary=rev_status(decision.canary)),
            "rollout": decision.status,
            "routing": RoutingTableStatus(
                config_map=routing_configmap_name(pool.metadata.name),
                fingerprint=table.fingerprint()[:16],
                serving_pairs=len(ready),
            ),
        }
    )
