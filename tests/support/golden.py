"""Golden files: compare rendered Kubernetes objects with committed YAML, or rewrite it on purpose.

What it owns: the one comparison every golden test uses (builder output, chart renders), its update
switch and its failure message. ``TANDEM_UPDATE_GOLDEN=1`` (or ``pytest --update-golden``) rewrites the
files instead of comparing (the same switch as the RBAC goldens in tests/cluster/test_chart.py); review
the diff and commit it with the change that caused it. A missing golden fails once and is written, so a
new case cannot pass unseen.

Invariants: the rendering is canonical (block YAML, keys sorted, documents in the caller's order), so a
file changes only when an object does. Volatile fields are removed by exact path (``VOLATILE``) before
the comparison, never matched loosely: anything not listed must be byte-for-byte deterministic.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

UPDATE_ENV = "TANDEM_UPDATE_GOLDEN"

VOLATILE: tuple[tuple[str, ...], ...] = (
    ("metadata", "creationTimestamp"),
    ("metadata", "resourceVersion"),
    ("metadata", "uid"),
    ("metadata", "generation"),
    ("metadata", "managedFields"),
    ("status",),
)
"""Fields the API server (not the builders) sets: dropped before comparing. Content hashes such as
``tandem.dev/template-hash`` are *not* volatile: they depend on the spec only, and a change to one means
every pod restarts on upgrade (testing.md UP-01), which is what these goldens are there to show."""


def scrub(obj: Mapping[str, Any], paths: Sequence[tuple[str, ...]] = VOLATILE) -> dict[str, Any]:
    """A deep copy of ``obj`` without the given paths (absent paths are fine)."""
    out = copy.deepcopy(dict(obj))
    for path in paths:
        node: Any = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's JSON, a script) as literal blocks, so a diff shows the changed line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(objects: Iterable[Mapping[str, Any]]) -> str:
    """Canonical multi-document YAML of the scrubbed objects."""
    docs = [scrub(o) for o in objects]
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120, explicit_start=True)


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def assert_golden(path: Path, objects: Iterable[Mapping[str, Any]]) -> None:
    """Fail with a unified diff when ``objects`` differ from the golden at ``path`` (or rewrite it)."""
    got = render(objects)
    if updating() or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        if not updating():
            pytest.fail(f"{path} did not exist; written now: review and commit it")
        return
    want = path.read_text()
    if got == want:
        return
    diff = "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True), got.splitlines(keepends=True), f"{path} (golden)", "rendered now", n=3
        )
    )
    pytest.fail(
        f"{path.name} differs from what the code renders now.\n"
        f"If the change is intended, regenerate with {UPDATE_ENV}=1 and commit the diff "
        f"(a changed revision id or template hash restarts pods on upgrade, testing.md UP-01).\n\n{diff}",
        pytrace=False,
    )
