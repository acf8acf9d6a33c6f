"""Mooncake traces: load exactly, spread 3-second ticks, scale to fleet rate by prefix-root multiplication.

What it owns: turning ``../shared/traces/*.jsonl`` (read-only data; never copied into the repository)
into :class:`~tandem_lab.sim.workload.Workload` columns, and the two trace transforms of benchmarks.md §2.1.

- :func:`load_trace`: one request per line (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids``); counts and token totals are kept exactly (a test checks them against the file).
- :func:`jitter_ticks`: the conversation trace's timestamps come in ~3 s ticks (~10 requests each);
  each request moves by a seeded uniform offset in [0, tick). Below 3 s its statistics are artefacts.
- :func:`multiply_prefix_roots`: k copies with disjoint ``hash_ids`` spaces (copy j adds
  ``j · 2**40``), each shifted by a seeded offset in [0, ``offset_s``) and re-jittered within ticks, so
  the rate grows k× while hit rates stay those of one copy (the AIPerf
  ``--synthesis-prefix-root-multiplier`` pattern).

Directory resolution (:func:`traces_dir`): env ``TANDEM_TRACES_DIR``, else ``<repo>/../shared/traces``,
else ``/work/shared/traces``. The environment is read only there, and only when no path is given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tandem_lab.sim.workload import BLOCK_TOKENS, COPY_ID_STRIDE, Workload

CONVERSATION = "mooncake_conversation_trace.jsonl"
SYNTHETIC = "mooncake_synthetic_trace.jsonl"
TICK_S = 3.0
TRACES_ENV = "TANDEM_TRACES_DIR"
FALLBACK_DIR = Path("/work/shared/traces")


def traces_dir() -> Path:
    """Where the shared traces live (see module docstring)."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    candidate = repo.parent / "shared" / "traces"
    if candidate.is_dir():
        return candidate
    return FALLBACK_DIR


def trace_path(name: str, directory: Path | None = None) -> Path:
    path = (directory or traces_dir()) / name
    if not path.exists():
        raise FileNotFoundError(f"trace not found: {path} (set {TRACES_ENV})")
    return path


def load_trace(path: Path, name: str | None = None) -> Workload:
    """Read a Mooncake trace file as-is (arrival = timestamp / 1000; stable order of equal timestamps)."""
    ts: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    starts: list[int] = []
    counts: list[int] = []
    flat: list[int] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row["hash_ids"]
            if len(ids) != -(-int(row["input_length"]) // BLOCK_TOKENS):
                raise ValueError(f"{path}: hash_ids length does not match input_length at line {len(ts) + 1}")
            ts.append(int(row["timestamp"]))
            inp.append(int(row["input_length"]))
            out.append(int(row["output_length"]))
            starts.append(len(flat))
            counts.append(len(ids))
            flat.extend(int(x) for x in ids)
    n = len(ts)
    arrival = np.asarray(ts, dtype=np.float64) / 1000.0
    order = np.argsort(arrival, kind="stable")
    blocks = np.asarray(flat, dtype=np.int64)
    if len(blocks) and int(blocks.max()) >= COPY_ID_STRIDE:
        raise ValueError("hash ids exceed the copy stride")
    return Workload(
        name=name or path.stem,
        arrival_s=arrival[order],
        input_tokens=np.asarray(inp, dtype=np.int64)[order],
        output_tokens=np.asarray(out, dtype=np.int64)[order],
        block_start=np.asarray(starts, dtype=np.int64)[order],
        block_count=np.asarray(counts, dtype=np.int64)[order],
        tail_id=np.full(n, -1, dtype=np.int64),
        id_offset=np.zeros(n, dtype=np.int64),
        blocks=blocks,
        duration_s=float(arrival.max()) + TICK_S if n else 0.0,
        meta={"source": str(path.name)},
    )


def jitter_ticks(workload: Workload, rng: np.random.Generator, tick_s: float = TICK_S) -> Workload:
    """Spread each request uniformly within its tick: t + U[0, tick)."""
    moved = workload.arrival_s + rng.uniform(0.0, tick_s, size=len(workload))
    return workload.with_arrivals(moved)


def multiply_prefix_roots(
    workload: Workload,
    k: int,
    rng: np.random.Generator,
    offset_s: float = TICK_S,
    tick_s: float = TICK_S,
    decorrelate: bool = False,
) -> Workload:
    """``k`` interleaved copies with disjoint id spaces (see module docstring). ``k = 1`` only jitters.

    ``decorrelate``: each copy is shifted by its own uniform offset in [0, span) and wrapped around the
    trace's span (a circular shift), so the copies of one burst land at independent times instead of
    stacking k× at the same instant (the default offsets are below one tick). Rate and mix are unchanged.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    n = len(workload)
    span = workload.duration_s
    offsets = rng.uniform(0.0, span if decorrelate and span > 0 else offset_s, size=k)
    jitter = rng.uniform(0.0, tick_s, size=(k, n))
    arrival = (workload.arrival_s[None, :] + offsets[:, None] + jitter).reshape(-1)
    if decorrelate and span > 0:
        arrival = np.mod(arrival, span)
    copy = np.repeat(np.arange(k, dtype=np.int64), n)
    tiled = Workload(
        name=f"{workload.name}x{k}",
        arrival_s=np.sort(arrival),  # placeholder order; with_arrivals re-sorts the real columns below
        input_tokens=np.tile(workload.input_tokens, k),
        output_tokens=np.tile(workload.output_tokens, k),
        block_start=np.tile(workload.block_start, k),
        block_count=np.tile(workload.block_count, k),
        tail_id=np.tile(workload.tail_id, k),
        id_offset=np.tile(workload.id_offset, k) + copy * COPY_ID_STRIDE,
        blocks=workload.blocks,
        prefix_key=None,
        session=None,
        duration_s=span if decorrelate and span > 0 else workload.duration_s + offset_s + tick_s,
        meta={**workload.meta, "copies": k, "decorrelated": decorrelate},
    )
    return tiled.with_arrivals(arrival)
