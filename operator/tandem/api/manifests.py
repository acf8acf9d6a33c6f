"""Reading manifest files the way the API server will see them, refusing what it would refuse.

What it owns: turning the bytes of a YAML (or JSON) file into plain JSON-like documents for
``tandem validate``, with every hostile or ambiguous construct refused as a one-line
:class:`ManifestError` instead of a traceback, a hang or an out-of-memory:

- text must be UTF-8 (UTF-16/32 files are named as such; other bytes give the offset);
- aliases are bounded: an alias to an anchor that is still open (a self-referencing structure) is
  refused, and so is a document whose alias-expanded size passes :data:`MAX_EXPANDED_NODES`
  (a "billion laughs" file is refused after composing a few hundred nodes, in bounded memory;
  Kubernetes' own YAML decoder likewise refuses "excessive aliasing");
- duplicate keys in one mapping are refused (the API server's strict field validation answers
  "duplicate field"; kubectl's client-side YAML conversion would silently keep the last one);
- only JSON types exist: YAML timestamps/dates stay strings (as ``sigs.k8s.io/yaml`` keeps them),
  explicit tags other than the JSON ones (``!!binary``, ``!!set``, ``!!timestamp``...) are refused,
  non-string scalar keys become their text, non-scalar keys are refused;
- nesting deeper than the parser can take and files larger than :data:`MAX_FILE_BYTES` are refused.

Pure apart from reading the file it is given.
"""

from __future__ import annotations

import codecs
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# A pool manifest is a few hundred nodes; a List of every pool of a large fleet a few ten thousand.
MAX_EXPANDED_NODES = 250_000
# Kubernetes refuses request bodies above 3 MiB; a larger manifest file cannot be applied whole.
MAX_FILE_BYTES = 16 * 2**20

_MERGE_TAG = "tag:yaml.org,2002:merge"
_JSON_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq"))
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class ManifestError(ValueError):
    """The file cannot be read as Kubernetes manifests; the message is one line."""


def _where(node: Node | None) -> str:
    mark = node.start_mark if node is not None else None
    return f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounded aliases, strict keys and JSON-only types."""

    # YAML 1.1 timestamps and the `=` value tag resolve to strings, as in sigs.k8s.io/yaml.
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag.rsplit(":", 1)[-1] not in ("timestamp", "value")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if event.anchor in self._open_anchors:
                raise ManifestError(
                    f"line {event.start_mark.line + 1}: alias *{event.anchor} refers to its own anchor "
                    "(a recursive structure cannot be sent to the API server)"
                )
            return super().compose_node(parent, index)
        anchor = getattr(self.peek_event(), "anchor", None)  # type: ignore[no-untyped-call]
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open_anchors.discard(anchor)

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _bounded_size(node)
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node.tag not in _JSON_TAGS:
            shown = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise ManifestError(f"{_where(node)}YAML tag {shown} has no JSON form; write a plain value")
        return super().construct_object(node, deep)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Hashable, Any]:
        if not isinstance(node, MappingNode):
            raise ManifestError(f"{_where(node)}expected a mapping")
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, ScalarNode):
                raise ManifestError(f"{_where(key_node)}a mapping key must be a plain string")
            if key_node.value in seen:
                raise ManifestError(
                    f'{_where(key_node)}duplicate field "{key_node.value}" (the API server refuses duplicate fields; '
                    "kubectl would silently keep the last one)"
                )
            seen.add(key_node.value)
        self.flatten_mapping(node)
        mapping: dict[Hashable, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise ManifestError(f"{_where(key_node)}a mapping key must be a plain string")
            key = self.construct_object(key_node, deep=deep)
            mapping[key if isinstance(key, str) else str(key_node.value)] = self.construct_object(value_node, deep=deep)
        return mapping


def _bounded_size(root: Node) -> int:
    """Alias-expanded node count of a document (each shared node counted once per use), bounded."""
    sizes: dict[int, int] = {}

    def size(node: Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_EXPANDED_NODES:
            raise ManifestError(
                f"{_where(root)}document expands to more than {MAX_EXPANDED_NODES} nodes through aliases "
                "(excessive aliasing)"
            )
        sizes[id(node)] = total
        return total

    return size(root)


def decode_text(data: bytes) -> str:
    """The text of a manifest file: UTF-8 (a UTF-8 BOM is allowed), anything else refused."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise ManifestError(f"the file is {name} encoded; Kubernetes manifests must be UTF-8")
    if len(data) >= 2 and (data[0] == 0 or data[1] == 0):
        raise ManifestError("the file looks UTF-16 or UTF-32 encoded (NUL bytes); Kubernetes manifests must be UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text: invalid byte at offset {exc.start}") from None


def parse_documents(text: str) -> list[tuple[int, Any]]:
    """(index, document) for every non-empty YAML document of ``text``; raise ManifestError."""
    docs: list[tuple[int, Any]] = []
    loader = _Loader(text)
    try:
        index = 0
        while loader.check_data():  # type: ignore[no-untyped-call]
            doc = loader.get_data()
            if doc is not None:
                docs.append((index, doc))
            index += 1
    except ManifestError:
        raise
    except yaml.YAMLError as exc:
        raise ManifestError("invalid YAML: " + " ".join(str(exc).split())) from None
    except RecursionError:
        raise ManifestError("the document is nested too deeply") from None
    finally:
        loader.dispose()
    return docs


def load_file(path: Path) -> list[tuple[int, Any]]:
    """Every non-empty document of a manifest file, with its index; raise ManifestError or OSError."""
    with path.open("rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ManifestError(f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB")
    return parse_documents(decode_text(data))
