#!/usr/bin/env bash
# Build one component N times, each into a new empty cache folder: the fresh-machine check of build.sh.
#
# Why: a developer's cache already holds every binary, so a build step that fails only on a cold cache
# (the SIGPIPE'd version check failed 3 of 20 etcd builds) never shows there. The Go build cache stays
# warm, so each run costs a link and the version check, not a full compile.
#
# Usage: tools/testenv/build-repeat.sh [N=30] [component=etcd]; prints one line per run and a tally;
# exits 1 if any run failed (its log is kept).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
n=${1:-30} component=${2:-etcd} ok=0 failed=0
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for i in $(seq 1 "$n"); do
  cache="$root/cache-$i"
  start=$SECONDS
  if TANDEM_TESTENV_CACHE="$cache" "$HERE/build.sh" "$component" >"$root/run-$i.log" 2>&1; then
    ok=$((ok + 1)); echo "run $i/$n: ok ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1)); echo "run $i/$n: FAILED ($((SECONDS - start)) s), log:"; cat "$root/run-$i.log"
  fi
  rm -rf "$cache"
done
echo "$component: $ok of $n builds into empty caches succeeded"
[ "$failed" -eq 0 ]
