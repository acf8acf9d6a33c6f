"""Capacity planning from work: the planning model the operator and the fleet simulator share.

What it owns (pure arithmetic, no I/O, no clock, no randomness):

- **SLO budgets** (:func:`ttft_budget`): a request's TTFT budget on its *total* prompt tokens, 1 s up to
  8,192 tokens, 3 s at 262,144, linear between (benchmarks.md §6); TPOT ≤ 16.7 ms (60 tok/s/user).
- **A capacity profile per stack version** (:class:`CapacityProfile`): what one instance of a role does
  at the SLO — prefill: uncached prompt tokens/s at a given prompt length (attention grows with the
  context, so tokens/s is only a unit at a stated length); decode: concurrent streams and tokens/s at the
  TPOT SLO for a given context. Declared in the pool spec (``spec.autoscaling.capacityProfile``) or
  derived by the simulator from its physics; a profile learned from the pool's own metrics is only ever
  used bounded by the declared one (:meth:`CapacityProfile.bounded_by`).
- **Demand from work, per role** (:class:`WorkDemand`): prefill = uncached prompt tokens/s, decode =
  concurrent streams and generated tokens/s.
- **Queue-model targets** (:func:`prefill_need`, :func:`decode_need`): the fewest instances whose
  *predicted attainment* meets the target. Prefill is an M/D/c queue (DistServe and Dynamo's SLA planner
  size prefill the same way); decode streams are an M/G/∞ population sized with square-root staffing.
- **A forecast over the capacity lead time** (:func:`update_forecast`): Holt's level + trend on the
  instance need, read ``lead_s`` ahead (capacity ordered now arrives after the measured load time), plus
  the peak need of the last ``lead_s``, which bounds scale-down: capacity released now cannot be back
  sooner than the lead time, so a need seen within it is kept.

Must not: import the simulator, Kubernetes or Prometheus code (import-linter); keep hidden state
(:class:`ForecastState` is returned and passed back in).

**M/D/c in one formula.** With offered load a = λ·S (instances' worth of prefill work; λ requests/s,
S seconds of mean service) on c instances, Erlang C gives P(wait > 0) = C(c, a); the M/M/c wait tail is
C·e^{−(c − a)t/S}. For deterministic service the mean wait is about half the M/M/c one (the Cosmetatos /
Allen–Cunneen correction with c_s² = 0), so we use P(W > t) ≈ C(c, a)·e^{−2(c − a)t/S}. A request meets
its TTFT when its wait ≤ slack = budget − S − overhead, so the predicted attainment is
1 − C(c, a)·e^{−2(c − a)·slack/S}. Worked example: λ = 4 req/s, S = 0.5 s (a = 2), budget 1.2 s,
overhead 0.1 s → slack 0.6 s; c = 3: C(3, 2) = 0.444, e^{−2·1·0.6/0.5} = 0.091 → 96.0 %; c = 4:
C(4, 2) = 0.174, e^{−2·2·1.2} = 0.0082 → 99.86 %. A 99 % target needs 4 instances (ρ = 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Final

TTFT_SHORT_S: Final = 1.0
"""TTFT budget of prompts up to :data:`L_SHORT_TOKENS` (benchmarks.md §6)."""
TTFT_LONG_S: Final = 3.0
"""TTFT budget of prompts of :data:`L_LONG_TOKENS` and more."""
L_SHORT_TOKENS: Final = 8_192
L_LONG_TOKENS: Final = 262_144
"""The speed pool's max context: the budget reaches 3 s there."""
TPOT_SLO_S: Final = 1.0 / 60.0
"""≥ 60 tokens/s per user."""

MAX_PLAN_INSTANCES: Final = 4096
"""Search bound of the queue model (the API's pair bound times the largest group is below it)."""
MIN_RATE: Final = 1e-9


def ttft_budget(
    input_tokens: float,
    short_s: float = TTFT_SHORT_S,
    long_s: float = TTFT_LONG_S,
    l_short: float = L_SHORT_TOKENS,
    l_long: float = L_LONG_TOKENS,
) -> float:
    """TTFT budget on *total* prompt tokens: ``short_s`` up to ``l_short``, ``long_s`` from ``l_long``, linear
    between (on total tokens: a budget on uncached tokens would reward cache misses). Example: 135,168 tokens
    (half-way) → 2 s."""
    if input_tokens <= l_short:
        return short_s
    if input_tokens >= l_long:
        return long_s
    return short_s + (long_s - short_s) * (input_tokens - l_short) / (l_long - l_short)


# --- per-request SLO outcome (the router's tandem_router_slo_requests_total) ---------------------

SLO_TTFT: Final = "ttft"
SLO_TPOT: Final = "tpot"
RESULT_MET: Final = "met"
RESULT_MISSED: Final = "missed"
RESULT_REJECTED: Final = "rejected"
"""Every pair walked was full (or had no serving pair): the client got the reject status."""
RESULT_TIMEOUT: Final = "timeout"
"""A leg timed out (a prefill on every pair walked, a decode connect, or the decode's idle timeout)."""
RESULT_ERROR: Final = "error"
"""The pool failed the request (a 5xx leg, a broken stream)."""
FAILURES: Final = (RESULT_REJECTED, RESULT_TIMEOUT, RESULT_ERROR)
SLO_RESULTS: Final = (RESULT_MET, RESULT_MISSED, *FAILURES)


def judge_request(
    prompt_tokens: float,
    *,
    failure: str | None = None,
    ttft_s: float | None = None,
    output_tokens: int = 0,
    decode_s: float | None = None,
    abandoned_after_s: float | None = None,
) -> dict[str, str]:
    """The SLO result of one request, per SLO (``ttft``, ``tpot``): the one rule the router records with.

    - ``failure`` (rejected, timeout, error): that result for both SLOs. They count against attainment like a
      miss: the client was not served within its budget, and the engines' own metrics never see them.
    - TTFT: ``met`` when ``ttft_s`` ≤ :func:`ttft_budget` (``prompt_tokens``), else ``missed``.
    - TPOT: the request's own mean, ``decode_s`` (first to last token) / (``output_tokens`` − 1), against
      :data:`TPOT_SLO_S`; a request with one output token has no TPOT and meets it (as the benchmarks count).
    - ``abandoned_after_s`` (the client left before its end): TTFT is judged on the first token when it came,
      else ``missed`` once the wait already exceeded the budget; otherwise nothing is known and nothing is
      counted. TPOT is never judged on an abandoned stream.

    Example: 20,000 prompt tokens → budget 1.09 s; TTFT 0.8 s, 101 tokens in 1.5 s (15 ms each) → both met.
    """
    if failure is not None:
        if failure not in FAILURES:
            raise ValueError(f"unknown failure {failure!r}")
        return {SLO_TTFT: failure, SLO_TPOT: failure}
    budget = ttft_budget(prompt_tokens)
    if abandoned_after_s is not None:
        if ttft_s is not None:
            return {SLO_TTFT: RESULT_MET if ttft_s <= budget else RESULT_MISSED}
        return {SLO_TTFT: RESULT_MISSED} if abandoned_after_s > budget else {}
    if ttft_s is None:
        raise ValueError("a finished request has a TTFT")
    if output_tokens > 1 and decode_s is None:
        raise ValueError("a request with more than one output token has a decode time")
    out = {SLO_TTFT: RESULT_MET if ttft_s <= budget else RESULT_MISSED}
    tpot_met = output_tokens <= 1 or decode_s is None or decode_s / (output_tokens - 1) <= TPOT_SLO_S
    out[SLO_TPOT] = RESULT_MET if tpot_met else RESULT_MISSED
    return out


def mdl_rho_max(budget_s: float, service_s: float, floor: float) -> float:
    """Largest utilisation of an M/D/1 queue whose mean sojourn (wait + service) stays within ``budget_s``:
    ρ ≤ 2(T − S)/(2T − S). Example: T = 1 s, S = 0.25 s → 0.857. Clamped to [floor, 1]."""
    if service_s <= 0:
        return 1.0
    if service_s >= budget_s:
        return floor
    return max(floor, min(1.0, 2.0 * (budget_s - service_s) / (2.0 * budget_s - service_s)))


# --- the profile ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One instance's prefill throughput at a mean prompt length."""

    prompt_tokens: float
    uncached_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One instance's decode capacity at the TPOT SLO for a mean context (prompt + output/2)."""

    context_tokens: float
    streams: float
    """Concurrent sequences at the TPOT SLO (the largest batch meeting it, within KV and max-num-seqs)."""
    tokens_per_s: float
    """Generated tokens/s of the instance at that batch."""


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation, clamped at the ends (a profile is never extrapolated)."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            span = xs[i] - xs[i - 1]
            w = (x - xs[i - 1]) / span if span > 0 else 1.0
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    """What one instance of each role does at the SLO, for one stack version (module docstring).

    Points are sorted by length; lookups interpolate linearly and clamp at the ends.
    """

    version: str
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    load_time_s: float
    """Capacity lead time: bind → Ready of a new instance (measured per revision when known)."""

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a capacity profile needs at least one prefill and one decode point")
        if any(p.uncached_tokens_per_s <= 0 for p in self.prefill):
            raise ValueError("prefill throughput must be > 0")
        if any(d.streams <= 0 or d.tokens_per_s <= 0 for d in self.decode):
            raise ValueError("decode streams and tokens/s must be > 0")
        object.__setattr__(self, "prefill", tuple(sorted(self.prefill, key=lambda p: p.prompt_tokens)))
        object.__setattr__(self, "decode", tuple(sorted(self.decode, key=lambda d: d.context_tokens)))

    def prefill_rate(self, prompt_tokens: float) -> float:
        """Uncached tokens/s of one prefill instance at this mean prompt length."""
        pts = self.prefill
        return _interp([p.prompt_tokens for p in pts], [p.uncached_tokens_per_s for p in pts], prompt_tokens)

    def decode_capacity(self, context_tokens: float) -> tuple[float, float]:
        """(streams, tokens/s) of one decode instance at the TPOT SLO for this mean context."""
        pts = self.decode
        xs = [d.context_tokens for d in pts]
        return (
            _interp(xs, [d.streams for d in pts], context_tokens),
            _interp(xs, [d.tokens_per_s for d in pts], context_tokens),
        )

    def bounded_by(self, declared: CapacityProfile) -> CapacityProfile:
        """This (learned) profile, never more optimistic than ``declared`` at any of its points: a learned
        profile may only lower capacity (an engine that measures faster than declared is not trusted)."""
        prefill = tuple(
            PrefillPoint(p.prompt_tokens, min(p.uncached_tokens_per_s, declared.prefill_rate(p.prompt_tokens)))
            for p in self.prefill
        )
        decode = []
        for d in self.decode:
            streams, tps = declared.decode_capacity(d.context_tokens)
            decode.append(DecodePoint(d.context_tokens, min(d.streams, streams), min(d.tokens_per_s, tps)))
        return replace(self, prefill=prefill, decode=tuple(decode), load_time_s=max(self.load_time_s, 0.0))

    def scaled(self, prefill_factor: float = 1.0, decode_factor: float = 1.0) -> CapacityProfile:
        """Capacity × factor per role (a learned correction; factors ≤ 1 lower capacity)."""
        return replace(
            self,
            prefill=tuple(
                PrefillPoint(p.prompt_tokens, p.uncached_tokens_per_s * prefill_factor) for p in self.prefill
            ),
            decode=tuple(
                DecodePoint(d.context_tokens, d.streams * decode_factor, d.tokens_per_s * decode_factor)
                for d in self.decode
            ),
        )


# --- demand --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkDemand:
    """The pool's work over the rate window (from router/engine counters; module docstring)."""

    request_rate: float
    """Requests/s arriving (served + rejected: a rejected request is demand too)."""
    prompt_tokens_per_s: float
    """Prompt tokens/s (cached and uncached)."""
    hit_ratio: float
    """Share of prompt tokens served from a cache (local + shared tier), 0–1."""
    generation_tokens_per_s: float
    decode_streams: float
    """Concurrent decode sequences (running + waiting on decode instances)."""

    @property
    def uncached_tokens_per_s(self) -> float:
        return self.prompt_tokens_per_s * (1.0 - min(1.0, max(0.0, self.hit_ratio)))

    @property
    def mean_prompt_tokens(self) -> float:
        return self.prompt_tokens_per_s / self.request_rate if self.request_rate > MIN_RATE else 0.0

    @property
    def mean_output_tokens(self) -> float:
        return self.generation_tokens_per_s / self.request_rate if self.request_rate > MIN_RATE else 0.0

    @property
    def mean_context_tokens(self) -> float:
        """Mean decode context: prompt + half the output (a sequence's mean over its decode)."""
        return self.mean_prompt_tokens + self.mean_output_tokens / 2.0

    def scaled(self, factor: float) -> WorkDemand:
        """The same mix at ``factor`` × the rate (a forecast or a burst)."""
        return replace(
            self,
            request_rate=self.request_rate * factor,
            prompt_tokens_per_s=self.prompt_tokens_per_s * factor,
            generation_tokens_per_s=self.generation_tokens_per_s * factor,
            decode_streams=self.decode_streams * factor,
        )


# --- a profile learned from the pool's own engines --------------------------------------------------

MIN_LEARN_PREFILLS: Final = 20
"""Prefills finished within one evaluation interval before their time says anything about the engines: fewer
is one or two long prompts' worth, and a cold start or a single cache-miss storm would set the capacity."""
MIN_LEARN_STREAMS: Final = 1.0
"""Decode streams per instance before a slow inter-token latency is the batch's doing, not one request's."""


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """What the pool's engines measured over the rate window (pool-wide sums; None when missing)."""

    prefill_busy: float | None = None
    """Seconds of prefill phase per second, summed over the prefill instances
    (``rate(vllm:request_prefill_time_seconds_sum)``): the mean number of prefills in progress."""
    prefills_per_s: float | None = None
    """Prefills finished per second on the prefill instances (``rate(vllm:request_prefill_time_seconds_count)``)."""
    prefill_instances: int = 0
    """Serving prefill instances (the most instance-seconds of prefill one second can hold)."""
    mean_itl_s: float | None = None
    """Mean inter-token latency on the decode instances (``_sum`` / ``_count`` of
    ``vllm:inter_token_latency_seconds``: an exact mean, not a quantile inside a 10–25 ms bucket)."""
    decode_running_per_instance: float | None = None
    """Mean running sequences per decode instance (the batch the latency was measured at)."""


@dataclass(frozen=True, slots=True)
class LearnedProfile:
    """The profile to plan with this evaluation and, per role, where it came from (decision metrics, ≤ 64
    characters each)."""

    profile: CapacityProfile
    prefill_note: str = "declared"
    decode_note: str = "declared"

    @property
    def learned(self) -> bool:
        return self.prefill_note != "declared" or self.decode_note != "declared"


def _number(value: float | None) -> float:
    """A measurement as a float, NaN when missing or not finite (every comparison with NaN is False, so a
    missing input never passes an evidence threshold)."""
    return value if value is not None and math.isfinite(value) else math.nan


def learn_profile(
    declared: CapacityProfile, demand: WorkDemand, seen: EngineObservation, interval_s: float
) -> LearnedProfile:
    """The declared profile, lowered where the pool's own engines measured less (issue 18 item 2).

    - **Prefill**: the uncached tokens the prefill instances computed per second of prefill phase,
      ``demand.uncached_tokens_per_s / busy``, at the window's mean prompt length, where busy is
      ``seen.prefill_busy`` capped at the serving prefill instances. With one prefill at a time that is the
      instance's rate. When the engine runs several at once (chunked prefill batches them), each one's phase
      is longer and a shared second is counted once per prefill in it, so the figure is lower than the
      instance's rate: sized on it, prefills share instances less, the side that errs toward the SLO. The cap
      keeps that error bounded: a pool cannot be busier than all its instances, so the learned rate never falls
      below what the instances deliver now, and the load term of the need never exceeds the instances serving
      (without it, four prefills sharing each instance would ask for four times the fleet, and the fleet that
      came would measure fast again). Learned only from :data:`MIN_LEARN_PREFILLS` prefills per evaluation
      interval or more.
    - **Decode**: when the mean inter-token latency at the observed batch R (streams per instance) is above
      the TPOT SLO, the instance holds fewer streams at the SLO than it ran: about R × SLO / ITL (step time is
      roughly linear in the batch while decode is memory-bound), at R / ITL tokens/s. A latency within the SLO
      says only that R fit, which the declared profile already allows, so nothing is learned from it.
    - Both are used only through :meth:`CapacityProfile.bounded_by` the declared profile: a learned figure can
      lower capacity, never raise it (an idle engine measures fast just before a burst). A role without enough
      evidence keeps its declared points.

    Example: declared 12,000 uncached tok/s at 6,000-token prompts, 2 prefill instances; the window computed
    9,000 uncached tok/s in 1.5 s of prefill phase per second over 40 prefills per interval → 6,000 tok/s
    learned, and the prefill load doubles (0.75 → 1.5 instances). Had the phase summed to 3 s per second, the cap
    (2 instances) would give 4,500 tok/s, not 3,000. Decode: ITL 25 ms at 32 streams per instance with a 16.7 ms
    SLO → 21.3 streams at the SLO (declared 48: learned).
    """
    prefill, decode = declared.prefill, declared.decode
    p_note = d_note = "declared"
    busy, done = _number(seen.prefill_busy), _number(seen.prefills_per_s)
    if busy > 0 and done * interval_s >= MIN_LEARN_PREFILLS and demand.uncached_tokens_per_s > 0:
        at = demand.mean_prompt_tokens
        rate = demand.uncached_tokens_per_s / min(busy, max(1, seen.prefill_instances))
        have = declared.prefill_rate(at)
        if rate < have:
            prefill = (PrefillPoint(at, rate),)
            p_note = f"learned {rate:,.0f} tok/s (declared {have:,.0f}) at {at:,.0f} tok"
    itl, per = _number(seen.mean_itl_s), _number(seen.decode_running_per_instance)
    if itl > TPOT_SLO_S and per >= MIN_LEARN_STREAMS:
        ctx = demand.mean_context_tokens
        streams = per * TPOT_SLO_S / itl
        have_streams, have_tps = declared.decode_capacity(ctx)
        if streams < have_streams:
            decode = (DecodePoint(ctx, streams, min(have_tps, per / itl)),)
            d_note = f"learned {streams:.1f} streams (declared {have_streams:.1f}), ITL {itl * 1000:.1f} ms"
    if prefill is declared.prefill and decode is declared.decode:
        return LearnedProfile(declared)
    learned = replace(declared, prefill=prefill, decode=decode).bounded_by(declared)
    return LearnedProfile(learned, p_note[:64], d_note[:64])


# --- queue models --------------------------------------------------------------------------------


def erlang_c(servers: int, load: float) -> float:
    """P(wait > 0) in an M/M/c queue with ``servers`` and offered ``load`` (Erlangs); 1 when saturated.
    Computed by the Erlang B recursion (stable for thousands of servers)."""
    if load <= 0:
        return 0.0
    if servers <= load:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return servers * b / (servers - load * (1.0 - b))


def mdc_attainment(servers: int, load: float, service_s: float, slack_s: float) -> float:
    """Predicted share of requests whose queue wait ≤ ``slack_s`` in an M/D/c queue (module docstring)."""
    if load <= 0:
        return 1.0
    if servers <= load or slack_s < 0 or service_s <= 0:
        return 0.0
    tail = erlang_c(servers, load) * math.exp(-2.0 * (servers - load) * slack_s / service_s)
    return max(0.0, 1.0 - tail)


@dataclass(frozen=True, slots=True)
class RoleNeed:
    """Instances one role needs, and why (recorded in the decision log)."""

    instances: float
    """Fractional need before rounding (forecasts run on it)."""
    load: float
    """Offered load in instances' worth of work (no headroom)."""
    predicted_attainment: float
    feasible: bool = True
    """False when the mean request misses its budget even on an idle instance (capacity cannot help)."""


def prefill_need(
    demand: WorkDemand, profile: CapacityProfile, target: float, overhead_s: float = 0.0, max_rho: float = 0.95
) -> RoleNeed:
    """Fewest prefill instances whose predicted M/D/c attainment ≥ ``target`` (0–1), at utilisation ≤
    ``max_rho``. ``overhead_s``: TTFT outside prefill (router walk, P→D, first decode step).

    The mean request sets service and budget: S = mean uncached tokens / rate(mean prompt), budget =
    :func:`ttft_budget` (mean prompt). When S + overhead already exceeds the budget, headroom cannot help:
    the need is the load at ``max_rho`` and ``feasible`` is False.
    """
    rate = demand.request_rate
    uncached = demand.uncached_tokens_per_s
    if rate <= MIN_RATE or uncached <= 0:
        return RoleNeed(0.0, 0.0, 1.0)
    per_instance = profile.prefill_rate(demand.mean_prompt_tokens)
    load = uncached / per_instance
    service = load / rate
    slack = ttft_budget(demand.mean_prompt_tokens) - service - overhead_s
    if slack <= 0:
        return RoleNeed(load / max_rho, load, 0.0, feasible=False)
    c = max(1, math.ceil(load / max_rho - 1e-9))
    while c < MAX_PLAN_INSTANCES:
        att = mdc_attainment(c, load, service, slack)
        if att >= target:
            return RoleNeed(float(c), load, att)
        c += 1
    return RoleNeed(float(c), load, mdc_attainment(c, load, service, slack))


def decode_need(demand: WorkDemand, profile: CapacityProfile, target: float) -> RoleNeed:
    """Fewest decode instances that hold the streams at the TPOT SLO with probability ``target``.

    Concurrent streams of independent requests are Poisson (M/G/∞) with mean L, so the fleet holds them
    at the SLO with probability ``target`` when it has room for L + z·√L streams (z = the normal
    quantile of ``target``; square-root staffing). Tokens/s must fit too: need = max(streams side,
    tokens side). Example: L = 200 streams, 32 per instance, 99 % (z = 2.33) → (200 + 33)/32 = 7.3.
    """
    streams = max(0.0, demand.decode_streams)
    tokens = max(0.0, demand.generation_tokens_per_s)
    if streams <= 0 and tokens <= 0:
        return RoleNeed(0.0, 0.0, 1.0)
    per_streams, per_tokens = profile.decode_capacity(demand.mean_context_tokens)
    z = NormalDist().inv_cdf(min(max(target, 0.5), 0.9999))
    # the token side in stream units: an instance at the SLO carries per_tokens/per_streams tokens/s per stream
    population = max(streams, tokens / per_tokens * per_streams)
    load = population / per_streams
    return RoleNeed((population + z * math.sqrt(population)) / per_streams, load, target)


def pairs_for(prefill: float, decode: float, shape: tuple[int, int]) -> int:
    """Pair groups of ``shape`` (p, d) that hold both roles' instances: max(⌈P/p⌉, ⌈D/d⌉)."""
    p, d = shape
    return max(math.ceil(prefill / p - 1e-9), math.ceil(decode / d - 1e-9), 0)


def groups_for(prefill: float, decode: float, shape: tuple[int, int], kept: Sequence[tuple[int, int]] = ()) -> int:
    """Pair groups that hold both roles' instances when the fleet keeps its groups of shapes ``kept`` (in the
    order a scale-down keeps them) and builds any more in ``shape`` (the pool's P:D).

    Why: a P:D change is taken by the groups as they cycle (``tandem.core.reshape``), so for a while the
    fleet mixes shapes. Sized as if every group were already in the new shape, a prefill-bound pool moving
    1P:1D → 2P:1D would be told half the groups it needs now, and a scale-down would take the old ones (they
    drain first) while the new ones are not there. Counting the groups that stay, as they are, sizes the fleet
    that will exist after the scaling; the count falls as the replacements land.

    Example: kept four 1P:1D, shape 2P:1D, need 6P and 2D → 5 (four old groups give 4P, one new adds 2P);
    with kept two 2P:1D and two 1P:1D (keep order: target-shaped first) the same need → 4 (2 + 2 + 1 + 1)."""
    if all(k == shape for k in kept):
        return pairs_for(prefill, decode, shape)
    have_p = have_d = 0
    for n, (p, d) in enumerate(kept):
        if have_p >= prefill - 1e-9 and have_d >= decode - 1e-9:
            return n
        have_p, have_d = have_p + p, have_d + d
    return len(kept) + pairs_for(max(0.0, prefill - have_p), max(0.0, decode - have_d), shape)


def instances_for(prefill: float, decode: float, shape: tuple[int, int], kept: Sequence[tuple[int, int]] = ()) -> int:
    """Instances (both roles) of the groups :func:`groups_for` counts: the first of ``kept`` in keep order, then
    groups of ``shape``. What a fleet of that mix costs for this need, to compare with ``shape`` alone.
    Example: need 4P and 4D, kept four 1P:1D, shape 2P:1D → 8 (the four kept groups); with nothing kept → 12
    (four 2P:1D groups for the 4 decode instances)."""
    n = groups_for(prefill, decode, shape, kept)
    sizes = [p + d for p, d in kept[:n]]
    return sum(sizes) + (n - len(sizes)) * (shape[0] + shape[1])


# --- forecast over the lead time -----------------------------------------------------------------

LEVEL_TIME_CONSTANT_S: Final = 60.0
"""Holt level smoothing: follows the need within about a minute (one to two rate windows)."""
TREND_TIME_CONSTANT_S: Final = 300.0
"""Holt trend smoothing: a slope must persist for minutes to be extrapolated (not one noisy window)."""


@dataclass(frozen=True, slots=True)
class ForecastState:
    """Holt's level and trend of one need, and its recent samples (time, need) for the lead-time peak."""

    at: float | None = None
    level: float = 0.0
    trend: float = 0.0
    """Per second."""
    samples: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Forecast:
    now: float
    """The need measured now."""
    ahead: float
    """The need forecast ``lead_s`` ahead (≥ level; a falling trend is not extrapolated: scale-down waits
    for the lead-time peak to fall instead)."""
    recent_peak: float
    """The largest need of the last ``lead_s`` (incl. now): the scale-down bound."""


def update_forecast(state: ForecastState, now: float, need: float, lead_s: float) -> tuple[Forecast, ForecastState]:
    """Fold ``need`` measured at ``now`` into the forecast (module docstring).

    α = 1 − e^{−dt/60 s} for the level, β = 1 − e^{−dt/300 s} for the trend (time-based, so any evaluation
    interval gives the same dynamics). Example: a need rising 0.01 instances/s for a while, lead 240 s →
    ahead ≈ level + 2.4.
    """
    if state.at is None or now <= state.at:
        level, trend = need, state.trend if state.at is not None else 0.0
    else:
        dt = now - state.at
        alpha = 1.0 - math.exp(-dt / LEVEL_TIME_CONSTANT_S)
        beta = 1.0 - math.exp(-dt / TREND_TIME_CONSTANT_S)
        predicted = state.level + state.trend * dt
        level = alpha * need + (1.0 - alpha) * predicted
        trend = beta * (level - state.level) / dt + (1.0 - beta) * state.trend
    keep = (*((t, v) for t, v in state.samples if t >= now - lead_s), (now, need))
    ahead = max(need, level + max(0.0, trend) * lead_s)
    peak = max(v for _, v in keep)
    return Forecast(now=need, ahead=ahead, recent_peak=peak), ForecastState(now, level, trend, keep)


# --- attainment correction -----------------------------------------------------------------------

MAX_CORRECTION: Final = 3.0
"""A model wrong by more than 3× is a wrong profile, not something to paper over with headroom."""
MAX_CORRECTION_STEP: Final = 1.1
"""Largest raise per evaluation: ×2 takes ≥ 7 evaluations (3.5 min at 30 s), within one load time."""
CORRECTION_DECAY: Final = 0.97
"""Per evaluation above target: back to 1 over ~20 min at 30 s (slowly: a correction that was needed
once is likely needed again at the next peak)."""


def update_correction(correction: float, attainment: float | None, target: float, queued: bool) -> float:
    """The multiplier on one role's modelled need, from measured attainment (Dynamo's planner uses the same
    observed/expected correction). Below target while requests queue → raise by the shortfall (×(1 + 2 ×
    missed share), at most ×1.1 per step: one window of a few hundred requests is noisy), above target →
    decay toward 1. No data → unchanged. A miss without a queue is not a capacity miss (the prompt's own
    service time), so it does not raise it. Example: target 99 %, attainment 95 %, queued → ×1.08."""
    if attainment is None or not math.isfinite(attainment):
        return correction
    if attainment < target and queued:
        step = min(MAX_CORRECTION_STEP, 1.0 + 2.0 * (target - attainment))
        return min(MAX_CORRECTION, correction * step)
    if attainment >= target:
        return max(1.0, correction * CORRECTION_DECAY)
    return correction
