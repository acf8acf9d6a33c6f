"""The `InferencePool` spec (tandem.dev/v1alpha1): one model, one traffic class, N prefill/decode pair groups.

What it owns: the user-facing shape of a pool and every static rule about it. Each field's docstring
is its `kubectl explain` text; each cross-field rule is a CEL rule the API server enforces and
`tandem validate` evaluates offline. Behaviour lives elsewhere (core/, builders/); this module only
says what a valid pool looks like and what its defaults are.

Running example (the reference fleet, docs/design/001-api.md): the `speed` pool serves agentic
coding with 1 prefill + 1 decode instance per pair, each FP4 on 4 MI325X GPUs, so one 8-GPU node
holds one pair; it autoscales between 8 and 95 pairs and rolls out new stack versions through a
canary gated on TTFT, tokens/s per user, errors and a tool-calling eval.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tandem.api.base import (
    ADMISSION_ERROR,
    PRIORITY_CLASS_PATTERN,
    ApiModel,
    DnsLabel,
    Duration,
    LabelKey,
    LabelValue,
    Rule,
    admission_checks,
    cel,
    cel_list,
    cel_regex,
    image_field,
    immutable,
)
from tandem.api.celenv import CONDITION_GRAMMAR, CONDITION_PATTERN, condition_problem
from tandem.api.common import URL_PASSWORD_PATTERN, EnvVar, Resources, SecretKeyRef, Toleration
from tandem.api.gatequery import QUERY_VARIABLES_PATTERN, VARIABLES, QueryRenderError, QueryVars, render_query
from tandem.api.labels import MAX_INSTANCES_PER_ROLE

MAX_PAIRS = 512  # fleet cap per pool (testing.md B-02): 512 pairs x 8 GPUs = 4096 GPUs
GPU_PRODUCTS = ("MI300X", "MI325X", "MI355X")

# Engine flags Tandem sets from the spec (builders/pods.py engine_args): a user copy would override the
# pool's shape, port or KV wiring behind the operator's back (vLLM's last occurrence wins).
MANAGED_ENGINE_FLAGS = (
    "model",
    "served-model-name",
    "host",
    "port",
    "tensor-parallel-size",
    "pipeline-parallel-size",
    "max-model-len",
    "max-num-seqs",
    "enable-prefix-caching",
    "no-enable-prefix-caching",
    "kv-transfer-config",
    "revision",
    "config",
)
MANAGED_ENGINE_SHORT_FLAGS = ("tp", "pp")
# Engine flags that run code or read files from outside the image, or carry a credential in the spec.
FORBIDDEN_ENGINE_FLAGS = (
    "trust-remote-code",
    "middleware",
    "tool-parser-plugin",
    "allowed-local-media-path",
    "api-key",
    "hf-token",
)


def _flag_regex(long_flags: tuple[str, ...], short_flags: tuple[str, ...] = ()) -> str:
    """An anchored regex for ``--flag``, ``--flag=value`` (vLLM also reads ``--flag_name``) and ``-short``."""
    names = "|".join(f.replace("-", "[-_]") for f in long_flags)
    shorts = f"|-({'|'.join(short_flags)})" if short_flags else ""
    return f"^(--({names}){shorts})([=\\s].*)?$"


MANAGED_FLAG_PATTERN = _flag_regex(MANAGED_ENGINE_FLAGS, MANAGED_ENGINE_SHORT_FLAGS)
FORBIDDEN_FLAG_PATTERN = _flag_regex(FORBIDDEN_ENGINE_FLAGS)

EngineArg = Annotated[
    str,
    Field(
        min_length=1,
        max_length=512,
        json_schema_extra=cel(
            Rule(
                f"!self.matches('{MANAGED_FLAG_PATTERN.replace(chr(92), chr(92) * 2)}')",
                "args: this engine flag is set by Tandem from the spec (model, parallelism, port, admission, "
                "KV transfer) and may not be overridden",
            ),
            Rule(
                f"!self.matches('{FORBIDDEN_FLAG_PATTERN.replace(chr(92), chr(92) * 2)}')",
                "args: this engine flag is not allowed (it runs code or reads files from outside the image, or puts "
                "a credential in the spec)",
            ),
        ),
    ),
]


# --- model -----------------------------------------------------------------------------------

# A `..` path segment in a model source (also percent-encoded): the loader would read outside the bucket,
# claim or directory the source names.
SOURCE_TRAVERSAL_PATTERN = r"^[a-z0-9]+://(.*/)?(\.|%2[eE]){2}(/.*)?$"
# An oci:// model source pinned by digest: a tag can move under a running pool.
OCI_PINNED_PATTERN = r"^oci://[^@\s]+@sha256:[a-f0-9]{64}$"


class ModelSpec(ApiModel):
    """The model the pool serves."""

    served_name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./:]*$",
            json_schema_extra=immutable("model.servedName"),
        ),
    ]
    """Name clients ask for (vLLM `--served-model-name`), e.g. `MiniMaxAI/MiniMax-M3.1-Flash`. Immutable: serve a new
    name from a new pool."""
    source: Annotated[
        str,
        Field(
            min_length=1,
            max_length=512,
            pattern=r"^(hf|s3|gs|pvc|oci|file)://.+$",
            json_schema_extra=cel(
                Rule(
                    f"!self.matches('{URL_PASSWORD_PATTERN.replace(chr(92), chr(92) * 2)}')",
                    "model.source may not carry a password (user:password@): use model.tokenSecretRef",
                ),
                Rule(
                    f"!self.matches('{cel_regex(SOURCE_TRAVERSAL_PATTERN)}')",
                    "model.source may not contain a '..' path segment (plain or percent-encoded)",
                ),
                Rule(
                    f"!self.startsWith('oci://') || self.matches('{cel_regex(OCI_PINNED_PATTERN)}')",
                    "model.source: an oci:// source must be pinned by digest "
                    "(oci://registry/repository@sha256:<64 hex>)",
                ),
            ),
        ),
    ]
    """Where the weights come from: `hf://org/model`, `s3://bucket/path`, `gs://...`, `pvc://claim/path`, `oci://...`
    or `file:///path`."""
    revision: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")] | None = None
    """Weights revision (a Hugging Face commit or tag). Pin it: a moving revision changes the model under a running
    pool."""
    quantization: Annotated[Literal["fp4", "fp8", "bf16"], Field(json_schema_extra=immutable("model.quantization"))]
    """Weight format: fp4, fp8 or bf16. Immutable: it changes memory per instance and thus the pool's shape. On MI325X
    (CDNA3) fp4 is a storage format computed at the FP8 rate."""
    max_context_tokens: Annotated[int, Field(ge=1, le=4_194_304)] = 131_072
    """Longest context (prompt + output) an instance accepts (vLLM `--max-model-len`)."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret key holding the token used to download the weights (for example a Hugging Face token). Never put the
    token itself in the spec."""


# --- traffic ---------------------------------------------------------------------------------


class HeaderMatch(ApiModel):
    """An exact HTTP header match the fleet router applies before sending a request to this pool."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")]
    """Header name (case-insensitive)."""
    value: Annotated[str, Field(max_length=256)]
    """Exact header value."""


class TrafficMatch(ApiModel):
    """Which requests the fleet router classifies into this pool."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "!has(self.maxPromptTokens) || self.minPromptTokens <= self.maxPromptTokens",
                "traffic.match.minPromptTokens must be ≤ maxPromptTokens",
                field_path=".minPromptTokens",
            )
        )
    }

    min_prompt_tokens: Annotated[int, Field(ge=0, le=4_194_304)] = 0
    """Smallest prompt (in tokens) this pool takes."""
    max_prompt_tokens: Annotated[int, Field(ge=1, le=4_194_304)] | None = None
    """Largest prompt (in tokens) this pool takes; unset means no upper bound."""
    images: Literal["Any", "Required", "Forbidden"] = "Any"
    """Whether requests must (Required), must not (Forbidden) or may (Any) carry images."""
    headers: Annotated[list[HeaderMatch], Field(max_length=8)] = []
    """Headers that must all match exactly."""


class TrafficSpec(ApiModel):
    """The pool's traffic class and the rules the fleet router uses to send requests here."""

    traffic_class: Annotated[DnsLabel, Field(alias="class")] = "default"
    """Traffic class, e.g. `speed`, `long-context` or `images`. Shown in the routing table."""
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    """When several pools match a request, the highest priority wins (ties: the more specific match — headers,
    then an images rule, then token bounds — then the pool name)."""
    match: TrafficMatch = TrafficMatch()
    """Request match rules for this pool."""


# --- stack -----------------------------------------------------------------------------------


class RoleOverride(ApiModel):
    """Per-role additions to the stack (prefill or decode)."""

    args: Annotated[list[EngineArg], Field(max_length=64)] = []
    """Extra engine arguments for this role only, appended after the shared ones."""
    env: Annotated[list[EnvVar], Field(max_length=64)] = []
    """Extra environment variables for this role only."""
    resources: Resources | None = None
    """CPU and memory for this role's engine container."""


class KvTransfer(ApiModel):
    """How a prefill instance hands its KV cache to the decode instance of its pair."""

    connector: Literal["MooncakeConnector", "NixlConnector", "MoRIIOConnector"] = "MooncakeConnector"
    """vLLM KV connector for the P→D transfer (vLLM 0.33 names). With a MooncakeCache reference the shared tier is
    added through a MultiConnector."""
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    """What the decode instance does when a KV load fails (vLLM `kv_load_failure_policy`)."""
    moriio_mode: Literal["Write", "Read"] = "Write"
    """MoRIIOConnector only (other connectors ignore it): `Write`, vLLM's default, has the prefill write the KV
    into the decode's blocks while both legs run; `Read` has the decode read it after the prefill answered (vLLM
    `kv_connector_extra_config.read_mode`; Read is the mode vLLM supports for hybrid sliding-window and mamba
    models)."""


class StackSpec(ApiModel):
    """The serving stack: engine image, kernels and flags. Any change here is a new revision and starts a rollout."""

    version: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]
    """Human version label of the stack, e.g. `v32`. Shown in status, printer columns and the scorecard."""
    image: Annotated[str, Field(max_length=512, json_schema_extra=image_field("stack.image"))]
    """Engine image pinned by digest, e.g. `docker.io/vllm/vllm-openai-rocm:v0.33.0@sha256:...`. A tag alone is
    rejected: a moving tag would change revisions behind Tandem's back."""
    args: Annotated[list[EngineArg], Field(max_length=64)] = []
    """Extra engine arguments for both roles (Tandem sets the model, parallelism, admission and KV-transfer flags
    itself)."""
    env: Annotated[list[EnvVar], Field(max_length=64)] = []
    """Extra environment variables for both roles, e.g. `VLLM_ROCM_USE_AITER=1`."""
    kv_transfer: KvTransfer = KvTransfer()
    """P→D KV transfer settings."""
    prefill: RoleOverride = RoleOverride()
    """Additions for prefill instances."""
    decode: RoleOverride = RoleOverride()
    """Additions for decode instances."""


# --- pairs -----------------------------------------------------------------------------------


class RoleShape(ApiModel):
    """How many instances of one role a pair group has, and how big each is."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "self.gpusPerInstance % self.pipelineParallel == 0",
                "pipelineParallel must divide gpusPerInstance",
                field_path=".pipelineParallel",
            ),
            Rule(
                "!has(self.tensorParallel) || self.tensorParallel * self.pipelineParallel == self.gpusPerInstance",
                "tensorParallel × pipelineParallel must equal gpusPerInstance",
                field_path=".tensorParallel",
            ),
        )
    }

    instances: Annotated[int, Field(ge=1, le=MAX_INSTANCES_PER_ROLE)] = 1
    """Instances of this role per pair group (the x or y of xPyD). To run no pairs set pairs.replicas to 0.
    Changing only this keeps the revision: new groups take the new shape, and existing ones are replaced one at a
    time, surge first, when free GPUs allow (status.pairs.offShape counts those left)."""
    gpus_per_instance: Annotated[
        int,
        Field(
            ge=1,
            le=8,
            json_schema_extra=cel(Rule("self in [1, 2, 4, 8]", "gpusPerInstance must be 1, 2, 4 or 8")),
        ),
    ] = 4
    """GPUs per instance (one Pod). 4 on MI325X lets one 8-GPU node hold a 1P+1D pair."""
    tensor_parallel: Annotated[int, Field(ge=1, le=8)] | None = None
    """Tensor-parallel size; defaults to gpusPerInstance / pipelineParallel."""
    pipeline_parallel: Annotated[int, Field(ge=1, le=8)] = 1
    """Pipeline-parallel size."""


class PairsSpec(ApiModel):
    """The pool's size in pair groups and the shape (xPyD) of each group."""

    replicas: Annotated[int, Field(ge=0, le=MAX_PAIRS)] = 1
    """Pair groups to run. Driven by `kubectl scale`, HPA/KEDA (scale subresource) or Tandem's autoscaler when
    autoscaling.enabled."""
    prefill: RoleShape = RoleShape()
    """Prefill instances per pair group."""
    decode: RoleShape = RoleShape()
    """Decode instances per pair group."""
    drain_timeout: Duration = "120s"
    """Longest a draining pair (scale-down or replacement) keeps its in-flight streams before its pods are
    deleted. The router stops sending new requests to it at once."""
    orphan_timeout: Duration = "300s"
    """A half pair (some instances Ready, others missing or Pending) is not counted as capacity; past this
    time it is drained and replaced as a whole."""

    @property
    def shape(self) -> tuple[int, int]:
        """(prefill, decode) instances per group: the shape new groups are built in (``tandem.core.reshape``)."""
        return self.prefill.instances, self.decode.instances


# --- placement -------------------------------------------------------------------------------


class RdmaResource(ApiModel):
    """An RDMA device resource requested by every instance (names are cluster-specific)."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$")]
    """Extended resource name, e.g. `amd.com/vnic` or `rdma/ib`. Never defaulted: ask your cluster admin."""
    per_instance: Annotated[int, Field(ge=1, le=16)] = 1
    """How many of the resource each instance requests."""


class PlacementSpec(ApiModel):
    """Where instances run: GPU resource, node selection, co-location of a pair and spread."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "!has(self.rdma) || self.rdma.name != self.gpuResource",
                "placement.rdma.name may not be the GPU resource (placement.gpuResource): every instance would "
                "request GPUs twice",
                field_path=".rdma.name",
            )
        )
    }

    gpu_resource: Annotated[
        str,
        Field(
            max_length=253, pattern=r"^[a-z0-9.-]+/[a-z0-9_.-]+$", json_schema_extra=immutable("placement.gpuResource")
        ),
    ] = "amd.com/gpu"
    """Extended resource for GPUs (AMD device plugin `single` strategy: `amd.com/gpu`; `mixed`: e.g.
    `amd.com/spx_nps1`). Immutable."""
    gpu_product: Literal["MI300X", "MI325X", "MI355X"] | None = None
    """Restrict to nodes with this AMD Instinct model, matched on the node labeller's `amd.com/gpu.device-id` label."""
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] = {}
    """Extra node labels every instance requires."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = []
    """Tolerations for tainted GPU nodes."""
    pair_colocation: Literal["SameNodeWhenFits", "SameTopologyDomain", "None"] = "SameNodeWhenFits"
    """Keep a pair's instances together: on one node when the pair fits (1P+1D at 4 GPUs each on an 8-GPU node), else
    within `pairTopologyKey`."""
    pair_topology_key: LabelKey = "topology.kubernetes.io/zone"
    """Node label naming the domain a pair stays inside when it cannot share a node."""
    spread_topology_key: LabelKey = "topology.kubernetes.io/zone"
    """Node label across which pairs are spread evenly."""
    priority_class_name: Annotated[str, Field(max_length=253, pattern=PRIORITY_CLASS_PATTERN)] | None = None
    """PriorityClass for instance pods."""
    gpu_budget: Annotated[int, Field(ge=1, le=65_536)] | None = None
    """GPU budget checked at admission: maxPairs (or replicas when autoscaling is off) × GPUs per pair must fit.
    The operator does not count rollout surge against it."""
    rdma: RdmaResource | None = None
    """RDMA device resource for KV transfer; also adds the IPC_LOCK capability."""


# --- admission and routing -------------------------------------------------------------------


class AdmissionSpec(ApiModel):
    """Per-instance limits: engine flags plus the router's fast-reject rule (a full instance rejects at once)."""

    max_in_flight: Annotated[int, Field(ge=1, le=4096)] = 64
    """Most requests an instance runs at once (vLLM `--max-num-seqs`)."""
    max_queued: Annotated[int, Field(ge=1, le=4096)] = 8
    """Requests an instance may queue before the router treats it as full and walks to the next pair."""
    max_kv_cache_utilization_percent: Annotated[int, Field(ge=1, le=100)] = 95
    """KV-cache utilization above which the router treats an instance as full."""
    reject_status: Literal[429, 503] = 429
    """HTTP status of a fast reject."""


class RoutingSpec(ApiModel):
    """Hash-bias routing: requests that start alike go to the same pair, so prefixes hit local GPU memory."""

    prefix_chars: Annotated[int, Field(ge=1, le=65_536)] = 1000
    """How many leading prompt characters the router hashes to pick a pair. It must reach past shared system prompts."""
    load_bound_percent: Annotated[int, Field(ge=100, le=1000)] = 125
    """A pair loaded above this percent of the mean is skipped (consistent hashing with bounded loads; 125 = 1.25 ×
    mean)."""
    max_walk: Annotated[int, Field(ge=1, le=64)] = 4
    """How many pairs the router tries (fast rejects) before it queues at the least-loaded one or returns the reject
    status."""


class MooncakeRef(ApiModel):
    """A MooncakeCache in the same namespace."""

    name: DnsLabel
    """Name of the MooncakeCache."""


class KvCacheSpec(ApiModel):
    """Local prefix caching and the shared Mooncake tier."""

    local_prefix_caching: bool = True
    """vLLM automatic prefix caching on each instance (local GPU memory)."""
    mooncake_ref: MooncakeRef | None = None
    """Shared KV cache to back local misses; Tandem injects its connector config, config file and PYTHONHASHSEED."""


# --- autoscaling -----------------------------------------------------------------------------


class SloTargets(ApiModel):
    """Service-level targets the autoscaler keeps. Unset targets are not used."""

    ttft_p95_ms: Annotated[int, Field(ge=1, le=600_000)] | None = None
    """Time to first token, 95th percentile, in milliseconds (e.g. 1000)."""
    tpot_p90_ms: Annotated[int, Field(ge=1, le=10_000)] | None = None
    """Time per output token, 90th percentile, in milliseconds (16 ≈ 60 tokens/s per user)."""
    kv_cache_utilization_percent: Annotated[int, Field(ge=1, le=100)] | None = 80
    """Target mean KV-cache utilization of decode instances."""
    in_flight_per_instance: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Target requests running plus waiting per instance."""


class ScalingRule(ApiModel):
    """How fast the autoscaler may move in one direction (HPA `behavior` semantics)."""

    stabilization_window: Duration
    """The latency- and utilization-driven rule acts on the most conservative recommendation within this window.
    With a `capacityProfile` (work planning) the bound is the work instead: scale-down keeps the largest need seen
    within the capacity lead time, and this window only delays scale-down after an operator restart or an
    evaluation without work data."""
    period: Duration
    """Length of the period the step limits apply to."""
    max_pairs: Annotated[int, Field(ge=1, le=MAX_PAIRS)]
    """Most pairs added or removed per period."""
    max_percent: Annotated[int, Field(ge=1, le=1000)]
    """Most pairs added or removed per period as a percent of the current count; the larger of the two limits
    applies."""


class ScaleUpRule(ScalingRule):
    """Scale-up behaviour. Defaults follow HPA: act at once, up to max(4 pairs, +100 %) per 15 s."""

    stabilization_window: Duration = "0s"
    """The smallest recommendation within this window is used (0s: react to load at once). Not used by work
    planning (`capacityProfile`), which scales up to its forecast at once."""
    period: Duration = "15s"
    """Length of the period the step limits apply to."""
    max_pairs: Annotated[int, Field(ge=1, le=MAX_PAIRS)] = 4
    """Most pairs added per period."""
    max_percent: Annotated[int, Field(ge=1, le=1000)] = 100
    """Most pairs added per period as a percent of the current count; the larger of the two limits applies."""


class ScaleDownRule(ScalingRule):
    """Scale-down behaviour. Defaults are conservative: 5 min of stable low load, then 1 pair (or 10 %) a minute."""

    stabilization_window: Duration = "300s"
    """The largest recommendation within this window is used (a short dip never removes capacity). With work
    planning (`capacityProfile`) the largest need within the capacity lead time bounds scale-down instead, and
    this window only runs after an operator restart or an evaluation without work data."""
    period: Duration = "60s"
    """Length of the period the step limits apply to."""
    max_pairs: Annotated[int, Field(ge=1, le=MAX_PAIRS)] = 1
    """Most pairs removed per period."""
    max_percent: Annotated[int, Field(ge=1, le=1000)] = 10
    """Most pairs removed per period as a percent of the current count; the larger of the two limits applies."""


class RatioAdjustment(ApiModel):
    """Optional P:D adjustment when one role is the bottleneck, inside declared bounds."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "self.minPrefill <= self.maxPrefill", "ratio.minPrefill must be ≤ maxPrefill", field_path=".minPrefill"
            ),
            Rule("self.minDecode <= self.maxDecode", "ratio.minDecode must be ≤ maxDecode", field_path=".minDecode"),
        )
    }

    enabled: bool = False
    """Let the autoscaler change instances per role within the bounds below when one role stays the
    bottleneck for a dwell (the scale-down window): with autoscaling.capacityProfile, when the work's
    prefill need per decode need is more than the tolerance off the pool's P:D; without one, when one role's
    latency or KV pressure is at its target and the other's is not. One instance moves per change. A change is
    written to pairs.prefill/decode.instances (and replicas, keeping at least today's instances per role). It is
    not a new revision: new pair groups take the new P:D, and the groups built before are replaced one at a
    time, surge first, while the mix costs more than 15 % over the new P:D; no new P:D is chosen until then."""
    min_prefill: Annotated[int, Field(ge=1, le=16)] = 1
    """Fewest prefill instances per pair group."""
    max_prefill: Annotated[int, Field(ge=1, le=16)] = 1
    """Most prefill instances per pair group."""
    min_decode: Annotated[int, Field(ge=1, le=16)] = 1
    """Fewest decode instances per pair group."""
    max_decode: Annotated[int, Field(ge=1, le=16)] = 1
    """Most decode instances per pair group."""


class PrefillCapacityPoint(ApiModel):
    """One prefill instance's throughput at a mean prompt length (from a benchmark of this stack version)."""

    prompt_tokens: Annotated[int, Field(ge=1, le=10_000_000)]
    """Mean prompt length (total tokens, cached and uncached) the point was measured at."""
    uncached_tokens_per_second: Annotated[int, Field(ge=1, le=100_000_000)]
    """Uncached prompt tokens per second one prefill instance computes at that length."""


class DecodeCapacityPoint(ApiModel):
    """One decode instance's capacity at the TPOT target for a mean context."""

    context_tokens: Annotated[int, Field(ge=1, le=10_000_000)]
    """Mean context (prompt + half the output) the point was measured at."""
    streams: Annotated[int, Field(ge=1, le=4096)]
    """Concurrent sequences one decode instance holds within the TPOT target."""
    tokens_per_second: Annotated[int, Field(ge=1, le=100_000_000)]
    """Generated tokens per second of one decode instance at that batch."""


class CapacityProfileSpec(ApiModel):
    """What one instance of each role does at the SLO, for this pool's stack version. When set, the autoscaler
    plans pairs from the work (uncached prompt tokens/s, decode streams and tokens/s) with a queue model and a
    forecast over the load time, and uses measured SLO attainment to correct the model
    (docs/design/012-autoscaler.md); the latency and utilization targets are then reported, not scaled on.
    With ``learnFromEngines``, where the pool's own engines measure less than declared the lower figure is
    planned with; a measurement above the declared one is never trusted."""

    prefill: Annotated[list[PrefillCapacityPoint], Field(min_length=1, max_length=16)]
    """Prefill throughput by prompt length; interpolated linearly, clamped at the ends."""
    decode: Annotated[list[DecodeCapacityPoint], Field(min_length=1, max_length=16)]
    """Decode capacity by context; interpolated linearly, clamped at the ends."""
    load_time: Duration = "300s"
    """Time from scheduling a new instance to Ready (model load): how far ahead the autoscaler forecasts, and
    how long a need is kept before its capacity is released."""
    attainment_percent: Annotated[int, Field(ge=50, le=100)] = 99
    """Share of requests that must meet their TTFT budget (1 s up to 8k prompt tokens, 3 s at 262k, linear
    between) and the TPOT target; rejected and timed-out requests count as misses."""
    burst_headroom_percent: Annotated[int, Field(ge=0, le=400)] = 20
    """Capacity kept above the forecast need for bursts shorter than the load time."""
    ttft_overhead_ms: Annotated[int, Field(ge=0, le=10_000)] = 50
    """Time to first token outside prefill (routing, P→D transfer, first decode step)."""
    learn_from_engines: bool = False
    """Lower the profile where the pool's engines measure less (prefill tokens per second of prefill phase,
    decode streams at the TPOT target from the mean inter-token latency); never raise it. Off by default: a
    prefill phase shared by batched prompts measures slower than the instance is, so an accurate profile would
    be lowered and the pool over-provisioned (docs/design/012-autoscaler.md)."""


class AutoscalingSpec(ApiModel):
    """SLO-driven scaling of whole pair groups."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule("self.minPairs <= self.maxPairs", "autoscaling.minPairs must be ≤ maxPairs", field_path=".minPairs")
        )
    }

    enabled: bool = False
    """When false, pairs.replicas is left to the user, HPA or KEDA (scale subresource)."""
    min_pairs: Annotated[int, Field(ge=0, le=MAX_PAIRS)] = 1
    """Fewest pair groups."""
    max_pairs: Annotated[int, Field(ge=0, le=MAX_PAIRS)] = 8
    """Most pair groups."""
    interval: Duration = "30s"
    """How often the autoscaler evaluates."""
    tolerance_percent: Annotated[int, Field(ge=0, le=100)] = 10
    """No change while every metric is within this percent of its target."""
    targets: SloTargets = SloTargets()
    """The SLO targets."""
    scale_up: ScaleUpRule = ScaleUpRule()
    """Scale-up behaviour; fields left out keep the scale-up defaults."""
    scale_down: ScaleDownRule = ScaleDownRule()
    """Scale-down behaviour; fields left out keep the scale-down defaults."""
    ratio: RatioAdjustment = RatioAdjustment()
    """Optional P:D ratio adjustment."""
    ttft_service_bound_in_flight_percent: Annotated[int, Field(ge=0, le=100_000)] = 50
    """A TTFT breach while prefill instances hold fewer than this many requests in flight (running plus
    waiting, percent of one request; 50 = 0.5) is service-time bound: long uncached prompts, no queue that
    more pairs would shorten. Such a breach then neither adds pairs nor vetoes a scale-down, and the status
    says HoldTTFTServiceBound. 0 turns the rule off (every TTFT breach scales up)."""
    capacity_profile: CapacityProfileSpec | None = None
    """Plan from the work with this capacity profile (queue model, forecast, attainment); unset keeps the
    latency- and utilization-driven rule."""


# --- rollout ---------------------------------------------------------------------------------

# Any valid values do: admission checks where the variables stand, not what they become.
_SAMPLE_QUERY_VARS = QueryVars(namespace="default", pool="pool", revision="r0")

GateTemplate = Literal["TTFTP90", "TTFTP95", "TokensPerSecondPerUser", "TPOTP90", "ErrorRate", "LocalKVHitRatio"]
GATE_TEMPLATES: tuple[str, ...] = get_args(GateTemplate)
NORMALIZABLE_TEMPLATES: tuple[str, ...] = ("TTFTP90", "TTFTP95")
"""Templates ``compare.normalize: UncachedPromptTokens`` applies to: TTFT is where prefill work shows. The API
server's rule, ``tandem validate`` and the query builder (``tandem.core.promql``) all read this one list."""
GatePreset = Literal["ttft-p90", "ttft-p95", "tokens-per-user", "tpot-p90", "errors", "local-kv-hits"]


DEFAULT_MIN_SAMPLES = 20
"""Requests a gate needs per window: about where the rank-sum test's normal approximation holds, and one
request can move an error rate by at most 5 %."""


class GateComparison(ApiModel):
    """A statistical test of the canary against stable over the same window (docs/design/009-canary-statistics.md).

    ErrorRate: Fisher's exact test of the error counts. Latency templates: a rank-sum test over the histogram
    buckets plus a test of the means from `_sum/_count`. One-sided: a canary that is better never fails.
    """

    confidence_percent: Annotated[float, Field(ge=50, le=99.99)] = 99
    """Confidence that the canary is worse before the gate fails (99 = 1 % false alarms per evaluation; decimals
    allowed, 99.9 = 0.1 %). Every evaluation is a new look at the data, so keep it high. A TTFT mean over the few
    dozen requests of one canary pair is heavy-tailed: at 99, W5's good canaries on one pair failed 2.7 % of their
    TTFT looks and 2.3 % of their tokens-per-user looks (docs/design/009); the examples' latency gates ask 99.9."""
    max_mean_ratio_percent: Annotated[int, Field(ge=100, le=1000)] = 110
    """Latency templates only: a significant slowdown fails only when the canary's mean latency exceeds stable's
    by more than this (110 = 10 % slower), so a large stable arm cannot fail a tiny shift."""
    min_power_percent: Annotated[int, Field(ge=0, le=99)] = 0
    """Power floor: a "not worse" result counts as a Success only when the window's test had at least this chance
    (percent) of flagging a canary worse by the effect size — stable's error rate + `errorIncreasePermille`, or a
    mean `maxMeanRatioPercent` of stable's; below it the verdict is NoData (Underpowered), so a step cannot pass on
    windows too small to see a bad version; a step whose traffic never gets there holds until `noDataDeadline` and
    then applies `onNoData`. With `window: Step` the power grows with the step. 0 turns the floor off. An ErrorRate
    Step gate's power is Wald's acceptance bound, so the floor is the most a canary worse by the effect size may pass
    a step with: 80 lets one in five through, 99 one in a hundred, and a good canary then needs about ln(100)/KL
    requests (≈ 1,000 on stable's 0.5 % at +1 point): size `noDataDeadline` to that at the step's traffic. A canary
    worse by about half the effect can leave Wald's test undecided; once a single test of the step's canary requests
    would have this power (≈ 2,300 requests on 0.5 % at 99), that test decides instead. Latency power is a lower
    bound (it counts only the mean test, with a bucket-based variance bound)."""
    error_increase_permille: Annotated[int, Field(ge=1, le=1000)] = 10
    """ErrorRate only: the rise in error rate the power is computed for, in per mille of requests (10 = +1
    percentage point over stable's rate)."""
    normalize: Literal["None", "UncachedPromptTokens"] = "None"
    """TTFT templates only. UncachedPromptTokens: compare the canary's TTFT per uncached prompt token — stable's
    mean is scaled by how many more prompt tokens per request the canary's prefill instances did not find in their
    prefix cache (vLLM's `prefix_cache_queries` − `prefix_cache_hits`, never scaled below 1), and only the mean test
    decides. A new canary pair's cache is cold, and its slice of the key ring may hold longer prompts: neither is the
    new version's doing, and both make it slower per request. A version that breaks prefix caching is then the
    `LocalKVHitRatio` gate's to catch. With ten or more stable pairs whose counters answer per `pair` label, stable's
    side is instead the line through its pairs' mean TTFT against their uncached tokens per request, at the canary's
    own work (only inside the stable pairs' range, and never above the scaled mean); where the KV connector's
    `external_prefix_cache_hits` answer too, the line prices the tokens fetched from the shared tier apart from those
    prefilled (a fetched token costs between nothing and a computed one). Counters absent or unusable: compared
    unscaled (docs/design/009)."""
    min_ratio_percent: Annotated[int, Field(ge=1, le=100)] = 90
    """LocalKVHitRatio only: the share of stable's local prefix-hit ratio the canary may fall to (90 = 10 % fewer
    prompt tokens from its own cache). The gate fails when the canary's ratio is significantly below this share of
    stable's — a one-sided score test whose variance is bounded from the prefix-cache counters and the longest
    prompt the pool admits (`traffic.match.maxPromptTokens`, else `model.maxContextTokens`), so a window whose
    hits come from a few long prompts is not read as a regression (docs/design/009). Power is reported against a
    canary with no local hits at all (a broken prefix cache)."""
    window: Literal["Interval", "Step"] = "Interval"
    """Interval: each evaluation compares the last `interval`. Step: each evaluation compares everything since the
    step started (the first look is still at `initialDelay`), so evidence accumulates over the step (a small first
    exposure reaches a verdict); the confidence is then spent over the step's looks — look j tests at α/(j·(j+1)),
    which sums to α however long the step runs — so looking again at growing data adds no false alarms. ErrorRate
    gates instead run Wald's sequential test against stable's rate + `errorIncreasePermille` at the full α, valid at
    every look, which needs about two thirds of the canary requests to fail a bad version. A Step gate's Failure
    fails the step at once, whatever `failureLimit` says: its test already holds its confidence over every look,
    and the next look would only read the same requests again. Keep TTFT gates on Interval when canary caches
    start cold: a step window keeps the cold start in every look."""


GATE_PRESETS: dict[str, dict[str, Any]] = {
    "ttft-p90": {"template": "TTFTP90", "compare": {"normalize": "UncachedPromptTokens", "confidencePercent": 99.9}},
    "ttft-p95": {"template": "TTFTP95", "compare": {"normalize": "UncachedPromptTokens", "confidencePercent": 99.9}},
    "tokens-per-user": {"template": "TokensPerSecondPerUser", "compare": {"confidencePercent": 99.9}},
    "tpot-p90": {"template": "TPOTP90", "compare": {"confidencePercent": 99.9}},
    "errors": {"template": "ErrorRate", "compare": {}, "failureCondition": "result > 0.01"},
    "local-kv-hits": {"template": "LocalKVHitRatio", "compare": {}},
}
"""Named gates (``preset``): the write-up's gates as docs/design/009 tests them — latency and tokens/s compared
with stable (rank + mean tests at 99.9 %: one canary pair's mean is heavy-tailed; ≥ 10 % worse on average; TTFT
per uncached prompt token), errors by
Fisher's test above a 1 % floor, and the local hit ratio not significantly below 90 % of stable's (a score test
bounded by the pool's longest prompt; the warm-up's measure). Fields set on the gate win."""
NORMALIZABLE_PRESETS: tuple[str, ...] = tuple(
    name for name, gate in GATE_PRESETS.items() if gate["template"] in NORMALIZABLE_TEMPLATES
)


GateCondition = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        json_schema_extra=cel(
            Rule(f"self.matches('{cel_regex(CONDITION_PATTERN)}')", f"condition: must be {CONDITION_GRAMMAR}")
        ),
    ),
]
"""A gate condition in the regular subset of CEL the API server can check (celenv.CONDITION_PATTERN)."""


class MetricGate(ApiModel):
    """One Prometheus gate of the canary analysis."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "has(self.template) || has(self.query) || has(self.preset)",
                "analysis metric: query is required unless a template or preset is set",
                field_path=".query",
            ),
            Rule(
                "!has(self.query) || self.query.matches('\\\\S')",
                "analysis metric: query is required and may not be blank",
                field_path=".query",
            ),
            Rule(
                "has(self.successCondition) || has(self.failureCondition) || has(self.compare) || has(self.preset)",
                "analysis metric: a condition is required (successCondition or failureCondition) unless compare is set",
            ),
            Rule(
                "!has(self.compare) || has(self.template) || (has(self.preset) && !has(self.query))",
                "analysis metric: compare needs a template (TTFTP90, TTFTP95, TPOTP90, TokensPerSecondPerUser, "
                "ErrorRate, LocalKVHitRatio): its counts are what is compared",
                field_path=".compare",
            ),
            Rule(
                "!has(self.compare) || !has(self.compare.normalize) || self.compare.normalize == 'None' || "
                f"(has(self.template) && self.template in {cel_list(NORMALIZABLE_TEMPLATES)}) || "
                "(!has(self.template) && !has(self.query) && has(self.preset) && "
                f"self.preset in {cel_list(NORMALIZABLE_PRESETS)})",
                "analysis metric: compare.normalize: UncachedPromptTokens applies to TTFT templates only "
                f"({', '.join(NORMALIZABLE_TEMPLATES)})",
                field_path=".compare.normalize",
            ),
            Rule(
                "!(has(self.template) && has(self.query))",
                "analysis metric: set template or query, not both",
                field_path=".query",
            ),
            Rule(
                "!has(self.failureLimit) || !has(self.compare) || !has(self.compare.window) || "
                "self.compare.window != 'Step'",
                "analysis metric: failureLimit has no use on a compare.window: Step gate (its Failure fails the step "
                "at once: its test holds its confidence over every look)",
                field_path=".failureLimit",
            ),
        )
    }

    name: DnsLabel
    """Gate name, shown in status verdicts."""
    preset: GatePreset | None = None
    """A named gate (template, comparison and conditions of docs/design/009); fields set here override it."""
    template: GateTemplate | None = None
    """A built-in query on vLLM metric names (see docs/design/001-api.md). `result` is in seconds, tokens/s or a 0-1
    ratio."""
    query: (
        Annotated[
            str,
            Field(
                max_length=4096,
                json_schema_extra=cel(
                    Rule(
                        f"self.matches('{cel_regex(QUERY_VARIABLES_PATTERN)}')",
                        "query: variables are written ${name}, name one of "
                        + ", ".join(VARIABLES)
                        + " (a $ followed by a letter, _ or { must start one)",
                    )
                ),
            ),
        ]
        | None
    ) = None
    """PromQL with variables `${pool}`, `${namespace}`, `${revision}`, `${role}`, `${interval}`; must return one
    series."""
    role: Literal["prefill", "decode", "any"] = "any"
    """Role the `${role}` variable selects."""
    success_condition: GateCondition | None = None
    """CEL over `result` (the canary's value) and `baseline` (the same query on the stable revision), e.g. `result <=
    1.0`."""
    failure_condition: GateCondition | None = None
    """CEL that marks a Failure, e.g. `result > baseline * 1.2`. With only a failureCondition, anything else is a
    Success."""
    min_samples: Annotated[int, Field(ge=0, le=10_000_000)] = DEFAULT_MIN_SAMPLES
    """Fewest canary requests in the window (and stable requests, with `compare`) for a verdict; fewer give NoData
    (TooFewSamples), never a Failure. Counted from the template's request counter (the histogram's `_count`, or
    `vllm:request_success_total`); a gate with its own `query` has no counter and ignores it. 0 turns it off."""
    compare: GateComparison | None = None
    """Compare the canary with stable statistically. With a condition as well, the gate fails only when both say
    so: the condition is then an absolute floor (e.g. `result > 0.01` for errors)."""
    failure_limit: Annotated[int, Field(ge=-1, le=100)] | None = None
    """Failed evaluations of this gate tolerated in a step, counted apart from the other gates; one more triggers the
    failure action (-1: this gate never does). Unset: the gate shares `analysis.failureLimit` with the other gates
    without one (an evaluation with any of their Failures counts once). For a gate whose rare false alarms come in
    a heavier tail than its test assumes: on W5, TTFT gates of canaries as fast as stable failed 2.7 % of their
    looks at 99 %, and two such Failures in a long first step, or one beside another gate's, rolled back a good
    version; a TTFT regression fails most of its looks and pays one or two more of them (docs/design/009). Not on a
    `compare.window: Step` gate, whose Failure fails the step at once."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        """A preset fills the fields the gate leaves unset (a query replaces the preset's template)."""
        if not isinstance(data, dict) or data.get("preset") not in GATE_PRESETS:
            return data
        base = dict(GATE_PRESETS[data["preset"]])
        if "query" in data:
            base.pop("template", None)
            base.pop("compare", None)
        snake = {"successCondition": "success_condition", "failureCondition": "failure_condition"}
        base = {k: v for k, v in base.items() if snake.get(k, k) not in data}
        return {**base, **data}

    @field_validator("query")
    @classmethod
    def _query_renders(cls, value: str | None, info: ValidationInfo) -> str | None:
        """At admission, a query whose variables cannot be rendered (unknown ``${name}``, ``$pool``, ``${pool}``
        outside a quoted matcher) is refused; at run time it would pause the rollout with InvalidQuery."""
        if value is not None and value.strip() and admission_checks(info):
            try:
                render_query(value, _SAMPLE_QUERY_VARS)
            except QueryRenderError as exc:
                raise PydanticCustomError(ADMISSION_ERROR, "{problem}", {"problem": str(exc)}) from None
        return value

    @field_validator("success_condition", "failure_condition")
    @classmethod
    def _condition_compiles(cls, value: str | None, info: ValidationInfo) -> str | None:
        """At admission, a condition that would only fail at run time (pausing the rollout) is refused."""
        if value is not None and admission_checks(info):
            problem = condition_problem(value)
            if problem is not None:
                raise PydanticCustomError(ADMISSION_ERROR, "{problem}", {"problem": problem})
        return value


class EvalGate(ApiModel):
    """A Job that runs an eval (e.g. tool-call exact match) against the canary revision."""

    image: Annotated[str, Field(max_length=512, json_schema_extra=image_field("eval.image"))]
    """Eval image pinned by digest."""
    command: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=16)] = []
    """Container command."""
    args: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=32)] = []
    """Container args. The canary's endpoints arrive in env `TANDEM_TARGET_URLS`."""
    env: Annotated[
        list[EnvVar],
        Field(
            max_length=32,
            json_schema_extra=cel(
                Rule(
                    "self.all(e, !e.name.startsWith('TANDEM_'))",
                    "eval.env: TANDEM_* variables (TANDEM_TARGET_URLS, TANDEM_MODEL...) are set by Tandem and may "
                    "not be overridden: the eval must test the canary",
                )
            ),
        ),
    ] = []
    """Extra environment (not `TANDEM_*`: Tandem sets the target, model, revision and pool)."""
    min_score_percent: Annotated[int, Field(ge=0, le=100)]
    """Lowest passing score in percent. The Job reports `{"score": <percent>}` as its termination message."""
    deadline: Duration = "20m"
    """How long the Job may run; past it the eval is an Error."""


class WarmUp(ApiModel):
    """Hold cache-sensitive gates while the canary's prefix cache is cold (docs/design/009, "Cold caches").

    New canary pairs start with an empty prefix cache: their TTFT and local hit ratio are worse than a warm
    stable's for reasons that say nothing about the new version. While the canary's local prefix-hit ratio
    (the `LocalKVHitRatio` gate's value) is below `hitRatioPercent` % of stable's, and the step started less
    than `maxDuration` ago, a Failure of the `LocalKVHitRatio` gate becomes NoData `WarmingUp`, and so does a
    TTFT Failure the extra cache misses explain: a canary whose TTFT ratio to stable exceeds its ratio of
    uncached prompt tokens, (1 − canary hits)/(1 − stable hits), times the gate's `maxMeanRatioPercent`
    (110 % without compare), is slower per uncached token and fails at once. Error and decode-speed gates
    are judged throughout: a cold cache does not cause errors or slower decoding.
    """

    hit_ratio_percent: Annotated[int, Field(ge=50, le=100)] = 90
    """The canary is warm once its local prefix-hit ratio reaches this percent of stable's."""
    max_duration: Duration = "5m"
    """A canary that has not warmed up this long after the step started is judged anyway (a version that
    breaks prefix caching must not hide behind its own cold cache). The bound of every hold; a slow TTFT the
    misses do not explain is not held at all."""


class AnalysisSpec(ApiModel):
    """How canary gates are evaluated (Argo/Flagger vocabulary)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "duration(self.timeout) < duration(self.interval)",
                "analysis.timeout must be shorter than interval",
                field_path=".timeout",
            ),
            Rule(
                "duration(self.noDataDeadline) >= duration(self.interval)",
                "analysis.noDataDeadline must be at least interval",
                field_path=".noDataDeadline",
            ),
        )
    }

    prometheus_address: (
        Annotated[
            str,
            Field(
                max_length=512,
                json_schema_extra=cel(
                    Rule(
                        "isURL(self) && url(self).getScheme() in ['http', 'https']",
                        "analysis.prometheusAddress must be an http(s) URL",
                    ),
                    Rule(
                        f"!self.matches('{URL_PASSWORD_PATTERN.replace(chr(92), chr(92) * 2)}')",
                        "analysis.prometheusAddress may not carry a password (user:password@); the operator's "
                        "Prometheus credentials come from its Secret",
                    ),
                ),
            ),
        ]
        | None
    ) = None
    """Prometheus (one deduplicating endpoint) to query; defaults to the operator's setting."""
    interval: Duration = "30s"
    """Time between evaluations of every gate."""
    timeout: Duration = "10s"
    """Timeout of one query; must be shorter than interval."""
    initial_delay: Duration = "60s"
    """Wait after a step starts before its first evaluation (canary caches are cold): Interval gates count
    samples from then on; `compare.window: Step` gates count the whole step from its start."""
    success_streak: Annotated[int, Field(ge=1, le=100)] = 3
    """Consecutive Successes of every gate needed to pass an analysis step."""
    failure_limit: Annotated[int, Field(ge=-1, le=100)] = 0
    """Failed evaluations tolerated in a step; one more triggers the failure action. An evaluation counts once
    however many gates failed in it; gates with their own `failureLimit` are counted apart. A Failure of a
    `compare.window: Step` gate triggers it at once (its test is valid at every look). -1 disables."""
    no_data_deadline: Duration = "10m"
    """How long NoData or Error may last before `onNoData` is applied. A gate below its `minPowerPercent` is NoData
    until its step has had enough traffic: size this to the time a small first step takes to gather it."""
    on_no_data: Literal["Pause", "Rollback"] = "Pause"
    """What to do at the NoData deadline: Pause (hold, Warning Event) or Rollback."""
    metrics: Annotated[
        list[MetricGate],
        Field(
            max_length=16,
            json_schema_extra=cel(
                Rule(
                    "self.all(g, self.filter(x, x.name == g.name).size() == 1)",
                    "analysis.metrics: gate names must be unique (steps and status verdicts refer to gates by name)",
                )
            ),
        ),
    ] = []
    """Metric gates; names are unique."""
    eval: EvalGate | None = None
    """Eval gate, run in analysis steps that ask for it."""
    warm_up: WarmUp | None = None
    """Hold TTFT and hit-ratio Failures while the canary's prefix cache is colder than stable's; needs a
    `LocalKVHitRatio` gate (its value and stable's are the measure). Unset: no warm-up beyond initialDelay."""


class PauseStep(ApiModel):
    """Hold the rollout."""

    duration: Duration | None = None
    """How long to hold; unset holds until `tandem rollout promote` skips the step."""


class AnalysisStep(ApiModel):
    """Run gates until they pass (successStreak) or fail (failureLimit)."""

    metrics: Annotated[list[DnsLabel], Field(max_length=16)] = []
    """Names of the gates to run; empty runs every metric gate."""
    eval: bool = False
    """Also run the eval gate."""


class RolloutStep(ApiModel):
    """One rollout step with exactly one action."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "[has(self.setWeight), has(self.setCanaryPairs), has(self.setMirrorPairs), has(self.pause),"
                " has(self.analysis)].filter(x, x).size() == 1",
                "each rollout step must have exactly one action: setWeight, setCanaryPairs, setMirrorPairs, pause"
                " or analysis",
            )
        )
    }

    set_weight: Annotated[int, Field(ge=1, le=100)] | None = None
    """Give the canary this percent of traffic and ⌈percent × replicas⌉ pairs. 100 promotes. With surge
    capacity the new percent is published once all the step's pairs are Ready (before, the previous step's)."""
    set_canary_pairs: Annotated[int, Field(ge=1, le=MAX_PAIRS)] | None = None
    """Run this many canary pairs; traffic follows their share of serving pairs."""
    set_mirror_pairs: Annotated[int, Field(ge=1, le=MAX_PAIRS)] | None = None
    """Run this many canary pairs that answer no user: the router sends each a copy of the requests whose keys it
    would own by pair count (a stable pair's share) and discards the copy's answer, so the gates measure the new
    revision on real traffic while no user is served by it. Mirror steps come before every setWeight and
    setCanaryPairs step. A copy is sent only when the canary pair has room (it never delays or fails the user's
    request) and costs that pair's GPUs; mirror only requests that may be processed twice (completions without side
    effects)."""
    pause: PauseStep | None = None
    """Hold, for a duration or until resumed."""
    analysis: AnalysisStep | None = None
    """Evaluate gates."""


_WEIGHTS = "self.filter(s, has(s.setWeight)).map(s, s.setWeight)"
_CANARY = "self.filter(s, has(s.setCanaryPairs)).map(s, s.setCanaryPairs)"
_MIRROR = "self.filter(s, has(s.setMirrorPairs)).map(s, s.setMirrorPairs)"
_SETS = "self.filter(s, has(s.setMirrorPairs) || has(s.setWeight) || has(s.setCanaryPairs))"


class RolloutSpec(ApiModel):
    """Staged canary rollout of a new stack revision, promoted or rolled back on its own from metrics."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "!(self.maxSurge == 0 && self.maxUnavailable == 0)",
                "rollout.maxSurge and rollout.maxUnavailable cannot both be 0",
                field_path=".maxSurge",
            ),
            Rule(
                "has(self.analysis.eval) || !self.steps.exists(s, has(s.analysis) && s.analysis.eval)",
                "rollout.steps: an analysis step asks for the eval gate but rollout.analysis.eval is not set",
                field_path=".steps",
            ),
            Rule(
                "self.steps.all(s, !has(s.analysis) || "
                "s.analysis.metrics.all(m, self.analysis.metrics.exists(g, g.name == m)))",
                "rollout.steps: an analysis step names a metric that rollout.analysis.metrics does not define",
                field_path=".steps",
            ),
        )
    }

    steps: Annotated[
        list[RolloutStep],
        Field(
            min_length=1,
            max_length=20,
            json_schema_extra=cel(
                Rule(
                    f"{_WEIGHTS}.isSorted() && {_WEIGHTS}.all(w, {_WEIGHTS}.filter(x, x == w).size() == 1)",
                    "rollout.steps: setWeight values must strictly increase",
                ),
                Rule(
                    f"{_CANARY}.isSorted() && {_CANARY}.all(w, {_CANARY}.filter(x, x == w).size() == 1)",
                    "rollout.steps: setCanaryPairs values must strictly increase",
                ),
                Rule(
                    f"{_MIRROR}.isSorted() && {_MIRROR}.all(w, {_MIRROR}.filter(x, x == w).size() == 1)",
                    "rollout.steps: setMirrorPairs values must strictly increase",
                ),
                Rule(
                    f"{_SETS}.map(s, has(s.setMirrorPairs) ? 0 : 1).isSorted()",
                    "rollout.steps: every setMirrorPairs step must come before the first setWeight or setCanaryPairs"
                    " step (a mirror answers no user, so it cannot follow a step whose canary already serves)",
                ),
            ),
        ),
    ] = [RolloutStep(set_weight=100)]
    """Steps, in order. The default replaces pairs capacity-first with no gates."""
    max_surge: Annotated[int, Field(ge=0, le=MAX_PAIRS)] = 1
    """Pairs that may exist above pairs.replicas during a rollout (new pairs come up before old ones go)."""
    max_unavailable: Annotated[int, Field(ge=0, le=MAX_PAIRS)] = 0
    """Pairs that may be below pairs.replicas during a rollout."""
    progress_deadline: Duration = "30m"
    """A setWeight, setCanaryPairs or setMirrorPairs step whose canary gains no Ready pair for this long (e.g.
    canary pods never get Ready) triggers the failure action. Size it to at least a model load; a large step moves
    maxSurge pairs at a time."""
    failure_action: Literal["Rollback", "Pause"] = "Rollback"
    """What a failed gate or a missed deadline does."""
    paused: bool = False
    """Hold the rollout where it is (`tandem rollout pause|resume`)."""
    analysis: AnalysisSpec = AnalysisSpec()
    """Gate definitions and their evaluation settings."""


# --- the spec --------------------------------------------------------------------------------

_GPUS_PER_PAIR = (
    "(self.pairs.prefill.instances * self.pairs.prefill.gpusPerInstance"
    " + self.pairs.decode.instances * self.pairs.decode.gpusPerInstance)"
)


class InferencePoolSpec(ApiModel):
    """Desired state of an InferencePool: one model, one traffic class, N prefill/decode pair groups."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "!self.autoscaling.enabled || "
                "(self.pairs.replicas >= self.autoscaling.minPairs"
                " && self.pairs.replicas <= self.autoscaling.maxPairs)",
                "pairs.replicas must be within autoscaling.minPairs..maxPairs when autoscaling is enabled",
                field_path=".pairs.replicas",
            ),
            Rule(
                "self.rollout.maxUnavailable == 0 || self.pairs.replicas == 0 "
                "|| self.rollout.maxUnavailable < self.pairs.replicas",
                "rollout.maxUnavailable must be less than pairs.replicas (a rollout would take every pair down)",
                field_path=".rollout.maxUnavailable",
            ),
            Rule(
                "!has(self.placement.gpuBudget) || "
                "(self.autoscaling.enabled ? self.autoscaling.maxPairs : self.pairs.replicas)"
                f" * {_GPUS_PER_PAIR} <= self.placement.gpuBudget",
                "pairs × GPUs per pair exceeds gpuBudget (placement.gpuBudget)",
                field_path=".placement.gpuBudget",
            ),
        )
    }

    model: ModelSpec
    """The model: served name, weights source, quantization, context length."""
    traffic: TrafficSpec = TrafficSpec()
    """Traffic class and router match rules."""
    stack: StackSpec
    """Engine image, flags and env. A change is a new revision and starts a rollout."""
    pairs: PairsSpec = PairsSpec()
    """How many pair groups and their xPyD shape."""
    placement: PlacementSpec = PlacementSpec()
    """GPU resource, node selection, pair co-location and spread."""
    admission: AdmissionSpec = AdmissionSpec()
    """Per-instance in-flight and queue limits."""
    routing: RoutingSpec = RoutingSpec()
    """Hash-bias routing parameters."""
    kv_cache: KvCacheSpec = KvCacheSpec()
    """Local prefix caching and the shared Mooncake tier."""
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    """SLO-driven scaling of pair groups."""
    rollout: RolloutSpec = RolloutSpec()
    """Canary rollout of new stack revisions."""

    @property
    def longest_prompt(self) -> int:
        """The longest prompt the pool's instances see: `traffic.match.maxPromptTokens` (the router classifies by
        it), never above `model.maxContextTokens` (vLLM refuses longer). It bounds the variance of the
        `LocalKVHitRatio` comparison (docs/design/009)."""
        bound = self.traffic.match.max_prompt_tokens
        return min(bound, self.model.max_context_tokens) if bound is not None else self.model.max_context_tokens


__all__ = [
    "GATE_TEMPLATES",
    "GPU_PRODUCTS",
    "MAX_PAIRS",
    "NORMALIZABLE_TEMPLATES",
    "AdmissionSpec",
    "AnalysisSpec",
    "AnalysisStep",
    "AutoscalingSpec",
    "EvalGate",
    "GateComparison",
    "InferencePoolSpec",
    "KvCacheSpec",
    "KvTransfer",
    "MetricGate",
    "ModelSpec",
    "PairsSpec",
    "PauseStep",
    "PlacementSpec",
    "RatioAdjustment",
    "RoleOverride",
    "RoleShape",
    "RolloutSpec",
    "RolloutStep",
    "RoutingSpec",
    "ScaleDownRule",
    "ScaleUpRule",
    "ScalingRule",
    "SloTargets",
    "StackSpec",
    "TrafficMatch",
    "TrafficSpec",
]
