#!/usr/bin/env bash
# The baseline router for `tandem bench router`: vllm-router 0.1.17 from PyPI (a Rust binary wheel with
# a Python launcher), installed into its own venv cached outside the repo so the project's environment
# never depends on it. Idempotent: prints the path of the `vllm-router` executable on success.
#
# Environment:
#   TANDEM_BENCH_CACHE=dir   cache root (default ~/.cache/tandem-bench)
#   PYTHON=python3           interpreter for the venv
set -euo pipefail
VERSION=0.1.17
ROOT="${TANDEM_BENCH_CACHE:-$HOME/.cache/tandem-bench}"
VENV="$ROOT/vllm-router-$VERSION"
BIN="$VENV/bin/vllm-router"
STAMP="$VENV/.installed-$VERSION"
if [[ -f "$STAMP" && -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$ROOT"
"${PYTHON:-python3}" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install -q --upgrade "pip>=25.1" >&2
"$VENV/bin/python" -m pip install -q "vllm-router==$VERSION" >&2
"$BIN" --help >/dev/null
touch "$STAMP"
echo "$BIN"
