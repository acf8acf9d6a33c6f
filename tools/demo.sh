#!/usr/bin/env bash
# `make demo`: build what the local cluster needs (cached after the first run), then run the demo.
# Extra arguments go to `tandem demo` (e.g. --down, --fresh, --nodes N).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .logs
echo "==> local control plane toolchain (cold: tens of minutes on 2 cores, then cached; log: .logs/testenv-build.log)"
( tools/testenv/build.sh && tools/testenv/prometheus.sh ) > .logs/testenv-build.log 2>&1 &
build=$!
while kill -0 "$build" 2>/dev/null; do sleep 30; kill -0 "$build" 2>/dev/null && echo "    $(grep '\[testenv' .logs/testenv-build.log | tail -1)"; done
wait "$build" || { tail -40 .logs/testenv-build.log; exit 1; }
exec .venv/bin/tandem demo "$@"
