"""Model load time measured per revision from the pool's own pods: the autoscaler's capacity lead time.

What it owns: the pure computation over timestamps the reconcile observed on its pods (``PodScheduled`` and
``Ready`` lastTransitionTime, parsed in :mod:`tandem.core.observed`); adapters only read the pods.

Definition. An instance's load time is ``Ready − PodScheduled``: from the bind to its node (GPUs held) to the
engine answering its readiness probe; image pull, model load and warm-up are inside it. Waiting for free GPUs
before the bind is left out: that is capacity, which the autoscaler already bounds with its placeable count.
A pair serves only once all its instances are Ready, so a pair's load time is its slowest instance's. The
revision's load time is the median over its measurable pairs (the lower one of an even count; robust to one
pair on a cold node), in whole seconds rounded up. Worked example: pairs of (95 s, 102 s), (110 s, 98 s)
and (300 s, 97 s) load in 102, 110 and 300 s; the revision's load time is 110 s.

Only first loads are measured: an instance that restarted has a later Ready transition than its load, and
one that is not Ready (or being deleted) has none. A pair with any such instance, a missing instance or
instances of another revision is not measurable.

Must not: read the clock or the API (everything is in the observed pods).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import median_low
from typing import Final

from tandem.core.observed import ObservedPod
from tandem.core.pairs import PairView

MAX_LOAD_SECONDS: Final = 86_400
"""The status field's bound: a day. A longer "load" is a pod stuck unready, reported as a day (the declared
load time bounds what planning uses anyway)."""


def instance_load_seconds(pod: ObservedPod) -> float | None:
    """Seconds from bind to Ready of one first load, or None when the pod does not show one."""
    if pod.deleting or not pod.ready or pod.restarts or pod.scheduled_at is None or pod.ready_at is None:
        return None
    seconds = (pod.ready_at - pod.scheduled_at).total_seconds()
    return seconds if seconds >= 0 else None


def pair_load_seconds(pair: PairView) -> float | None:
    """The slowest instance's load time of a complete pair whose every instance shows a first load."""
    if not pair.complete:
        return None
    loads = []
    for role, index in pair.expected:
        pod = pair.pod(role, index)
        load = None if pod is None else instance_load_seconds(pod)
        if load is None:
            return None
        loads.append(load)
    return max(loads, default=None)


def measure_load_seconds(pairs: Iterable[PairView], revision: str) -> int | None:
    """The revision's measured load time (module docstring), or None when none of its pairs is measurable."""
    loads = [load for p in pairs if p.revision == revision and (load := pair_load_seconds(p)) is not None]
    if not loads:
        return None
    return min(MAX_LOAD_SECONDS, math.ceil(median_low(loads) - 1e-9))
