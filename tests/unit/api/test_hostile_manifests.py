"""`tandem validate` on hostile files: one clean line per problem, exit 1, never a traceback or a hang.

Each row is a file a careless or malicious user could hand to `tandem validate` (issue 19, class 5),
with the text its one-line error must contain. The property tests feed random bytes and random YAML
documents to the command's entry point and check that nothing escapes.
"""

from __future__ import annotations

import contextlib
import io
import resource
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.api.manifests import MAX_EXPANDED_NODES, ManifestError, decode_text, parse_documents
from tandem.api.validate import metadata_errors, validate_object
from tandem.cli import main
from tests.support.catalog import EXAMPLES

MINIMAL = (EXAMPLES / "minimal-pool.yaml").read_text(encoding="utf-8")
POOL = "apiVersion: tandem.dev/v1alpha1\nkind: InferencePool\n"
SPEC = (
    "spec:\n  model: {servedName: m, source: hf://m, quantization: bf16}\n"
    "  stack: {version: v1, image: 'r@sha256:" + "a" * 64 + "'}\n"
)


def billion_laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def run_validate(data: bytes) -> tuple[int, str]:
    """Run `tandem validate` in-process on a file holding ``data``; return (exit code, all output)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.yaml"
        path.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", str(path)])
    return code, out.getvalue() + err.getvalue()


HOSTILE: list[tuple[str, bytes, str]] = [
    ("wrong-apiVersion", (POOL.replace("v1alpha1", "v1") + "metadata: {name: a}\n" + SPEC).encode(), "no matches"),
    ("missing-apiVersion", ("kind: InferencePool\nmetadata: {name: a}\n" + SPEC).encode(), "apiVersion: Required"),
    ("missing-kind", b"apiVersion: tandem.dev/v1alpha1\nmetadata: {name: a}\n", "kind: Required"),
    ("unknown-kind", b"apiVersion: tandem.dev/v1alpha1\nkind: InferencePol\nmetadata: {name: a}\n", "no matches"),
    ("core-group-kind", b"apiVersion: v1\nkind: MooncakeCache\nmetadata: {name: a}\n", "no matches"),
    ("top-level-sequence", b"- a\n- b\n", "got a list"),
    ("top-level-scalar", b"just text\n", "expected an object"),
    ("duplicate-key", (POOL + "metadata: {name: a}\n" + SPEC + "spec: {}\n").encode(), 'duplicate field "spec"'),
    (
        "int-beyond-int64",
        (POOL + "metadata: {name: a}\n" + SPEC + "  pairs: {replicas: 1" + "0" * 30 + "}\n").encode(),
        "int64",
    ),
    ("nan", (POOL + "metadata: {name: a}\n" + SPEC + "  pairs: {replicas: .nan}\n").encode(), "finite"),
    ("binary-tag", (POOL + "metadata: {name: !!binary aGVsbG8=}\n" + SPEC).encode(), "!!binary"),
    ("timestamp-tag", (POOL + "metadata: {name: !!timestamp 2020-01-01}\n" + SPEC).encode(), "!!timestamp"),
    ("date-as-name", (POOL + "metadata: {name: 2020-01-01}\n" + SPEC).encode(), "DNS-1035"),
    ("metadata-list", (POOL + "metadata: [a]\n" + SPEC).encode(), "metadata must be an object"),
    ("metadata-scalar", (POOL + "metadata: a\n" + SPEC).encode(), "metadata must be an object"),
    ("name-not-string", (POOL + "metadata: {name: [a]}\n" + SPEC).encode(), "must be a string"),
    ("name-not-dns", (POOL + "metadata: {name: Bad_Name}\n" + SPEC).encode(), "RFC 1123 subdomain"),
    ("namespace-not-dns", (POOL + "metadata: {name: a, namespace: A.b}\n" + SPEC).encode(), "RFC 1123 label"),
    ("label-value-int", (POOL + "metadata: {name: a, labels: {v: 1}}\n" + SPEC).encode(), "must be a string"),
    ("label-key-bad", (POOL + "metadata: {name: a, labels: {'-x': y}}\n" + SPEC).encode(), "name part"),
    ("label-value-bad", (POOL + "metadata: {name: a, labels: {x: '-y'}}\n" + SPEC).encode(), "label value"),
    ("annotations-list", (POOL + "metadata: {name: a, annotations: [x]}\n" + SPEC).encode(), "object of strings"),
    ("metadata-unknown-field", (POOL + "metadata: {name: a, owner: me}\n" + SPEC).encode(), "unknown field"),
    ("self-referencing-anchor", (POOL + "metadata: &m {name: a, x: *m}\n" + SPEC).encode(), "own anchor"),
    ("billion-laughs", billion_laughs().encode(), "excessive aliasing"),
    ("utf16", MINIMAL.encode("utf-16"), "UTF-16"),
    ("utf16-no-bom", MINIMAL.encode("utf-16-le"), "UTF-16"),
    ("latin1", "metadata: {name: caf\u00e9}\n".encode("latin-1"), "not UTF-8"),
    ("invalid-yaml", b"a: [b\n", "invalid YAML"),
    ("deep-nesting", b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
    ("list-item-bad", (b"apiVersion: v1\nkind: List\nitems:\n- 5\n"), "items[0]"),
    ("empty-file", b"# nothing here\n---\n", "no objects"),
    ("date-timestamp", (POOL + "metadata: {name: a, creationTimestamp: 2020-01-01}\n" + SPEC).encode(), "RFC 3339"),
    ("generation-string", (POOL + "metadata: {name: a, generation: x}\n" + SPEC).encode(), "type integer"),
]


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in HOSTILE])
def test_hostile_file_is_one_clean_error(data: bytes, expected: str) -> None:
    code, output = run_validate(data)
    assert code == 1, output
    assert expected in output
    assert "Traceback" not in output


def test_billion_laughs_is_refused_fast_in_bounded_memory() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(ManifestError, match="excessive aliasing"):
        parse_documents(billion_laughs(12))
    assert time.monotonic() - started < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB


def test_shared_aliases_within_the_bound_are_expanded() -> None:
    docs = parse_documents("a: &x {k: v}\nb: *x\nc: [*x, *x]\n")
    assert docs == [(0, {"a": {"k": "v"}, "b": {"k": "v"}, "c": [{"k": "v"}, {"k": "v"}]})]
    assert MAX_EXPANDED_NODES >= 100_000  # a List of a large fleet's pools must still load


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("a: 2020-01-01\n", {"a": "2020-01-01"}, id="date-stays-string"),
        pytest.param("a: 2020-01-01T10:00:00Z\n", {"a": "2020-01-01T10:00:00Z"}, id="timestamp-stays-string"),
        pytest.param("1: a\ntrue: b\n", {"1": "a", "true": "b"}, id="scalar-keys-become-text"),
        pytest.param("b: &b {x: 1}\nc: {<<: *b, y: 2}\n", {"b": {"x": 1}, "c": {"x": 1, "y": 2}}, id="merge-key"),
        pytest.param("a: =\n", {"a": "="}, id="equals-is-a-string"),
    ],
)
def test_yaml_is_read_as_the_api_server_reads_it(text: str, expected: object) -> None:
    assert parse_documents(text) == [(0, expected)]


def test_utf8_bom_is_accepted() -> None:
    assert parse_documents(decode_text(b"\xef\xbb\xbfa: 1\n")) == [(0, {"a": 1})]


def test_list_items_are_validated_one_by_one() -> None:
    good = yaml.safe_load(MINIMAL)
    bad = {**good, "metadata": {"name": "bad"}, "spec": {**good["spec"], "pairs": {"replicas": -1}}}
    data = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [good, bad]}).encode()
    code, output = run_validate(data)
    assert code == 1
    assert "[0].items[1] InferencePool/bad: spec.pairs.replicas" in output
    assert "items[0]" not in output


def test_multi_document_files_check_every_document() -> None:
    code, output = run_validate((MINIMAL + "\n---\n- a\n---\n" + POOL + "metadata: {name: b}\n").encode())
    assert code == 1
    assert "[1]: expected an object" in output
    assert "[2] InferencePool/b: spec: Required value" in output


def test_other_groups_objects_are_skipped() -> None:
    code, output = run_validate(b"apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n---\n" + MINIMAL.encode())
    assert (code, output.strip()) == (0, "1 file(s) valid")


def test_metadata_generate_name_only_is_allowed_by_metadata_rules() -> None:
    assert metadata_errors({"generateName": "pool-"}) == []


def test_null_fields_are_dropped_like_the_api_server_does() -> None:
    obj = yaml.safe_load(MINIMAL)
    obj["spec"]["pairs"] = None
    obj["spec"]["traffic"] = {"class": None}
    assert validate_object(obj) == []


# --- properties ---------------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=30,
)
_BASE = yaml.safe_load(MINIMAL)
_FIELDS = ["apiVersion", "kind", "metadata", "spec", "status", "items"]


@st.composite
def mutated_pools(draw: st.DrawFn) -> object:
    """The minimal example with random parts replaced by random JSON values (deep or shallow)."""
    obj: dict[str, object] = yaml.safe_load(MINIMAL)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        target: dict[str, object] = obj
        if draw(st.booleans()) and isinstance(obj.get("spec"), dict):
            target = obj["spec"]  # type: ignore[assignment]
        key = draw(st.sampled_from([*_FIELDS, *_BASE["spec"], "name"]))
        target[key] = draw(_json)
    return obj


PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _clean(code: int, output: str) -> None:
    assert code in (0, 1, 2)
    assert "Traceback" not in output
    assert all(len(line) < 20_000 for line in output.splitlines())


@PROPERTY
@given(data=st.binary(max_size=400))
def test_random_bytes_never_crash_validate(data: bytes) -> None:
    _clean(*run_validate(data))


@PROPERTY
@given(data=st.one_of(_json, mutated_pools()))
def test_random_documents_never_crash_validate(data: object) -> None:
    text = yaml.safe_dump(data, allow_unicode=True) if data is not None else ""
    _clean(*run_validate(text.encode()))


@PROPERTY
@given(prefix=st.text(max_size=60), cut=st.integers(min_value=0, max_value=len(MINIMAL)))
def test_truncated_and_spliced_yaml_never_crash_validate(prefix: str, cut: int) -> None:
    _clean(*run_validate((prefix + MINIMAL[:cut] + "\n" + MINIMAL[cut:]).encode("utf-8", "surrogatepass")))


@PROPERTY
@given(
    old=st.one_of(
        st.binary(max_size=200),
        st.one_of(_json, mutated_pools()).map(lambda v: yaml.safe_dump(v, allow_unicode=True).encode()),
    )
)
def test_random_old_files_never_crash_validate(old: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        new_path, old_path = Path(tmp) / "new.yaml", Path(tmp) / "old.yaml"
        new_path.write_text(MINIMAL, encoding="utf-8")
        old_path.write_bytes(old)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", str(new_path), "--old", str(old_path)])
    _clean(code, out.getvalue() + err.getvalue())
