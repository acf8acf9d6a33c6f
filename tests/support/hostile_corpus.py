"""A seeded generator of hostile manifests (issue 19 classes 1-5): mutations of the examples, driven by field paths.

Shared by the offline test (``tandem validate`` alone, tests/unit/api) and the contract test (the same
corpus against the real API server, tests/contract), so both judge the very same manifests.

How it works: each example is defaulted the way the API server defaults it, then walked together with the
generated CRD schema. Every field is classified by what its schema says (a duration rule, a quantity
rule, an image rule, an env list, an engine-args list, a toleration list, a label-key map, a gate
condition...), so a new field of a known kind is mutated without editing this file. Each *family* below
turns one classified field into hostile values and says which field path a refusal must name. Cross-field
families (replicas against autoscaling bounds, GPU budget, maxUnavailable, duplicate gate names, ...) name
their fields directly. The corpus is a stratified seeded sample: every family is represented, the total is
bounded, and the same seed gives the same corpus.

Nothing here decides what is valid: the expectations are the issue's classes, and the two judges are
``tandem validate`` and the API server.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tandem.api.base import LABEL_KEY_PATTERN
from tandem.api.crdgen import openapi_schema
from tandem.api.resources import KIND_BY_NAME
from tandem.api.validate import apply_defaults

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEFAULT_SEED = 19
DEFAULT_PER_FAMILY = 14
"""Mutants drawn per field family (cross-field and document families keep all theirs): a few hundred."""
DIGEST = "@sha256:" + "a" * 64


@dataclass(frozen=True)
class Mutant:
    """One hostile manifest and the field a refusal must name."""

    id: str
    klass: int
    """Issue 19's class (1 engine args/env and secrets, 2 cross-field, 3 overflow, 4 gates, 5 document)."""
    obj: dict[str, Any]
    field: str
    """Field path ``tandem validate`` must report an error on (``spec.stack.env[1].name``)."""
    server_says: str
    """Text the API server's refusal must contain: the field path, except for apiVersion/kind (kubectl
    names them in its own words before any request)."""


# --- the examples and their fields ----------------------------------------------------------------


@cache
def _examples() -> tuple[tuple[str, dict[str, Any]], ...]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") in KIND_BY_NAME:
                out.append((path.stem, doc))
    return tuple(out)


@cache
def _schema(kind: str) -> dict[str, Any]:
    return openapi_schema(KIND_BY_NAME[kind])


@dataclass(frozen=True)
class Field:
    """A field of an example (after defaulting) and its schema."""

    example: str
    path: tuple[str | int, ...]
    schema: dict[str, Any]
    value: Any


def render(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else part)
    return out


def _walk(example: str, schema: dict[str, Any], value: Any, path: tuple[str | int, ...]) -> Iterator[Field]:
    """Fields present in ``value``, plus absent optional ones the mutation can create: scalars, lists and
    objects with no required field (an absent object with required fields would need more than one field)."""
    yield Field(example, path, schema, value)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        for name, sub in schema["properties"].items():
            if name in value:
                yield from _walk(example, sub, value[name], (*path, name))
            elif sub.get("type") == "object" and not sub.get("required") and "properties" in sub:
                yield from _walk(example, sub, {}, (*path, name))
            elif sub.get("type") != "object":
                yield Field(example, (*path, name), sub, None)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _walk(example, schema["items"], item, (*path, i))


@cache
def fields() -> tuple[Field, ...]:
    out: list[Field] = []
    for name, doc in _examples():
        schema = _schema(doc["kind"])
        defaulted = apply_defaults(schema, copy.deepcopy(doc))
        out.extend(f for f in _walk(name, schema, defaulted, ()) if f.path[:1] == ("spec",))
    return tuple(out)


def _rules(schema: dict[str, Any]) -> str:
    return " ".join(r["rule"] + " " + r["message"] for r in schema.get("x-kubernetes-validations", []))


def _item_props(schema: dict[str, Any]) -> set[str]:
    items = schema.get("items")
    return set(items.get("properties", {})) if isinstance(items, dict) else set()


CLASSIFIERS: dict[str, Callable[[Field], bool]] = {
    "duration": lambda f: "duration(self) <=" in _rules(f.schema),
    "quantity": lambda f: "isLessThan(quantity('8Ei'))" in _rules(f.schema),
    "positive": lambda f: "isGreaterThan(quantity('0'))" in _rules(f.schema),
    "image": lambda f: "valid image reference" in _rules(f.schema),
    "label-key": lambda f: f.schema.get("pattern") == LABEL_KEY_PATTERN,
    "label-map": lambda f: "valid label key" in _rules(f.schema),
    "env-list": lambda f: f.schema.get("type") == "array" and {"name", "value", "valueFrom"} <= _item_props(f.schema),
    "args-list": lambda f: (
        f.schema.get("type") == "array"
        and f.schema.get("items", {}).get("type") == "string"
        and "set by Tandem" in _rules(f.schema.get("items", {}))
    ),
    "toleration-list": lambda f: (
        f.schema.get("type") == "array" and {"key", "operator", "effect"} <= _item_props(f.schema)
    ),
    "condition": lambda f: "condition: must be" in _rules(f.schema),
    "secret-url": lambda f: "may not carry a password" in _rules(f.schema),
    "pattern": lambda f: f.schema.get("type") == "string" and "pattern" in f.schema,
}


def fields_of(kind: str) -> list[Field]:
    return [f for f in fields() if CLASSIFIERS[kind](f)]


# --- mutation --------------------------------------------------------------------------------------


def _set(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    """Set ``path`` in ``obj``; a missing parent is taken from the defaulted object (a list the API server
    would default, such as the default rollout steps) or created empty."""
    defaulted = apply_defaults(_schema(obj["kind"]), copy.deepcopy(obj))
    node: Any = obj
    shadow: Any = defaulted
    for part in path[:-1]:
        if not isinstance(part, int) and part not in node:
            node[part] = copy.deepcopy(shadow[part]) if isinstance(shadow, dict) and part in shadow else {}
        node = node[part]
        shadow = shadow[part] if isinstance(shadow, dict | list) and _has(shadow, part) else None
    node[path[-1]] = value


def _has(node: dict[str, Any] | list[Any], part: str | int) -> bool:
    return part in node if isinstance(node, dict) else isinstance(part, int) and part < len(node)


def _example(name: str) -> dict[str, Any]:
    for stem, doc in _examples():
        if stem == name:
            return copy.deepcopy(doc)
    raise KeyError(name)


def _get(obj: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def _defaulted(name: str) -> dict[str, Any]:
    doc = _example(name)
    return apply_defaults(_schema(doc["kind"]), doc)  # type: ignore[no-any-return]


Candidate = tuple[int, str, dict[str, Any], str, str]
"""(class, example, object, field path, text the server must say)."""
Family = Callable[[random.Random], Iterator[Candidate]]


def _field_family(
    klass: int, kind: str, values: Callable[[random.Random, Field], Iterator[tuple[Any, tuple[str | int, ...]]]]
) -> Family:
    """A family over every field of one classification: ``values`` yields (new value, field path suffix)."""

    def family(rng: random.Random) -> Iterator[Candidate]:
        for f in fields_of(kind):
            for value, suffix in values(rng, f):
                obj = _example(f.example)
                _set(obj, f.path, value)
                where = render((*f.path, *suffix))
                yield klass, f.example, obj, where, where

    return family


def _with_hostile_item(rng: random.Random, benign: list[Any], hostile: Any) -> tuple[list[Any], int]:
    items = list(benign)
    index = rng.randint(0, len(items))
    items.insert(index, hostile)
    return items, index


BENIGN_ARGS = ["--enable-chunked-prefill", "--max-num-batched-tokens=8192", "--disable-log-requests"]
MANAGED_ARGS = [
    "--port=9000",
    "--port 9000",
    "--served-model-name=x",
    "--served_model_name",
    "--kv-transfer-config={}",
    "-tp=2",
    "--max_num_seqs=4",
    "--model=/tmp/m",
    "--host=0.0.0.0",
    "--tensor-parallel-size",
]
DANGEROUS_ARGS = ["--trust-remote-code", "--trust_remote_code=True", "--middleware=x.y", "--api-key=abc", "--hf-token"]
BENIGN_ENV = [{"name": "VLLM_ROCM_USE_AITER", "value": "1"}, {"name": "OMP_NUM_THREADS", "value": "8"}]
MANAGED_ENV = ["PYTHONHASHSEED", "MOONCAKE_CONFIG_PATH", "TANDEM_POOL", "VLLM_HOST_IP", "HF_HOME"]
DANGEROUS_ENV = ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV"]
SECRET_ENV = ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "OPENAI_API_KEY", "GITHUB_TOKEN"]


def _args(pool: list[str]) -> Callable[[random.Random, Field], Iterator[tuple[Any, tuple[str | int, ...]]]]:
    def values(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
        for hostile in rng.sample(pool, 2):
            items, i = _with_hostile_item(rng, rng.sample(BENIGN_ARGS, rng.randint(0, 2)), hostile)
            yield items, (i,)

    return values


def _env(
    names: list[str], suffix: str
) -> Callable[[random.Random, Field], Iterator[tuple[Any, tuple[str | int, ...]]]]:
    def values(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
        for name in rng.sample(names, 2):
            hostile = {"name": name, "value": rng.choice(["1", "x", "hf_abcdef"])}
            items, i = _with_hostile_item(rng, rng.sample(BENIGN_ENV, rng.randint(0, 2)), hostile)
            yield items, (i, suffix)

    return values


def _pick(
    options: list[Any], k: int = 2
) -> Callable[[random.Random, Field], Iterator[tuple[Any, tuple[str | int, ...]]]]:
    def values(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
        for v in rng.sample(options, min(k, len(options))):
            yield v, ()

    return values


BAD_DURATIONS = ["2562048h", "99999999999999h", "9223372037s", "2562047h47m17s", "106751d", "153722867281m"]
BAD_QUANTITIES = ["8Ei", "9Ei", "9999999999999999E", "9" * 31, "10000P"]
ZERO_QUANTITIES = ["0", "0Gi", "0.0", "0m"]
BAD_IMAGES = [
    "UPPER/engine" + DIGEST,
    "ghcr.io/x::tag" + DIGEST,
    "ghcr.io/a b" + DIGEST,
    "ghcr.io/x@sha256:abc",
    "ghcr.io/x:latest",
    "/engine" + DIGEST,
    "ghcr.io/-x" + DIGEST,
    "ghcr.io/x:" + "t" * 129 + DIGEST,
]
BAD_LABEL_KEYS = ["-x", "a" * 64, "Example.com/x", "x/", "a/b/c", "ex_ample.com/x", "example.com/" + "n" * 64]
BAD_TOLERATIONS: list[tuple[dict[str, Any], str]] = [
    ({"key": "amd.com/gpu", "operator": "Exists", "value": "x", "effect": "NoSchedule"}, "value"),
    (
        {"key": "amd.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule", "tolerationSeconds": 5},
        "tolerationSeconds",
    ),
    ({"operator": "Equal", "value": "x"}, "operator"),
    ({"key": "amd.com/gpu", "operator": "Equal", "value": "-bad value-"}, "value"),
    ({"key": "-gpu", "operator": "Exists"}, "key"),
]
BAD_CONDITIONS = [
    "result <=",
    "latency > 1.0",
    "result * 2.0",
    "result <= 1",
    "size(result) > 1.0",
    "'fast'",
    "result > 1.0 && foo",
    "result <= 1.0 ||",
    "result <= (1.0)",
    "result\u00a0<= 1.0",
]
BAD_QUERIES = ['sum(x{pool="${pol}"})', 'sum(x{pool="$pool"})', 'sum(x{pool="${pool"})', 'x{ns="${NAMESPACE}"}']
SECRET_URLS = {
    "model.source": ["s3://AKIAEXAMPLE:secret@models/q", "hf://u:p@Qwen/Q"],
    "prometheusAddress": ["https://a:b@prometheus:9090", "http://reader:pw@p/"],
    "connString": ["redis://u:pw@redis:6379", "etcd://root:x@etcd-0:2379"],
}


def _secret_urls(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    for key, values in SECRET_URLS.items():
        if render(f.path).endswith(key):
            yield rng.choice(values), ()


def _tolerations(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    for hostile, suffix in rng.sample(BAD_TOLERATIONS, 2):
        items, i = _with_hostile_item(rng, [{"key": "ok", "operator": "Exists"}] * rng.randint(0, 1), hostile)
        yield items, (i, suffix)


def _label_maps(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    for key in rng.sample(BAD_LABEL_KEYS, 2):
        yield {"good": "x", key: "v"}, ()


# --- cross-field families (class 2), named directly -------------------------------------------------


def _pools() -> list[str]:
    return [name for name, doc in _examples() if doc["kind"] == "InferencePool"]


def _caches() -> list[str]:
    return [name for name, doc in _examples() if doc["kind"] == "MooncakeCache"]


def _cross(rng: random.Random) -> Iterator[Candidate]:
    for name in _pools():
        base = _defaulted(name)
        gpus = sum(
            base["spec"]["pairs"][r]["instances"] * base["spec"]["pairs"][r]["gpusPerInstance"]
            for r in ("prefill", "decode")
        )
        # replicas outside [minPairs, maxPairs] while autoscaling is on
        obj = _example(name)
        lo, hi = rng.randint(1, 4), rng.randint(5, 20)
        _set(obj, ("spec", "autoscaling", "enabled"), True)
        _set(obj, ("spec", "autoscaling", "minPairs"), lo)
        _set(obj, ("spec", "autoscaling", "maxPairs"), hi)
        _set(obj, ("spec", "pairs", "replicas"), rng.choice([0, lo - 1, hi + 1, hi + rng.randint(2, 400)]))
        yield 2, name, obj, "spec.pairs.replicas", "spec.pairs.replicas"
        # the GPU budget, with autoscaling on (maxPairs) and off (replicas)
        for autoscale in (True, False):
            obj = _example(name)
            pairs = rng.randint(2, 30)
            _set(obj, ("spec", "autoscaling", "enabled"), autoscale)
            _set(obj, ("spec", "autoscaling", "minPairs"), 1)
            _set(obj, ("spec", "autoscaling", "maxPairs"), pairs)
            _set(obj, ("spec", "pairs", "replicas"), pairs)
            _set(obj, ("spec", "placement", "gpuBudget"), pairs * gpus - rng.randint(1, gpus))
            yield 2, name, obj, "spec.placement.gpuBudget", "spec.placement.gpuBudget"
        # maxUnavailable >= replicas
        obj = _example(name)
        replicas = int(base["spec"]["pairs"]["replicas"]) or 1
        _set(obj, ("spec", "pairs", "replicas"), replicas)
        if base["spec"]["autoscaling"]["enabled"]:
            _set(obj, ("spec", "autoscaling", "minPairs"), min(replicas, base["spec"]["autoscaling"]["minPairs"]))
        _set(obj, ("spec", "rollout", "maxUnavailable"), replicas + rng.randint(0, 3))
        yield 2, name, obj, "spec.rollout.maxUnavailable", "spec.rollout.maxUnavailable"
        # duplicate gate names
        metrics = base["spec"]["rollout"]["analysis"]["metrics"]
        if metrics:
            obj = _example(name)
            gates = copy.deepcopy(obj["spec"]["rollout"]["analysis"]["metrics"])
            gates.append({**rng.choice(gates)})
            _set(obj, ("spec", "rollout", "analysis", "metrics"), gates)
            yield 2, name, obj, "spec.rollout.analysis.metrics", "spec.rollout.analysis.metrics"
        # eval env overriding the target Tandem sets
        if "eval" in base["spec"]["rollout"]["analysis"]:
            obj = _example(name)
            env = [{"name": rng.choice(["TANDEM_TARGET_URLS", "TANDEM_MODEL", "TANDEM_REVISION"]), "value": "http://x"}]
            _set(obj, ("spec", "rollout", "analysis", "eval", "env"), env)
            yield 2, name, obj, "spec.rollout.analysis.eval.env", "spec.rollout.analysis.eval.env"
        # an RDMA resource named like the GPU resource
        obj = _example(name)
        _set(obj, ("spec", "placement", "rdma"), {"name": base["spec"]["placement"]["gpuResource"]})
        yield 2, name, obj, "spec.placement.rdma.name", "spec.placement.rdma.name"
        # priority class names pod creation refuses
        obj = _example(name)
        _set(obj, ("spec", "placement", "priorityClassName"), rng.choice(["Bad_Name", "-x", "a..b", "UPPER", "x y"]))
        yield 2, name, obj, "spec.placement.priorityClassName", "spec.placement.priorityClassName"
        # model sources: path traversal, unpinned OCI
        obj = _example(name)
        source = rng.choice(
            [
                "hf://../../etc/passwd",
                "pvc://claim/../other",
                "file:///models/../../root",
                "s3://bucket/%2e%2e/x",
                "oci://ghcr.io/models/qwen:latest",
                "oci://ghcr.io/models/qwen",
            ]
        )
        _set(obj, ("spec", "model", "source"), source)
        yield 2, name, obj, "spec.model.source", "spec.model.source"
    for name in _caches():
        obj = _example(name)
        port = rng.randint(1024, 65535)
        _set(obj, ("spec", "master", "rpcPort"), port)
        _set(obj, ("spec", "master", "metricsPort"), port)
        yield 2, name, obj, "spec.master.metricsPort", "spec.master.metricsPort"


def _custom_queries(rng: random.Random) -> Iterator[Candidate]:
    for name in _pools():
        obj = _example(name)
        gate = {"name": "custom", "query": rng.choice(BAD_QUERIES), "successCondition": "result < 1.0"}
        gates = [
            g for g in obj["spec"].get("rollout", {}).get("analysis", {}).get("metrics", []) if g["name"] != "custom"
        ]
        gates, i = _with_hostile_item(rng, gates, gate)
        _set(obj, ("spec", "rollout", "analysis", "metrics"), gates)
        where = f"spec.rollout.analysis.metrics[{i}].query"
        yield 4, name, obj, where, where


def _documents(rng: random.Random) -> Iterator[Candidate]:
    for name, doc in _examples():
        obj = _example(name)
        obj["apiVersion"] = rng.choice(["tandem.dev/v1", "tandem.dev/v1beta1", "tandem.io/v1alpha1"])
        yield 5, name, obj, "apiVersion", "version"
        obj = _example(name)
        obj["kind"] = rng.choice([doc["kind"] + "s", doc["kind"].lower(), "Pool"])
        yield 5, name, obj, "kind", "kind"
        obj = _example(name)
        del obj["kind"]
        yield 5, name, obj, "kind", "kind"
        obj = _example(name)
        obj["metadata"]["name"] = rng.choice(["Bad_Name", "-x", "a" * 254, "x.."])
        yield 5, name, obj, "metadata.name", "metadata.name"
        obj = _example(name)
        obj["metadata"]["labels"] = {rng.choice(BAD_LABEL_KEYS): "v"}
        yield 5, name, obj, "metadata.labels", "metadata.labels"


def _trailing_newline(rng: random.Random, f: Field) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    """A value that is valid but for a final newline: Python's ``$`` matches before it, Go's does not."""
    if isinstance(f.value, str) and f.value and f.schema.get("pattern", "").endswith("$"):
        yield f.value + "\n", ()


def _newline_documents(rng: random.Random) -> Iterator[Candidate]:
    for name, _doc in _examples():
        obj = _example(name)
        obj["metadata"]["name"] += "\n"
        yield 5, name, obj, "metadata.name", "metadata.name"


FAMILIES: dict[str, Family] = {
    "managed-args": _field_family(1, "args-list", _args(MANAGED_ARGS)),
    "dangerous-args": _field_family(1, "args-list", _args(DANGEROUS_ARGS)),
    "managed-env": _field_family(1, "env-list", _env(MANAGED_ENV, "name")),
    "dangerous-env": _field_family(1, "env-list", _env(DANGEROUS_ENV, "name")),
    "literal-secret-env": _field_family(1, "env-list", _env(SECRET_ENV, "value")),
    "secret-in-url": _field_family(1, "secret-url", _secret_urls),
    "cross-field": _cross,
    "zero-size": _field_family(2, "positive", _pick(ZERO_QUANTITIES, 1)),
    "image-reference": _field_family(2, "image", _pick(BAD_IMAGES, 3)),
    "label-key": _field_family(2, "label-key", _pick(BAD_LABEL_KEYS, 1)),
    "label-key-map": _field_family(2, "label-map", _label_maps),
    "toleration": _field_family(2, "toleration-list", _tolerations),
    "duration-overflow": _field_family(3, "duration", _pick(BAD_DURATIONS, 1)),
    "quantity-overflow": _field_family(3, "quantity", _pick(BAD_QUANTITIES, 1)),
    "gate-condition": _field_family(4, "condition", _pick(BAD_CONDITIONS, 3)),
    "custom-query": _custom_queries,
    "document": _documents,
    "trailing-newline": _field_family(5, "pattern", _trailing_newline),
    "newline-name": _newline_documents,
}


def corpus(seed: int = DEFAULT_SEED, per_family: int = DEFAULT_PER_FAMILY) -> list[Mutant]:
    """The hostile corpus: up to ``per_family`` mutants of each family, seeded (same seed, same corpus)."""
    rng = random.Random(seed)
    out: list[Mutant] = []
    for family, generate in FAMILIES.items():
        candidates = list(generate(rng))
        # Keep every field path once before repeating one, so no field hides behind a popular one.
        rng.shuffle(candidates)
        seen: set[str] = set()
        first = [c for c in candidates if not (c[3] in seen or seen.add(c[3]))]  # type: ignore[func-returns-value]
        rest = [c for c in candidates if c not in first]
        chosen = (
            (first + rest)[: max(per_family, 1)]
            if family not in ("cross-field", "document", "newline-name")
            else candidates
        )
        for n, (klass, example, obj, field, server_says) in enumerate(chosen):
            slug = re.sub(r"[^a-z0-9]+", "-", field.lower()).strip("-")[-40:]
            out.append(Mutant(f"c{klass}-{family}-{example}-{slug}-{n}", klass, obj, field, server_says))
    return out
