"""The controller benchmark's pure arithmetic: statistics, API-write tallies, the operator's /metrics.

What it owns: everything ``tandem bench controller`` computes from what it recorded (audit events,
timings, scraped metric text), with no I/O, so it is unit-tested on its own (tests/unit/dev). The
script that records (``benchctl``) and the report (``benchreport``) import from here.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from tandem import GROUP
from tandem_lab.dev import audit

PLURAL = "inferencepools"
CATEGORY_OPERATOR = "operator"
CATEGORY_FRAMEWORK = "framework"
CATEGORY_EVENTS = "events"
CATEGORIES: tuple[str, ...] = (CATEGORY_OPERATOR, CATEGORY_FRAMEWORK, CATEGORY_EVENTS)
SECTIONS: tuple[str, ...] = ("c1", "c2", "c4", "c6")

# benchmarks.md §7 targets the report checks against.
TARGET_C1_RATIO_AT_95 = 1.5
TARGET_C2_ADD_PAIR_CREATE_PASS = 3
TARGET_C2_ADD_PAIR_READY_PASS = 2
TARGET_C4_RSS_MIB_AT_1K = 150.0
TARGET_C6_TOTAL_S = 90.0


# --- pure: statistics ---------------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repeated measurements: ``{n, median, min, max, spread}`` (spread = max − min).

    Worked example: ``[8.0, 9.1, 8.5]`` → median 8.5, min 8.0, max 9.1, spread 1.1 (rounded to 4 places).
    With fewer than three repeats the median is the mean of what there is, and the spread says so.
    """
    if not values:
        raise ValueError("summarize needs at least one value")
    ordered = sorted(float(v) for v in values)
    return {
        "n": float(len(ordered)),
        "median": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "spread": round(ordered[-1] - ordered[0], 4),
    }


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """A/B per repeat (arm A and arm B of repeat i ran back to back, so they share the machine's mood).

    Worked example: A = [8.5, 9.1, 8.0], B = [5.7, 6.0, 5.5] → [1.4912, 1.5167, 1.4545]; their median
    1.4912 is the reported ratio, min–max 1.4545–1.5167 its spread. The ratio of the medians
    (8.5 / 5.7 = 1.4912 here) is reported next to it.
    """
    if len(a) != len(b):
        raise ValueError(f"arms have {len(a)} and {len(b)} repeats")
    if any(v <= 0 for v in b):
        raise ValueError("arm B durations must be > 0")
    return [round(x / y, 4) for x, y in zip(a, b, strict=True)]


def ratio_summary(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """``summarize(paired_ratios(a, b))`` plus ``of_medians`` = median(A) / median(B)."""
    out = summarize(paired_ratios(a, b))
    out["of_medians"] = round(statistics.median(a) / statistics.median(b), 4)
    return out


# --- pure: API writes -----------------------------------------------------------------------------------


def classify_write(verb: str, resource: str) -> str:
    """Which account a write of the operator's identity belongs to.

    - ``events``: Events (core or events.k8s.io), whoever posts them (the operator's decisions, kopf);
    - ``framework``: writes to a Tandem object itself rather than its status (kopf's finalizer and
      annotation patches; the autoscaler's ``spec.pairs.replicas`` patch would land here too, but every
      benchmark pool runs with autoscaling off) and ``/finalizers`` updates;
    - ``operator``: everything else: pods, ConfigMaps, Services, Jobs, ``inferencepools/status``.

    >>> classify_write("patch", "inferencepools.tandem.dev"), classify_write("create", "pods")
    ('framework', 'operator')
    """
    base, _, sub = resource.partition("/")
    if base in ("events", "events.events.k8s.io"):
        return CATEGORY_EVENTS
    if base.endswith(f".{GROUP}") and sub in ("", "finalizers"):
        return CATEGORY_FRAMEWORK
    return CATEGORY_OPERATOR


def call_name(verb: str, resource: str) -> str:
    """``"create pods"``, ``"update inferencepools/status"``: a write's verb and resource, group dropped."""
    base, _, sub = resource.partition("/")
    base = base.split(".", 1)[0]
    return f"{verb} {base}" + (f"/{sub}" if sub else "")


def tally_writes(events: Iterable[audit.AuditEvent]) -> dict[str, dict[str, Any]]:
    """Writes per category: ``{category: {"total": n, "by_verb": {verb: n}, "by_call": {call: n}}}``.

    Worked example: two pod creates, a status update, kopf's finalizer patch and one Event give
    operator 3 (create 2, update 1), framework 1 (patch 1), events 1 (create 1).
    """
    out: dict[str, dict[str, Any]] = {}
    for category in CATEGORIES:
        out[category] = {"total": 0, "failed": 0, "by_verb": {}, "by_call": {}}
    for ev in events:
        if not ev.is_write:
            continue
        slot = out[classify_write(ev.verb, ev.resource)]
        slot["total"] += 1
        slot["failed"] += int(not ev.succeeded)
        slot["by_verb"][ev.verb] = slot["by_verb"].get(ev.verb, 0) + 1
        name = call_name(ev.verb, ev.resource)
        slot["by_call"][name] = slot["by_call"].get(name, 0) + 1
    for slot in out.values():
        slot["by_verb"] = dict(sorted(slot["by_verb"].items()))
        slot["by_call"] = dict(sorted(slot["by_call"].items()))
    return out


def total_writes(tally: Mapping[str, Mapping[str, Any]]) -> int:
    return sum(int(tally[c]["total"]) for c in CATEGORIES if c in tally)


def is_status_write(ev: audit.AuditEvent) -> bool:
    return ev.resource == f"{PLURAL}.{GROUP}/status" and ev.verb in ("update", "patch")


def split_passes(events: Sequence[audit.AuditEvent]) -> list[list[audit.AuditEvent]]:
    """The operator's writes cut into reconcile passes: a pass ends with its status write (step 4).

    A pass acts, then reports (Events, then status when it changed), so in time order every status
    write closes one pass; writes after the last status write form a final, open segment. This holds
    for passes without a persisted rollout step (``rollout_first`` writes status *first*), which is why
    it is used only for the create and +1 pair scenarios.

    Worked example (times in order): create pod, create pod, update status, patch routing ConfigMap,
    update status → [[pod, pod, status], [routing, status]].
    """
    passes: list[list[audit.AuditEvent]] = []
    current: list[audit.AuditEvent] = []
    for ev in sorted(events, key=lambda e: e.timestamp):
        current.append(ev)
        if is_status_write(ev):
            passes.append(current)
            current = []
    if current:
        passes.append(current)
    return passes


def split_create_and_ready(events: Sequence[audit.AuditEvent]) -> dict[str, list[audit.AuditEvent]]:
    """Passes up to the last one that creates pods ("create") and the passes after it ("ready").

    >>> split_create_and_ready([])
    {'create': [], 'ready': []}
    """
    passes = split_passes(events)
    last_create = -1
    for i, segment in enumerate(passes):
        if any(ev.verb == "create" and ev.resource == "pods" for ev in segment):
            last_create = i
    create = [ev for segment in passes[: last_create + 1] for ev in segment]
    ready = [ev for segment in passes[last_create + 1 :] for ev in segment]
    return {"create": create, "ready": ready}


def timeline(events: Sequence[audit.AuditEvent], since: datetime) -> list[str]:
    """``"+0.123s create pods speed-p2-prefill-0 201"`` lines: the evidence behind a count."""
    return [
        f"+{(ev.timestamp - since).total_seconds():.3f}s {call_name(ev.verb, ev.resource)} {ev.name} {ev.code}"
        for ev in sorted(events, key=lambda e: e.timestamp)
    ]


# --- pure: the operator's /metrics ---------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition → ``[(name, labels, value)]`` (comments and malformed lines skipped)."""
    out: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.append((m.group(1), labels, value))
    return out


def metric_sum(samples: Iterable[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """Sum of every series of ``name`` whose labels include ``labels``."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == want for k, want in labels.items()))


def api_writes(samples: Iterable[tuple[str, dict[str, str], float]]) -> dict[str, int]:
    """``tandem_api_writes_total`` as ``{"create Pod": n, ...}`` (the operator's own count, no kopf)."""
    out: dict[str, int] = {}
    for name, labels, value in samples:
        if name == "tandem_api_writes_total":
            out[f"{labels.get('verb', '')} {labels.get('resource', '')}"] = int(value)
    return out


def counter_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    keys = sorted(set(before) | set(after))
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) - before.get(k, 0)}
