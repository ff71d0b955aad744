#!/usr/bin/env bash
# Local Kubernetes control plane for venturi e2e tests: etcd + kube-apiserver +
# kube-controller-manager + kube-scheduler + kwok (one fake Node, fake pods). No kubelet, no containers.
#
#   e2e/cluster.sh up       start everything, wait until usable (refuses if a cluster is already running
#                           in the run dir; a stale run dir whose processes are gone is removed first)
#   e2e/cluster.sh down     stop exactly the PIDs recorded by `up` (TERM, then KILL after a grace period)
#                           and delete the run dir (VENTURI_E2E_KEEP_RUN=1 keeps it, e.g. for its logs)
#   e2e/cluster.sh env      print shell exports (KUBECONFIG, PATH, ...): eval "$(e2e/cluster.sh env)"
#   e2e/cluster.sh status   show the recorded processes and whether they are alive
#
# Everything listens on 127.0.0.1 only. Ports are free ports picked at `up` (written to $RUN/env);
# fix them with VENTURI_E2E_{ETCD_PORT,ETCD_PEER_PORT,API_PORT,KCM_PORT,SCHED_PORT}.
# Run dir: ${VENTURI_E2E_RUN:-/tmp/venturi-e2e-run}. Binaries come from e2e/build.sh's cache; `up`
# runs build.sh first (a no-op taking ~1 s when everything is cached).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
RUN=${VENTURI_E2E_RUN:-/tmp/venturi-e2e-run}
PIDS=$RUN/pids
MARKER=$RUN/.venturi-e2e-run   # only a directory holding this marker is ever deleted
NODE_NAME=${VENTURI_E2E_NODE_NAME:-kwok-node-0}
# bounded waits (seconds)
T_ETCD=${VENTURI_E2E_TIMEOUT_ETCD:-30}
T_API=${VENTURI_E2E_TIMEOUT_APISERVER:-120}
T_COMPONENT=${VENTURI_E2E_TIMEOUT_COMPONENT:-60}
T_NODE=${VENTURI_E2E_TIMEOUT_NODE:-60}

KCM_CONTROLLERS=${VENTURI_E2E_KCM_CONTROLLERS:-deployment-controller,replicaset-controller,statefulset-controller,daemonset-controller,job-controller,cronjob-controller,serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,root-ca-certificate-publisher-controller,node-lifecycle-controller,taint-eviction-controller,clusterrole-aggregation-controller,endpoints-controller,endpointslice-controller,pod-garbage-collector-controller,disruption-controller,ttl-after-finished-controller,resourcequota-controller}

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------------ process bookkeeping
# $PIDS lines: "<name> <pid> <starttime>", starttime = field 22 of /proc/<pid>/stat, so a
# recycled PID is never mistaken for ours.
# (a zombie, state Z, counts as gone: it has exited and only waits to be reaped)
proc_start() { [[ -r /proc/$1/stat ]] && sed 's/^.*) //' "/proc/$1/stat" | awk '$1 != "Z" {print $20}'; }
is_ours() { # pid starttime
  local st; st=$(proc_start "$1" 2>/dev/null) || return 1
  [[ -n $st && $st == "$2" ]]
}
any_alive() {
  [[ -f $PIDS ]] || return 1
  local name pid st
  while read -r name pid st; do is_ours "$pid" "$st" && return 0; done <"$PIDS"
  return 1
}

# start NAME CMD... : run detached in its own session, log to $RUN/log/NAME.log, record the PID.
start() {
  local name=$1; shift
  local pidf=$RUN/.pid.$name
  rm -f "$pidf"
  # The inner bash writes its own PID, then execs the binary, so the PID is the binary's.
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" "$@" >"$RUN/log/$name.log" 2>&1 </dev/null &
  local i
  for i in $(seq 50); do [[ -s $pidf ]] && break; sleep 0.1; done
  [[ -s $pidf ]] || die "could not start $name"
  local pid; pid=$(cat "$pidf"); rm -f "$pidf"
  local st=""
  for i in $(seq 20); do st=$(proc_start "$pid" 2>/dev/null || true); [[ -n $st ]] && break; sleep 0.05; done
  [[ -n $st ]] || die "$name (pid $pid) exited immediately; log: $RUN/log/$name.log"$'\n'"$(tail -n 20 "$RUN/log/$name.log")"
  echo "$name $pid $st" >>"$PIDS"
  log "started $name (pid $pid), log $RUN/log/$name.log"
}

pid_of() { awk -v n="$1" '$1==n {print $2}' "$PIDS"; }
st_of() { awk -v n="$1" '$1==n {print $3}' "$PIDS"; }

# wait_for NAME[:what] TIMEOUT CMD... : poll CMD once a second; fail early if NAME's process died.
wait_for() {
  local name=${1%%:*} what="${1%%:*} ready" timeout=$2
  [[ $1 == *:* ]] && what=${1#*:}
  shift 2
  local pid st deadline=$((SECONDS + timeout))
  pid=$(pid_of "$name"); st=$(st_of "$name")
  while ((SECONDS < deadline)); do
    if "$@" >/dev/null 2>&1; then log "$what"; return 0; fi
    if [[ -n $pid ]] && ! is_ours "$pid" "$st"; then
      die "$name (pid $pid) died during startup; log: $RUN/log/$name.log"$'\n'"$(tail -n 30 "$RUN/log/$name.log")"
    fi
    sleep 1
  done
  die "$name: '$what' not reached after ${timeout}s (check: $*); log: $RUN/log/$name.log"$'\n'"$(tail -n 30 "$RUN/log/$name.log" 2>/dev/null)"
}

stop_all() {
  [[ -f $PIDS ]] || return 0
  local lines name pid st i
  mapfile -t lines < <(tac "$PIDS")    # reverse start order
  for l in "${lines[@]}"; do
    read -r name pid st <<<"$l"
    if is_ours "$pid" "$st"; then
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 100); do is_ours "$pid" "$st" || break; sleep 0.1; done
      if is_ours "$pid" "$st"; then
        log "$name (pid $pid) ignored SIGTERM for 10s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for i in $(seq 50); do is_ours "$pid" "$st" || break; sleep 0.1; done
      fi
      log "stopped $name (pid $pid)"
    fi
  done
  rm -f "$PIDS"
}

# ------------------------------------------------------------------ helpers
free_ports() { # N -> N distinct free loopback ports
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

make_pki() {
  local P=$RUN/pki; mkdir -p "$P"
  (
    cd "$P"
    exec 2>>"$RUN/log/pki.log" >>"$RUN/log/pki.log"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=venturi-e2e-ca" -keyout ca.key -out ca.crt
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr
    printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out apiserver.crt -extfile apiserver.ext
    # admin client cert (group system:masters), used by kubectl/helm/tests and by kcm, scheduler, kwok
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=venturi-e2e-admin" -keyout admin.key -out admin.csr
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out admin.crt -extfile client.ext
    # front proxy (aggregation layer): lets aggregated APIs (e.g. a metrics API) authenticate the
    # apiserver, and gives kcm/scheduler the requestheader CA they look up in extension-apiserver-authentication
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=venturi-e2e-front-proxy-ca" -keyout front-proxy-ca.key -out front-proxy-ca.crt
    openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout front-proxy-client.key -out front-proxy-client.csr
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial -days 3650 -out front-proxy-client.crt -extfile client.ext
    # ServiceAccount token signing key pair
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
    openssl verify -CAfile ca.crt apiserver.crt admin.crt
  ) || die "PKI generation failed; log: $RUN/log/pki.log"
}

write_kubeconfigs() {
  local P=$RUN/pki server=https://127.0.0.1:$API_PORT ca
  ca=$(base64 -w0 <"$P/ca.crt")
  cat >"$RUN/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: venturi-e2e
  cluster: {server: "$server", certificate-authority-data: "$ca"}
users:
- name: admin
  user: {client-certificate-data: "$(base64 -w0 <"$P/admin.crt")", client-key-data: "$(base64 -w0 <"$P/admin.key")"}
contexts:
- name: venturi-e2e
  context: {cluster: venturi-e2e, user: admin}
current-context: venturi-e2e
EOF
  # Same cluster, no credentials: use with --token=... (a client cert would take precedence over a token).
  cat >"$RUN/noauth.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: venturi-e2e
  cluster: {server: "$server", certificate-authority-data: "$ca"}
users:
- name: none
  user: {}
contexts:
- name: venturi-e2e
  context: {cluster: venturi-e2e, user: none}
current-context: venturi-e2e
EOF
  chmod 600 "$RUN/admin.kubeconfig"
}

resolve_bins() {
  eval "$("$HERE/build.sh" --print)"   # K8S_BIN KWOK_BIN HELM_BIN
  KUBECTL=$K8S_BIN/kubectl
  [[ -x $KUBECTL ]] || KUBECTL=$(command -v kubectl || true)
  ETCD=${VENTURI_E2E_ETCD:-$(command -v etcd || echo /usr/bin/etcd)}
}

# ------------------------------------------------------------------ up
cmd_up() {
  if [[ -e $RUN ]]; then
    [[ -f $MARKER ]] || die "$RUN exists but is not a venturi e2e run dir (no $MARKER); remove it or set VENTURI_E2E_RUN"
    if any_alive; then
      die "a cluster is already running in $RUN (see '$0 status'); run '$0 down' first"
    fi
    log "removing stale run dir $RUN (no live processes)"
    rm -rf "$RUN"
  fi
  "$HERE/build.sh" || die "e2e/build.sh failed"
  resolve_bins
  local b
  [[ -s $KWOK_BIN/stages.yaml ]] || die "missing $KWOK_BIN/stages.yaml (run e2e/build.sh)"
  for b in "$ETCD" "$K8S_BIN/kube-apiserver" "$K8S_BIN/kube-controller-manager" "$K8S_BIN/kube-scheduler" "$KWOK_BIN/kwok" "$KUBECTL"; do
    [[ -x $b ]] || die "missing binary $b (run e2e/build.sh)"
  done
  mkdir -p "$RUN/log" "$RUN/etcd" "$RUN/apiserver-certs"
  : >"$MARKER"
  : >"$PIDS"
  local t0=$SECONDS
  trap 'rc=$?; if [[ $rc -ne 0 ]]; then log "up failed; stopping what was started (logs kept in $RUN/log)"; stop_all; fi' EXIT

  local ports; read -r -a ports <<<"$(free_ports 5)"
  ETCD_PORT=${VENTURI_E2E_ETCD_PORT:-${ports[0]}}
  ETCD_PEER_PORT=${VENTURI_E2E_ETCD_PEER_PORT:-${ports[1]}}
  API_PORT=${VENTURI_E2E_API_PORT:-${ports[2]}}
  KCM_PORT=${VENTURI_E2E_KCM_PORT:-${ports[3]}}
  SCHED_PORT=${VENTURI_E2E_SCHED_PORT:-${ports[4]}}
  log "ports: etcd $ETCD_PORT (peer $ETCD_PEER_PORT), apiserver $API_PORT, kcm $KCM_PORT, scheduler $SCHED_PORT"

  make_pki
  write_kubeconfigs
  local P=$RUN/pki KC=$RUN/admin.kubeconfig

  # --- etcd
  start etcd "$ETCD" --name=venturi-e2e --data-dir="$RUN/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="venturi-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes=8589934592 --auto-compaction-retention=1
  wait_for etcd "$T_ETCD" bash -c "curl -fs http://127.0.0.1:$ETCD_PORT/health | grep -q true"

  # --- kube-apiserver
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --cert-dir="$RUN/apiserver-certs" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
    --client-ca-file="$P/ca.crt" \
    --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$P/sa.pub" \
    --service-account-signing-key-file="$P/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=Node,RBAC \
    --allow-privileged=true \
    --endpoint-reconciler-type=none \
    --profiling=false
  wait_for kube-apiserver "$T_API" curl -fs --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
    "https://127.0.0.1:$API_PORT/readyz"

  # --- kube-controller-manager
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --leader-elect=false \
    --service-account-private-key-file="$P/sa.key" \
    --root-ca-file="$P/ca.crt" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --controllers="$KCM_CONTROLLERS"
  wait_for kube-controller-manager "$T_COMPONENT" curl -fsk "https://127.0.0.1:$KCM_PORT/healthz"

  # --- kube-scheduler
  cat >"$RUN/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: "$KC"
leaderElection:
  leaderElect: false
EOF
  start kube-scheduler "$K8S_BIN/kube-scheduler" --config="$RUN/scheduler.yaml" \
    --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics
  wait_for kube-scheduler "$T_COMPONENT" curl -fsk "https://127.0.0.1:$SCHED_PORT/healthz"

  # --- kwok (no HTTP server: without --server-address/--node-port it opens no listener)
  start kwok "$KWOK_BIN/kwok" --kubeconfig="$KC" --config="$KWOK_BIN/stages.yaml" \
    --manage-all-nodes=true \
    --cidr=10.244.0.0/24 --node-ip=10.244.0.1 \
    --node-lease-duration-seconds=40

  # --- the fake Node (no kwok taint, so ordinary pods schedule on it)
  "$KUBECTL" --kubeconfig="$KC" apply -f - >>"$RUN/log/kubectl.log" 2>&1 <<EOF || die "creating node failed; log: $RUN/log/kubectl.log"
apiVersion: v1
kind: Node
metadata:
  name: $NODE_NAME
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: $NODE_NAME
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake, kubeProxyVersion: fake}
EOF
  wait_for "kwok:node $NODE_NAME Ready" "$T_NODE" "$KUBECTL" --kubeconfig="$KC" wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  # the node-lifecycle controller removes the not-ready taint once the Node is Ready
  wait_for "kube-controller-manager:not-ready taint removed from $NODE_NAME" "$T_NODE" bash -c \
    "t=\$('$KUBECTL' --kubeconfig='$KC' get node '$NODE_NAME' -o jsonpath='{.spec.taints[*].key}') && [[ \$t != *not-ready* ]]"
  # pods need the default ServiceAccount (ServiceAccount admission is on)
  wait_for "kube-controller-manager:serviceaccount default/default exists" "$T_COMPONENT" \
    "$KUBECTL" --kubeconfig="$KC" -n default get serviceaccount default

  cat >"$RUN/env" <<EOF
export VENTURI_E2E_RUN=$RUN
export KUBECONFIG=$RUN/admin.kubeconfig
export VENTURI_E2E_KUBECONFIG=$RUN/admin.kubeconfig
export VENTURI_E2E_NOAUTH_KUBECONFIG=$RUN/noauth.kubeconfig
export VENTURI_E2E_API_SERVER=https://127.0.0.1:$API_PORT
export VENTURI_E2E_CA_FILE=$RUN/pki/ca.crt
export VENTURI_E2E_ETCD=http://127.0.0.1:$ETCD_PORT
export VENTURI_E2E_KCM_PORT=$KCM_PORT
export VENTURI_E2E_SCHED_PORT=$SCHED_PORT
export VENTURI_E2E_NODE=$NODE_NAME
export VENTURI_E2E_KUBECTL=$KUBECTL
export VENTURI_E2E_HELM=$HELM_BIN/helm
export PATH=$K8S_BIN:$HELM_BIN:$KWOK_BIN:\$PATH
EOF
  trap - EXIT
  log "cluster up in $((SECONDS - t0))s (excluding build check). Use: eval \"\$($0 env)\""
}

cmd_down() {
  if [[ ! -d $RUN ]]; then log "no run dir $RUN: nothing to stop"; return 0; fi
  [[ -f $MARKER ]] || die "$RUN is not a venturi e2e run dir (no $MARKER); not touching it"
  stop_all
  if [[ ${VENTURI_E2E_KEEP_RUN:-0} == 1 ]]; then
    log "kept $RUN (logs in $RUN/log)"
  else
    rm -rf "$RUN"; log "removed $RUN"
  fi
}

cmd_env() {
  [[ -f $RUN/env ]] || die "no cluster in $RUN (run '$0 up')"
  cat "$RUN/env"
}

cmd_status() {
  [[ -f $PIDS ]] || { echo "no cluster recorded in $RUN"; return 1; }
  local name pid st rc=0
  while read -r name pid st; do
    if is_ours "$pid" "$st"; then echo "$name pid=$pid running"; else echo "$name pid=$pid DEAD"; rc=1; fi
  done <"$PIDS"
  return $rc
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|env|status" >&2; exit 2 ;;
esac
