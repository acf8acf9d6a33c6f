"""Status conditions: types, reasons, and the one rule for updating them.

What it owns: the condition vocabulary (`CONDITION_*`, `REASON_*`) and `set_condition`, which keeps
`lastTransitionTime` unchanged unless the status flips (metav1.Condition semantics), so a pass that
re-derives the same conditions produces an identical status and therefore zero writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, Literal

from tandem.api.common import Condition

CONDITION_READY: Final = "Ready"
CONDITION_PROGRESSING: Final = "Progressing"
CONDITION_DEGRADED: Final = "Degraded"
CONDITION_KV_CACHE_DEGRADED: Final = "KVCacheDegraded"
CONDITION_METRICS_AVAILABLE: Final = "MetricsAvailable"
CONDITION_UNTRUSTED_INPUT: Final = "UntrustedInput"
"""True while the operator ignores or refuses something it did not write or may not trust (tandem.core.integrity)."""

# Ready
REASON_ALL_PAIRS_READY: Final = "AllPairsReady"
REASON_PAIRS_NOT_READY: Final = "PairsNotReady"
REASON_BELOW_FLOOR: Final = "BelowCapacityFloor"
REASON_SCALED_TO_ZERO: Final = "ScaledToZero"
# Progressing
REASON_STEADY: Final = "Steady"
REASON_SCALING: Final = "Scaling"
REASON_ROLLOUT_IN_PROGRESS: Final = "RolloutInProgress"
REASON_CANARY_CAPACITY_FIRST: Final = "CanaryCapacityFirst"
"""A rollout step whose canary pairs do not fit beside stable (no surge room): they replace stable pairs."""
REASON_ROLLOUT_PAUSED: Final = "RolloutPaused"
REASON_ROLLOUT_RESTARTED: Final = "RolloutRestarted"
REASON_ROLLING_BACK: Final = "RollingBack"
REASON_ROLLED_BACK: Final = "RolledBack"
REASON_PROMOTED: Final = "Promoted"
REASON_PROGRESS_DEADLINE: Final = "ProgressDeadlineExceeded"
# Degraded
REASON_HEALTHY: Final = "Healthy"
REASON_INSUFFICIENT_GPU: Final = "InsufficientGPU"
REASON_QUOTA_EXCEEDED: Final = "QuotaExceeded"
REASON_PAIR_INCOMPLETE: Final = "PairIncomplete"
REASON_CRASH_LOOPING: Final = "CrashLooping"
REASON_ADMISSION_BLOCKED: Final = "AdmissionBlocked"
REASON_REVISION_MISSING: Final = "RevisionSnapshotMissing"
REASON_API_ERROR: Final = "APIError"
REASON_RECONCILE_ERROR: Final = "ReconcileError"
# UntrustedInput (tandem.core.integrity)
REASON_FOREIGN_PODS_IGNORED: Final = "ForeignPodsIgnored"
REASON_DRAIN_RECORD_REJECTED: Final = "DrainRecordRejected"
REASON_SNAPSHOT_TAMPERED: Final = "SnapshotTampered"
REASON_IMAGE_NOT_ALLOWED: Final = "ImageNotAllowed"
REASON_PROMETHEUS_CREDENTIALS_WITHHELD: Final = "PrometheusCredentialsWithheld"
REASON_NO_UNTRUSTED_INPUT: Final = "NoUntrustedInput"
# KV cache
REASON_CACHE_OK: Final = "CacheHealthy"
REASON_NO_CACHE: Final = "NoCacheReferenced"
REASON_CACHE_NOT_FOUND: Final = "CacheNotFound"
REASON_CACHE_DEGRADED: Final = "CacheDegraded"

MAX_MESSAGE = 1024

Status = Literal["True", "False", "Unknown"]


def find(conditions: Sequence[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def set_condition(
    conditions: Sequence[Condition],
    kind: str,
    status: Status,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[Condition]:
    """Return ``conditions`` with ``kind`` set; ``lastTransitionTime`` moves only when status flips."""
    message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"
    old = find(conditions, kind)
    when = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != kind]
    out.append(new)
    order = {CONDITION_READY: 0, CONDITION_PROGRESSING: 1, CONDITION_DEGRADED: 2}
    return sorted(out, key=lambda c: (order.get(c.type, 9), c.type))
