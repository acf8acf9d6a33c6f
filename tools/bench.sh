#!/usr/bin/env bash
# `make bench`: the fleet benchmark (simulator, W1-W3 and W5), the controller benchmark (local
# cluster: C1 apply->Ready vs direct, C2 API writes, C4 memory at 1,000 pools, C6 breach->rollback) and
# the router benchmark (`tandem router` beside vllm-router 0.1.17 on engine doubles: B1 overhead, B2
# locality, B3 faults and rollout), all into bench/results/ as JSON + Markdown + PNG. Ratios are measured
# side by side in one run.
#
# Environment:
#   BENCH_OUT=dir        output directory (default bench/results)
#   BENCH_ONLY=fleet|controller|router   run one of the three
#   BENCH_FLEET_PROFILE=ci|full   fleet profile (default ci, ~15-20 min on 2 cores)
#   BENCH_CONTROLLER_ARGS="..."   extra args for `tandem bench controller` (e.g. --quick)
#   BENCH_ROUTER_ARGS="..."       extra args for `tandem bench router` (e.g. --quick, --only b2)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${BENCH_OUT:-bench/results}"
ONLY="${BENCH_ONLY:-}"
TANDEM=.venv/bin/tandem
mkdir -p "$OUT"
status=0
stamp() { date -u +%H:%M:%S; }

if [[ -z "$ONLY" || "$ONLY" == fleet ]]; then
  echo "[$(stamp)] fleet benchmark (profile ${BENCH_FLEET_PROFILE:-ci}) -> $OUT/fleet.{json,md,png}"
  "$TANDEM" bench fleet --out "$OUT" --profile "${BENCH_FLEET_PROFILE:-ci}" || status=$?
fi
if [[ -z "$ONLY" || "$ONLY" == controller ]]; then
  echo "[$(stamp)] controller benchmark -> $OUT/controller.{json,md,png}"
  # The toolchain (control plane from Go modules) is built once and cached outside the repo.
  make --no-print-directory testenv
  # shellcheck disable=SC2086
  "$TANDEM" bench controller --out "$OUT" ${BENCH_CONTROLLER_ARGS:-} || status=$?
fi
if [[ -z "$ONLY" || "$ONLY" == router ]]; then
  echo "[$(stamp)] router benchmark -> $OUT/router.{json,md,png}"
  # The baseline, vllm-router 0.1.17 from PyPI, lives in its own venv cached outside the repo.
  tools/bench/vllm-router-env.sh >/dev/null
  # shellcheck disable=SC2086
  "$TANDEM" bench router --out "$OUT" ${BENCH_ROUTER_ARGS:-} || status=$?
fi
echo "[$(stamp)] done (exit $status): $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
