#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (`make test`, called by .ci/run).
#
# Order, chosen for a 2-core machine with a 90-minute budget (testing.md §1):
#   1. the local control plane toolchain builds in the background (seconds when cached);
#   2. meanwhile: lint, typecheck, and the unit + component tiers (no cluster needed);
#   3. then the contract, cluster, fault and scale tiers against the real local control plane.
# The realengine tier (real vLLM on the CPU, `make test-realengine`) is not part of this run yet: in a
# clean-clone run its P/D test failed once on vLLM's hard-coded 5 s NIXL handshake receive timeout with
# two engines starving a 2-core box (docs/design/011-real-engine.md, "Flake"). A flaky gate blocks
# every landing, so it joins `make test` once that is fixed.
# Every tier is mandatory: a missing binary or a cluster that fails to start is an error, not a skip.
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

echo "==> [1/4] toolchain: building what is missing in the background (log: .logs/testenv-build.log)"
( tools/testenv/build.sh && tools/testenv/prometheus.sh ) > .logs/testenv-build.log 2>&1 &
build_pid=$!
( while kill -0 "$build_pid" 2>/dev/null; do sleep 60
    kill -0 "$build_pid" 2>/dev/null && echo "    toolchain: $(last_line '[testenv' .logs/testenv-build.log)"
  done ) &
progress_pid=$!
trap 'kill "$progress_pid" 2>/dev/null || true' EXIT

echo "==> [2/4] lint and typecheck"
make --no-print-directory lint typecheck

echo "==> [3/4] unit and component tiers"
pytest_ok -m "(unit or component) and not nightly" -p no:cacheprovider

echo "==> waiting for the toolchain"
if ! wait "$build_pid"; then
  echo "toolchain build failed; last lines of .logs/testenv-build.log:" >&2
  tail -40 .logs/testenv-build.log >&2
  exit 1
fi
last_line '[testenv' .logs/testenv-build.log

echo "==> [4/4] contract, cluster, fault and scale tiers (real local control plane)"
pytest_ok -m "not (unit or component or realengine) and not nightly" -p no:cacheprovider
echo "==> all tiers passed"
