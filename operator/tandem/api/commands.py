"""`tandem crds` and `tandem validate`: the API's command-line face.

What it owns: reading manifest files, calling the pure generator/validator, printing results.
`crds` writes (or with --check, diffs) `crds/`; `validate` prints each error with its file, document
index, object name and field path, and exits 1 when any manifest is invalid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from tandem import API_VERSION
from tandem.api import crdgen
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
    """All YAML documents of a file (empty documents skipped)."""
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def _key(doc: Any) -> tuple[str, str, str]:
    meta = doc.get("metadata", {}) if isinstance(doc, dict) else {}
    return (str(doc.get("kind")) if isinstance(doc, dict) else "", meta.get("namespace", ""), meta.get("name", ""))


def validate_files(files: list[Path], old_file: Path | None = None) -> list[tuple[str, FieldError]]:
    """Validate every Tandem object in ``files``; other kinds are skipped. Returns (where, error)."""
    olds: dict[tuple[str, str, str], Any] = {}
    if old_file is not None:
        olds = {_key(doc): doc for doc in load_documents(old_file)}
    problems: list[tuple[str, FieldError]] = []
    for path in files:
        try:
            docs = load_documents(path)
        except (OSError, yaml.YAMLError) as exc:
            problems.append((str(path), FieldError("", f"cannot read: {exc}")))
            continue
        for index, doc in enumerate(docs):
            if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION:
                continue
            name = doc.get("metadata", {}).get("name", "?") if isinstance(doc.get("metadata"), dict) else "?"
            where = f"{path}[{index}] {doc.get('kind')}/{name}"
            for error in validate_object(doc, olds.get(_key(doc))):
                problems.append((where, error))
    return problems


def run_validate(args: argparse.Namespace) -> int:
    problems = validate_files(list(args.files), args.old)
    for where, error in problems:
        print(f"{where}: {error}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} error(s)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{len(args.files)} file(s) valid")
    return 0
