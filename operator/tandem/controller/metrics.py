"""The operator's own Prometheus metrics (served on ``--metrics-port``).

Module-level objects because prometheus_client registers each name once per process; everything else the
process keeps lives in ``runtime.Runtime``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from tandem.adapters.kube import WRITES

RECONCILE_SECONDS = Histogram(
    "tandem_reconcile_duration_seconds",
    "Duration of one reconcile pass",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_TOTAL = Counter("tandem_reconcile_total", "Reconcile passes by result", ["kind", "result"])
DECISIONS = Counter("tandem_decisions_total", "Decisions (Events) by reason", ["kind", "reason"])
PAIRS_DESIRED = Gauge("tandem_pool_pairs_desired", "Desired pair groups", ["namespace", "pool"])
PAIRS_READY = Gauge("tandem_pool_pairs_ready", "Ready pair groups", ["namespace", "pool"])
CONDITION = Gauge(
    "tandem_pool_condition", "Pool conditions (1 for the current status)", ["namespace", "pool", "type", "status"]
)
ROLLOUT_STEP = Gauge("tandem_rollout_step", "Current rollout step index", ["namespace", "pool"])
ELECTION = Gauge("tandem_leader", "1 while this process leads (holds the operator Lease and may act)")
LEADERSHIP_LOST = Counter("tandem_leadership_lost_total", "Times this process stopped leading")
LAST_PASS = Gauge("tandem_last_reconcile_timestamp_seconds", "Unix time of the last finished reconcile pass")
STORES_DESIRED = Gauge("tandem_cache_stores_desired", "Placed Mooncake stores", ["namespace", "cache"])
STORES_READY = Gauge("tandem_cache_stores_ready", "Ready Mooncake stores", ["namespace", "cache"])
CAPACITY_BYTES = Gauge("tandem_cache_ready_capacity_bytes", "Capacity of Ready stores", ["namespace", "cache"])


class _WritesCollector:
    """Exposes the adapter's write counter (verb, resource) as tandem_api_writes_total."""

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "tandem_api_writes", "API writes by verb and resource", labels=["verb", "resource"]
        )
        for (verb, resource), value in sorted(WRITES.items()):
            family.add_metric([verb, resource], value)
        yield family


with contextlib.suppress(ValueError):
    REGISTRY.register(_WritesCollector())
