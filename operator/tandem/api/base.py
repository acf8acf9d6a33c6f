"""Building blocks shared by every v1alpha1 model: the base model, CEL rules and bounded scalar types.

What it owns: the conventions that make pydantic models the single source of the CRD schema.

- Python names are snake_case, wire names camelCase (an alias generator), unknown fields are
  rejected (``extra="forbid"`` mirrors the API server's strict field validation), and each field's
  docstring becomes its ``description`` (``use_attribute_docstrings``), which ``kubectl explain``
  prints. A field without a docstring fails the generator's test.
- CEL rules are attached with :func:`cel` as ``x-kubernetes-validations``; the generator copies them
  into the CRD verbatim and ``tandem validate`` evaluates the very same rules offline.
- Every string, list and map is bounded (style.md, testing.md B-22): the bounded aliases below are
  the only way models declare them, and the generator test fails on an unbounded one.

It must not import kopf, kubernetes or any client: it is imported by pure code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo
from pydantic.alias_generators import to_camel

from tandem.api.quantity import MAX_DURATION, parse_duration_ns

# Go-style durations the API server's CEL ``duration()`` accepts ("30s", "5m", "1h30m", "500ms").
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
# Kubernetes resource quantities ("64Gi", "500m", "1.5T"); exponent forms are not accepted here.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
# RFC 1123 label, used for names of things Tandem derives object names from.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes label key (optional DNS prefix + name) and value.
# The name part is at most 63 characters (pod creation checks it; the prefix only as a whole, <= 253).
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A container image pinned by digest (a tag may precede the digest for readability).
DIGEST_IMAGE_PATTERN = r"^[^@\s]+@sha256:[a-f0-9]{64}$"
# A valid image reference (the distribution reference grammar) pinned by digest: an optional registry host
# (it has a dot or a port, or is localhost), lowercase path components, an optional tag, then the digest.
# What the kubelet would fail to pull is refused here, not at pod creation.
_REF_HOST_PART = r"([a-zA-Z0-9]|[a-zA-Z0-9][-a-zA-Z0-9]*[a-zA-Z0-9])"
_REF_HOST = rf"(localhost|{_REF_HOST_PART}(\.{_REF_HOST_PART})+|{_REF_HOST_PART}(\.{_REF_HOST_PART})*:[0-9]+)"
_REF_PATH_PART = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_REF_TAG = r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
IMAGE_REFERENCE_PATTERN = rf"^({_REF_HOST}/)?{_REF_PATH_PART}(/{_REF_PATH_PART})*{_REF_TAG}@sha256:[a-f0-9]{{64}}$"
PRIORITY_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, min_length=1, max_length=63)]
ShortText = Annotated[str, Field(max_length=256)]
Text = Annotated[str, Field(max_length=1024)]
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=317)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


def cel_regex(pattern: str) -> str:
    """A regex as the body of a single-quoted CEL string literal (backslashes doubled)."""
    return pattern.replace("\\", "\\\\")


def cel_list(items: tuple[str, ...]) -> str:
    """A CEL list literal of plain string constants (names with no quote or backslash to escape)."""
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def image_field(name: str) -> dict[str, Any]:
    """Schema extras for an image field: a valid reference pinned by digest, one message naming the field."""
    return cel(
        Rule(
            f"self.matches('{cel_regex(IMAGE_REFERENCE_PATTERN)}')",
            f"{name} must be a valid image reference pinned by digest (registry/repository[:tag]@sha256:<64 hex>, "
            "lowercase repository)",
        )
    )


@dataclass(frozen=True)
class Rule:
    """One CEL validation rule as the API server runs it (``x-kubernetes-validations`` entry).

    ``message`` must name the field it is about: it is what ``kubectl apply`` prints.
    ``field_path`` (a JSONPath relative to the node, e.g. ``.minPairs``) makes the API server report
    the error on that field instead of on the object holding the rule.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


def cel(*rules: Rule, **extra: Any) -> dict[str, Any]:
    """Schema extras carrying CEL rules (plus any other ``x-kubernetes-*`` keys given as ``extra``)."""
    out: dict[str, Any] = {"x-kubernetes-validations": [r.as_dict() for r in rules]} if rules else {}
    for key, value in extra.items():
        out[key.replace("_", "-")] = value
    return out


def immutable(name: str) -> dict[str, Any]:
    """Schema extras for a field that may not change once set (a transition rule)."""
    return cel(Rule("self == oldSelf", f"{name} is immutable", reason="FieldValueForbidden"))


def _go_duration(value: str) -> str:
    """Refuse a duration Go cannot hold (the CRD rule below does the same in the API server)."""
    parse_duration_ns(value)
    return value


Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=32,
        # Beyond Go's int64 nanoseconds duration() itself fails: the API server then reports
        # "... evaluating rule: <message>", so the message shows either way.
        json_schema_extra=cel(
            Rule(
                f"duration(self) <= duration('{MAX_DURATION}')",
                f"must be a duration of at most {MAX_DURATION} (Go's limit, about 292 years)",
            )
        ),
    ),
    AfterValidator(_go_duration),
]


# Quantities stay below 2^63 (bytes or cores): what an int64 field of a pod, a Mooncake flag or a JSON
# config can carry. The pattern alone lets 32 digits of exabytes through.
MAX_QUANTITY = "8Ei"
Quantity = Annotated[
    str,
    Field(
        pattern=QUANTITY_PATTERN,
        max_length=32,
        json_schema_extra=cel(
            Rule(f"quantity(self).isLessThan(quantity('{MAX_QUANTITY}'))", f"must be less than {MAX_QUANTITY}")
        ),
    ),
]


# A size or CPU amount that must be above zero (a zero segment, memory limit or CPU makes the pod or the
# Mooncake flag meaningless or refused later).
PositiveQuantity = Annotated[
    str,
    Field(
        pattern=QUANTITY_PATTERN,
        max_length=32,
        json_schema_extra=cel(
            Rule(f"quantity(self).isLessThan(quantity('{MAX_QUANTITY}'))", f"must be less than {MAX_QUANTITY}"),
            Rule("quantity(self).isGreaterThan(quantity('0'))", "must be greater than 0"),
        ),
    ),
]


# Validation context key that turns on the checks only admission can make (a gate condition that does not
# compile...). Off when the operator parses a stored object: the API server accepted it, so refusing it
# there would stop every reconcile of the pool instead of pausing one rollout step.
ADMISSION_CONTEXT = "tandem.dev/admission"
ADMISSION_ERROR = "admission"


def admission_checks(info: ValidationInfo) -> bool:
    """True when a validator runs for ``tandem validate`` (admission), not for the operator's parse."""
    return isinstance(info.context, dict) and bool(info.context.get(ADMISSION_CONTEXT))


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected, docstrings documented."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
        validate_default=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as it is sent to the API server: camelCase keys, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
