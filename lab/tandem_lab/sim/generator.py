"""Seeded agentic-session generator (benchmarks.md §2.2): sessions of chained LLM calls, open loop.

What it owns: turning :class:`~tandem_lab.sim.config.GeneratorParams` and a seed into a
:class:`~tandem_lab.sim.workload.Workload` in the trace schema of §2.1 plus ``session`` and ``prefix_key``,
and :func:`summarize_generated`, the statistics the calibration tests compare with the published
targets (TraceLab for Claude Code / Codex, the GitHub Copilot coding-agent dataset).

Session model (per profile; parameters are *start* values fitted by ``tests/sim``):

- A session belongs to a **system-prompt family** (a long shared prefix, as with coding tools), so
  the first blocks of every request of a family are equal: the shared-first-block hazard of §2.1
  exists in generated traffic too.
- It is a chain of user requests (mean ``user_requests_per_session``, 1 + geometric), each made of
  LLM calls ("steps", mean ``steps_per_request``, 1 + geometric) separated by tool gaps; requests are
  separated by human idle gaps (log-normal gaps, *start*: tool median 2 s, idle median 60 s).
- Step k's prompt = step k−1's prompt + its output + an append (first message, user text or tool
  result; log-normal, heavy-tailed), so step k−1's full blocks are step k's prefix. The last partial
  block of a prompt is unique to that request (its content changes when the prompt grows).
- When the context would exceed the session's compaction size (log-normal per session), the agent
  compacts: the new context is the system prompt + a summary (+ ``compaction_keep`` of the old
  conversation re-sent), all in new blocks — the chain breaks and the router key changes.
- Open loop: step k+1 arrives at t_k + ``assumed_ttft_s`` + output_k × ``slo.tpot_s`` + gap.
- ``prefix_key`` models the hash of the first N prompt characters as (family id, first user message
  of the segment): stable for a conversation, shared by nobody else.

Requests follow λ(t) = λ_peak · w(day) · [f + (1 − f)·((1 + cos(2π(h − h_peak)/24))/2)^k] (w = 1 on
weekdays, ``weekend_factor`` on Saturday and Sunday; the week starts Monday 00:00). Sessions last from
minutes to hours, so starting them at λ(t)/E[steps] would smear and delay the envelope (badly so
when it is compressed): session starts follow s(t), the Richardson–Lucy deconvolution of λ by the
mean request profile of a session (estimated from 3,000 sampled sessions on a 60 s grid), by
thinning a Poisson process (or a Gamma renewal process for CV > 1), from ``warmup_s`` before t = 0
so the run opens in steady state; requests before 0 or after the horizon are dropped. With
``compress`` > 1 the envelope (not the gaps) runs ``compress`` times faster. Worked example: f = 0.1, k = 4 →
weekday mean/peak = 0.1 + 0.9·C(8,4)/2⁸ = 0.346 (peak/mean 2.89); week 0.346·(5 + 2/4.5)/7 = 0.269
(3.71), so λ_peak = 550 req/s gives 148 req/s on average.

Must not: read files or the clock; all randomness comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tandem.routing import routing_key
from tandem_lab.sim.config import GeneratorParams, LogNormal, ProfileParams
from tandem_lab.sim.workload import Workload, infinite_cache_hits

DAY_S = 86_400.0
WEEK_DAYS = 7
TAIL_BASE = 1 << 52
"""Ids of partial last blocks start here (never equal to a full block id)."""
FAMILY_BASE = 1 << 50
"""Family (system prompt) block ids start here; segment blocks count up from 0."""
FAMILY_STRIDE = 1 << 20


def rate_at(
    t_s: npt.NDArray[np.float64], gen: GeneratorParams, peak_rps: float, compress: float
) -> npt.NDArray[np.float64]:
    """λ(t) in requests/s at simulated times ``t_s`` (envelope time = t · compress)."""
    te = np.asarray(t_s, dtype=np.float64) * compress
    day = np.floor(te / DAY_S).astype(np.int64) % WEEK_DAYS
    hour = (te % DAY_S) / 3600.0
    w = np.where(day < 5, 1.0, gen.weekend_factor)
    shape = ((1.0 + np.cos(2.0 * np.pi * (hour - gen.peak_hour) / 24.0)) / 2.0) ** gen.exponent
    out: npt.NDArray[np.float64] = peak_rps * w * (gen.floor + (1.0 - gen.floor) * shape)
    return out


def mean_rate(gen: GeneratorParams, peak_rps: float, days: float) -> float:
    """Mean of λ over ``days`` envelope days starting Monday 00:00 (numerical, 60 s grid)."""
    t = np.arange(0.0, days * DAY_S, 60.0)
    return float(rate_at(t, gen, peak_rps, 1.0).mean())


def _lognormal(rng: np.random.Generator, d: LogNormal, size: int) -> npt.NDArray[np.float64]:
    return rng.lognormal(math.log(d.median), d.sigma, size=size)


def _one_plus_geometric(rng: np.random.Generator, mean: float, size: int) -> npt.NDArray[np.int64]:
    """1 + Geometric with the given mean (≥ 1); mean 1 gives all ones."""
    if mean <= 1.0:
        return np.ones(size, dtype=np.int64)
    p = 1.0 / mean
    out: npt.NDArray[np.int64] = rng.geometric(p, size=size).astype(np.int64)
    return out


@dataclass(frozen=True)
class GeneratorRun:
    """Knobs of one generation: envelope scale, horizon and compression."""

    days: float = 7.0
    peak_rps: float = 550.0
    compress: float = 1.0
    start_day: float = 0.0
    """Envelope day at t = 0 (0 = Monday 00:00)."""
    arrival_cv: float = 1.0
    """CV of session inter-arrival times before thinning: 1 = Poisson, > 1 = Gamma renewal (burstier)."""
    burst_at_s: float | None = None
    """If set: at this simulated time, ``burst_factor`` × the sessions then active start within ``burst_ramp_s``."""
    burst_ramp_s: float = 60.0
    burst_factor: float = 1.0
    max_context_tokens: int | None = None
    """The served model's context limit: a session compacts before a prompt + output would exceed it."""


DECONV_BIN_S = 60.0
KERNEL_SESSIONS = 3000


def _session_kernel(
    gen: GeneratorParams,
    profiles: list[ProfileParams],
    weights: npt.NDArray[np.float64],
    rng: np.random.Generator,
    bin_s: float,
    tpot_s: float,
) -> npt.NDArray[np.float64]:
    """Mean requests per session at each lag (bins of ``bin_s``) after its start, from a sample of sessions
    drawn with the same timing rules as :func:`generate` (gaps, outputs, steps)."""
    counts: dict[int, float] = {}
    choice = rng.choice(len(profiles), size=KERNEL_SESSIONS, p=weights)
    for pi in choice.tolist():
        p = profiles[pi]
        if p.user_requests_sigma > 0:
            median = p.user_requests_per_session * math.exp(-(p.user_requests_sigma**2) / 2)
            n_req = max(1, round(float(rng.lognormal(math.log(median), p.user_requests_sigma))))
        else:
            n_req = int(_one_plus_geometric(rng, p.user_requests_per_session, 1)[0])
        steps = _one_plus_geometric(rng, p.steps_per_request, n_req).tolist()
        n_steps = int(sum(steps))
        outputs = np.clip(_lognormal(rng, p.output_tokens, n_steps), 1.0, p.max_output_tokens).astype(np.int64).tolist()
        tool_gaps = _lognormal(rng, gen.tool_gap_s, n_steps).tolist()
        idle_gaps = _lognormal(rng, gen.idle_gap_s, n_req).tolist()
        t = 0.0
        step = 0
        for r in range(n_req):
            for k in range(steps[r]):
                if k == 0 and r > 0:
                    t += idle_gaps[r]
                elif k > 0:
                    t += tool_gaps[step]
                b = int(t // bin_s)
                counts[b] = counts.get(b, 0.0) + 1.0
                t += gen.assumed_ttft_s + outputs[step] * tpot_s
                step += 1
    kernel = np.zeros(max(counts) + 1 if counts else 1)
    for b, c in counts.items():
        kernel[b] = c / KERNEL_SESSIONS
    return kernel


def _deconvolve(
    target: npt.NDArray[np.float64], kernel: npt.NDArray[np.float64], iterations: int = 40
) -> npt.NDArray[np.float64]:
    """Session starts per bin x ≥ 0 with (x ∗ kernel) ≈ target (Richardson–Lucy deconvolution)."""
    n, k = len(target), len(kernel)
    total = float(kernel.sum())
    if n == 0 or total <= 0:
        return np.zeros(n)
    x = target / total
    flipped = kernel[::-1]
    for _ in range(iterations):
        forward = np.convolve(x, kernel)[:n]
        ratio = np.divide(target, forward, out=np.zeros(n), where=forward > 0)
        x = x * np.convolve(ratio, flipped)[k - 1 : k - 1 + n] / total
    out: npt.NDArray[np.float64] = x
    return out


def expected_steps(profile: ProfileParams) -> float:
    return max(1.0, profile.user_requests_per_session) * max(1.0, profile.steps_per_request)


def generate(
    gen: GeneratorParams, run: GeneratorRun, rng: np.random.Generator, tpot_s: float, name: str = "agentic"
) -> Workload:
    """Generate a workload (see module docstring)."""
    names = sorted(gen.profiles)
    profiles = [gen.profiles[n] for n in names]
    weights = np.array([p.weight for p in profiles], dtype=np.float64)
    weights = weights / weights.sum()
    duration = run.days * DAY_S / run.compress
    t0 = -gen.warmup_s
    start_offset = run.start_day * DAY_S / run.compress

    # 1. Session starts: thinning of a Poisson (or Gamma renewal) process whose rate s(t) makes the
    #    *request* rate follow λ(t): s = λ deconvolved by the mean request profile of a session.
    bin_s = DECONV_BIN_S
    grid = np.arange(t0, duration, bin_s)
    target = rate_at(grid + bin_s / 2 + start_offset, gen, run.peak_rps, run.compress) * bin_s
    kernel = _session_kernel(gen, profiles, weights, rng.spawn(1)[0], bin_s, tpot_s)
    per_bin = _deconvolve(target, kernel)
    s_max = float(per_bin.max()) / bin_s if len(per_bin) else 0.0
    if run.arrival_cv == 1.0:
        n_cand = rng.poisson(s_max * (duration - t0))
        cand = np.sort(rng.uniform(t0, duration, size=n_cand))
    else:
        shape = 1.0 / (run.arrival_cv**2)
        expected = s_max * (duration - t0)
        gaps = rng.gamma(shape, 1.0 / (shape * s_max), size=int(expected * 1.2 + 10 * math.sqrt(expected) + 100))
        cand = t0 + np.cumsum(gaps)
        cand = cand[cand < duration]
        n_cand = len(cand)
    idx = np.clip(((cand - t0) // bin_s).astype(np.int64), 0, len(per_bin) - 1)
    accept = rng.uniform(0.0, 1.0, size=n_cand) * s_max < per_bin[idx] / bin_s
    starts: list[float] = cand[accept].tolist()
    n_sessions = len(starts)
    profile_of: list[int] = rng.choice(len(profiles), size=n_sessions, p=weights).tolist()

    # 2. Families: system prompt length fixed per family.
    family_tokens: list[list[int]] = []
    for p in profiles:
        family_tokens.append([int(x) for x in _lognormal(rng, p.system_prompt_tokens, p.families)])
    family_index = [int(rng.integers(0, profiles[pi].families)) for pi in profile_of]
    family_offsets = np.cumsum([0] + [p.families for p in profiles])

    bt = gen.block_tokens
    out_t: list[float] = []
    out_in: list[int] = []
    out_out: list[int] = []
    out_bstart: list[int] = []
    out_bcount: list[int] = []
    out_tail: list[int] = []
    out_key: list[int] = []
    out_session: list[int] = []
    out_segment: list[int] = []
    out_family: list[int] = []
    out_family_blocks: list[int] = []
    regions: list[npt.NDArray[np.int64]] = []
    region_base = 0  # offset of the next region in the flat block array
    next_block_id = 0  # segment-unique block ids
    next_tail = TAIL_BASE
    session_user_requests: list[int] = []
    session_steps: list[int] = []
    session_end: list[float] = []
    segment_id = 0
    burst_pending = run.burst_at_s is not None

    s = -1
    while True:
        s += 1
        if s == len(starts) and burst_pending:
            # 3. Burst: as many new sessions as are active at t_b (× factor), all starting within the ramp.
            burst_pending = False
            tb = float(run.burst_at_s)  # type: ignore[arg-type]
            active = sum(1 for a, b in zip(starts, session_end, strict=True) if a <= tb < b)
            extra = round(run.burst_factor * active)
            starts.extend(sorted(rng.uniform(tb, tb + run.burst_ramp_s, size=extra).tolist()))
            new_profiles = rng.choice(len(profiles), size=extra, p=weights).tolist()
            profile_of.extend(new_profiles)
            family_index.extend(int(rng.integers(0, profiles[pi].families)) for pi in new_profiles)
        if s >= len(starts):
            break
        pi = int(profile_of[s])
        p = profiles[pi]
        fam_global = int(family_offsets[pi]) + family_index[s]
        sys_tokens = family_tokens[pi][family_index[s]]
        fam_blocks = sys_tokens // bt
        if p.user_requests_sigma > 0:
            median = p.user_requests_per_session * math.exp(-(p.user_requests_sigma**2) / 2)
            n_req = max(1, round(float(rng.lognormal(math.log(median), p.user_requests_sigma))))
        else:
            n_req = int(_one_plus_geometric(rng, p.user_requests_per_session, 1)[0])
        session_user_requests.append(n_req)
        steps_per = _one_plus_geometric(rng, p.steps_per_request, n_req).tolist()
        n_steps = int(sum(steps_per))
        session_steps.append(n_steps)
        outputs = np.clip(_lognormal(rng, p.output_tokens, n_steps), 1.0, p.max_output_tokens).astype(np.int64).tolist()
        cap = p.max_append_tokens
        scale = math.exp(rng.normal(0.0, p.tool_session_sigma)) if p.tool_session_sigma > 0 else 1.0
        tools = np.minimum(_lognormal(rng, p.tool_result_tokens, n_steps) * scale, cap).astype(np.int64).tolist()
        users = np.minimum(_lognormal(rng, p.user_message_tokens, n_req), cap).astype(np.int64).tolist()
        first = int(min(_lognormal(rng, p.first_message_tokens, 1)[0], cap))
        tool_gaps = _lognormal(rng, gen.tool_gap_s, n_steps).tolist()
        idle_gaps = _lognormal(rng, gen.idle_gap_s, n_req).tolist()
        compaction = float(_lognormal(rng, p.compaction_tokens, 1)[0])
        if run.max_context_tokens is not None:
            compaction = min(compaction, run.max_context_tokens - p.max_output_tokens)

        # Segments: (t, prompt, output) per step; a compaction starts a new segment (new blocks, new key).
        segments: list[list[tuple[float, int, int]]] = [[]]
        ctx = sys_tokens
        t = float(starts[s])
        step = 0
        for r in range(n_req):
            for k in range(steps_per[r]):
                if r == 0 and k == 0:
                    append = first
                elif k == 0:
                    t += idle_gaps[r]
                    append = users[r]
                else:
                    t += tool_gaps[step]
                    append = tools[step]
                if ctx + append > compaction and ctx > sys_tokens:
                    summary = int(_lognormal(rng, p.summary_tokens, 1)[0])
                    ctx = sys_tokens + summary + int(p.compaction_keep * (ctx - sys_tokens))
                    segments.append([])
                prompt = ctx + append
                out_tokens = outputs[step]
                segments[-1].append((t, prompt, out_tokens))
                ctx = prompt + out_tokens
                t += gen.assumed_ttft_s + out_tokens * tpot_s
                step += 1
        session_end.append(t)

        # Materialise each segment as one region: family blocks, then ids unique to the segment.
        for reqs in segments:
            if not reqs:
                continue
            longest = max(q[1] for q in reqs) // bt
            n_unique = max(0, longest - fam_blocks)
            region = np.empty(fam_blocks + n_unique, dtype=np.int64)
            region[:fam_blocks] = FAMILY_BASE + fam_global * FAMILY_STRIDE + np.arange(fam_blocks, dtype=np.int64)
            region[fam_blocks:] = next_block_id + np.arange(n_unique, dtype=np.int64)
            next_block_id += n_unique
            regions.append(region)
            key = routing_key(f"family-{fam_global}/first-message-{segment_id}")
            for tq, prompt, out_tokens in reqs:
                out_t.append(tq)
                out_in.append(prompt)
                out_out.append(out_tokens)
                out_bstart.append(region_base)
                out_bcount.append(prompt // bt)
                if prompt % bt:
                    out_tail.append(next_tail)
                    next_tail += 1
                else:
                    out_tail.append(-1)
                out_key.append(key)
                out_session.append(s)
                out_segment.append(segment_id)
                out_family.append(fam_global)
                out_family_blocks.append(fam_blocks)
            region_base += len(region)
            segment_id += 1

    arrival = np.asarray(out_t, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    order = order[(arrival[order] >= 0.0) & (arrival[order] < duration)]
    block_count = np.asarray(out_bcount, dtype=np.int64)[order]
    family = np.asarray(out_family, dtype=np.int64)[order]
    segment = np.asarray(out_segment, dtype=np.int64)[order]
    fam_blocks_arr = np.asarray(out_family_blocks, dtype=np.int64)[order]
    # Infinite-cache hit by construction, in arrival order: a segment's later steps find the previous
    # step's full blocks; its first kept step finds only the family's blocks, and only if an earlier kept
    # request of the family exists (requests before t = 0 are dropped and never reach a cache).
    n = len(order)
    prev_full = np.zeros(n, dtype=np.int64)
    first_of_segment = np.ones(n, dtype=bool)
    if n:
        by_segment = np.lexsort((np.arange(n), segment))
        same = segment[by_segment][1:] == segment[by_segment][:-1]
        later = by_segment[1:][same]
        prev_full[later] = block_count[by_segment[:-1][same]]
        first_of_segment[later] = False
    first_family_index = np.full(int(family_offsets[-1]) or 1, n, dtype=np.int64)
    if n:
        fams, idx = np.unique(family, return_index=True)
        first_family_index[fams] = idx
    family_seen = np.arange(n) > first_family_index[family] if n else np.zeros(0, dtype=bool)
    fam_hit = np.where(family_seen, fam_blocks_arr, 0)
    bound = np.minimum(block_count, np.where(first_of_segment, fam_hit, prev_full))
    return Workload(
        name=name,
        arrival_s=arrival[order],
        input_tokens=np.asarray(out_in, dtype=np.int64)[order],
        output_tokens=np.asarray(out_out, dtype=np.int64)[order],
        block_start=np.asarray(out_bstart, dtype=np.int64)[order],
        block_count=block_count,
        tail_id=np.asarray(out_tail, dtype=np.int64)[order],
        id_offset=np.zeros(n, dtype=np.int64),
        blocks=np.concatenate(regions) if regions else np.zeros(0, dtype=np.int64),
        prefix_key=np.asarray(out_key, dtype=np.uint64)[order],
        session=np.asarray(out_session, dtype=np.int64)[order],
        bound_hit_blocks=bound,
        duration_s=duration,
        meta={
            "profiles": names,
            "session_profile": np.asarray(profile_of, dtype=np.int64),
            "session_user_requests": np.asarray(session_user_requests, dtype=np.int64),
            "session_steps": np.asarray(session_steps, dtype=np.int64),
            "compress": run.compress,
            "peak_rps": run.peak_rps,
            "days": run.days,
        },
    )


def chained_bound(wl: Workload) -> npt.NDArray[np.int64]:
    """Leading blocks each request of a *generated* workload (or any row subset of one, in arrival order)
    finds in one infinite cache fed in arrival order — the §2.1 bound — without replaying the cache.

    It uses the generator's block layout: each segment is one region of the block array (its family's
    system-prompt blocks, then ids unique to the segment), and every request of the segment is a prefix of
    that region. So a request shares min(its blocks, the earlier request's blocks) with an earlier request
    of its region and exactly its family's blocks with an earlier request of another region of the same
    family; nothing else. Needed for pool subsets (the speed pool drops a session's prompts above its
    limit, so the by-construction bound of :func:`generate` no longer applies). Tested against a replay.
    """
    n = len(wl)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    count = wl.block_count.astype(np.int64)
    region = wl.block_start.astype(np.int64)
    # (1) earlier requests of the same region: running max of their block counts
    order = np.lexsort((np.arange(n), region))
    reg_sorted = region[order]
    cnt_sorted = count[order]
    new_group = np.concatenate(([True], reg_sorted[1:] != reg_sorted[:-1]))
    prev_max = np.zeros(n, dtype=np.int64)
    group_id = np.cumsum(new_group) - 1
    # cumulative max within each group, shifted by one (exclusive)
    offset = group_id.astype(np.int64) * (int(count.max()) + 1)
    cum = np.maximum.accumulate(cnt_sorted + offset) - offset
    excl = np.concatenate(([0], cum[:-1]))
    excl[new_group] = 0
    prev_max[order] = excl
    # (2) earlier requests of other regions of the same family share the family's blocks
    blocks = wl.blocks
    first = np.where(count > 0, blocks[np.minimum(region, max(len(blocks) - 1, 0))], -1) if len(blocks) else -np.ones(n)
    is_family = first >= FAMILY_BASE
    fam = np.where(is_family, (first - FAMILY_BASE) // FAMILY_STRIDE, -1).astype(np.int64)
    fam_ids = blocks[blocks >= FAMILY_BASE]
    fam_blocks_of = np.zeros(int(fam.max()) + 2 if is_family.any() else 1, dtype=np.int64)
    if len(fam_ids):
        f = (fam_ids - FAMILY_BASE) // FAMILY_STRIDE
        keep = f < len(fam_blocks_of)
        np.maximum.at(fam_blocks_of, f[keep], (fam_ids[keep] - FAMILY_BASE) % FAMILY_STRIDE + 1)
    seen = np.zeros(n, dtype=bool)
    if is_family.any():
        fidx = np.flatnonzero(is_family)
        _, first_idx = np.unique(fam[fidx], return_index=True)
        seen[fidx] = True
        seen[fidx[first_idx]] = False
    fam_hit = np.where(seen, fam_blocks_of[np.maximum(fam, 0)], 0)
    out = np.minimum(count, np.maximum(prev_max, fam_hit))
    return out


def check_bound_by_construction(wl: Workload) -> bool:
    """True when the generator's ``bound_hit_blocks`` equals an explicit infinite-cache replay (tests)."""
    fast = wl.bound_hit_blocks
    if fast is None:
        return False
    slow_wl = Workload(
        name=wl.name,
        arrival_s=wl.arrival_s,
        input_tokens=wl.input_tokens,
        output_tokens=wl.output_tokens,
        block_start=wl.block_start,
        block_count=wl.block_count,
        tail_id=wl.tail_id,
        id_offset=wl.id_offset,
        blocks=wl.blocks,
        duration_s=wl.duration_s,
    )
    slow, _ = infinite_cache_hits(slow_wl)
    return bool(np.array_equal(slow, fast))


def summarize_generated(wl: Workload, block_tokens: int = 512) -> dict[str, dict[str, float]]:
    """Emitted statistics per profile and overall, measured on the trace with one infinite cache:
    prefix = cached tokens, append = uncached tokens (prompt − prefix), output, cached share, prompt
    mean; steps and user requests per session as generated (sessions with a request inside the horizon)."""
    _, hit_tokens = infinite_cache_hits(wl, block_tokens)
    names = list(wl.meta.get("profiles", []))  # type: ignore[call-overload]
    session_profile = np.asarray(wl.meta.get("session_profile", np.zeros(0, dtype=np.int64)))
    session_user = np.asarray(wl.meta.get("session_user_requests", np.zeros(0, dtype=np.int64)))
    session_steps = np.asarray(wl.meta.get("session_steps", np.zeros(0, dtype=np.int64)))
    out: dict[str, dict[str, float]] = {}
    sessions = wl.session if wl.session is not None else np.zeros(len(wl), dtype=np.int64)
    req_profile = session_profile[sessions] if len(session_profile) else np.zeros(len(wl), dtype=np.int64)
    groups: list[tuple[str, npt.NDArray[np.bool_]]] = [("all", np.ones(len(wl), dtype=bool))]
    groups += [(n, req_profile == i) for i, n in enumerate(names)]
    for label, mask in groups:
        if not mask.any():
            continue
        inp = wl.input_tokens[mask].astype(np.float64)
        hit = hit_tokens[mask].astype(np.float64)
        outp = wl.output_tokens[mask].astype(np.float64)
        append = inp - hit
        sess = sessions[mask]
        uniq, counts = np.unique(sess, return_counts=True)
        stats = {
            "requests": float(mask.sum()),
            "prefix_p50": float(np.percentile(hit, 50)),
            "prefix_p99": float(np.percentile(hit, 99)),
            "prefix_mean": float(hit.mean()),
            "append_p50": float(np.percentile(append, 50)),
            "append_mean": float(append.mean()),
            "output_p50": float(np.percentile(outp, 50)),
            "output_mean": float(outp.mean()),
            "cached_share": float(hit.sum() / inp.sum()),
            "prompt_mean": float(inp.mean()),
            "steps_per_session": float(session_steps[uniq].mean()) if len(session_steps) else float(counts.mean()),
        }
        if len(session_user):
            stats["user_requests_per_session"] = float(session_user[uniq].mean())
        out[label] = stats
    return out
