"""The end-to-end scenario (issue 6), one test per step, in order; run it with `e2e/run.sh`.

1. `helm install --wait` of the chart with monitoring on and namespaced RBAC; the API server
   accepted every object.
2. The operator runs as a local process with a token of the chart's ServiceAccount: the chart's
   RBAC is what it has (and only that): no Secret but those it was given.
3. An embedded PostgreSQL, `venturi migrate`, dead jobs seeded by a real worker, the Secret, a
   worker Deployment at 0 and the JobQueue: Ready, idle, reconciling once per interval.
4. A JobQueue whose Secret does not exist: not Ready (SecretNotFound), a Warning Event, Fallback
   (issue step 7; done here so that steps 5-6 prove the first JobQueue keeps working beside it).
5. Invalid JobQueues are rejected by the API server (issue step 6).
6. A backlog scales the pool up to what the policy says; status, Events and printer columns.
7. Real `venturi worker` processes drain it; the pool is never at zero while a job is claimed,
   and goes to zero after its cooldown; the workers stop on SIGTERM with status 0.
8. Prometheus scraped all along: rules, alerts, every dashboard query, promtool.
9. The JobQueues are deleted while the operator runs (its finalizer goes); fixtures and run.sh
   stop everything.

Later steps use what earlier ones did (session fixtures and `State`); run the whole file.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from e2e.app import FAIL_KIND, KINDS, SLEEP_KIND, Fail, Sleep

from conftest import (
    APPS_NS,
    CHART,
    MISSING_SECRET,
    OPERATOR_NS,
    PREFIX,
    SCRAPE_INTERVAL,
    SECRET,
    Abort,
    Db,
    Helm,
    Kubectl,
    Object,
    Operator,
    Ports,
    Proc,
    Processes,
    Prometheus,
    Release,
    abort_unless,
    b64,
    cluster_pids,
    condition,
    http_get,
    listeners,
    venturi_bin,
    wait_until,
    worker_env,
)
from venturi import JobFilter, JobStatus, Priority, Task
from venturi.embedded import EmbeddedPostgres

QUEUE = "e2e-queue"
DEPLOYMENT = "e2e-worker"
BROKEN = "e2e-nosecret"
BROKEN_DEPLOYMENT = "e2e-other"
OTHER_SECRET = "e2e-not-given"  # a Secret the operator was not given (rbac.secretNames)

INTERVAL = 2  # spec.interval, seconds
COOLDOWN = 5  # cooldownSeconds
TARGET = 10  # targetPerReplica
MAX_REPLICAS = 5
MAX_AGE = 10  # maxOldestPendingAge, seconds: the backlog waits longer than this on purpose

BACKLOG = 100  # e2e_sleep jobs
SLEEP_SECONDS = 0.3
LONG = 2  # e2e_sleep jobs that outlast the backlog's drain: they keep one pod busy at scale-in
LONG_SECONDS = 30.0
DEAD_SEEDED = 3  # e2e_fail jobs killed before the JobQueue exists
DEAD_IN_BACKLOG = 2  # e2e_fail jobs in the backlog

CONDITION_TYPES = {
    "Ready",
    "DatabaseReachable",
    "ScalingActive",
    "ScalingLimited",
    "Fallback",
    "UnservedKinds",
}
REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ALERTS = {
    "VenturiDeadJobsGrowing",
    "VenturiJobQueueNotReconciled",
    "VenturiJobQueueStatsUnavailable",
    "VenturiOldestPendingAgeAboveTarget",
    "VenturiPoolAtMaxReplicas",
    "VenturiReconcileErrors",
}


@dataclass
class State:
    """What earlier steps leave for later ones."""

    queue_created: float | None = None
    broken_created: float | None = None
    backlog_enqueued: float | None = None
    drained: float | None = None
    scaled_to_zero: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="session")
def state() -> State:
    return State()


# --------------------------------------------------------------------------- helpers


def jobqueue(
    name: str,
    secret: str,
    deployment: str,
    kinds: list[str],
    *,
    prefix: str = PREFIX,
    min_replicas: int = 0,
    max_replicas: int = MAX_REPLICAS,
    queues: list[str] | None = None,
) -> Object:
    pool: Object = {
        "deployment": deployment,
        "kinds": kinds,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "targetPerReplica": TARGET,
        "cooldownSeconds": COOLDOWN,
        "maxOldestPendingAge": MAX_AGE,
        # The HPA's default 300 s scale-down window would hold the pool for 5 minutes.
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
    }
    if queues is not None:
        pool["queues"] = queues
    return {
        "apiVersion": "venturi.dev/v1alpha1",
        "kind": "JobQueue",
        "metadata": {"name": name, "namespace": APPS_NS},
        "spec": {
            "database": {"secretName": secret, "key": "dsn", "prefix": prefix},
            "interval": INTERVAL,
            "pools": [pool],
        },
    }


def worker_deployment(name: str, queue: str) -> Object:
    """A worker Deployment at 0 replicas, opted in to being scaled by the JobQueue `queue`;
    kwok fakes its pods (the real workers run locally)."""
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "worker"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": APPS_NS,
            "labels": labels,
            "annotations": {"venturi.dev/jobqueue": queue},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    # Above the worker's shutdown_timeout (10 s, e2e/app.py): a removed pod
                    # drains instead of being killed.
                    "terminationGracePeriodSeconds": 15,
                    "containers": [
                        {
                            "name": "worker",
                            "image": "registry.invalid/venturi/e2e-worker:0",
                            "command": ["venturi", "worker", "e2e.app:make_worker"],
                        }
                    ],
                },
            },
        },
    }


def replicas(kubectl: Kubectl, name: str = DEPLOYMENT) -> int:
    dep = kubectl.get("deployment", name, APPS_NS)
    return int(dep["spec"].get("replicas", 1))


def jq_status(kubectl: Kubectl, name: str) -> Object:
    status: Object = kubectl.get("jobqueue", name, APPS_NS).get("status") or {}
    return status


def cond(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    found = condition({"status": status}, type_)
    assert found is not None, f"no {type_} condition in {status.get('conditions')}"
    return found


def events(kubectl: Kubectl, name: str, reason: str) -> list[Object]:
    items: list[Object] = kubectl.json(
        "get",
        "events",
        "-n",
        APPS_NS,
        "--field-selector",
        f"involvedObject.kind=JobQueue,involvedObject.name={name},reason={reason}",
    )["items"]
    return items


def table(kubectl: Kubectl, *args: str) -> list[dict[str, str]]:
    """`kubectl get` output as rows keyed by column header (cells may be empty)."""
    lines = kubectl.run("get", *args).stdout.rstrip("\n").splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        bounds = zip(starts, [*starts[1:], None], strict=True)
        rows.append({n: line[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)})
    return rows


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """A sample's value in Prometheus text format (labels must match exactly those given)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name) : line.rindex("}") + 1]))
        if got == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


def start_worker(
    processes: Processes, name: str, dsn: str, metrics_port: int, pod: str | None = None
) -> Proc:
    env = worker_env(dsn, metrics_port)
    if pod is not None:
        env["POD_NAME"] = pod  # its claims count for that (kwok) pod of the Deployment
    return processes.start(name, [venturi_bin("venturi"), "worker", "e2e.app:make_worker"], env=env)


def worker_pods(kubectl: Kubectl) -> dict[str, Object]:
    selector = f"app.kubernetes.io/name={DEPLOYMENT}"
    items = kubectl.json("get", "pods", "-n", APPS_NS, "-l", selector)["items"]
    return {p["metadata"]["name"]: p for p in items}


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def stop_worker(processes: Processes, proc: Proc) -> None:
    rc = processes.stop(proc, sig=signal.SIGTERM, timeout=30)
    assert rc == 0, f"{proc.name} exited {rc} on SIGTERM:\n{proc.tail()}"


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


# --------------------------------------------------------------------------- 1. the chart


def test_01_chart_installed_and_accepted(
    kubectl: Kubectl, helm: Helm, release: Release, monitoring_crds: list[str]
) -> None:
    status = json.loads(
        helm.run("status", release.name, "-n", release.namespace, "-o", "json").stdout
    )
    assert status["info"]["status"] == "deployed"

    for name in ["jobqueues.venturi.dev", *monitoring_crds]:
        crd = kubectl.get("crd", name)
        for type_ in ("Established", "NamesAccepted"):
            c = condition(crd, type_)
            assert c is not None, (name, type_)
            assert c["status"] == "True", (name, type_, c)
    crd = kubectl.get("crd", "jobqueues.venturi.dev")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"]
    assert version["storage"]
    assert version["subresources"] == {"status": {}}

    # Namespaced RBAC: a Role and RoleBinding in the watched namespace, nothing cluster-wide.
    role = kubectl.get("role", release.fullname, APPS_NS)
    granted = {(r["apiGroups"][0], res) for r in role["rules"] for res in r["resources"]}
    assert {
        ("venturi.dev", "jobqueues"),
        ("venturi.dev", "jobqueues/status"),
        ("apps", "deployments"),
        ("apps", "deployments/scale"),
        ("", "pods"),
        ("", "secrets"),
        ("", "events"),
    } <= granted
    binding = kubectl.get("rolebinding", release.fullname, APPS_NS)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": release.fullname,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": release.service_account, "namespace": OPERATOR_NS}
    ]
    assert not kubectl.exists("clusterrole", release.fullname)
    assert not kubectl.exists("clusterrolebinding", release.fullname)
    kubectl.get("serviceaccount", release.service_account, OPERATOR_NS)

    # The operator Deployment, its pod Running under kwok, and the Service in front of it.
    dep = kubectl.get("deployment", release.fullname, OPERATOR_NS)
    assert cond(dep["status"], "Available")["status"] == "True"
    assert dep["status"].get("readyReplicas") == 1
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={APPS_NS}" in args
    assert "--all-namespaces" not in args
    selector = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
    pods = kubectl.json("get", "pods", "-n", OPERATOR_NS, "-l", selector)["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    svc = kubectl.get("service", release.fullname, OPERATOR_NS)
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 8080)]
    assert svc["spec"]["selector"].items() <= pods[0]["metadata"]["labels"].items()

    # ServiceMonitor: selects that Service (by its labels) in the release namespace.
    monitor = kubectl.get("servicemonitor", release.fullname, OPERATOR_NS)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [OPERATOR_NS]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]

    rule = kubectl.get("prometheusrule", release.fullname, OPERATOR_NS)
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == ALERTS

    maps = kubectl.json("get", "configmaps", "-n", OPERATOR_NS, "-l", "grafana_dashboard=1")
    dashboards = {}
    for cm in maps["items"]:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        dashboards[key] = json.loads(text)
        assert text == (CHART / "dashboards" / key).read_text().rstrip("\n")
    assert sorted(dashboards) == ["queue.json", "scaling.json"]
    assert {d["uid"] for d in dashboards.values()} == {"venturi-queue", "venturi-scaling"}


# --------------------------------------------------------------------------- 2. the operator


def can_i(kubectl: Kubectl, kubeconfig: Path, *args: str) -> bool:
    result = kubectl.run("auth", "can-i", *args, kubeconfig=str(kubeconfig), check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def test_02_operator_runs_with_the_chart_serviceaccount(
    kubectl: Kubectl, release: Release, sa_kubeconfig: Path, operator: Operator
) -> None:
    who = kubectl.json("auth", "whoami", kubeconfig=str(sa_kubeconfig))
    expected = f"system:serviceaccount:{OPERATOR_NS}:{release.service_account}"
    assert who["status"]["userInfo"]["username"] == expected
    allowed = [
        ("watch", "jobqueues.venturi.dev", "-n", APPS_NS),
        ("patch", "jobqueues.venturi.dev", "-n", APPS_NS),
        ("patch", "jobqueues.venturi.dev", "--subresource=status", "-n", APPS_NS),
        ("get", "deployments.apps", "-n", APPS_NS),
        ("patch", "deployments.apps", "--subresource=scale", "-n", APPS_NS),
        ("list", "horizontalpodautoscalers.autoscaling", "-n", APPS_NS),
        ("get", f"secret/{SECRET}", "-n", APPS_NS),
        ("get", f"secret/{MISSING_SECRET}", "-n", APPS_NS),
        ("create", "events", "-n", APPS_NS),
        # pod-deletion-cost on the worker pods before a scale-in
        ("get", "pods", "-n", APPS_NS),
        ("list", "pods", "-n", APPS_NS),
        ("patch", "pods", "-n", APPS_NS),
        # its leader election's Lease, in its own namespace
        ("create", "leases.coordination.k8s.io", "-n", OPERATOR_NS),
        ("get", f"leases.coordination.k8s.io/{release.fullname}", "-n", OPERATOR_NS),
        ("update", f"leases.coordination.k8s.io/{release.fullname}", "-n", OPERATOR_NS),
    ]
    denied = [
        ("patch", "deployments.apps", "-n", APPS_NS),  # scale subresource only
        ("delete", "jobqueues.venturi.dev", "-n", APPS_NS),
        ("list", "secrets", "-n", APPS_NS),
        ("get", "secrets", "-n", APPS_NS),  # any Secret: only the ones it was given
        ("get", f"secret/{OTHER_SECRET}", "-n", APPS_NS),
        ("get", f"secret/{SECRET}", "-n", "default"),
        ("patch", "deployments.apps", "--subresource=scale", "-n", "default"),
        ("watch", "jobqueues.venturi.dev", "-n", "default"),
        ("get", "secrets", "-n", OPERATOR_NS),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("delete", "pods", "-n", APPS_NS),  # the ReplicaSet deletes pods, not the operator
        ("create", "pods", "-n", APPS_NS),
        ("patch", "pods", "-n", "default"),
        ("list", "pods", "-n", OPERATOR_NS),
        ("update", "leases.coordination.k8s.io/another", "-n", OPERATOR_NS),
        ("get", "leases.coordination.k8s.io", "-n", APPS_NS),
    ]
    for args in allowed:
        assert can_i(kubectl, sa_kubeconfig, *args), f"the chart's RBAC should allow {args}"
    for args in denied:
        assert not can_i(kubectl, sa_kubeconfig, *args), f"the chart's RBAC allows {args}"

    # The operator leads: it created the chart's Lease with that RBAC, and renews it.
    def held() -> Object | None:
        lease = kubectl.get("lease", release.fullname, OPERATOR_NS)
        return lease if lease["spec"].get("holderIdentity") else None

    lease = wait_until("the operator holds its Lease", held, timeout=30)
    assert lease["spec"]["leaseDurationSeconds"] == 15
    renewed = lease["metadata"]["resourceVersion"]
    wait_until(
        "the Lease renewed",
        lambda: (
            kubectl.get("lease", release.fullname, OPERATOR_NS)["metadata"]["resourceVersion"]
            != renewed
        ),
        timeout=30,
    )

    # The same, asked by the admin on the ServiceAccount's behalf (impersonation), and for
    # real: a Secret it was not given cannot be read, the one it was given can.
    account = f"--as=system:serviceaccount:{OPERATOR_NS}:{release.service_account}"
    assert can_i(
        kubectl, Path(kubectl.kubeconfig), "get", f"secret/{SECRET}", "-n", APPS_NS, account
    )
    for args in (("get", f"secret/{OTHER_SECRET}"), ("get", "secrets"), ("list", "secrets")):
        assert not can_i(kubectl, Path(kubectl.kubeconfig), *args, "-n", APPS_NS, account), args
    not_given = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": OTHER_SECRET, "namespace": APPS_NS},
        "type": "Opaque",
        "data": {"dsn": b64("postgresql://someone:else@elsewhere/db")},
    }
    kubectl.apply(not_given)
    denied_read = kubectl.run(
        "get", "secret", OTHER_SECRET, "-n", APPS_NS, kubeconfig=str(sa_kubeconfig), check=False
    )
    assert denied_read.returncode != 0, denied_read.stdout
    assert "Forbidden" in denied_read.stderr, denied_read.stderr
    assert operator.proc.alive()
    assert "venturi_reconcile_duration_seconds" in operator.metrics()


# --------------------------------------------------------------------------- 3. the JobQueue


def test_03_jobqueue_ready_and_idle(
    kubectl: Kubectl,
    db: Db,
    processes: Processes,
    ports: Ports,
    operator: Operator,
    state: State,
) -> None:
    # Dead jobs before the JobQueue exists, killed by a real worker (the dead-job series then
    # exist from the operator's first tick on, long enough for the alert's [15m:1m] subquery).
    db.call(db.queue.enqueue_many([Fail(reason=f"seeded {i}") for i in range(DEAD_SEEDED)]))
    seeder = start_worker(processes, "worker-seed", db.dsn, ports.workers[0])

    def seeded() -> bool:
        abort_unless(seeder.alive(), lambda: f"worker exited:\n{seeder.tail()}")
        return db.stats().dead_by_kind.get(FAIL_KIND) == DEAD_SEEDED

    wait_until("seeded jobs dead", seeded, timeout=60)
    stop_worker(processes, seeder)

    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": APPS_NS},
        "type": "Opaque",
        "data": {"dsn": b64(db.dsn)},
    }
    kubectl.apply(secret, worker_deployment(DEPLOYMENT, QUEUE))
    # The pool names its queue: its load is its kinds' jobs within the default queue.
    kubectl.apply(jobqueue(QUEUE, SECRET, DEPLOYMENT, list(KINDS), queues=["default"]))
    state.queue_created = time.time()

    def ready() -> Object | None:
        obj = kubectl.get("jobqueue", QUEUE, APPS_NS)
        status = obj.get("status") or {}
        ok = (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and (condition(obj, "Ready") or {}).get("status") == "True"
        )
        return status if ok else None

    status = wait_until("JobQueue Ready", ready, timeout=60)
    assert (status["stats"]["pending"], status["stats"]["claimed"]) == (0, 0)
    assert status["stats"]["deadByKind"] == {FAIL_KIND: DEAD_SEEDED}
    (pool,) = status["pools"]
    assert pool["deployment"] == DEPLOYMENT
    assert (pool["currentReplicas"], pool["desiredReplicas"]) == (0, 0)
    assert pool["reason"] == "Idle"
    assert replicas(kubectl) == 0  # dead jobs need no worker
    finalizers = kubectl.get("jobqueue", QUEUE, APPS_NS)["metadata"].get("finalizers")
    assert finalizers == ["venturi.dev/operator"]


def test_03b_idle_jobqueue_reconciles_once_per_interval(operator: Operator) -> None:
    """Nothing changes, so the operator ticks every spec.interval; its own status patches
    must not wake it up for extra reconciles."""

    def ticks() -> float:
        value = metric_value(
            operator.metrics(),
            "venturi_reconcile_duration_seconds_count",
            jobqueue=QUEUE,
            jobqueue_namespace=APPS_NS,
        )
        assert value is not None
        return value

    # A measurement window of 5 intervals, sampled every 0.2 s: the extra ticks come right
    # after the regular ones, so two ticks within one sample gap are the symptom.
    window = 5 * INTERVAL
    started = time.monotonic()
    samples = [(0.0, ticks())]
    while samples[-1][0] < window:
        time.sleep(0.2)
        samples.append((time.monotonic() - started, ticks()))
    elapsed = samples[-1][0]
    done = samples[-1][1] - samples[0][1]
    expected = elapsed / INTERVAL
    bursts = [(round(t, 1), n - m) for (_, m), (t, n) in itertools.pairwise(samples) if n - m > 1]
    assert done >= expected / 2, f"{done:.0f} ticks in {elapsed:.1f}s: the daemon stalls"
    extra_ticks = bool(bursts) or done > expected + 1.5
    assert not extra_ticks, (
        f"{done:.0f} reconcile ticks in {elapsed:.1f}s of an idle JobQueue with interval "
        f"{INTERVAL}s (expected {expected:.0f}); ticks in bursts (seconds, ticks within 0.2 s): "
        f"{bursts}. Each status patch wakes the daemon for an extra tick: "
        "handlers.on_change sets the wake-up on every MODIFIED event, status included"
    )


# --------------------------------------------------------------------------- 4. missing Secret


def test_04_missing_secret_is_reported_and_the_first_queue_keeps_working(
    kubectl: Kubectl, operator: Operator, state: State
) -> None:
    kubectl.apply(worker_deployment(BROKEN_DEPLOYMENT, BROKEN))
    kubectl.apply(jobqueue(BROKEN, MISSING_SECRET, BROKEN_DEPLOYMENT, ["e2e_other"]))
    state.broken_created = time.time()

    def not_ready() -> Object | None:
        obj = kubectl.get("jobqueue", BROKEN, APPS_NS)
        status = obj.get("status") or {}
        ready = condition(obj, "Ready") or {}
        ok = status.get("observedGeneration") == obj["metadata"]["generation"] and (
            ready.get("status") == "False"
        )
        return status if ok else None

    status = wait_until("the JobQueue without its Secret reports it", not_ready, timeout=60)
    for type_ in ("Ready", "DatabaseReachable"):
        c = cond(status, type_)
        assert (c["status"], c["reason"]) == ("False", "SecretNotFound"), c
        assert MISSING_SECRET in c["message"], c
    active = cond(status, "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "StatsUnavailable"), active
    fallback = cond(status, "Fallback")
    assert fallback["status"] == "True", fallback  # decisions without stats: keep replicas
    assert "stats" not in status or status["stats"].get("pending") is None
    assert replicas(kubectl, BROKEN_DEPLOYMENT) == 0

    warnings = wait_until(
        "a Warning Event SecretNotFound on the JobQueue",
        lambda: events(kubectl, BROKEN, "SecretNotFound"),
        timeout=30,
    )
    assert all(e["type"] == "Warning" for e in warnings), warnings
    assert MISSING_SECRET in warnings[0]["message"]
    assert warnings[0]["involvedObject"]["kind"] == "JobQueue"

    # The first JobQueue keeps reading its stats (a tick after the broken one appeared).
    assert state.broken_created is not None
    created = state.broken_created

    def first_fresh() -> bool:
        status = jq_status(kubectl, QUEUE)
        return (
            parse_time(status["stats"]["observedTime"]) > created
            and cond(status, "Ready")["status"] == "True"
        )

    wait_until("the first JobQueue ticks on, Ready", first_fresh, timeout=30)
    text = operator.metrics()
    up = "venturi_jobqueue_stats_up"
    assert metric_value(text, up, jobqueue=QUEUE, jobqueue_namespace=APPS_NS) == 1.0
    assert metric_value(text, up, jobqueue=BROKEN, jobqueue_namespace=APPS_NS) == 0.0


# --------------------------------------------------------------------------- 5. invalid specs


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        (
            "e2e-bad-bounds",
            {"min_replicas": 3, "max_replicas": 2},
            "minReplicas must be less than or equal to maxReplicas",
        ),
        (
            "e2e-bad-prefix",
            {"prefix": "Bad-Prefix"},
            "spec.database.prefix in body should match '^[a-z][a-z0-9_]{0,38}$'",
        ),
        (
            "e2e-bad-kinds",
            {"kinds_twice": True},
            "two pools that name the same fields (kinds, queues, or both) may not serve",
        ),
        (
            "e2e-bad-queues",
            {"kinds_twice": True, "queues": ["high", "default"]},
            "a kind (in a queue, when they name queues) or a queue (when they name no kinds)",
        ),
        (
            "e2e-bad-queue-pools",
            {"queues_twice": True, "queues": ["high", "default"]},
            "or a queue (when they name no kinds) is named by one of them only",
        ),
        # The pools are a list-type map keyed by deployment, each pool's kinds a list-type set:
        # the API server itself refuses duplicates (spec.py refuses them too).
        (
            "e2e-dup-deployment",
            {"deployment_twice": True},
            'spec.pools[1]: Duplicate value: {"deployment":"e2e-worker"}',
        ),
        (
            "e2e-dup-kind",
            {"kinds": ["e2e_a", "e2e_b", "e2e_a"]},
            'spec.pools[0].kinds[2]: Duplicate value: "e2e_a"',
        ),
    ],
)
def test_05_invalid_jobqueue_is_rejected(
    kubectl: Kubectl, release: Release, name: str, change: dict[str, Any], message: str
) -> None:
    change = dict(change)
    twice = change.pop("kinds_twice", False)
    queues_twice = change.pop("queues_twice", False)
    deployment_twice = change.pop("deployment_twice", False)
    kinds = change.pop("kinds", ["e2e_a", "e2e_b"])
    queues = change.pop("queues", None)
    obj = jobqueue(name, SECRET, DEPLOYMENT, kinds, queues=queues, **change)
    if twice:
        second = dict(obj["spec"]["pools"][0], deployment="e2e-worker-b", kinds=["e2e_b"])
        if queues is not None:  # the second pool shares one queue and one kind
            second["queues"] = queues[1:]
        obj["spec"]["pools"].append(second)
    if queues_twice:  # two pools of queues only, sharing one queue
        del obj["spec"]["pools"][0]["kinds"]
        second = dict(obj["spec"]["pools"][0], deployment="e2e-worker-b", queues=queues[1:])
        obj["spec"]["pools"].append(second)
    if deployment_twice:
        second = dict(obj["spec"]["pools"][0], kinds=["e2e_c"])
        obj["spec"]["pools"].append(second)
    result = kubectl.apply(obj, check=False)
    assert result.returncode != 0, f"the API server accepted an invalid JobQueue: {result.stdout}"
    assert f'The JobQueue "{name}" is invalid' in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert not kubectl.exists("jobqueue", name, APPS_NS)


# --------------------------------------------------------------------------- 6. scale up


def test_06_backlog_scales_the_pool_up(kubectl: Kubectl, db: Db, state: State) -> None:
    tasks: list[Task] = [Sleep(seconds=SLEEP_SECONDS) for _ in range(BACKLOG)]
    tasks += [Fail(reason=f"backlog {i}") for i in range(DEAD_IN_BACKLOG)]
    db.call(db.queue.enqueue_many(tasks))
    state.backlog_enqueued = time.time()
    outstanding = BACKLOG + DEAD_IN_BACKLOG
    expected = min(math.ceil(outstanding / TARGET), MAX_REPLICAS)
    assert expected == MAX_REPLICAS

    # The default scale-up policy allows +4 pods per 15 s from zero, then the rest.
    wait_until(
        f"Deployment scaled to {expected}", lambda: replicas(kubectl) >= expected, timeout=90
    )
    assert replicas(kubectl) == expected  # never above maxReplicas

    def running() -> bool:
        dep = kubectl.get("deployment", DEPLOYMENT, APPS_NS)
        pods = kubectl.json(
            "get", "pods", "-n", APPS_NS, "-l", f"app.kubernetes.io/name={DEPLOYMENT}"
        )["items"]
        phases = [p["status"].get("phase") for p in pods]
        return (
            phases.count("Running") == expected and dep["status"].get("readyReplicas") == expected
        )

    wait_until(f"{expected} worker pods Running (kwok)", running, timeout=120)

    def settled() -> Object | None:
        status = jq_status(kubectl, QUEUE)
        pool = (status.get("pools") or [{}])[0]
        ok = (
            pool.get("currentReplicas") == expected
            and pool.get("desiredReplicas") == expected
            and (status.get("stats") or {}).get("pending") == outstanding
        )
        return status if ok else None

    status = wait_until("JobQueue status shows the scaled pool", settled, timeout=30)
    obj = kubectl.get("jobqueue", QUEUE, APPS_NS)
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert {c["type"] for c in status["conditions"]} == CONDITION_TYPES
    for c in status["conditions"]:  # metav1.Condition's shape
        assert c["status"] in ("True", "False"), c
        assert REASON.match(c["reason"]), c
        assert isinstance(c["message"], str), c
        assert c["message"], c
        assert RFC3339.match(c["lastTransitionTime"]), c
        assert c["observedGeneration"] == obj["metadata"]["generation"], c
    expect = {
        "Ready": ("True", "Reconciled"),
        "DatabaseReachable": ("True", "StatsRead"),
        "ScalingActive": ("True", "Scaling"),
        "ScalingLimited": ("True", "TooManyReplicas"),  # 11 needed, maxReplicas 5
        "Fallback": ("False", "StatsAvailable"),
        "UnservedKinds": ("False", "AllKindsServed"),  # no worker registered yet: none known
    }
    for type_, (want_status, want_reason) in expect.items():
        c = cond(status, type_)
        assert (c["status"], c["reason"]) == (want_status, want_reason), c
    stats = status["stats"]
    assert (stats["pending"], stats["claimed"]) == (outstanding, 0)
    assert stats["pendingByKind"] == {SLEEP_KIND: BACKLOG, FAIL_KIND: DEAD_IN_BACKLOG}
    assert stats["deadByKind"] == {FAIL_KIND: DEAD_SEEDED}
    assert stats["oldestPendingAge"] > 0
    assert stats["unservedKinds"] == []
    (pool,) = status["pools"]
    assert (pool["pending"], pool["claimed"]) == (outstanding, 0)
    assert pool["recommendedReplicas"] == math.ceil(outstanding / TARGET)
    assert pool["fallback"] is False
    assert RFC3339.match(pool["lastScaleTime"])
    assert (status["replicas"], status["desiredReplicas"]) == (expected, expected)

    scaled = events(kubectl, QUEUE, "Scaled")
    assert scaled
    assert all(e["type"] == "Normal" for e in scaled), scaled
    messages = " | ".join(e["message"] for e in scaled)
    assert f"Scaled Deployment {DEPLOYMENT} from 0 to" in messages, messages
    assert f"to {expected}" in messages, messages

    rows = {r["NAME"]: r for r in table(kubectl, "jobqueues", "-n", APPS_NS)}
    row = rows[QUEUE]
    assert list(row) == ["NAME", "PENDING", "CLAIMED", "OLDEST", "REPLICAS", "READY", "AGE"]
    assert (row["PENDING"], row["CLAIMED"], row["REPLICAS"], row["READY"]) == (
        str(outstanding),
        "0",
        str(expected),
        "True",
    ), row
    assert float(row["OLDEST"]) > 0, row
    assert rows[BROKEN]["READY"] == "False", rows[BROKEN]
    wide = {r["NAME"]: r for r in table(kubectl, "jobqueues", "-n", APPS_NS, "-o", "wide")}
    assert (wide[QUEUE]["DESIRED"], wide[QUEUE]["REASON"], wide[QUEUE]["PAUSED"]) == (
        str(expected),
        "Reconciled",
        "false",
    ), wide[QUEUE]
    assert wide[BROKEN]["REASON"] == "SecretNotFound", wide[BROKEN]


# --------------------------------------------------------------------------- 7. drain


@dataclass(frozen=True)
class Sample:
    at: float
    pending: int
    claimed: int
    replicas: int


def test_07_workers_drain_the_queue_and_the_pool_goes_to_zero(
    kubectl: Kubectl,
    db: Db,
    processes: Processes,
    ports: Ports,
    state: State,
    workdir: Path,
    operator: Operator,
    postgres: EmbeddedPostgres,
) -> None:
    # The first worker claims as one of the Deployment's (kwok) pods, and holds two long jobs
    # through the drain: the operator must see that pod as busy, and spare it, at a scale-in.
    busy_pod = sorted(worker_pods(kubectl))[0]
    db.call(
        db.queue.enqueue_many(
            [Sleep(seconds=LONG_SECONDS) for _ in range(LONG)], priority=Priority.HIGH
        )
    )
    first = start_worker(processes, "worker-1", db.dsn, ports.workers[0], busy_pod)
    wait_until(
        "the first worker holds the long jobs",
        lambda: db.call(db.queue.claimed_by_pod()).get(busy_pod) == LONG,
        timeout=30,
    )
    workers = [
        first,
        *(
            start_worker(processes, f"worker-{i + 2}", db.dsn, port)
            for i, port in enumerate(ports.workers[1:])
        ),
    ]
    samples: list[Sample] = []
    scale_in: dict[str, Object] = {}  # the worker pods just after the first scale-in

    def sample() -> Sample:
        for w in workers:
            if not w.alive():
                raise Abort(f"{w.name} exited:\n{w.tail()}")
        stats = db.stats()
        s = Sample(time.time(), stats.pending, stats.claimed, replicas(kubectl))
        if not scale_in and samples and s.replicas < samples[-1].replicas:
            scale_in.update(worker_pods(kubectl))
        samples.append(s)
        return s

    def drained() -> Sample | None:
        s = sample()
        return s if s.pending == 0 and s.claimed == 0 else None

    def at_zero() -> Sample | None:
        s = sample()
        return s if s.replicas == 0 else None

    # Poll the queue and the Deployment together, throughout the drain (~0.2 s per sample).
    drained_sample = wait_until("the workers drain the queue", drained, timeout=180, interval=0)
    state.drained = drained_sample.at
    zero = wait_until(
        "the pool scales to zero after its cooldown",
        at_zero,
        timeout=COOLDOWN + 10 * INTERVAL + 30,
        interval=0.2,
    )
    state.scaled_to_zero = zero.at

    busy = [s for s in samples if s.claimed > 0]
    assert len(busy) >= 3, f"the drain was not observed: {samples[:5]}"
    unserved = [s for s in busy if s.replicas == 0]
    assert not unserved, f"the Deployment was at 0 while jobs were claimed: {unserved}"

    # Before the first scale-in the operator marked every pod with the jobs it held, and
    # fenced the idle pods it was taking (cost -1, below every other): the busy one costs
    # more than the idle ones, and the ReplicaSet took the fenced pods.
    assert scale_in, "no scale-in was observed"
    costs = {
        n: p["metadata"].get("annotations", {}).get(DELETION_COST) for n, p in scale_in.items()
    }
    assert None not in costs.values(), f"pods without a deletion cost at a scale-in: {costs}"
    leaving = {n for n, p in scale_in.items() if p["metadata"].get("deletionTimestamp")}
    assert costs.get(busy_pod) == str(LONG), (busy_pod, costs)
    assert busy_pod not in leaving, (busy_pod, costs, leaving)
    assert all(costs[n] == "-1" for n in leaving), (costs, leaving)
    after = [s for s in samples if s.at >= drained_sample.at]
    assert any(s.replicas == 1 for s in after), (
        "expected the last replica to be held during the cooldown",
        [(round(s.at - drained_sample.at, 1), s.replicas) for s in after],
    )
    idle_for = zero.at - drained_sample.at
    # The operator sees the idle queue up to one interval late, and counts the cooldown from
    # its last tick that saw work.
    assert idle_for >= COOLDOWN - INTERVAL - 0.5, f"scaled to zero {idle_for:.1f}s after idle"
    assert idle_for <= COOLDOWN + 5 * INTERVAL + 5, f"scaled to zero {idle_for:.1f}s after idle"
    assert any(" to 0 " in e["message"] for e in events(kubectl, QUEUE, "Scaled"))

    # Everything this run started (control plane, PostgreSQL, Prometheus, operator, workers)
    # listens on 127.0.0.1 only.
    ours = {p.pid: p.name for p in processes.started if p.alive()}
    assert postgres.pid is not None
    ours[postgres.pid] = "postgres"
    bound = listeners(set(ours) | cluster_pids())
    silent = {name for pid, name in ours.items() if pid not in {b[1] for b in bound}}
    assert not silent, f"no listener found for {silent} (ss output: {bound})"
    public = [b for b in bound if not b[0].startswith("127.0.0.1:")]
    assert not public, f"listeners not on 127.0.0.1: {public}"

    # The workers' own /metrics (what the dashboards' throughput panels read) pass promtool.
    status, text = http_get(f"http://127.0.0.1:{ports.workers[0]}/metrics")
    assert status == 200
    assert 'venturi_jobs_settled_total{kind="e2e_sleep",outcome="completed"}' in text
    result = promtool("check", "metrics", input=text)
    assert result.returncode == 0, result.stdout + result.stderr

    for w in workers:
        stop_worker(processes, w)
    timeline = workdir / "drain-timeline.tsv"
    timeline.write_text(
        "seconds_since_drained\tpending\tclaimed\treplicas\n"
        + "".join(
            f"{s.at - drained_sample.at:.2f}\t{s.pending}\t{s.claimed}\t{s.replicas}\n"
            for s in samples
        )
    )
    completed = db.call(
        db.queue.jobs(JobFilter(status=JobStatus.COMPLETED, kind=SLEEP_KIND, limit=1000))
    )
    assert len(completed) == BACKLOG + LONG
    assert db.stats().dead_by_kind == {FAIL_KIND: DEAD_SEEDED + DEAD_IN_BACKLOG}
    state.extra["samples"] = len(samples)
    # The replica changes the operator made (for the monitoring checks), against its Events.
    text = http_get(operator.metrics_url)[1]
    made = sum(
        metric_value(text, "venturi_pool_scale_events_total", **labels) or 0.0
        for labels in (
            {"jobqueue_namespace": APPS_NS, "jobqueue": QUEUE, "pool": DEPLOYMENT, "direction": d}
            for d in ("up", "down")
        )
    )
    scaled = events(kubectl, QUEUE, "Scaled")
    # Up in one step, down to what the long jobs hold, then to zero.
    assert made == sum(int(e.get("count") or 1) for e in scaled) >= 3, (made, scaled)
    state.extra["scale_events"] = made
    print(f"drain: {len(samples)} samples, {len(busy)} with claimed jobs; timeline {timeline}")


@dataclass
class Unregistered(Task):
    """A kind the JobQueue's pool is given, and its workers (e2e.app) have no task for."""

    KIND = "e2e_unregistered"


def test_07b_a_kind_the_pools_workers_do_not_register_is_a_condition_not_demand(
    kubectl: Kubectl, db: Db, state: State
) -> None:
    """The pool is at zero. Its workers (the first one as one of its kwok pods) registered
    e2e_sleep and e2e_fail; the JobQueue now gives the pool another kind, and a job of it
    arrives. No worker of the pool would take it: the pool stays at zero (by what its workers
    of this pod template registered), and the JobQueue says why -- the condition and the
    pool's unservedKinds, read back from the real API server (its schema prunes a field it
    does not declare)."""
    assert state.scaled_to_zero is not None, "the drain did not run"
    kinds = [*KINDS, Unregistered.KIND]
    kubectl.apply(jobqueue(QUEUE, SECRET, DEPLOYMENT, kinds, queues=["default"]))
    db.call(db.queue.enqueue(Unregistered()))
    try:

        def said() -> Object | None:
            status = jq_status(kubectl, QUEUE)
            c = condition({"status": status}, "UnservedKinds") or {}
            return status if c.get("status") == "True" else None

        status = wait_until("the JobQueue names the unserved job", said, timeout=10 * INTERVAL)
        c = cond(status, "UnservedKinds")
        assert c["reason"] == "KindsUnserved", c
        prefix = f"pool {DEPLOYMENT}: pending {Unregistered.KIND} (queue default), which its"
        assert c["message"].startswith(prefix), c
        assert "when last seen" in c["message"], c
        (pool,) = status["pools"]
        assert pool["unservedKinds"] == [Unregistered.KIND], pool
        assert pool["pending"] == 1, pool
        warned = wait_until(
            "a KindsUnserved Warning", lambda: events(kubectl, QUEUE, "KindsUnserved"), timeout=30
        )
        assert all(e["type"] == "Warning" for e in warned), warned
        # Ticks go on (each rewrites lastDecisionTime, to the second) and none wakes the pool.
        decided = {pool["lastDecisionTime"]}

        def ticked_twice() -> bool:
            (p,) = jq_status(kubectl, QUEUE)["pools"]
            if p["desiredReplicas"] != 0 or replicas(kubectl) != 0:
                raise Abort(f"the pool woke for a job none of its workers serves: {p}")
            decided.add(p["lastDecisionTime"])
            return len(decided) >= 3

        wait_until("two more ticks", ticked_twice, timeout=10 * INTERVAL, interval=0.2)
    finally:
        db.call(
            db.store._pool.execute(f"DELETE FROM {PREFIX}_jobs WHERE kind = $1", Unregistered.KIND)
        )
        kubectl.apply(jobqueue(QUEUE, SECRET, DEPLOYMENT, list(KINDS), queues=["default"]))


# --------------------------------------------------------------------------- 8. monitoring


def promtool(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], input=input, capture_output=True, text=True, timeout=60, check=False
    )


def test_08a_promtool_checks_the_rendered_rules(prometheus: Prometheus) -> None:
    result = promtool("check", "rules", str(prometheus.rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout, result.stdout


def test_08b_promtool_checks_the_operator_metrics(operator: Operator) -> None:
    text = operator.metrics()
    for name in ("venturi_jobqueue_stats_up", "venturi_pool_desired_replicas"):
        assert f"\n{name}{{" in text, name
    result = promtool("check", "metrics", input=text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not result.stdout.strip(), result.stdout


def test_08c_prometheus_scraped_everything_and_evaluates_the_rules(
    prometheus: Prometheus, state: State
) -> None:
    targets = prometheus.api("targets")["activeTargets"]
    jobs = {t["labels"]["job"] for t in targets}
    assert jobs == {"venturi-operator", "venturi-workers"}, targets
    operator_target = next(t for t in targets if t["labels"]["job"] == "venturi-operator")
    assert operator_target["health"] == "up", operator_target
    assert state.backlog_enqueued is not None
    for job in jobs:  # every target was up at some point (the workers are stopped by now)
        series = prometheus.query_range(
            f'max_over_time(up{{job="{job}"}}[1m])', prometheus.started_at
        )
        values = {float(v) for s in series for _, v in s["values"]}
        assert 1.0 in values, (job, series)

    # Prometheus has caught up with the end of the scenario: the pool at 0 again.
    final = f'venturi_pool_current_replicas{{jobqueue="{QUEUE}",pool="{DEPLOYMENT}"}}'
    wait_until(
        "Prometheus scraped the pool back at 0",
        lambda: [s for s in prometheus.query(final) if float(s["value"][1]) == 0],
        timeout=30,
    )

    groups = prometheus.api("rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == ALERTS
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule)
        assert not rule.get("lastError"), (name, rule)

    # Alerts that the broken JobQueue makes true right now, as the rule engine evaluates them
    # ("pending": their `for:` is minutes, longer than the scenario).
    def pending() -> set[tuple[str, str]] | None:
        found = {
            (a["labels"]["alertname"], a["labels"]["jobqueue"])
            for a in prometheus.api("alerts")["alerts"]
            if a["state"] in ("pending", "firing")
        }
        want = {
            ("VenturiJobQueueStatsUnavailable", BROKEN),
            ("VenturiReconcileErrors", BROKEN),
        }
        return found if want <= found else None

    alerts = wait_until("alerts pending for the broken JobQueue", pending, timeout=60)
    assert ("VenturiJobQueueStatsUnavailable", QUEUE) not in alerts


# The dashboards' variables as a user would pick them: the apps namespace and both JobQueues
# (Grafana formats a multi-value regex variable as (a|b)); $__rate_interval as Grafana computes
# it for a 1 s scrape interval and 1 s step: max(4 * scrape interval, step + scrape interval).
VARIABLES = {
    "$jobqueue_namespace": APPS_NS,
    "$jobqueue": f"({QUEUE}|{BROKEN})",
    "$__rate_interval": f"{4 * SCRAPE_INTERVAL:g}s",
}


def substitute(expr: str) -> str:
    for var in sorted(VARIABLES, key=len, reverse=True):  # $jobqueue_namespace before $jobqueue
        expr = expr.replace(var, VARIABLES[var])
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def dashboard_targets() -> Iterator[Any]:
    for path in sorted((CHART / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        panels = [p for top in board["panels"] for p in [top, *top.get("panels", [])]]
        for panel in panels:
            for i, target in enumerate(panel.get("targets", [])):
                yield pytest.param(
                    path.name,
                    panel["title"],
                    target["expr"],
                    id=f"{path.stem}:{panel['id']}:{panel['title']}:{i}",
                )


def _max(series: list[Object]) -> float:
    return max(float(v) for s in series for _, v in s["values"] if v not in ("NaN", "+Inf"))


def _scale_events_counted(series: list[Object], state: State) -> bool:
    """Every replica change the operator made in the scenario shows in the last hour's count.

    Prometheus sees a counter child only from its first scrape: a child that the first
    increment creates starts at 1, and increase() never counts that first increment. So each
    (pool, direction) child must exist at 0 before the pool's first scale event.
    """
    made = state.extra["scale_events"]
    shown = _max(series)
    assert shown >= made - 0.5, (
        f"the 'Scale events (1h)' panel shows {shown:.2f} but the operator scaled {made:.0f} "
        "times: venturi_pool_scale_events_total{direction=...} children are created by their "
        "first inc() (they start at 1, and increase() misses that first scale event per pool "
        "and direction); create them at 0 when a pool is first seen"
    )
    return True


# What some panels must show over the scenario, beyond "some data".
PANEL_VALUES: dict[tuple[str, str], Callable[[list[Object], State], bool]] = {
    ("queue.json", "Pending"): lambda s, _: _max(s) >= BACKLOG,
    ("queue.json", "Dead"): lambda s, _: _max(s) >= DEAD_SEEDED + DEAD_IN_BACKLOG,
    ("queue.json", "Completed / s"): lambda s, _: _max(s) > 0,
    ("scaling.json", "Current replicas"): lambda s, _: _max(s) == MAX_REPLICAS,
    ("scaling.json", "Desired replicas"): lambda s, _: _max(s) == MAX_REPLICAS,
    ("scaling.json", "Scale events (1h)"): _scale_events_counted,
    ("scaling.json", "Reconcile errors (1h)"): lambda s, _: _max(s) > 0,
}


@pytest.mark.parametrize(("dashboard", "title", "expr"), list(dashboard_targets()))
def test_08d_every_dashboard_query_returns_data(
    prometheus: Prometheus, state: State, dashboard: str, title: str, expr: str
) -> None:
    """Each panel query over the scenario, as a Grafana time-series panel asks for it: a range
    query with 1 s steps. "Returns data" = at least one series with at least one sample."""
    assert state.scaled_to_zero is not None, "the scenario did not run to its end"
    query = substitute(expr)
    series = prometheus.query_range(query, prometheus.started_at)
    assert any(s["values"] for s in series), f"no data for {title}: {query}"
    check = PANEL_VALUES.get((dashboard, title))
    if check is not None:  # (re-evaluated a few times: the last scrapes may still be coming)

        def shows() -> bool:
            return check(prometheus.query_range(query, prometheus.started_at), state)

        wait_until(f"the panel {title!r} shows the scenario ({query})", shows, timeout=15)


def test_08e_dashboard_variables_list_the_jobqueues(prometheus: Prometheus) -> None:
    """The variables' label_values(...) queries, through the label values API Grafana uses."""
    for path in sorted((CHART / "dashboards").glob("*.json")):
        variables = json.loads(path.read_text())["templating"]["list"]
        for var in variables:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
            assert m, var["query"]
            selector = m.group(1).replace('=~"$jobqueue_namespace"', f'=~"{APPS_NS}"')
            values = set(prometheus.api(f"label/{m.group(2)}/values", **{"match[]": selector}))
            want = {APPS_NS} if var["name"] == "jobqueue_namespace" else {QUEUE, BROKEN}
            assert values == want, (path.name, var["name"], values)


def alert_rules() -> dict[str, str]:
    import yaml

    groups = yaml.safe_load((CHART / "rules" / "alerts.yaml").read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def labelset(series: list[Object], *keys: str) -> set[tuple[str, ...]]:
    return {tuple(s["metric"].get(k, "") for k in keys) for s in series}


def test_08f_alert_expressions_return_data(prometheus: Prometheus, state: State) -> None:
    """Each alert expression as Prometheus evaluates it, over the scenario (a range query):

    - false all along: JobQueueNotReconciled (each JobQueue ticks), while its left side (the
      time since each JobQueue's last tick) returns a series per JobQueue;

    - true by design at some point of the scenario, so the full expression returns the series
      it should (and only those): StatsUnavailable and ReconcileErrors (the JobQueue without its
      Secret), OldestPendingAgeAboveTarget and PoolAtMaxReplicas (the backlog before the workers
      started: older than maxOldestPendingAge 10 s, 11 replicas wanted, 5 allowed);
    - VenturiDeadJobsGrowing compares the dead count with 15 minutes ago on a 1-minute grid,
      longer than the scenario: its expression without the `> 0` threshold must return a series
      per dead kind (the delta is computed: the subquery found two points), with a value >= 0.
    """
    assert state.scaled_to_zero is not None, "the scenario did not run to its end"
    rules = alert_rules()
    assert set(rules) == ALERTS
    start = prometheus.started_at
    jq = ("jobqueue_namespace", "jobqueue")

    got = prometheus.query_range(rules["VenturiJobQueueStatsUnavailable"], start)
    assert labelset(got, *jq) == {(APPS_NS, BROKEN)}, got
    got = prometheus.query_range(rules["VenturiReconcileErrors"], start)
    assert labelset(got, *jq, "reason") == {(APPS_NS, BROKEN, "SecretNotFound")}, got
    got = prometheus.query_range(rules["VenturiOldestPendingAgeAboveTarget"], start)
    assert labelset(got, *jq, "pool") == {(APPS_NS, QUEUE, DEPLOYMENT)}, got
    assert _max(got) > MAX_AGE
    got = prometheus.query_range(rules["VenturiPoolAtMaxReplicas"], start)
    assert labelset(got, *jq, "pool") == {(APPS_NS, QUEUE, DEPLOYMENT)}, got
    assert _max(got) == MAX_REPLICAS

    # Never true here: both JobQueues tick every interval (the broken one's ticks fail, and
    # are stamped too). Its left side is how long ago each JobQueue's last tick ended.
    stale = rules["VenturiJobQueueNotReconciled"]
    assert prometheus.query_range(stale, start) == []
    since, _, _ = stale.partition(">")
    got = prometheus.query_range(since, start)
    assert labelset(got, *jq) == {(APPS_NS, QUEUE), (APPS_NS, BROKEN)}, got

    dead = rules["VenturiDeadJobsGrowing"]
    assert dead.rstrip().endswith("> 0"), dead
    without_threshold = dead.rstrip().removesuffix("> 0")
    # The [15m:1m] subquery needs two minute-aligned points since the dead series appeared.
    found = wait_until(
        "the dead-jobs delta computed",
        lambda: prometheus.query(without_threshold),
        timeout=150,
        interval=2,
    )
    assert labelset(found, *jq, "kind") == {(APPS_NS, QUEUE, FAIL_KIND)}, found
    assert all(float(s["value"][1]) >= 0 for s in found), found
    full = prometheus.query(dead)  # valid; returns the series exactly when the delta is > 0
    assert labelset(full, *jq, "kind") <= {(APPS_NS, QUEUE, FAIL_KIND)}, full


def test_08g_every_selector_of_the_alerts_returns_data(prometheus: Prometheus) -> None:
    names = sorted({n for e in alert_rules().values() for n in re.findall(r"venturi_\w+", e)})
    assert len(names) >= 6, names
    for name in names:
        series = prometheus.query_range(name, prometheus.started_at)
        assert series, f"no series of {name}"


# --------------------------------------------------------------------------- 9. cleanup


def test_09_jobqueues_are_deleted_while_the_operator_runs(
    kubectl: Kubectl, operator: Operator
) -> None:
    """The operator's finalizer comes off when a JobQueue is deleted, and its series go."""
    started = time.monotonic()
    kubectl.run("delete", "jobqueue", QUEUE, BROKEN, "-n", APPS_NS, "--timeout=60s", timeout=90)
    print(f"JobQueues deleted (finalizer removed) in {time.monotonic() - started:.1f}s")
    assert not kubectl.exists("jobqueue", QUEUE, APPS_NS)
    assert not kubectl.exists("jobqueue", BROKEN, APPS_NS)

    def forgotten() -> bool:
        return f'jobqueue="{QUEUE}"' not in operator.metrics()

    wait_until("the operator drops the deleted JobQueues' series", forgotten, timeout=30)
    assert replicas(kubectl) == 0  # deleting a JobQueue never touches its Deployments
