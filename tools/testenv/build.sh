#!/usr/bin/env bash
# Build the local control plane Tandem's cluster tier runs on, from Go modules only.
#
# What it owns: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes),
# etcd, kwok + kwokctl and Helm, each built from the small wrapper module beside this script (go.mod and
# go.sum are committed, so the versions are pinned and checked), into a cache folder keyed by version:
#
#   ${TANDEM_TESTENV_CACHE:-~/.cache/tandem-testenv}/{k8s-v1.34.4,etcd-v3.6.14,kwok-v0.8.0,helm-v3.21.4}/
#
# Invariants: idempotent (a component whose binaries exist is skipped in milliseconds); a component is
# built into "<dir>.tmp" and renamed only once its version check passes, so an interrupted build never
# leaves a half folder that looks complete; nothing built is ever written inside the repository.
# Prometheus is not built here: it comes from the Debian package (tools/testenv/prometheus.sh).
#
# Usage: tools/testenv/build.sh [component...]   (components: k8s etcd kwok helm; default all)
#        tools/testenv/build.sh --print          (print the binary paths as shell assignments)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/testenv/versions.sh
. "$HERE/versions.sh"
# shellcheck source=tools/testenv/checks.sh
. "$HERE/checks.sh"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOPROXY="${GOPROXY:-https://proxy.golang.org}"
CACHE=${TANDEM_TESTENV_CACHE:-$HOME/.cache/tandem-testenv}
mkdir -p "$CACHE"

log() { printf '[testenv %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# A heartbeat so a long cold build always shows it is alive, even between `go build -v` lines.
heartbeat() {
  local what=$1 start=$SECONDS
  while sleep 60; do log "still building $what ($(( (SECONDS - start) / 60 )) min so far)"; done
}

run_with_heartbeat() {
  local what=$1; shift
  heartbeat "$what" & local hb=$!
  local rc=0
  "$@" || rc=$?
  kill "$hb" 2>/dev/null || true; wait "$hb" 2>/dev/null || true
  return "$rc"
}

k8s_ldflags() {
  local minor ldf="-s -w" kv
  minor=$(cut -d. -f2 <<<"$K8S_VERSION")
  for kv in "gitVersion=$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean "buildDate=$(date -u +%FT%TZ)"; do
    ldf="$ldf -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  printf '%s' "$ldf"
}

build_k8s() {
  local out="$CACHE/k8s-$K8S_VERSION" b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$out/$b" ] || break
    [ "$b" = kubectl ] && { log "k8s $K8S_VERSION present: $out"; return 0; }
  done
  cd "$HERE/k8s"
  if ! file_has "k8s.io/kubernetes $K8S_VERSION" go.mod; then
    # Regenerated only on a version bump: k8s.io/kubernetes pins its staging modules at v0.0.0 and maps
    # them with replace lines that are ignored for a dependency, so we replace each with its tag.
    log "resolving k8s.io/kubernetes@$K8S_VERSION staging modules"
    local kmod stg m gd
    stg="v0${K8S_VERSION#v1}"
    kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod"); do go mod edit -replace="$m=$m@$stg"; done
    gd=$(awk '$1 == "godebug" {print $2}' "$kmod")
    [ -n "$gd" ] && go mod edit -godebug="$gd"
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION"
  fi
  log "building Kubernetes $K8S_VERSION (cold: 15-30 min on 2 cores)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  run_with_heartbeat "k8s $K8S_VERSION" go build -v -p "${TESTENV_JOBS:-2}" -ldflags "$(k8s_ldflags)" -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  output_has_line "Kubernetes $K8S_VERSION" "$out.tmp/kube-apiserver" --version
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "k8s $K8S_VERSION built: $out"
}

build_etcd() {
  local out="$CACHE/etcd-$ETCD_VERSION"
  [ -x "$out/etcd" ] && { log "etcd $ETCD_VERSION present: $out"; return 0; }
  cd "$HERE/etcd"
  file_has "go.etcd.io/etcd/server/v3 $ETCD_VERSION" go.mod || go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  # go install refuses etcd (replace directives upstream), so the wrapper builds it; -o names the file.
  run_with_heartbeat "etcd" go build -v -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  output_has "etcd Version: ${ETCD_VERSION#v}" "$out.tmp/etcd" --version
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "etcd $ETCD_VERSION built: $out"
}

build_kwok() {
  local out="$CACHE/kwok-$KWOK_VERSION"
  [ -x "$out/kwok" ] && [ -x "$out/kwokctl" ] && { log "kwok $KWOK_VERSION present: $out"; return 0; }
  cd "$HERE/kwok"
  file_has "sigs.k8s.io/kwok $KWOK_VERSION" go.mod || \
    go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  log "building kwok $KWOK_VERSION"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  local ldf="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  run_with_heartbeat "kwok" go build -v -ldflags "$ldf" -o "$out.tmp/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  "$out.tmp/kwokctl" --version >/dev/null
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "kwok $KWOK_VERSION built: $out"
}

build_helm() {
  local out="$CACHE/helm-$HELM_VERSION"
  [ -x "$out/helm" ] && { log "helm $HELM_VERSION present: $out"; return 0; }
  cd "$HERE/helm"
  file_has "helm.sh/helm/v3 $HELM_VERSION" go.mod || go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  # Helm's Makefile stamps the Kubernetes version it assumes offline from its own client-go minor.
  local hm h=helm.sh/helm/v3 ldf
  hm=$(awk '$1 == "k8s.io/client-go" {print $2}' go.mod | cut -d. -f2)
  ldf="-s -w -X $h/internal/version.version=$HELM_VERSION -X $h/pkg/chartutil.k8sVersionMajor=1 -X $h/pkg/chartutil.k8sVersionMinor=$hm"
  ldf="$ldf -X $h/pkg/lint/rules.k8sVersionMajor=1 -X $h/pkg/lint/rules.k8sVersionMinor=$hm"
  log "building helm $HELM_VERSION (assumes Kubernetes 1.$hm offline)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  run_with_heartbeat "helm" go build -v -ldflags "$ldf" -o "$out.tmp/helm" "$h/cmd/helm"
  output_has_prefix "$HELM_VERSION" "$out.tmp/helm" version --short
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "helm $HELM_VERSION built: $out"
}

print_paths() {
  cat <<EOF
TANDEM_TESTENV_CACHE=$CACHE
KUBE_APISERVER=$CACHE/k8s-$K8S_VERSION/kube-apiserver
KUBE_CONTROLLER_MANAGER=$CACHE/k8s-$K8S_VERSION/kube-controller-manager
KUBE_SCHEDULER=$CACHE/k8s-$K8S_VERSION/kube-scheduler
KUBECTL=$CACHE/k8s-$K8S_VERSION/kubectl
ETCD=$CACHE/etcd-$ETCD_VERSION/etcd
KWOK=$CACHE/kwok-$KWOK_VERSION/kwok
KWOKCTL=$CACHE/kwok-$KWOK_VERSION/kwokctl
HELM=$CACHE/helm-$HELM_VERSION/helm
EOF
}

if [ "${1:-}" = "--print" ]; then print_paths; exit 0; fi
components=("$@"); [ ${#components[@]} -gt 0 ] || components=(etcd kwok helm k8s)
start=$SECONDS
for c in "${components[@]}"; do
  case "$c" in
    # One build per component at a time: a second caller waits here, then finds the binaries and skips.
    k8s|etcd|kwok|helm) ( flock -x 9; "build_$c" ) 9>"$CACHE/.build-$c.lock" ;;
    *) echo "unknown component: $c (k8s etcd kwok helm)" >&2; exit 2 ;;
  esac
done
log "done in $(( SECONDS - start )) s; binaries:"
print_paths
