#!/usr/bin/env bash
# Install the Prometheus server the local cluster tier scrapes with (Debian package `prometheus`).
#
# What it owns: making /usr/bin/prometheus exist. Nothing else: the package starts no service on this
# machine (no systemd), and `tandem dev cluster up` / the pytest fixture run Prometheus themselves on
# 127.0.0.1 with their own config and a temporary TSDB (lab/tandem_lab/dev/prometheus.py).
#
# Invariants: idempotent (exits at once when the binary exists); never builds or downloads anything but
# the Debian package; prints the binary and its version on success.
#
# Usage: tools/testenv/prometheus.sh            (env PROMETHEUS_BIN overrides the path checked)
set -euo pipefail

BIN=${PROMETHEUS_BIN:-/usr/bin/prometheus}
# shellcheck source=tools/testenv/checks.sh
. "$(cd "$(dirname "$0")" && pwd)/checks.sh"
log() { printf '[testenv %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if [ ! -x "$BIN" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
  else
    SUDO=
  fi
  log "installing the Debian package prometheus (no recommends)"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing or stale on a fresh machine: update once, then install.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
[ -x "$BIN" ] || { echo "prometheus.sh: $BIN still missing after apt-get install" >&2; exit 1; }
log "prometheus present: $BIN ($(first_line "$BIN" --version))"
echo "PROMETHEUS=$BIN"
