#!/usr/bin/env bash
# Smoke check of the e2e control plane: brings a cluster up (own run dir), exercises Deployments,
# the scale subresource, kwok's fake pods, ServiceAccount tokens and RBAC, then tears it down,
# also on failure. Exit status 0 = all checks passed.
#
#   e2e/smoke.sh
#   VENTURI_E2E_KEEP_RUN=1 e2e/smoke.sh    # keep the run dir (logs, kubeconfig) after teardown
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export VENTURI_E2E_RUN=${VENTURI_E2E_RUN:-/tmp/venturi-e2e-smoke-run}
NS=venturi-smoke
T=${VENTURI_E2E_SMOKE_TIMEOUT:-90}   # seconds per wait

step() { printf '\n[smoke %s] == %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[smoke] FAIL: %s\n' "$*" >&2; exit 1; }
ok() { printf '[smoke] ok: %s\n' "$*" >&2; }

PASSED=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 || $PASSED -ne 1 ]]; then
    printf '\n[smoke] FAILED (rc=%s). Last log lines of each component:\n' "$rc" >&2
    for f in "$VENTURI_E2E_RUN"/log/*.log; do
      [[ -f $f ]] || continue
      printf -- '--- %s\n' "$f" >&2; tail -n 15 "$f" >&2
    done
    [[ $rc -eq 0 ]] && rc=1
  fi
  step "teardown"
  "$HERE/cluster.sh" down || rc=1
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# poll CMD until it succeeds, at most $1 seconds
until_ok() {
  local t=$1; shift
  local deadline=$((SECONDS + t))
  while ((SECONDS < deadline)); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  return 1
}

t_start=$SECONDS
step "cluster up"
"$HERE/cluster.sh" up
eval "$("$HERE/cluster.sh" env)"
t_up=$((SECONDS - t_start))
ok "cluster up in ${t_up}s"
k() { "$VENTURI_E2E_KUBECTL" "$@"; }
k version
k get nodes -o wide

step "Deployment with 2 replicas"
k create namespace "$NS"
until_ok "$T" k -n "$NS" get serviceaccount default || fail "no default ServiceAccount in $NS"
k -n "$NS" create deployment smoke --image=registry.invalid/venturi/fake:smoke --replicas=2
pods_running() {
  local phases
  phases=$(k -n "$NS" get pods -l app=smoke -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')
  [[ $(grep -c '^Running$' <<<"$phases") -eq 2 && $(wc -l <<<"$phases") -eq 2 ]]
}
until_ok "$T" pods_running || { k -n "$NS" get pods -o wide >&2; fail "2 pods not Running within ${T}s"; }
k -n "$NS" get pods -o wide
ready_2() { [[ $(k -n "$NS" get deploy smoke -o jsonpath='{.status.readyReplicas}') == 2 ]]; }
until_ok "$T" ready_2 || { k -n "$NS" get deploy smoke -o yaml >&2; fail "Deployment does not report 2 ready replicas"; }
k -n "$NS" get deploy smoke
ok "2 pods Running, Deployment readyReplicas=2"

step "scale to 0 through the scale subresource"
k get --raw "/apis/apps/v1/namespaces/$NS/deployments/smoke/scale"; echo
k -n "$NS" patch deployment smoke --subresource=scale --type=merge -p '{"spec":{"replicas":0}}'
scale=$(k get --raw "/apis/apps/v1/namespaces/$NS/deployments/smoke/scale")
grep -q '"replicas":0' <<<"$scale" || fail "scale subresource does not show replicas 0: $scale"
no_pods() { [[ -z $(k -n "$NS" get pods -l app=smoke -o name) ]]; }
until_ok "$T" no_pods || { k -n "$NS" get pods -o wide >&2; fail "pods still present ${T}s after scaling to 0"; }
zero_ready() { [[ $(k -n "$NS" get deploy smoke -o jsonpath='{.status.replicas}{.status.readyReplicas}') == "" ]]; }
until_ok "$T" zero_ready || fail "Deployment status does not show 0 replicas"
k -n "$NS" get deploy smoke
ok "scaled to 0, pods gone"

step "ServiceAccount token and RBAC"
k -n "$NS" create serviceaccount smoke-sa
k -n "$NS" create role pod-reader --verb=get,list,watch --resource=pods
k -n "$NS" create rolebinding smoke-sa-pod-reader --role=pod-reader --serviceaccount="$NS:smoke-sa"
TOKEN=$(k -n "$NS" create token smoke-sa --duration=10m)
[[ -n $TOKEN ]] || fail "kubectl create token returned nothing"
ok "got a TokenRequest token (${#TOKEN} chars)"
# credential-less kubeconfig: with the admin one, the client certificate would win over --token
ks() { "$VENTURI_E2E_KUBECTL" --kubeconfig="$VENTURI_E2E_NOAUTH_KUBECONFIG" --token="$TOKEN" "$@"; }
who=$(ks auth whoami -o jsonpath='{.status.userInfo.username}')
[[ $who == "system:serviceaccount:$NS:smoke-sa" ]] || fail "token authenticates as '$who'"
ok "token authenticates as $who"
can() { # expect VERB RESOURCE [-n NS]...: expect yes|no
  local want=$1; shift
  local got; got=$(ks auth can-i "$@" 2>/dev/null || true)
  [[ $got == "$want" ]] || fail "auth can-i $* -> '$got', expected '$want'"
  ok "can-i $* -> $got"
}
can yes list pods -n "$NS"
can yes get pods -n "$NS"
can no delete pods -n "$NS"
can no list pods -n kube-system
can no list secrets -n "$NS"
can no create deployments -n "$NS"
can no patch deployments --subresource=scale -n "$NS"
can no '*' '*' --all-namespaces
ks -n "$NS" get pods >/dev/null || fail "granted 'list pods' failed with the token"
if out=$(ks -n "$NS" get deployments 2>&1); then fail "listing deployments with the token was allowed"; fi
grep -q Forbidden <<<"$out" || fail "expected Forbidden, got: $out"
ok "real request denied: $(head -1 <<<"$out")"

PASSED=1
step "all smoke checks passed (cluster up took ${t_up}s, total $((SECONDS - t_start))s before teardown)"
