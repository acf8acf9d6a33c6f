"""Micro-benchmark of the routing decision (issue 15 item 3): µs per ``plan_route`` / ``select_for_table``.

Not a test (no assertion on time): it prints a table. Run it against two checkouts to compare::

    PYTHONPATH=/path/to/checkout/operator python tools/routing_decision_bench.py

Cases per pool size (8/32/100/300 serving pairs, idle loads plus a few loaded pairs):

- ``plan_route unique``: every request a new prompt (the key-order cache never hits: the worst case).
- ``plan_route repeat``: 256 distinct prompts cycled (conversations and shared system prompts: the
  common case; hits the key-order cache where there is one).
- ``select unique``: :func:`tandem.routing.select_for_table` alone on new keys (no classification, no key hash).

Only APIs present before and after the change are used, so the same script measures both. Times are
process CPU time (``time.process_time``), so waiting for a core on a shared machine is not counted; the
median of the rounds is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tandem.routing import (
    Admission,
    Endpoint,
    Pair,
    PairLoad,
    PairState,
    RequestFeatures,
    Revisions,
    RoutingTable,
    plan_route,
    select_for_table,
)

SIZES = (8, 32, 100, 300)


def make_table(n: int) -> RoutingTable:
    pairs = tuple(
        Pair(
            id=f"speed-p{i}",
            index=i,
            revision="r1",
            state=PairState.SERVING,
            prefill=(Endpoint(pod=f"speed-p{i}-prefill-0", address=f"10.0.{i // 250}.{i % 250}:8000"),),
            decode=(Endpoint(pod=f"speed-p{i}-decode-0", address=f"10.1.{i // 250}.{i % 250}:8000"),),
        )
        for i in range(n)
    )
    return RoutingTable(
        pool="speed",
        namespace="ml",
        traffic_class="speed",
        admission=Admission(max_in_flight=64, max_queued=64),
        revisions=Revisions(stable="r1"),
        pairs=pairs,
    )


def per_call_us(fn, args_list, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """Median over ``repeat`` rounds of the mean µs per call over ``args_list``."""
    rounds = []
    for _ in range(repeat):
        t0 = time.process_time()
        for args in args_list:
            fn(*args)
        rounds.append((time.process_time() - t0) / len(args_list) * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    features = RequestFeatures(prompt_tokens=500)
    print("| pairs | plan_route unique (µs) | plan_route repeat (µs) | select unique (µs) |")
    print("|---:|---:|---:|---:|")
    for n in SIZES:
        table = make_table(n)
        tables = [table]
        loads = {f"speed-p{i}": PairLoad(in_flight=i % 5, queued=i % 2) for i in range(0, n, 3)}
        unique = [
            (tables, features, f"prompt {r} {i} " * 20, loads)
            for r in range(args.repeat + 1)
            for i in range(args.calls)
        ]
        repeat = [(tables, features, f"conversation {i % 256} " * 20, loads) for i in range(args.calls)]
        keys = [
            (table, (0x9E3779B97F4A7C15 * (i + 1)) & 0xFFFFFFFFFFFFFFFF, loads)
            for i in range(args.calls * (args.repeat + 1))
        ]
        # fresh keys per round so a key-order cache never hits in the "unique" columns
        u = _rounds(plan_route, unique, args.calls, args.repeat)
        r = per_call_us(plan_route, repeat, args.repeat)
        s = _rounds(select_for_table, keys, args.calls, args.repeat)
        print(f"| {n} | {u:.1f} | {r:.1f} | {s:.1f} |")


def _rounds(fn, items, calls: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn(*items[0])  # warm-up (compiles per-table state where there is some)
    out = []
    for k in range(repeat):
        chunk = items[(k + 1) * calls : (k + 2) * calls] or items[:calls]
        t0 = time.process_time()
        for a in chunk:
            fn(*a)
        out.append((time.process_time() - t0) / len(chunk) * 1e6)
    return statistics.median(out)


if __name__ == "__main__":
    main()
