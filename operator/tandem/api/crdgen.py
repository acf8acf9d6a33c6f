"""Generate the CustomResourceDefinitions from the pydantic models (the single source of the schema).

What it owns: turning pydantic JSON Schema into Kubernetes *structural* OpenAPI v3 schemas, and
assembling CRD manifests (names, printer columns, status and scale subresources, root CEL rules).

Rules of the conversion (each one is why a hand-written CRD would drift):
- ``$ref``/``allOf`` are inlined; ``X | None`` becomes an optional ``X`` (never ``nullable``);
- ``title`` is dropped; ``additionalProperties: false`` next to ``properties`` is dropped (the API
  server prunes and strict field validation rejects unknown fields anyway);
- model defaults are emitted as their wire form (camelCase, ``None`` omitted) so the API server's
  structural defaulting gives exactly the Python defaults;
- map key patterns (``propertyNames``, not structural) become a CEL rule on the map;
- only whitelisted keywords are emitted; anything else raises, so a new pydantic feature can never
  slip an invalid keyword into a CRD unnoticed;
- status schemas carry no defaults: the operator always writes status whole.

Output is deterministic (no timestamps, stable key order), so ``make verify`` can diff it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from tandem import GROUP, VERSION
from tandem.api.resources import KINDS, KindInfo

ALLOWED_KEYS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "enum",
        "default",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "additionalProperties",
        "format",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
_DROP = frozenset({"title"})
CRD_DIR = Path(__file__).resolve().parents[3] / "crds"


class SchemaError(ValueError):
    """The models use a construct that has no structural-schema equivalent."""


class _WireDefaults(GenerateJsonSchema):
    """Render model defaults the way they travel on the wire (aliases, no nulls)."""

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, BaseModel):
            return dft.model_dump(by_alias=True, exclude_none=True, mode="json")
        if isinstance(dft, list) and any(isinstance(x, BaseModel) for x in dft):
            return [x.model_dump(by_alias=True, exclude_none=True, mode="json") for x in dft]
        return super().encode_default(dft)


def model_schema(model: type[BaseModel], *, with_defaults: bool = True) -> dict[str, Any]:
    """The structural OpenAPI schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_WireDefaults)
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, with_defaults=with_defaults, path=model.__name__)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Merge a ``$ref`` (or single-element ``allOf``) target with the keywords beside it."""
    node = dict(node)
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError("allOf with more than one schema is not structural")
        node = {**parts[0], **node}
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        rules = target.get("x-kubernetes-validations", []) + node.pop("x-kubernetes-validations", [])
        target.update(node)
        if rules:
            target["x-kubernetes-validations"] = rules
        node = target
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any], *, with_defaults: bool, path: str) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"{path}: unions other than `X | None` are not structural")
        inner = _resolve(options[0], defs)
        rules = inner.get("x-kubernetes-validations", []) + node.pop("x-kubernetes-validations", [])
        inner.update({k: v for k, v in node.items() if not (k == "default" and v is None)})
        if rules:
            inner["x-kubernetes-validations"] = rules
        node = inner
        if "$ref" in node or "allOf" in node:
            node = _resolve(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "default":
            if value is None or not with_defaults:
                continue
            out["default"] = value
            continue
        if key == "properties":
            out["properties"] = {
                name: _convert(sub, defs, with_defaults=with_defaults, path=f"{path}.{name}")
                for name, sub in value.items()
            }
            continue
        if key == "items":
            out["items"] = _convert(value, defs, with_defaults=with_defaults, path=f"{path}[]")
            continue
        if key == "additionalProperties":
            if value is False:
                continue
            if not isinstance(value, dict):
                raise SchemaError(f"{path}: additionalProperties must be a schema")
            out["additionalProperties"] = _convert(value, defs, with_defaults=with_defaults, path=f"{path}{{}}")
            continue
        if key == "patternProperties":
            if len(value) != 1:
                raise SchemaError(f"{path}: maps need exactly one key pattern")
            ((pattern, sub),) = value.items()
            limit = node.get("propertyNames", {}).get("maxLength")
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(pattern, limit, path))
            out["additionalProperties"] = _convert(sub, defs, with_defaults=with_defaults, path=f"{path}{{}}")
            continue
        if key == "propertyNames":
            continue  # folded into the patternProperties rule above
        if key == "description":
            out["description"] = " ".join(str(value).split())  # docstrings wrap; kubectl explain re-wraps
            continue
        if key not in ALLOWED_KEYS:
            raise SchemaError(f"{path}: keyword {key!r} is not emitted into CRDs")
        out[key] = value
    if "properties" in out:
        out.pop("additionalProperties", None)
        out.setdefault("type", "object")
    if "enum" in out and "type" not in out:
        out["type"] = "integer" if all(isinstance(v, int) for v in out["enum"]) else "string"
    if "x-kubernetes-validations" in node and "x-kubernetes-validations" in out:
        # keep model-level rules before field-level ones, deduplicated, order-stable
        seen: list[dict[str, Any]] = []
        for rule in out["x-kubernetes-validations"]:
            if rule not in seen:
                seen.append(rule)
        out["x-kubernetes-validations"] = seen
    return out


def _key_rule(pattern: str, limit: int | None, path: str) -> dict[str, str]:
    if not limit:
        raise SchemaError(f"{path}: map keys need a maxLength")
    escaped = pattern.replace("\\", "\\\\").replace("'", "\\'")
    field = path.rsplit(".", 1)[-1]
    return {
        "rule": f"self.all(k, k.size() <= {limit} && k.matches('{escaped}'))",
        "message": f"{field}: every key must be a valid label key",
    }


def openapi_schema(info: KindInfo) -> dict[str, Any]:
    """The whole object's ``openAPIV3Schema`` for one kind."""
    spec = model_schema(info.spec_model)
    status = model_schema(info.status_model, with_defaults=False)
    spec.pop("default", None)
    schema: dict[str, Any] = {
        "type": "object",
        "description": info.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this representation of an object.",
            },
            "kind": {
                "type": "string",
                "description": "Kind is a string value representing the REST resource this object represents.",
            },
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if info.root_rules:
        schema["x-kubernetes-validations"] = [r.as_dict() for r in info.root_rules]
    return schema


def build_crd(info: KindInfo) -> dict[str, Any]:
    """One CustomResourceDefinition manifest."""
    subresources: dict[str, Any] = {"status": {}}
    if info.scale:
        subresources["scale"] = dict(info.scale)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": info.crd_name,
            "labels": {"app.kubernetes.io/name": "tandem", "app.kubernetes.io/part-of": "tandem"},
            # Helm must never delete CRDs (deleting one cascades to every pool and pod).
            "annotations": {"helm.sh/resource-policy": "keep"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": list(info.categories),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema(info)},
                    "subresources": subresources,
                    "additionalPrinterColumns": [c.as_dict() for c in info.printer_columns],
                }
            ],
        },
    }


def crd_filename(info: KindInfo) -> str:
    return f"{GROUP}_{info.plural}.yaml"


def render_crd(info: KindInfo) -> str:
    header = "# Generated by `tandem crds` from tandem.api (pydantic models). Do not edit: run `make generate`.\n"
    return header + yaml.safe_dump(build_crd(info), sort_keys=False, width=120, allow_unicode=True)


def render_all() -> dict[str, str]:
    """File name → content for every CRD."""
    return {crd_filename(info): render_crd(info) for info in KINDS}


def write_all(directory: Path = CRD_DIR) -> list[Path]:
    """Write every CRD into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        target = directory / name
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def drift(directory: Path = CRD_DIR) -> list[str]:
    """Names of committed CRD files that differ from the generator's output (or are missing/extra)."""
    expected = render_all()
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name}: differs from the models")
    for path in sorted(directory.glob("*.yaml")):
        if path.name not in expected:
            problems.append(f"{path.name}: not generated by tandem crds")
    return problems
