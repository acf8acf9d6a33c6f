"""Simulator parameters: the typed form of ``params.yaml`` (package data) and the config hash.

What it owns: every number the simulator uses that is not a workload or a seed — the model and GPU
(roofline inputs), instance limits, network and shared tier, instance lifecycle, the observation
pipeline, SLOs, router and admission settings, the oracle, the generator profiles and the policies'
defaults. Each field says whether it is a published value, an *est.* (estimate) or a *start* value.

Must not: read the environment or the clock. :func:`load_params` reads the shipped YAML (or a given
file) and applies overrides; nothing else in ``tandem_lab.sim`` reads files for parameters.

Invariants: models are frozen and reject unknown keys, so a typo in a parameter file fails loudly;
:func:`config_hash` of equal configurations is equal in every process (canonical JSON, sorted keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

PARAMS_RESOURCE = "params.yaml"


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelParams(_Cfg):
    """The served model (illustrative: 1 T total / 32 B active MoE, DeepSeek-V3-like attention)."""

    name: str
    active_params: float
    linear_flops_per_token: float
    """Prefill FLOPs per token outside attention (2·N_active plus projections and head; §3.2: 74 GFLOP)."""
    experts: int
    experts_per_token: int
    weight_bytes: float
    """Resident weights per instance (FP4 storage)."""
    expert_weight_bytes: float
    """W_experts: expert weights, read only for experts touched by the batch (fitted to benchmarks.md §3.2)."""
    dense_weight_bytes: float
    """W_dense: weights read every decode step (attention, shared experts, norms)."""
    layers: int
    attention_heads: int
    d_qk: int
    d_v: int
    kv_bytes_per_token: float
    max_context_tokens: int


class HardwareParams(_Cfg):
    gpu: str
    hbm_bytes: float
    hbm_bandwidth: float
    fp8_flops: float
    """Dense FP8 FLOP/s per GPU (FP4 weights compute at this rate on CDNA3)."""
    bf16_flops: float
    gpus_per_node: int


class InstanceParams(_Cfg):
    gpus: int
    hbm_reserve_fraction: float
    """Share of instance HBM kept for activations and graphs (*start*)."""
    eta_linear: float
    eta_attention: float
    eta_bandwidth: float
    decode_comm_s: float
    tokens_per_step: float
    """m: tokens accepted per decode step (1 without MTP/speculation)."""
    prefill_overhead_s: float
    max_num_seqs: int
    """Decode batch cap (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int = 16384
    """vLLM ``--max-num-batched-tokens``: the per-step token budget chunked prefill fills (speed-pool.yaml)."""
    long_prefill_token_threshold: int = 0
    """vLLM ``--long-prefill-token-threshold``: most tokens one prefill may take from a step's budget
    (0 = no limit: the oldest prefill takes the whole budget, FCFS)."""
    prefill_concurrency: int = 1
    """Prefills that share a prefill instance's compute at once (processor sharing). When not given it is
    derived from the two knobs above: ⌊max_num_batched_tokens / long_prefill_token_threshold⌋ (≥ 1), the
    number of partial prefills vLLM's scheduler advances per step; 1 = FCFS (vLLM's default, threshold 0):
    a long prompt blocks the ones behind it."""

    @model_validator(mode="before")
    @classmethod
    def _derive_prefill_concurrency(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("prefill_concurrency") is None:
            budget = int(data.get("max_num_batched_tokens", 16384))
            threshold = int(data.get("long_prefill_token_threshold", 0))
            data = {**data, "prefill_concurrency": max(1, budget // threshold) if threshold > 0 else 1}
        return data


class PoolParams(_Cfg):
    """The pool the fleet benchmark sizes (``examples/speed-pool.yaml``) and how traffic is classified into it."""

    name: str = "speed"
    max_prompt_tokens: int = 131072
    """``traffic.match.maxPromptTokens``: longer prompts are routed to the long-context pool (counted, not served)."""
    max_context_tokens: int = 262144
    """``model.maxContextTokens`` of the pool's engines (the TTFT budget reaches 3 s here, §6)."""
    images: Literal["Forbidden", "Allowed"] = "Forbidden"
    """Requests with images go to the images pool (the simulated workloads carry none)."""


class NetworkParams(_Cfg):
    nic_bandwidth: float
    """Bytes/s per instance NIC (400 Gb/s = 50 GB/s)."""
    intra_node_bandwidth: float
    """Bytes/s for P→D inside one node (*est.*)."""
    router_rtt_s: float


class SharedTierParams(_Cfg):
    enabled: bool
    stores: int
    """Store nodes at fleet scale (scaled with the run's rate scale, at least 1)."""
    segment_bytes: float
    nic_bandwidth: float

    def stores_at(self, rate_scale: float) -> int:
        """Store nodes of a run at ``rate_scale`` of the fleet's rate: the tier scales with the traffic, so a
        5 % run keeps the fleet's bytes of tier per request (at least one store)."""
        return max(1, round(self.stores * rate_scale))


class LifecycleParams(_Cfg):
    schedule_delay_s: float
    load_times_s: dict[str, float]
    load_mix: dict[str, float]
    load_kind_scope: Literal["node", "instance"]
    """What one draw from ``load_mix`` covers: ``node``, the instances a pair group places on one node (they share
    its weight cache), or ``instance``, every instance on its own (the simulator's rule before stop 52)."""
    drain_timeout_s: float


class ObservationParams(_Cfg):
    scrape_interval_s: float
    rate_window_s: float
    lag_s: float


class SloParams(_Cfg):
    ttft_short_s: float
    ttft_long_s: float
    l_short_tokens: int
    l_long_tokens: int
    tpot_s: float
    window_s: float
    """Reporting window for attainment (worst window)."""


class RouterParams(_Cfg):
    policy: Literal["prefix-hash", "round-robin", "least-loaded"]
    key: Literal["auto", "blocks", "prefix-key"]
    key_blocks: int
    load_bound_percent: int
    max_walk: int


class AdmissionParams(_Cfg):
    max_in_flight: int
    max_queued: int
    max_kv_utilization_percent: int
    reject_status: Literal[429, 503]


class OracleParams(_Cfg):
    window_s: float
    rho_floor: float
    """Smallest ρ_max used when a window's mean service time reaches its TTFT budget."""
    smooth_s: float = 60.0
    """Centred moving average applied to per-window needs before rounding up (*start*)."""


class LogNormal(_Cfg):
    """Log-normal from a median and σ (μ = ln median)."""

    median: float
    sigma: float


class ProfileTargets(_Cfg):
    """Published aggregates a profile is calibrated to (benchmarks.md §2.2). Absent = not published."""

    prefix_p50: float | None = None
    prefix_p99: float | None = None
    prefix_mean: float | None = None
    append_p50: float | None = None
    output_p50: float | None = None
    output_mean: float | None = None
    cached_share: float | None = None
    steps_per_session: float | None = None
    user_requests_per_session: float | None = None
    prompt_mean: float | None = None


class ProfileParams(_Cfg):
    """One agent family's session shape (a profile of the generator)."""

    weight: float
    """Share of sessions."""
    families: int
    """System-prompt families (distinct long shared prefixes)."""
    system_prompt_tokens: LogNormal
    first_message_tokens: LogNormal
    user_message_tokens: LogNormal
    tool_result_tokens: LogNormal
    output_tokens: LogNormal
    max_output_tokens: int
    user_requests_per_session: float
    """Mean; 1 + geometric, or log-normal when ``user_requests_sigma`` > 0 (marathon sessions)."""
    user_requests_sigma: float = 0.0
    steps_per_request: float
    """Mean LLM calls per user request; 1 + geometric."""
    compaction_tokens: LogNormal
    """Per-session context size at which the agent compacts (*start*)."""
    summary_tokens: LogNormal
    compaction_keep: float = 0.0
    """Share of the old conversation re-sent (as new blocks) after a compaction; 0 = summary only."""
    tool_session_sigma: float = 0.0
    """σ of a per-session log-normal multiplier on tool results (some sessions read far more)."""
    max_append_tokens: int = 32768
    """Largest single append (tool result, message): agents truncate tool output (*start*)."""
    targets: ProfileTargets


class GeneratorParams(_Cfg):
    block_tokens: int
    peak_rps: float
    weekend_factor: float
    floor: float
    """f of the diurnal shape."""
    exponent: float
    """k of the diurnal shape."""
    peak_hour: float
    tool_gap_s: LogNormal
    idle_gap_s: LogNormal
    assumed_ttft_s: float
    """Open-loop timestamps assume this TTFT and ``slo.tpot_s`` per output token."""
    warmup_s: float
    """Sessions start this long before t = 0 so the run opens in steady state."""
    profiles: dict[str, ProfileParams]


class HpaParams(_Cfg):
    sync_period_s: float
    tolerance: float
    scale_up_pods: int
    scale_up_percent: float
    scale_up_period_s: float
    scale_down_stabilization_s: float
    scale_down_percent: float
    scale_down_period_s: float


class FlaggerParams(_Cfg):
    """The Flagger-like rollout baseline (W5): fixed interval, failed-check threshold, weight steps."""

    interval_s: float = 60.0
    threshold: int = 5
    step_weight: int = 5
    max_weight: int = 50


class PolicyParams(_Cfg):
    static_headroom: float
    hpa: HpaParams
    hpa_decode_kv_target: float
    hpa_prefill_busy_target: float
    keda_target: float
    keda_include_running: bool
    keda_polling_s: float
    planner_interval_s: float
    planner_prefill_correction: bool
    planner_decode_correction: bool
    ratio_target_utilization: float
    clairvoyant_headroom: float = Field(1.0, gt=0)
    clairvoyant_decode_headroom: float | None = Field(None, gt=0)
    clairvoyant_lead_s: float | None = Field(None, ge=0)
    ratio_interval_s: float
    ratio_tolerance: float
    ratio_down_stabilization_s: float
    tandem_pool: dict[str, Any]
    """InferencePool ``spec.autoscaling`` (camelCase, as in a manifest) for Tandem's autoscaler."""
    tandem_shape: tuple[int, int] | Literal["auto"]
    """Prefill and decode instances per pair group for Tandem (xPyD) at t = 0; ``auto`` = the offline
    profile's P:D (the same information B0 and B4 get)."""
    tandem_rollout: dict[str, Any] = Field(default_factory=dict)
    """InferencePool ``spec.rollout`` (camelCase) for ``tandem.core.rollout`` in W5; ``${ttft_target_s}`` in a
    condition is replaced by the pool's TTFT p95 target in seconds."""
    flagger: FlaggerParams = Field(default_factory=FlaggerParams)
    w5_regression_gates: list[str] = Field(default_factory=lambda: ["tokens-per-user", "errors"])
    """Gate names of W5's ``regression`` gate set (a subset of ``tandem_rollout.analysis.metrics``)."""
    reconcile_s: float = 5.0
    """Period of the simulated operator reconcile during a rollout (event-driven in the operator)."""
    stable_error_prob: float = 0.0
    """Engine error probability of the stable revision in W5."""
    w5_pairs: int | Literal["auto"] = "auto"
    """Fixed pair count of both W5 arms (``auto``: B0's size in 1P:1D pairs)."""


class SimParams(_Cfg):
    version: int
    model: ModelParams
    hardware: HardwareParams
    instance: InstanceParams
    pool: PoolParams = Field(default_factory=PoolParams)
    network: NetworkParams
    shared_tier: SharedTierParams
    lifecycle: LifecycleParams
    observation: ObservationParams
    slo: SloParams
    router: RouterParams
    admission: AdmissionParams
    oracle: OracleParams
    generator: GeneratorParams
    policies: PolicyParams
    bounds: dict[str, float] = Field(default_factory=dict)
    """Fleet bounds shared by every policy: ``max_factor`` × oracle peak per role (+ ``max_extra``)."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``override``, recursing into mappings (lists and scalars are replaced)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def default_params_text() -> str:
    """The shipped ``params.yaml``."""
    return resources.files("tandem_lab.sim").joinpath(PARAMS_RESOURCE).read_text(encoding="utf-8")


def load_params(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> SimParams:
    """Parameters from ``path`` (default: the shipped file), deep-merged with ``overrides``."""
    text = path.read_text(encoding="utf-8") if path is not None else default_params_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("parameter file must hold a mapping")
    if overrides:
        data = deep_merge(data, overrides)
    return SimParams.model_validate(data)


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def config_hash(*parts: Any) -> str:
    """sha256 (hex, 16 chars) over the canonical JSON of ``parts`` (pydantic models are dumped)."""
    dumped = [p.model_dump(mode="json") if isinstance(p, BaseModel) else p for p in parts]
    return hashlib.sha256(canonical_json(dumped).encode("utf-8")).hexdigest()[:16]
