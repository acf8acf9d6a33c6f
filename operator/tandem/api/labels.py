"""Names, labels and annotations of everything Tandem creates: part of the API contract.

What it owns: the label keys users and routers select on, the annotation keys Tandem reads, and the
derived object names (each checked against the 63-character limit). Pool names are at most 40
characters (a CRD rule), which keeps every derived name within the limit:

    <pool>-p<index>-<role>-<i>    speed-p12-prefill-0  (40 + 2 + 3 + 8 + 3 = 56 at worst)
    <pool>-routing                speed-routing
    <pool>-rev-<revision>         speed-rev-7f3a9c2e1b
    <pool>-engines                speed-engines        (headless Service)

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final, Literal

from tandem import GROUP

Role = Literal["prefill", "decode"]
ROLES: Final[tuple[Role, Role]] = ("prefill", "decode")

LABEL_POOL: Final = f"{GROUP}/pool"
LABEL_PAIR: Final = f"{GROUP}/pair"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_REVISION: Final = f"{GROUP}/revision"
LABEL_INSTANCE: Final = f"{GROUP}/instance"
LABEL_SHAPE: Final = f"{GROUP}/shape"
"""The pair group's shape on each of its pods (``2p1d``: 2 prefill + 1 decode instances), for people and selectors;
the planner reads the immutable ``TANDEM_PAIR_SHAPE`` env (``core.observed``), not the label."""
LABEL_COMPONENT: Final = f"{GROUP}/component"
LABEL_CACHE: Final = f"{GROUP}/cache"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_VERSION: Final = "app.kubernetes.io/version"
LABEL_INSTANCE_NAME: Final = "app.kubernetes.io/instance"
MANAGED_BY: Final = "tandem"

ANNOTATION_CONFIRM_DELETE: Final = f"{GROUP}/confirm-delete"
ANNOTATION_PROMOTE: Final = f"{GROUP}/promote"
ANNOTATION_ABORT: Final = f"{GROUP}/abort"
ANNOTATION_SIM_LOAD_SECONDS: Final = f"{GROUP}/sim-load-seconds"
ANNOTATION_EVAL_TARGET: Final = f"{GROUP}/eval-target"
"""On an eval Job: what its client calls, :data:`EVAL_TARGET_ROUTER` or :data:`EVAL_TARGET_DECODE_PODS`."""
EVAL_TARGET_ROUTER: Final = "router"
"""The eval runs through `tandem router` (the real P/D path), pinned to the canary by ``X-Tandem-Revision``."""
EVAL_TARGET_DECODE_PODS: Final = "decode-pods"
"""No router configured: the eval calls the canary's decode pods directly (each serves whole requests)."""
FINALIZER: Final = f"{GROUP}/finalizer"
FIELD_MANAGER: Final = "tandem-operator"

COMPONENT_ENGINE: Final = "engine"
COMPONENT_ROUTING: Final = "routing-table"
COMPONENT_REVISION: Final = "revision"
COMPONENT_EVAL: Final = "eval"

MAX_NAME_LENGTH: Final = 63

# AMD node labeller (ROCm/k8s-device-plugin) device ids per Instinct model: lower-case hex, no 0x.
LABEL_GPU_DEVICE_ID: Final = "amd.com/gpu.device-id"
GPU_DEVICE_IDS: Final = {"MI300X": "74a1", "MI325X": "74a5", "MI355X": "75a3"}


class NameTooLongError(ValueError):
    """A derived name would exceed the Kubernetes limit."""


def _checked(name: str) -> str:
    if len(name) > MAX_NAME_LENGTH:
        raise NameTooLongError(f"derived name {name!r} is longer than {MAX_NAME_LENGTH} characters")
    return name


def pair_id(pool: str, index: int) -> str:
    """Stable id of pair ``index`` of ``pool`` (label value and routing-table id)."""
    return _checked(f"{pool}-p{index}")


MAX_INSTANCES_PER_ROLE: Final = 16
"""The API's bound on ``pairs.{prefill,decode}.instances``."""


def shape_text(shape: tuple[int, int]) -> str:
    """A pair group's shape as its label and env write it: ``(2, 1)`` → ``2p1d``."""
    return f"{shape[0]}p{shape[1]}d"


def parse_shape(text: str | None) -> tuple[int, int] | None:
    """``2p1d`` → ``(2, 1)``; None for anything else, or counts outside the API's 1..16 (a pod with a forged or
    garbled value has no shape of its own: its group falls back to its revision's)."""
    if not text or not text.endswith("d") or text.count("p") != 1:
        return None
    prefill, decode = text[:-1].split("p")
    if not (prefill.isdigit() and decode.isdigit()):
        return None
    shape = int(prefill), int(decode)
    return shape if all(1 <= n <= MAX_INSTANCES_PER_ROLE for n in shape) else None


def pod_name(pool: str, index: int, role: Role, instance: int) -> str:
    """Name of one instance pod. Stable: a replaced pod gets the same name (and the pair's revision)."""
    return _checked(f"{pool}-p{index}-{role}-{instance}")


def routing_configmap_name(pool: str) -> str:
    return _checked(f"{pool}-routing")


def revision_configmap_name(pool: str, revision: str) -> str:
    return _checked(f"{pool}-rev-{revision}")


def service_name(pool: str) -> str:
    return _checked(f"{pool}-engines")


def cache_client_configmap_name(cache: str) -> str:
    """ConfigMap holding the Mooncake client config file (mooncake.json) engines mount."""
    return _checked(f"{cache}-client")


def eval_job_name(pool: str, revision: str, step: int) -> str:
    return _checked(f"{pool}-eval-{revision}-s{step}")


def pool_selector(pool: str) -> dict[str, str]:
    """Labels that select every engine pod of a pool (the scale subresource's selector)."""
    return {LABEL_POOL: pool, LABEL_COMPONENT: COMPONENT_ENGINE}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
