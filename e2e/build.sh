#!/usr/bin/env bash
# Build (or reuse) every binary the e2e control plane needs, into a cache outside the repository:
#   ${VENTURI_E2E_CACHE:-$HOME/.cache/venturi-e2e}/<component>-<version>/
# A component is rebuilt only when its pinned version (e2e/versions.env) changes, or when its
# directory is missing / incomplete. Debian packages (etcd-server, openssl, prometheus, curl)
# are installed with apt-get when missing.
#
# Usage: e2e/build.sh                   build / reuse everything
#        e2e/build.sh --print           print the cache paths of the binaries (shell-sourceable) and exit
#        e2e/build.sh --monitoring-crds fetch / reuse only the pinned Prometheus Operator CRDs (for
#                                       e2e/run.sh against an existing cluster: no Kubernetes build)
#
# Environment knobs:
#   VENTURI_E2E_CACHE        cache root (default $HOME/.cache/venturi-e2e)
#   VENTURI_E2E_GOMODCACHE   Go module cache used for the builds (default $CACHE/go/mod)
#   VENTURI_E2E_GOCACHE      Go build cache used for the builds   (default $CACHE/go/build)
#   VENTURI_E2E_BUILD_JOBS   go build -p (default 1)
#   VENTURI_E2E_GOMAXPROCS   GOMAXPROCS for the go tool and compiler (default 2)
#   VENTURI_E2E_KEEP_GOCACHE 0 (default) deletes the Go build cache (~4 GB) after a build that compiled
#                            something; 1 keeps it (faster rebuild when a version changes)
#   GO                       go binary (default: go in PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE=${VENTURI_E2E_CACHE:-$HOME/.cache/venturi-e2e}
K8S_DIR=$CACHE/kubernetes-$K8S_VERSION
KWOK_DIR=$CACHE/kwok-$KWOK_VERSION
HELM_DIR=$CACHE/helm-$HELM_VERSION
MON_DIR=$CACHE/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION
MON_CRDS=(servicemonitors podmonitors prometheusrules)

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ ${1:-} == --print ]]; then
  cat <<EOF
K8S_BIN=$K8S_DIR
KWOK_BIN=$KWOK_DIR
HELM_BIN=$HELM_DIR
MONITORING_CRDS=$MON_DIR
EOF
  exit 0
fi

mkdir -p "$CACHE"
TIMES=$CACHE/build-times.log

# ---------------------------------------------------------------- Debian packages
ensure_debian() {
  local need=() pair bin pkg
  for pair in "etcd:$ETCD_DEBIAN_PACKAGE" openssl:openssl prometheus:prometheus curl:curl; do
    bin=${pair%%:*}; pkg=${pair#*:}
    command -v "$bin" >/dev/null 2>&1 || need+=("$pkg")
  done
  [[ ${#need[@]} -eq 0 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})"
  log "apt-get install ${need[*]}"
  # The etcd-server and prometheus postinst scripts start system services (etcd on :2379,
  # prometheus on :9090). We never want those; block service starts during the install if the
  # machine has no policy-rc.d of its own.
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  local rc=0
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"; } \
    >"$CACHE/apt.log" 2>&1 || rc=$?
  [[ $made_policy -eq 1 ]] && rm -f /usr/sbin/policy-rc.d
  [[ $rc -eq 0 ]] || die "apt-get failed (rc=$rc), see $CACHE/apt.log"
}

# ---------------------------------------------------------------- Go environment
GO=${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}
setup_go() {
  [[ -x $GO ]] || die "no Go toolchain (looked for go in PATH and /usr/local/go/bin/go)"
  export GOTOOLCHAIN=local CGO_ENABLED=0
  export GOFLAGS="-mod=mod -modcacherw -buildvcs=false"
  export GOMODCACHE=${VENTURI_E2E_GOMODCACHE:-$CACHE/go/mod}
  export GOCACHE=${VENTURI_E2E_GOCACHE:-$CACHE/go/build}
  export GOMAXPROCS=${VENTURI_E2E_GOMAXPROCS:-2}
  JOBS=${VENTURI_E2E_BUILD_JOBS:-1}
  NICE=(nice -n 10)
  mkdir -p "$GOMODCACHE" "$GOCACHE"
}

# run CMD... with timing; a step that built something is appended to $TIMES
timed() {
  local what=$1; shift
  local t0=$SECONDS before=$BUILT
  BUILT=0
  "$@"
  local dt=$((SECONDS - t0))
  if [[ $BUILT == 1 ]]; then
    printf '%s %s %ss\n' "$(date -u +%FT%TZ)" "$what" "$dt" >>"$TIMES"
    log "$what took ${dt}s"
  fi
  [[ $before == 1 ]] && BUILT=1
  return 0
}

# ---------------------------------------------------------------- Kubernetes control plane
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

k8s_ok() {
  [[ -f $K8S_DIR/.complete ]] || return 1
  local c; for c in "${K8S_CMDS[@]}"; do [[ -x $K8S_DIR/$c ]] || return 1; done
  "$K8S_DIR/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $K8S_VERSION"
}

build_k8s() {
  if k8s_ok; then log "kubernetes $K8S_VERSION: cached in $K8S_DIR"; return 0; fi
  local minor patch staging_ver src kmod
  minor=$(cut -d. -f2 <<<"$K8S_VERSION"); patch=$(cut -d. -f3 <<<"$K8S_VERSION")
  staging_ver=v0.$minor.$patch
  src=$CACHE/src/k8sbin-$K8S_VERSION
  log "kubernetes $K8S_VERSION: building (staging modules at $staging_ver) in $src"
  rm -rf "$src" "$K8S_DIR.tmp"; mkdir -p "$src" "$K8S_DIR.tmp"
  (
    cd "$src"
    kmod=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
    [[ -f $kmod ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION go.mod"
    # Same go / godebug lines as k8s.io/kubernetes itself (godebug only applies in the main module).
    {
      echo "module venturi.e2e.local/k8sbin"; echo
      grep -m1 '^go ' "$kmod"; echo
      grep -m1 '^godebug ' "$kmod" || true
    } >go.mod
    # k8s.io/kubernetes requires every staging module at v0.0.0 and replaces it with
    # ./staging/src/...; those replaces are ignored for a dependency, so repeat them here
    # pointing at the published versions. The list is read from the exact go.mod of this version.
    local mods m args=()
    mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$kmod")
    [[ -n $mods ]] || die "no staging replace lines found in $kmod"
    for m in $mods; do args+=("-replace=$m=$m@$staging_ver"); done
    "$GO" mod edit "${args[@]}"
    log "  $(wc -w <<<"$mods") staging replaces; go get k8s.io/kubernetes@$K8S_VERSION"
    "${NICE[@]}" "$GO" get "k8s.io/kubernetes@$K8S_VERSION"

    local ld="-s -w" p date
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    local pkgs=(); for m in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$m"); done
    log "  go build -p $JOBS (GOMAXPROCS=$GOMAXPROCS) ${K8S_CMDS[*]}"
    "${NICE[@]}" "$GO" build -p "$JOBS" -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ld" \
      -o "$K8S_DIR.tmp/" "${pkgs[@]}"
  )
  BUILT=1
  cp "$src/go.mod" "$src/go.sum" "$K8S_DIR.tmp/"   # keep the resolved wrapper module for reference
  rm -rf "$K8S_DIR"; mv "$K8S_DIR.tmp" "$K8S_DIR"; touch "$K8S_DIR/.complete"
  k8s_ok || die "built kube-apiserver does not report 'Kubernetes $K8S_VERSION': $("$K8S_DIR/kube-apiserver" --version 2>&1)"
}

# ---------------------------------------------------------------- go install components
# goinstall NAME VERSION DIR PKG [LDFLAGS]
goinstall() {
  local name=$1 ver=$2 dir=$3 pkg=$4 ld=${5:-}
  local bin=$dir/$name
  if [[ -f $dir/.complete && -x $bin ]]; then log "$name $ver: cached in $dir"; return 0; fi
  log "$name $ver: go install $pkg@$ver"
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" "${NICE[@]}" "$GO" install -p "$JOBS" -trimpath -ldflags="-s -w $ld" "$pkg@$ver"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.complete"
  BUILT=1
}

# kwok v0.8.0 has no built-in stages: `kwok` alone exits with "no stages found" (kwokctl writes
# the defaults into its config). Assemble the same defaults kwokctl uses (node-initialize +
# node-heartbeat-with-lease, pod-ready/complete/delete from the "fast" set) from the kwok module
# source into $KWOK_DIR/stages.yaml, passed to kwok with --config.
kwok_stages() {
  local out=$KWOK_DIR/stages.yaml
  [[ -s $out ]] && return 0
  local dir f
  dir=$(cd "$CACHE" && "$GO" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [[ -d $dir/kustomize/stage ]] || die "kwok module source not found for $KWOK_VERSION"
  {
    echo "# kwok default stages, assembled by e2e/build.sh from sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      [[ -f $dir/kustomize/stage/$f ]] || die "missing kwok stage $f in $dir"
      echo "---"; echo "# $f"; cat "$dir/kustomize/stage/$f"
    done
  } >"$out.tmp"
  mv "$out.tmp" "$out"
  log "kwok stages written to $out"
}

# ---------------------------------------------------------------- Prometheus Operator CRDs
# The monitoring.coreos.com CRDs (ServiceMonitor, PodMonitor, PrometheusRule) that the chart's
# monitoring objects need, pinned: `go mod download` of the prometheus-operator module (through
# the Go module proxy, into $GOMODCACHE) and a copy of example/prometheus-operator-crd/*.yaml into
# $MON_DIR. e2e/run.sh applies them before `helm install`.
fetch_monitoring_crds() {
  if [[ -f $MON_DIR/.complete ]]; then log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: cached in $MON_DIR"; return 0; fi
  local mod=github.com/prometheus-operator/prometheus-operator dir c f
  log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: go mod download $mod@$PROMETHEUS_OPERATOR_VERSION"
  dir=$(cd "$CACHE" && "$GO" mod download -json "$mod@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [[ -d $dir/example/prometheus-operator-crd ]] || die "no example/prometheus-operator-crd in $mod@$PROMETHEUS_OPERATOR_VERSION (dir: '$dir')"
  rm -rf "$MON_DIR.tmp"; mkdir -p "$MON_DIR.tmp"
  for c in "${MON_CRDS[@]}"; do
    f=$dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml
    [[ -f $f ]] || die "missing $f"
    cp "$f" "$MON_DIR.tmp/"
  done
  echo "$mod@$PROMETHEUS_OPERATOR_VERSION example/prometheus-operator-crd" >"$MON_DIR.tmp/SOURCE"
  rm -rf "$MON_DIR"; mv "$MON_DIR.tmp" "$MON_DIR"; touch "$MON_DIR/.complete"
}

if [[ ${1:-} == --monitoring-crds ]]; then
  setup_go
  fetch_monitoring_crds
  exit 0
fi

BUILT=0
main() {
  local t0=$SECONDS
  ensure_debian
  setup_go
  log "cache: $CACHE  (GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE)"
  timed "kubernetes-$K8S_VERSION" build_k8s
  timed "kwok-$KWOK_VERSION" goinstall kwok "$KWOK_VERSION" "$KWOK_DIR" sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  kwok_stages
  timed "helm-$HELM_VERSION" goinstall helm "$HELM_VERSION" "$HELM_DIR" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  fetch_monitoring_crds
  if [[ $BUILT == 1 && ${VENTURI_E2E_KEEP_GOCACHE:-0} != 1 ]]; then
    # ~4 GB of compiled packages that only speed up a rebuild at another version
    log "deleting Go build cache $GOCACHE (keep it with VENTURI_E2E_KEEP_GOCACHE=1)"
    "$GO" clean -cache; rm -rf "$GOCACHE"
  fi
  log "done in $((SECONDS - t0))s:"
  "$K8S_DIR/kube-apiserver" --version >&2
  "$KWOK_DIR/kwok" --version >&2 || true
  "$HELM_DIR/helm" version --short >&2 || true
  etcd --version 2>&1 | sed -n 1p >&2   # sed reads all: no SIGPIPE (exit 141 under pipefail) as with head -1
}

main "$@"
