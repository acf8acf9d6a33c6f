"""Offline validation of Tandem manifests: what `kubectl apply` would say, without a cluster.

What it owns: checking a manifest against the *generated* CRD schema, in the order the API server
does it, so `tandem validate` and the server agree on accept/reject:

1. structural defaulting (fill absent fields that have a `default`, recursively);
2. schema validation: types, required, enums, bounds, lengths, patterns, item/property counts,
   unknown fields (kubectl's strict field validation);
3. CEL `x-kubernetes-validations` at every node, with `oldSelf` when an old object is given
   (transition rules such as immutability only run on updates);
4. a final parse with the pydantic models (must succeed when 1-3 did; a failure is reported, since
   it would mean the models and the generated schema disagree).

Each error carries the field path (`spec.pairs.replicas`) and a message worded like the API
server's. Pure: no I/O beyond what callers pass in.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from tandem import API_VERSION
from tandem.api.base import ADMISSION_CONTEXT, ADMISSION_ERROR
from tandem.api.celenv import holds, pattern_matches
from tandem.api.crdgen import openapi_schema
from tandem.api.resources import KIND_BY_NAME, KindInfo


@dataclass(frozen=True)
class FieldError:
    """One problem, on one field."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@lru_cache(maxsize=8)
def _schema(kind: str) -> dict[str, Any]:
    return openapi_schema(KIND_BY_NAME[kind])


def kinds() -> Iterable[KindInfo]:
    return KIND_BY_NAME.values()


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: absent properties with a default get it, recursively (in place)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            for name, sub in props.items():
                if name not in value and "default" in sub:
                    value[name] = copy.deepcopy(sub["default"])
                if name in value:
                    apply_defaults(sub, value[name])
        elif isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                apply_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def _type_ok(expected: str | None, value: Any) -> bool:
    if expected is None:
        return True
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == "boolean":
        return isinstance(value, bool)
    return False


def _fmt(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _cel_type(value: Any) -> str:
    """The type name the API server prints for a value a CEL rule rejected."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check(schema: dict[str, Any], value: Any, path: str, errors: list[FieldError]) -> bool:
    """Schema checks for one node and its children; return False when the node's type is wrong."""
    expected = schema.get("type")
    if not _type_ok(expected, value):
        errors.append(FieldError(path, f"Invalid value: {_fmt(value)}: {path} in body must be of type {expected}"))
        return False
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_fmt(v) for v in schema["enum"])
        errors.append(FieldError(path, f"Unsupported value: {_fmt(value)}: supported values: {allowed}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(
                FieldError(
                    path,
                    f"Invalid value: {value}: {path} in body should be greater than or equal to {schema['minimum']}",
                )
            )
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(
                FieldError(
                    path, f"Invalid value: {value}: {path} in body should be less than or equal to {schema['maximum']}"
                )
            )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError(path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                FieldError(
                    path,
                    f"Invalid value: {_fmt(value)}: {path} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and not pattern_matches(schema["pattern"], value):
            errors.append(
                FieldError(path, f"Invalid value: {_fmt(value)}: {path} in body should match '{schema['pattern']}'")
            )
        if schema.get("format") == "date-time":
            try:
                dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                errors.append(
                    FieldError(path, f"Invalid value: {_fmt(value)}: {path} in body must be of type date-time")
                )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(FieldError(path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                FieldError(
                    path, f"Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items"
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _check(items, item, f"{path}[{i}]", errors)
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(
                FieldError(path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items")
            )
        props = schema.get("properties")
        if props is not None:
            for name in schema.get("required", []):
                if name not in value:
                    errors.append(FieldError(_join(path, name), "Required value"))
            for name, item in value.items():
                if name not in props:
                    errors.append(FieldError(_join(path, name), f'unknown field "{_join(path, name)}"'))
                elif item is None:
                    # A null is dropped by the API server for optional fields; required ones fail above.
                    continue
                else:
                    _check(props[name], item, _join(path, name), errors)
        elif isinstance(schema.get("additionalProperties"), dict):
            for name, item in value.items():
                _check(schema["additionalProperties"], item, f"{path}[{name}]", errors)
    return True


def _rules(schema: dict[str, Any], value: Any, old: Any, path: str, errors: list[FieldError]) -> None:
    """Evaluate CEL rules bottom-up (children first, as the API server reports them)."""
    if not _type_ok(schema.get("type"), value):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            for name, item in value.items():
                if name in props and item is not None:
                    old_item = old.get(name) if isinstance(old, dict) else None
                    _rules(props[name], item, old_item, _join(path, name), errors)
        elif isinstance(schema.get("additionalProperties"), dict):
            for name, item in value.items():
                old_item = old.get(name) if isinstance(old, dict) else None
                _rules(schema["additionalProperties"], item, old_item, f"{path}[{name}]", errors)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            # Items of atomic lists are not correlated with old items: no oldSelf for them.
            _rules(schema["items"], item, None, f"{path}[{i}]", errors)
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        transition = "oldSelf" in text
        if transition and old is None:
            continue
        variables: dict[str, Any] = {"self": value}
        if transition:
            variables["oldSelf"] = old
        if not holds(text, variables):
            field_path = rule.get("fieldPath", "")
            where = (path + field_path if path else field_path.lstrip(".")) if field_path else path
            shown = f'"{_cel_type(value)}"'
            errors.append(FieldError(where, f"Invalid value: {shown}: {rule['message']}"))


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# ObjectMeta fields a manifest may carry (strict field validation refuses any other).
_METADATA_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
# JSON types of the other ObjectMeta fields (the API server's decoder refuses anything else).
_METADATA_TYPES = {
    "selfLink": "string",
    "uid": "string",
    "resourceVersion": "string",
    "generation": "integer",
    "creationTimestamp": "string",
    "deletionTimestamp": "string",
    "deletionGracePeriodSeconds": "integer",
    "ownerReferences": "array",
    "managedFields": "array",
}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's total size limit for annotations


def json_value_errors(value: Any, path: str = "") -> list[FieldError]:
    """Values JSON (and so the API server) cannot carry: integers beyond int64, NaN/Inf, non-string keys."""
    errors: list[FieldError] = []
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, bool) or node is None or isinstance(node, str):
            continue
        if isinstance(node, int):
            if not INT64_MIN <= node <= INT64_MAX:
                errors.append(FieldError(where, f"Invalid value: {node}: integer beyond the int64 range"))
        elif isinstance(node, float):
            if not math.isfinite(node):
                errors.append(FieldError(where, f"Invalid value: {node}: not a finite number (JSON has no NaN or Inf)"))
        elif isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    errors.append(FieldError(where, f"Invalid value: {key!r}: object keys must be strings"))
                    continue
                stack.append((item, _join(where, key)))
        elif isinstance(node, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(node))
        else:
            errors.append(FieldError(where, f"Invalid value: a {type(node).__name__} has no JSON form"))
    return errors


def _qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a valid label/annotation key (Kubernetes IsQualifiedName), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return "prefix part must be non-empty"
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix part {_SUBDOMAIN_MSG}"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _QUALIFIED_NAME.fullmatch(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return None


def _string_map(meta: dict[str, Any], field: str, errors: list[FieldError]) -> dict[str, str]:
    value = meta.get(field)
    if value is None:
        return {}
    path = f"metadata.{field}"
    if not isinstance(value, dict):
        errors.append(FieldError(path, f"Invalid value: {_fmt(value)}: {path} must be an object of strings"))
        return {}
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str):
            errors.append(FieldError(f"{path}[{key}]", f"Invalid value: {_fmt(item)}: must be a string"))
            continue
        reason = _qualified_name_error(str(key))
        if reason:
            errors.append(FieldError(path, f"Invalid value: {_fmt(key)}: {reason}"))
        out[str(key)] = item
    return out


def metadata_errors(metadata: Any) -> list[FieldError]:
    """What the API server's ObjectMeta validation says about a namespaced object's metadata."""
    if metadata is None:
        return [FieldError("metadata.name", "Required value: name or generateName is required")]
    if not isinstance(metadata, dict):
        return [FieldError("metadata", f"Invalid value: {_fmt(metadata)}: metadata must be an object")]
    errors: list[FieldError] = []
    for key in metadata:
        if key not in _METADATA_FIELDS:
            errors.append(FieldError(f"metadata.{key}", f'unknown field "metadata.{key}"'))
    name = metadata.get("name")
    if name is None or name == "":
        if not metadata.get("generateName"):
            errors.append(FieldError("metadata.name", "Required value: name or generateName is required"))
    elif not isinstance(name, str):
        errors.append(FieldError("metadata.name", f"Invalid value: {_fmt(name)}: metadata.name must be a string"))
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        errors.append(FieldError("metadata.name", f"Invalid value: {_fmt(name)}: {_SUBDOMAIN_MSG}"))
    for field in ("generateName", "namespace"):
        value = metadata.get(field)
        if value is not None and not isinstance(value, str):
            errors.append(
                FieldError(f"metadata.{field}", f"Invalid value: {_fmt(value)}: metadata.{field} must be a string")
            )
    namespace = metadata.get("namespace")
    if isinstance(namespace, str) and namespace and (len(namespace) > 63 or not _DNS1123_LABEL.fullmatch(namespace)):
        errors.append(FieldError("metadata.namespace", f"Invalid value: {_fmt(namespace)}: {_LABEL_MSG}"))
    labels = _string_map(metadata, "labels", errors)
    for value in labels.values():
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f"Invalid value: {_fmt(value)}: a valid label value must be 63 characters or less and "
                    "must be empty or begin and end with an alphanumeric character",
                )
            )
    annotations = _string_map(metadata, "annotations", errors)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        errors.append(FieldError("metadata.annotations", f"Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"))
    for field, kind in _METADATA_TYPES.items():
        value = metadata.get(field)
        if value is not None and not _type_ok(kind, value):
            errors.append(FieldError(f"metadata.{field}", f"Invalid value: {_fmt(value)}: must be of type {kind}"))
    for field in ("creationTimestamp", "deletionTimestamp"):
        value = metadata.get(field)
        if isinstance(value, str) and not _RFC3339.fullmatch(value):
            errors.append(FieldError(f"metadata.{field}", f"Invalid value: {_fmt(value)}: not an RFC 3339 time"))
    finalizers = metadata.get("finalizers")
    if finalizers is not None and not (isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)):
        errors.append(FieldError("metadata.finalizers", "Invalid value: metadata.finalizers must be a list of strings"))
    return errors


def prune_nulls(value: Any) -> Any:
    """Drop null object fields, as the API server does for fields that are not nullable (none of ours are)."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def validate_object(obj: Any, old: dict[str, Any] | None = None) -> list[FieldError]:
    """Every error `kubectl apply` would report for ``obj`` (an update of ``old`` when given)."""
    if not isinstance(obj, dict):
        return [FieldError("", "a manifest must be a mapping")]
    kind = obj.get("kind")
    if kind not in KIND_BY_NAME:
        return [FieldError("kind", f"not a Tandem kind: {kind!r} (apiVersion {obj.get('apiVersion')!r})")]
    if obj.get("apiVersion") != API_VERSION:
        return [FieldError("apiVersion", f"not a Tandem version: {obj.get('apiVersion')!r} (kind {kind!r})")]
    value_errors = json_value_errors(obj)
    if value_errors:
        return value_errors
    meta_errors = metadata_errors(obj.get("metadata"))
    if meta_errors:
        return meta_errors
    info = KIND_BY_NAME[str(kind)]
    schema = _schema(info.kind)
    work = apply_defaults(schema, prune_nulls(obj))
    old_work = None
    if isinstance(old, dict) and not json_value_errors(old):
        old_work = apply_defaults(schema, prune_nulls(old))
    errors: list[FieldError] = []
    if not _check(schema, work, "", errors):
        return errors
    _rules(schema, work, old_work, "", errors)
    if not errors:
        try:
            info.resource_model.model_validate(work, context={ADMISSION_CONTEXT: True})
        except ValidationError as exc:
            for err in exc.errors():
                loc = _loc_path(err["loc"])
                if err["type"] == ADMISSION_ERROR:
                    # A check CEL in the CRD cannot make (the API server needs a webhook for it).
                    errors.append(FieldError(loc, f"Invalid value: {_fmt(err['input'])}: {err['msg']}"))
                else:
                    errors.append(FieldError(loc, f"models disagree with the schema: {err['msg']}"))
    return errors


def _loc_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: ``spec.rollout.analysis.metrics[2].successCondition``."""
    out = ""
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, part)
    return out
