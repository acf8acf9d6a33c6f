#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (`make test`, called by .ci/run).
#
# Order, chosen for a 2-core machine with a 90-minute budget (testing.md §1):
#   1. in the background: the local control plane toolchain builds, and the real-engine environment
#      (vLLM on the CPU and the tiny model, tools/realengine/install.sh) installs (seconds when cached);
#   2. meanwhile: lint, typecheck, and the unit + component tiers (no cluster needed);
#   3. then the contract, cluster, fault and scale tiers against the real local control plane;
#   4. last, alone, the realengine tier (real vLLM engines, real P/D, real Prometheus): nothing else
#      competes for the two cores while its engines start and hand KV over (docs/design/011-real-engine.md).
# Every tier is mandatory: a missing binary, a failed install or a cluster that fails to start is an error,
# not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .logs
BIN=.venv/bin
export PYTHONDONTWRITEBYTECODE=1

pytest_ok() {  # pytest exit 5 = nothing collected for that selection: not a failure
  local rc=0
  "$BIN/pytest" "$@" || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]
}

last_line() {  # PREFIX LOG: the log's last progress line (no pipe into an early-exiting reader)
  local lines
  lines=$(grep -F "$1" "$2" 2>/dev/null) || true
  printf '%s\n' "${lines##*$'\n'}"
}

echo "==> [1/5] in the background: toolchain build (log: .logs/testenv-build.log) and real-engine install (log: .logs/realengine-install.log)"
( tools/testenv/build.sh && tools/testenv/prometheus.sh ) > .logs/testenv-build.log 2>&1 &
build_pid=$!
tools/realengine/install.sh > .logs/realengine-install.log 2>&1 &
install_pid=$!
( while kill -0 "$build_pid" 2>/dev/null || kill -0 "$install_pid" 2>/dev/null; do sleep 60
    kill -0 "$build_pid" 2>/dev/null && echo "    toolchain: $(last_line '[testenv' .logs/testenv-build.log)"
    kill -0 "$install_pid" 2>/dev/null && echo "    real engine: $(last_line '[realengine' .logs/realengine-install.log)"
  done ) &
progress_pid=$!
trap 'kill "$progress_pid" 2>/dev/null || true' EXIT

echo "==> [2/5] lint and typecheck"
make --no-print-directory lint typecheck

echo "==> [3/5] unit and component tiers"
pytest_ok -m "(unit or component) and not nightly" -p no:cacheprovider

echo "==> waiting for the toolchain"
if ! wait "$build_pid"; then
  echo "toolchain build failed; last lines of .logs/testenv-build.log:" >&2
  tail -40 .logs/testenv-build.log >&2
  exit 1
fi
last_line '[testenv' .logs/testenv-build.log

echo "==> [4/5] contract, cluster, fault and scale tiers (real local control plane)"
pytest_ok -m "not (unit or component or realengine) and not nightly" -p no:cacheprovider

echo "==> waiting for the real-engine install"
if ! wait "$install_pid"; then
  echo "real-engine install failed; last lines of .logs/realengine-install.log:" >&2
  tail -40 .logs/realengine-install.log >&2
  exit 1
fi
last_line '[realengine' .logs/realengine-install.log

echo "==> [5/5] realengine tier (real vLLM engines on the CPU; logs: .logs/realengine/)"
tier_start=$(date +%s)
# Plain pytest, not pytest_ok: a mandatory tier that collects nothing is an error too.
"$BIN/pytest" -m "realengine and not nightly" -p no:cacheprovider
echo "    realengine tier: $(( $(date +%s) - tier_start ))s"
echo "==> all tiers passed"
