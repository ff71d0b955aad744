#!/usr/bin/env bash
# The end-to-end suite in one command: e2e/test_scenario.py against a real Kubernetes API server.
#
#   e2e/run.sh                  build/reuse the binaries, start a local control plane (cluster.sh, in
#                               a run dir of its own), run `python -m pytest e2e -q`, stop everything
#   KUBECONFIG=... e2e/run.sh   use that cluster instead (kubectl and helm from PATH, else from the
#                               e2e cache); the suite installs into venturi-system and e2e-apps
#                               and removes them afterwards
#   e2e/run.sh -k scale -x      extra arguments go to pytest
#
# Everything started here or by the tests (cluster processes, the operator, PostgreSQL,
# Prometheus, workers) is stopped on success and on failure, by PID: cluster.sh stops what it
# recorded, the tests stop what they started and also record it in $WORK/pids (name pid
# starttime signal) so that this script can stop it if pytest dies; a last check fails the run if
# any process carrying this run's marker is still alive. Logs: kept in $WORK on failure
# (VENTURI_E2E_KEEP=1 keeps them on success too).
#
# Environment: VENTURI_E2E_PYTHON (default: the repository's .venv/bin/python, else python3),
# VENTURI_E2E_CACHE (build.sh's cache), VENTURI_E2E_KEEP.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PY=${VENTURI_E2E_PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)

log() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

WORK=$(mktemp -d /tmp/venturi-e2e-suite.XXXXXX)
export VENTURI_E2E_WORKDIR=$WORK
export VENTURI_E2E_PIDFILE=$WORK/pids
: >"$VENTURI_E2E_PIDFILE"
CLUSTER_RUN=$WORK/cluster
STARTED_CLUSTER=0
T0=$SECONDS

# Stop the processes the tests recorded whose start time still matches (pytest normally stops
# them itself; this covers a pytest that was killed).
stop_recorded() {
  local name pid start sig now i
  [[ -f $VENTURI_E2E_PIDFILE ]] || return 0
  while read -r name pid start sig; do
    now=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '$1 != "Z" {print $20}') || now=
    [[ -n $now && $now == "$start" ]] || continue
    log "stopping leftover $name (pid $pid) with $sig"
    kill "-$sig" "$pid" 2>/dev/null || true
    for i in $(seq 100); do
      now=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '$1 != "Z" {print $20}') || now=
      [[ -n $now && $now == "$start" ]] || break
      sleep 0.1
    done
    [[ -n $now && $now == "$start" ]] && kill -KILL "$pid" 2>/dev/null || true
  done <"$VENTURI_E2E_PIDFILE"
}

# PIDs of processes (other than this script and its children doing the check) whose environment
# carries this run's VENTURI_E2E_WORKDIR: everything started by this run inherits it.
leftovers() {
  "$PY" - "$WORK" "$$" <<'PY'
import os, sys
marker = f"VENTURI_E2E_WORKDIR={sys.argv[1]}".encode()
skip = {os.getpid(), os.getppid(), int(sys.argv[2])}
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) in skip:
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        continue
    if marker in env and state != "Z":
        print(pid, cmd)
PY
}

PYTEST_PID=
cleanup() {
  local rc=$? left i
  trap - EXIT INT TERM
  if [[ -n $PYTEST_PID ]] && kill -0 "$PYTEST_PID" 2>/dev/null; then
    # Interrupted: pytest turns SIGTERM into KeyboardInterrupt and runs its fixtures' teardown.
    log "stopping pytest (pid $PYTEST_PID)"
    kill -TERM "$PYTEST_PID" 2>/dev/null || true
    for i in $(seq 1200); do kill -0 "$PYTEST_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PYTEST_PID" 2>/dev/null || true
    wait "$PYTEST_PID" 2>/dev/null || true
  fi
  stop_recorded
  if [[ $STARTED_CLUSTER == 1 ]]; then
    log "stopping the cluster"
    VENTURI_E2E_RUN=$CLUSTER_RUN VENTURI_E2E_KEEP_RUN=$([[ $rc -ne 0 ]] && echo 1 || echo 0) \
      "$HERE/cluster.sh" down || rc=1
  fi
  left=$(leftovers)
  if [[ -n $left ]]; then
    log "ERROR: processes of this run are still alive:"$'\n'"$left"
    rc=1
  fi
  if [[ $rc -eq 0 && ${VENTURI_E2E_KEEP:-0} != 1 ]]; then
    rm -rf "$WORK"
  else
    log "logs kept in $WORK (session/log: operator, prometheus, workers; cluster/log: control plane)"
  fi
  log "done in $((SECONDS - T0))s, exit $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -n ${KUBECONFIG:-} ]]; then
  log "using the cluster of KUBECONFIG=$KUBECONFIG"
  "$HERE/build.sh" --monitoring-crds
  eval "$("$HERE/build.sh" --print)"
  KUBECTL=$(command -v kubectl || true)
  [[ -n $KUBECTL ]] || KUBECTL=$K8S_BIN/kubectl
  HELM=$(command -v helm || true)
  [[ -n $HELM ]] || HELM=$HELM_BIN/helm
  [[ -x $KUBECTL && -x $HELM ]] || { log "ERROR: need kubectl and helm (PATH, or e2e/build.sh)"; exit 1; }
  export VENTURI_E2E_KUBECTL=$KUBECTL VENTURI_E2E_HELM=$HELM VENTURI_E2E_CLUSTER_OWNED=0
else
  log "starting a local control plane in $CLUSTER_RUN"
  STARTED_CLUSTER=1
  VENTURI_E2E_RUN=$CLUSTER_RUN "$HERE/cluster.sh" up
  eval "$(VENTURI_E2E_RUN=$CLUSTER_RUN "$HERE/cluster.sh" env)"
  eval "$("$HERE/build.sh" --print)"
  export VENTURI_E2E_CLUSTER_OWNED=1
fi
export VENTURI_E2E_MONITORING_CRDS=$MONITORING_CRDS
log "cluster ready after $((SECONDS - T0))s; running pytest"

cd "$ROOT"
# Temporary files of the tests (EmbeddedPostgres' data dir) under $WORK too. PostgreSQL runs as
# the postgres user when we are root: it must be able to traverse $WORK (not list it).
chmod 711 "$WORK"
mkdir -m 755 "$WORK/tmp"
# In the background, so that a signal to this script is handled at once (cleanup above).
TMPDIR=$WORK/tmp "$PY" -m pytest e2e -q -p no:cacheprovider --durations=12 --basetemp="$WORK/pytest" "$@" &
PYTEST_PID=$!
wait "$PYTEST_PID"
