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
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from tandem import API_VERSION
from tandem.api.celenv import holds
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
        if "pattern" in schema and not re.search(schema["pattern"], value):
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


def validate_object(obj: Any, old: dict[str, Any] | None = None) -> list[FieldError]:
    """Every error `kubectl apply` would report for ``obj`` (an update of ``old`` when given)."""
    if not isinstance(obj, dict):
        return [FieldError("", "a manifest must be a mapping")]
    kind = obj.get("kind")
    if obj.get("apiVersion") != API_VERSION or kind not in KIND_BY_NAME:
        return [FieldError("", f"not a Tandem object: apiVersion {obj.get('apiVersion')!r} kind {kind!r}")]
    info = KIND_BY_NAME[str(kind)]
    schema = _schema(info.kind)
    work = apply_defaults(schema, copy.deepcopy(obj))
    old_work = apply_defaults(schema, copy.deepcopy(old)) if old is not None else None
    errors: list[FieldError] = []
    metadata = work.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        errors.append(FieldError("metadata.name", "Required value: name or generateName is required"))
        return errors
    if not _check(schema, work, "", errors):
        return errors
    _rules(schema, work, old_work, "", errors)
    if not errors:
        try:
            info.resource_model.model_validate(work)
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                errors.append(FieldError(loc, f"models disagree with the schema: {err['msg']}"))
    return errors
