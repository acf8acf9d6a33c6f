"""The `InferencePool` status: what the operator observed and decided, in a shape people can read.

What it owns: the status schema only. Every field the operator writes is declared here (the strict
structural schema prunes anything undeclared, silently), bounded, and documented. Values are
derived by the pure planner in core/; this module holds no logic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from tandem.api.base import ApiModel, Text
from tandem.api.common import ConditionList

Name63 = Annotated[str, Field(max_length=63)]
Reason = Annotated[str, Field(max_length=128)]
Count = Annotated[int, Field(ge=0, le=100_000)]


class PairCounts(ApiModel):
    """Pair groups by state (a pair counts only when every one of its instances is in that state)."""

    desired: Count = 0
    """Pair groups the pool should have (spec.pairs.replicas)."""
    current: Count = 0
    """Pair groups that exist and are not draining, complete or not, any revision."""
    ready: Count = 0
    """Pair groups whose prefill and decode instances are all Ready."""
    updated: Count = 0
    """Pair groups on the revision being rolled out (equals ready stable pairs when idle)."""
    draining: Count = 0
    """Pair groups marked draining: no new requests, deleted after in-flight streams end."""
    pending: Count = 0
    """Instances waiting for GPUs (Pending pods)."""
    off_shape: Count = 0
    """Live pair groups of the stable revision built with another P:D than spec.pairs (they keep their shape
    after a P:D change and are replaced one at a time, surge first, while nothing else moves; with autoscaling,
    only while the mix needs over 15 % more instances than the pool's P:D would). The Progressing condition's
    message says which: replacing, waiting for room, or kept."""
    summary: Annotated[str, Field(max_length=32)] = "0/0"
    """Ready/desired, as printed by `kubectl get tpool`."""


class RevisionStatus(ApiModel):
    """One stack revision present in the pool."""

    name: Name63
    """Revision id: a short hash of spec.stack (and the pair shape it was first built with; a later P:D change
    alone keeps the revision), used in the `tandem.dev/revision` label."""
    version: Name63
    """spec.stack.version of this revision."""
    image: Annotated[str, Field(max_length=512)] = ""
    """Engine image of this revision."""
    digest: Annotated[str, Field(max_length=71)] = ""
    """`sha256:<hex>` of this revision's snapshot (ConfigMap `<pool>-rev-<revision>`, canonical JSON). Recorded by
    the operator; a snapshot that no longer matches is not used to create pods (`SnapshotTampered`)."""
    pairs: Count = 0
    """Pair groups of this revision."""
    ready_pairs: Count = 0
    """Ready pair groups of this revision."""
    weight_percent: Annotated[int, Field(ge=0, le=100)] = 0
    """Share of the pool's traffic the routing table gives this revision."""
    mirrored: bool = False
    """This revision's pairs get copies of requests and answer no user (a `setMirrorPairs` step)."""
    measured_load_seconds: Annotated[int, Field(ge=0, le=86_400)] | None = None
    """Measured model load time of this revision: seconds from a pair's instances being bound to their node to
    the last of them Ready (image pull, model load, warm-up), the median over the revision's pairs; first loads
    only (a restarted instance is not measured). Kept while no pair of the revision is measurable. Work
    planning uses it as its capacity lead time, at most `spec.autoscaling.capacityProfile.loadTime`."""


class RevisionsStatus(ApiModel):
    """Stable and canary revisions."""

    stable: RevisionStatus | None = None
    """The revision serving most traffic; the one a rollback returns to."""
    canary: RevisionStatus | None = None
    """The revision being rolled out, if any."""


class GateVerdict(ApiModel):
    """The latest verdict of one gate, with the numbers behind it (a verdict is never unexplained)."""

    name: Name63
    """Gate name (metric name, or `eval`)."""
    verdict: Literal["Success", "Failure", "NoData", "Error"]
    """Success, Failure, NoData (NaN, empty, stale, partial, multi-series, ±Inf) or Error (query failed)."""
    reason: Reason = ""
    """Why, for NoData and Error: Stale, Partial, InvalidQueryResult, InvalidQuery, MetricsUnavailable..."""
    value: Annotated[str, Field(max_length=64)] = ""
    """The canary's value as returned."""
    baseline: Annotated[str, Field(max_length=64)] = ""
    """The stable revision's value, when the condition used it."""
    condition: Annotated[str, Field(max_length=1024)] = ""
    """The condition that was evaluated."""
    query: Annotated[str, Field(max_length=4096)] = ""
    """The resolved query."""
    evaluated_at: datetime | None = None
    """When the sample was taken."""


class AnalysisProgress(ApiModel):
    """Progress of the current analysis step. Reset when a step starts (and after a restart the window starts fresh)."""

    success_streak: Count = 0
    """Consecutive evaluations in which every gate was a Success."""
    failures: Count = 0
    """Failed evaluations counted in this step against `analysis.failureLimit` (gates without their own limit)."""
    gate_failures: Annotated[dict[str, Count], Field(max_length=16)] = {}
    """Failed evaluations in this step of each gate with its own `failureLimit`, by gate name."""
    no_data_since: datetime | None = None
    """Start of the current run of NoData/Error verdicts."""
    last_evaluated_at: datetime | None = None
    """When gates were last evaluated."""
    eval_job: Annotated[str, Field(max_length=63)] = ""
    """Name of the eval Job of this step, if one runs."""


class RolloutStatus(ApiModel):
    """Where the rollout stands. Persisted before acting, so a restarted operator resumes the same step."""

    phase: Literal["Idle", "Progressing", "Paused", "RollingBack", "RolledBack", "Promoted"] = "Idle"
    """Idle (nothing to roll out), Progressing, Paused, RollingBack, RolledBack (failed revision parked until the spec
    changes) or Promoted (last rollout finished)."""
    revision: Name63 = ""
    """Revision being rolled out (or last rolled out)."""
    step_index: Annotated[int, Field(ge=0, le=20)] = 0
    """Index of the current step in spec.rollout.steps."""
    step_count: Annotated[int, Field(ge=0, le=20)] = 0
    """Number of steps."""
    step: Annotated[str, Field(max_length=32)] = "-"
    """Current step as printed by `kubectl get tpool`, e.g. `2/5` or `-`."""
    steps_hash: Annotated[str, Field(max_length=16)] = ""
    """Hash of the steps the rollout started with; a change restarts the rollout at step 0."""
    step_started_at: datetime | None = None
    """When the current step started (server time)."""
    progress_at: datetime | None = None
    """Last time the rollout made progress (for the progress deadline)."""
    analysis: AnalysisProgress = AnalysisProgress()
    """Progress of the current analysis step."""
    gates: Annotated[list[GateVerdict], Field(max_length=17)] = []
    """Latest verdict of each gate in this step."""
    message: Text = ""
    """What the rollout is doing or waiting for."""
    failed_revision: Name63 = ""
    """A revision that was rolled back; it is not retried until spec.stack changes."""
    handled_action: Annotated[str, Field(max_length=64)] = ""
    """Id of the last promote/abort request (annotation) already carried out."""


class VersionScore(ApiModel):
    """Measured quality of one stack version, so versions can be compared side by side."""

    version: Name63
    """spec.stack.version."""
    revision: Name63
    """Revision id."""
    ttft_p90_ms: float | None = None
    """Time to first token, p90, milliseconds."""
    ttft_p95_ms: float | None = None
    """Time to first token, p95, milliseconds."""
    tokens_per_second_per_user: float | None = None
    """Decode speed per user (1 / TPOT)."""
    error_rate_percent: float | None = None
    """Share of requests that ended in an error, percent."""
    local_kv_hit_percent: float | None = None
    """Prompt tokens served from the instance's own prefix cache, percent."""
    eval_score_percent: float | None = None
    """Latest eval score, percent."""
    updated_at: datetime | None = None
    """When these values were measured."""


class ScalingDecision(ApiModel):
    """The last scaling decision and the numbers behind it."""

    time: datetime
    """When it was decided."""
    from_pairs: Count
    """Pair groups before."""
    to_pairs: Count
    """Pair groups after (equal to fromPairs for a hold)."""
    reason: Reason
    """PascalCase reason, e.g. ScaleUpTTFT, HoldNoData, HoldStabilizing."""
    message: Text = ""
    """Human explanation."""
    metrics: Annotated[
        dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=64)]], Field(max_length=16)
    ] = {}
    """Metric values the decision used, by name."""


class RoutingTableStatus(ApiModel):
    """The routing table the operator publishes."""

    config_map: Name63 = ""
    """Name of the ConfigMap (`<pool>-routing`)."""
    fingerprint: Annotated[str, Field(max_length=64)] = ""
    """Fingerprint of the published table."""
    serving_pairs: Count = 0
    """Pairs marked serving in it."""


class InferencePoolStatus(ApiModel):
    """Observed state of an InferencePool."""

    observed_generation: Annotated[int, Field(ge=0)] = 0
    """The .metadata.generation this status describes."""
    conditions: ConditionList = []
    """Ready, Progressing, Degraded and, with a MooncakeCache, KVCacheDegraded (metav1.Condition shape)."""
    replicas: Count = 0
    """Pair groups that exist (scale subresource status)."""
    selector: Annotated[str, Field(max_length=512)] = ""
    """Label selector of the pool's pods (scale subresource, for HPA/KEDA)."""
    pairs: PairCounts = PairCounts()
    """Pair counts by state."""
    revisions: RevisionsStatus = RevisionsStatus()
    """Stable and canary revisions."""
    rollout: RolloutStatus = RolloutStatus()
    """Rollout progress and gate verdicts."""
    scorecard: Annotated[list[VersionScore], Field(max_length=10)] = []
    """Per-version scorecard, newest first."""
    last_scaling: ScalingDecision | None = None
    """Last scaling decision."""
    routing: RoutingTableStatus = RoutingTableStatus()
    """The published routing table."""
