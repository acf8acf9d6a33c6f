"""Types shared by both kinds: conditions, env vars, secret references, tolerations, resources.

What it owns: the small shapes that appear in several places of the API, each bounded and
documented once. Nothing here knows about pools or caches.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from tandem.api.base import (
    ENV_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    ApiModel,
    LabelKey,
    PositiveQuantity,
    Rule,
    cel,
    cel_list,
    cel_regex,
)

DnsSubdomain = Annotated[
    str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", max_length=253)
]

# Env var names Tandem sets itself; a user value would break cross-instance KV hits or the wiring.
RESERVED_ENV = (
    "PYTHONHASHSEED",
    "MOONCAKE_CONFIG_PATH",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT",
    "MOONCAKE_REQUESTER_LOCAL_HOSTNAME",
    "VLLM_HOST_IP",
    "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "HF_HOME",
    "HF_TOKEN_PATH",
    "TANDEM_POOL",
    "TANDEM_PAIR",
    "TANDEM_ROLE",
    "TANDEM_REVISION",
)


# Variables that make the loader or interpreter run code from outside the image (LD_* too, by prefix).
INJECTION_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "BASH_ENV",
    "ENV",
)
# Env names that hold credentials: a literal value there would sit in the spec, in every revision
# snapshot and in `kubectl get -o yaml`; it must come from valueFrom.secretKeyRef (security.md S-SEC-03).
SECRET_ENV_NAME_PATTERN = r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|APIKEY|CREDENTIALS?)(_|$)"
# A URL whose user-info carries a password (scheme://user:password@host).
URL_PASSWORD_PATTERN = r"^[A-Za-z][-A-Za-z0-9+.]*://[^/@\s]*:[^/@\s]*@"


class SecretKeyRef(ApiModel):
    """A key of a Secret in the pool's own namespace. The kubelet reads it; Tandem never does."""

    name: DnsSubdomain
    """Name of the Secret, in the same namespace as the object that refers to it."""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    """Key within the Secret."""


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from when it is not a literal."""

    secret_key_ref: SecretKeyRef
    """Read the value from a Secret key (tokens and credentials belong here, never in `value`)."""


class EnvVar(ApiModel):
    """One environment variable for the engine container."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "has(self.value) != has(self.valueFrom)",
                "env: set exactly one of value or valueFrom",
            ),
            Rule(
                "!(self.name in " + str(list(RESERVED_ENV)).replace('"', "'") + ")",
                "env: this variable is set by Tandem and may not be overridden",
                field_path=".name",
            ),
            Rule(
                f"!self.name.startsWith('LD_') && !(self.name in {cel_list(INJECTION_ENV)})",
                "env: this variable loads code from outside the image (LD_*, PYTHONPATH...) and is not allowed",
                field_path=".name",
            ),
            Rule(
                f"!has(self.value) || self.value == '' || !self.name.matches('{cel_regex(SECRET_ENV_NAME_PATTERN)}')",
                "env: a token, key, secret or password may not be a literal value: use valueFrom.secretKeyRef",
                field_path=".value",
            ),
        )
    }

    name: Annotated[str, Field(pattern=ENV_NAME_PATTERN, min_length=1, max_length=128)]
    """Variable name."""
    value: Annotated[str, Field(max_length=4096)] | None = None
    """Literal value. Do not put secrets here: use valueFrom.secretKeyRef."""
    value_from: EnvVarSource | None = None
    """Take the value from a Secret key in the same namespace."""


class Resources(ApiModel):
    """CPU and memory for one container. GPUs are not set here: they follow `gpusPerInstance`."""

    cpu: PositiveQuantity | None = None
    """CPU request and limit, e.g. `32`. Defaults to the operator's per-role default."""
    memory: PositiveQuantity | None = None
    """Memory request and limit, e.g. `512Gi`. Defaults to the operator's per-role default."""


class Toleration(ApiModel):
    """A toleration added to the pods Tandem creates (for tainted GPU nodes).

    The rules are the ones pod creation applies (a toleration it refuses would only fail later, when the
    operator creates the pods)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            Rule(
                "has(self.key) || self.operator == 'Exists'",
                "tolerations: operator must be Exists when key is empty",
                field_path=".operator",
            ),
            Rule(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "tolerations: value must be empty when operator is Exists",
                field_path=".value",
            ),
            Rule(
                f"!has(self.value) || self.value.matches('{cel_regex(LABEL_VALUE_PATTERN)}')",
                "tolerations: value must be a valid label value",
                field_path=".value",
            ),
            Rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerations: tolerationSeconds needs effect NoExecute",
                field_path=".tolerationSeconds",
            ),
        )
    }

    key: LabelKey | None = None
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal (compare `value`)."""
    value: Annotated[str, Field(max_length=63)] | None = None
    """Taint value for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all effects."""
    toleration_seconds: Annotated[int, Field(ge=0, le=86400)] | None = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


class Condition(ApiModel):
    """A status condition in the `metav1.Condition` shape."""

    type: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=64)]
    """Condition type in PascalCase, e.g. Ready, Progressing, Degraded."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The .metadata.generation the condition was computed from."""
    last_transition_time: datetime
    """When the status last flipped; unchanged while only reason or message change."""
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=128)]
    """A PascalCase, machine-readable reason for the last transition."""
    message: Annotated[str, Field(max_length=1024)] = ""
    """A human-readable explanation (bounded)."""


ConditionList = Annotated[
    list[Condition],
    Field(
        max_length=16,
        json_schema_extra=cel(x_kubernetes_list_type="map", x_kubernetes_list_map_keys=["type"]),
    ),
]
