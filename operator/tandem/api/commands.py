"""`tandem crds` and `tandem validate`: the API's command-line face.

What it owns: reading manifest files, calling the pure generator/validator, printing results.
`crds` writes (or with --check, diffs) `crds/`; `validate` prints each error with its file, document
index, object name and field path, and exits 1 when any manifest is invalid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem import API_VERSION, GROUP
from tandem.api import crdgen
from tandem.api.manifests import ManifestError, load_file
from tandem.api.resources import KIND_BY_NAME
from tandem.api.validate import FieldError, validate_object


def register(subparsers: Any) -> None:
    crds = subparsers.add_parser("crds", help="generate crds/ from the API models (or --check for drift)")
    crds.add_argument("--out", type=Path, default=crdgen.CRD_DIR, help="output directory (default: crds/)")
    crds.add_argument("--check", action="store_true", help="exit 1 if the files differ from the models")
    crds.add_argument("--stdout", action="store_true", help="print the CRDs instead of writing files")
    crds.set_defaults(func=run_crds)

    validate = subparsers.add_parser(
        "validate", help="check Tandem manifests offline with the CRD schema and CEL rules"
    )
    validate.add_argument("files", nargs="+", type=Path, help="YAML files (multi-document allowed)")
    validate.add_argument(
        "--old", type=Path, help="validate FILES as an update of the objects in this file (immutability rules)"
    )
    validate.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    validate.set_defaults(func=run_validate)


def run_crds(args: argparse.Namespace) -> int:
    if args.stdout:
        for text in crdgen.render_all().values():
            sys.stdout.write("---\n" + text)
        return 0
    if args.check:
        problems = crdgen.drift(args.out)
        for problem in problems:
            print(f"drift: {args.out}/{problem}", file=sys.stderr)
        if problems:
            print("run `make generate` and commit the result", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date")
        return 0
    for path in crdgen.write_all(args.out):
        print(f"wrote {path}")
    return 0


def load_documents(path: Path) -> list[Any]:
    """All YAML documents of a file (empty documents skipped); raise ManifestError or OSError."""
    return [doc for _, doc in load_file(path)]


def _key(doc: Any) -> tuple[str, str, str]:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return (
        str(doc.get("kind")) if isinstance(doc, dict) else "",
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
    )


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_list(doc: dict[str, Any]) -> bool:
    """A `v1 List` (what `kubectl get -o yaml` prints) or a `<Kind>List` of a Tandem kind."""
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind == "List" and api_version == "v1":
        return True
    return api_version == API_VERSION and isinstance(kind, str) and kind.endswith("List") and kind[:-4] in KIND_BY_NAME


def _identity_error(doc: dict[str, Any]) -> FieldError | None:
    """Why the object's apiVersion/kind cannot be a Tandem object the API server knows, when it claims to be one.

    Objects of other groups are not Tandem's to judge (a file may hold a Namespace or a Secret); an
    object is Tandem's when its apiVersion is in the tandem.dev group, or it names a Tandem kind with
    no group at all. A missing apiVersion or kind is refused, as kubectl refuses it.
    """
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version is None or api_version == "":
        return FieldError("apiVersion", "Required value: apiVersion is not set")
    if not isinstance(api_version, str):
        return FieldError("apiVersion", f"Invalid value: {_short(api_version)!r}: apiVersion must be a string")
    if kind is None or kind == "":
        return FieldError("kind", "Required value: kind is not set")
    if not isinstance(kind, str):
        return FieldError("kind", f"Invalid value: {_short(kind)!r}: kind must be a string")
    group = api_version.rpartition("/")[0]
    ours = group == GROUP or (kind in KIND_BY_NAME and not group)
    if ours and (api_version != API_VERSION or kind not in KIND_BY_NAME):
        field = "kind" if api_version == API_VERSION else "apiVersion"
        known = ", ".join(KIND_BY_NAME)
        return FieldError(
            field,
            f'no matches for kind "{_short(kind)}" in version "{_short(api_version)}" '
            f"(Tandem serves {known} in {API_VERSION})",
        )
    return None


def _objects(doc: Any, where: str) -> Iterator[tuple[str, Any]]:
    """The objects a document holds: itself, or each item of a List."""
    if isinstance(doc, dict) and _is_list(doc):
        items = doc.get("items")
        if items is None:
            return
        if not isinstance(items, list):
            yield where, FieldError("items", "Invalid value: items must be a list of objects")
            return
        for i, item in enumerate(items):
            yield f"{where}.items[{i}]", item
        return
    yield where, doc


def _check_object(obj: Any, where: str, olds: dict[tuple[str, str, str], Any]) -> list[tuple[str, FieldError]]:
    if isinstance(obj, FieldError):
        return [(where, obj)]
    if not isinstance(obj, dict):
        shape = "a list" if isinstance(obj, list) else f"a value of type {type(obj).__name__}"
        return [(where, FieldError("", f"expected an object (a YAML mapping with apiVersion and kind), got {shape}"))]
    problem = _identity_error(obj)
    if problem is not None:
        return [(where, problem)]
    if obj.get("apiVersion") != API_VERSION:
        return []  # another group's object: not ours to validate
    meta = obj.get("metadata")
    name = meta.get("name", "?") if isinstance(meta, dict) else "?"
    label = f"{where} {obj.get('kind')}/{_short(name)}"
    try:
        return [(label, error) for error in validate_object(obj, olds.get(_key(obj)))]
    except Exception as exc:  # a validator bug must still be one line, never a traceback
        return [(label, FieldError("", f"internal error while validating: {type(exc).__name__}: {_short(exc, 200)}"))]


def validate_files(files: list[Path], old_file: Path | None = None) -> list[tuple[str, FieldError]]:
    """Validate every Tandem object in ``files``; other groups' objects are skipped. Returns (where, error)."""
    olds: dict[tuple[str, str, str], Any] = {}
    problems: list[tuple[str, FieldError]] = []
    if old_file is not None:
        try:
            for index, doc in load_file(old_file):
                for _, obj in _objects(doc, f"{old_file}[{index}]"):
                    if isinstance(obj, dict):
                        olds[_key(obj)] = obj
        except (OSError, ManifestError) as exc:
            problems.append((f"{old_file} (--old)", FieldError("", f"cannot read: {_one_line(exc)}")))
            return problems
    for path in files:
        try:
            docs = load_file(path)
        except (OSError, ManifestError) as exc:
            problems.append((str(path), FieldError("", f"cannot read: {_one_line(exc)}")))
            continue
        if not docs:
            problems.append((str(path), FieldError("", "no objects in the file (kubectl apply refuses it too)")))
        for index, doc in docs:
            for where, obj in _objects(doc, f"{path}[{index}]"):
                problems.extend(_check_object(obj, where, olds))
    return problems


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, ManifestError) else f"{type(exc).__name__}: {text}"


def run_validate(args: argparse.Namespace) -> int:
    """Print every problem, one line each; exit 1 on any. Never lets an exception out as a traceback."""
    try:
        problems = validate_files(list(args.files), args.old)
    except Exception as exc:
        print(f"tandem validate: internal error: {_one_line(exc)}", file=sys.stderr)
        return 1
    for where, error in problems:
        print(f"{where}: {error}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} error(s)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{len(args.files)} file(s) valid")
    return 0
