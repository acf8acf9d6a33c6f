"""Kubernetes Event reasons: the names users' alerts and dashboards match on.

What it owns: the reason of every Event the operator posts that is not also a status-condition reason
(those stay with their vocabulary: `tandem.core.conditions`, the gate verdicts in `tandem.core.gates`,
the autoscaler's in `tandem.core.autoscale`, the cache's in `tandem.core.mooncake`). An Event that
reports a condition flip reuses that condition's constant, so one word never has two spellings.

Invariants: every value is CamelCase (the Kubernetes convention for `reason`) and never changes once
released: a renamed reason silently breaks every alert written against it. Add new names; never edit
old ones. tests/unit/core/test_reasons.py checks both, and that no product code builds an Event or a
condition with a literal reason.
"""

from __future__ import annotations

from typing import Final

# Rollout (tandem.core.rollout): user requests.
REASON_ABORT_REQUESTED: Final = "AbortRequested"
REASON_ABORT_IGNORED: Final = "AbortIgnored"
"""An abort annotation arrived with no rollout in progress: a no-op, said out loud (DP-08)."""
REASON_PROMOTE_REQUESTED: Final = "PromoteRequested"
REASON_ROLL_FORWARD: Final = "RollForward"
"""A full promotion skipped every remaining gate (the audited override of DP-08)."""
REASON_ROLLOUT_RESUMED: Final = "RolloutResumed"
# Rollout: the state machine's own transitions.
REASON_ROLLOUT_STARTED: Final = "RolloutStarted"
REASON_ROLLOUT_CANCELLED: Final = "RolloutCancelled"
"""The spec went back to the stable revision mid-rollout: the canary is dropped, nothing rolls back."""
REASON_STEP_COMPLETED: Final = "StepCompleted"
REASON_ANALYSIS_PASSED: Final = "AnalysisPassed"
REASON_ANALYSIS_NO_DATA: Final = "AnalysisNoData"
"""Analysis had no usable data until `noDataDeadline`: paused, or rolled back with `onNoData: Rollback`."""
REASON_GATE_FAILED: Final = "GateFailed"

# Pairs (tandem.core.plan).
REASON_PAIRS_CREATED: Final = "PairsCreated"
REASON_RESHAPING: Final = "Reshaping"
"""A pair group off the pool's P:D is being replaced, surge first (``tandem.core.reshape``)."""
REASON_PAIRS_DRAINING: Final = "PairsDraining"

# Mooncake cache (tandem.core.mooncake).
REASON_STORE_PLACED: Final = "StorePlaced"
REASON_STORE_REMOVED: Final = "StoreRemoved"
REASON_STORE_REPLACED: Final = "StoreReplaced"
REASON_DELETION_BLOCKED: Final = "DeletionBlocked"
"""A cache deletion waits: pools still reference it and the confirm annotation is absent."""
REASON_DELETION_RELEASED: Final = "DeletionReleased"
