"""The operator end to end in-process: kopf handlers against an API that behaves like
Kubernetes (kmock, in kube_harness.py), with a real PostgreSQL for the queue's stats."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kube_harness import DEPLOYMENTS, JOBQUEUES, PODS, KubeHarness, kube_fixture, run_operator

from venturi import PostgresStore, Queue, Task
from venturi_operator.cadence import BURST_WAKE_SECONDS
from venturi_operator.config import OperatorConfig
from venturi_operator.databases import Databases
from venturi_operator.handlers import build_registry
from venturi_operator.kube import Kube
from venturi_operator.metrics import OperatorMetrics
from venturi_operator.reconcile import Reconciler

kube = pytest.fixture(kube_fixture, name="kube")

NS = "apps"
TIMEOUT = 20.0


@dataclass
class Mail(Task):
    KIND = "mail"


@dataclass
class Report(Task):
    KIND = "report"


def spec(prefix: str, secret: str = "db", **pool: Any) -> dict[str, Any]:
    return {
        "database": {"secretName": secret, "prefix": prefix},
        "interval": 1,
        "pools": [
            {
                "deployment": pool.pop("deployment", "mailer"),
                "kinds": ["mail"],
                "maxReplicas": 5,
                "targetPerReplica": 10,
                "cooldownSeconds": 0,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
                **pool,
            }
        ],
    }


@asynccontextmanager
async def operator(kube: KubeHarness) -> AsyncIterator[Reconciler]:
    api = kube.api_client()
    databases = Databases(OperatorConfig(metrics_port=None, liveness_endpoint=None))
    reconciler = Reconciler(Kube(api), databases, OperatorMetrics())
    try:
        async with run_operator(kube, build_registry(reconciler), namespaces=[NS]):
            yield reconciler
    finally:
        api.close()


def condition(jq: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in jq.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


async def replicas_become(kube: KubeHarness, name: str, n: int) -> None:
    await kube.wait_for(
        DEPLOYMENTS, NS, name, lambda d: d["spec"]["replicas"] == n, timeout=TIMEOUT
    )


async def test_scales_from_the_queue_and_reports_it(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store)
    await queue.enqueue_many(Mail() for _ in range(25))
    await queue.enqueue_many(Report() for _ in range(7))  # served by no pool
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "mailer", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with operator(kube) as reconciler:
        await replicas_become(kube, "mailer", 3)  # ceil(25 / 10)
        jq = await kube.wait_for(  # a tick after the scale observes it as current
            JOBQUEUES,
            NS,
            "mail",
            lambda o: (
                condition(o, "Ready").get("status") == "True"
                and o["status"]["pools"][0].get("currentReplicas") == 3
            ),
            timeout=TIMEOUT,
        )
        status = jq["status"]
        assert status["observedGeneration"] == jq["metadata"]["generation"]
        assert status["stats"]["pending"] == 32
        assert status["stats"]["pendingByKind"] == {"mail": 25, "report": 7}
        assert status["stats"]["unservedKinds"] == ["report"]
        [pool] = status["pools"]
        assert (pool["deployment"], pool["currentReplicas"], pool["desiredReplicas"]) == (
            "mailer",
            3,
            3,
        )
        assert status["replicas"] == 3
        for kind in ("Ready", "DatabaseReachable", "ScalingActive", "ScalingLimited", "Fallback"):
            c = condition(jq, kind)
            assert set(c) == {
                "type",
                "status",
                "reason",
                "message",
                "lastTransitionTime",
                "observedGeneration",
            }
        assert condition(jq, "DatabaseReachable")["status"] == "True"
        assert condition(jq, "Fallback")["status"] == "False"
        scaled = [e for e in kube.events(NS, involved="mail") if e["reason"] == "Scaled"]
        assert scaled and "from 0 to 3" in scaled[0]["message"]
        assert scaled[0]["type"] == "Normal"

        # Work drains (the test deletes the jobs, as finishing workers would): back to zero.
        await store._pool.execute(f"DELETE FROM {store.prefix}_jobs WHERE kind = 'mail'")
        await replicas_become(kube, "mailer", 0)
        # The operator remembers the pool is at zero (that is what a NOTIFY wakes up).
        await kube.wait_until(lambda: reconciler.pools_at_zero_for(NS, "mail", "mail"))


async def test_never_zero_while_jobs_are_claimed(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store)
    [_job] = await queue.enqueue_many([Mail()])
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET status = 'claimed', lease_until = now() + interval '1h'"
    )
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "mailer", replicas=1)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: bool(o.get("status", {}).get("pools")),
            timeout=TIMEOUT,
        )
        # Let a few more ticks pass (interval 1 s): the claimed job keeps the replica.
        first = jq["status"]["pools"][0]["lastDecisionTime"]
        await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: o["status"]["pools"][0]["lastDecisionTime"] != first,
            timeout=TIMEOUT,
        )
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 1
        assert jq["status"]["stats"]["claimed"] == 1


async def test_problems_become_conditions_and_others_keep_working(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    await Queue(store).enqueue_many(Mail() for _ in range(15))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.secret(NS, "wrong", string_data={"dsn": "postgresql://nobody@127.0.0.1:1/none"})
    kube.deployment(NS, "mailer", replicas=0)
    kube.deployment(NS, "fallback", replicas=0)
    kube.deployment(NS, "fought", replicas=1)
    kube.hpa(NS, "hpa", target="fought")
    kube.jobqueue(NS, "good", spec(store.prefix))
    kube.jobqueue(NS, "nosecret", spec(store.prefix, secret="absent", deployment="x1"))
    kube.jobqueue(
        NS, "downdb", spec(store.prefix, secret="wrong", deployment="fallback", fallbackReplicas=2)
    )
    kube.jobqueue(NS, "nodeploy", spec(store.prefix, deployment="missing"))
    kube.jobqueue(NS, "conflict", spec(store.prefix, deployment="fought"))

    async def reason(name: str, kind: str, want: str) -> dict[str, Any]:
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            name,
            lambda o: condition(o, kind).get("reason") == want,
            timeout=TIMEOUT,
        )
        return condition(jq, kind)

    async with operator(kube):
        await replicas_become(kube, "mailer", 2)  # the healthy one is unaffected
        c = await reason("nosecret", "Ready", "SecretNotFound")
        assert c["status"] == "False" and "absent" in c["message"]
        assert (await reason("nosecret", "DatabaseReachable", "SecretNotFound"))[
            "status"
        ] == "False"
        warnings = [e for e in kube.events(NS, involved="nosecret") if e["type"] == "Warning"]
        assert warnings and warnings[0]["reason"] == "SecretNotFound"

        c = await reason("downdb", "DatabaseReachable", "ConnectionFailed")
        assert "nobody" not in c["message"] or "<dsn>" in c["message"]  # no DSN leaks
        await replicas_become(kube, "fallback", 2)  # fallbackReplicas works from zero
        assert (await reason("downdb", "Fallback", "FallbackReplicas"))["status"] == "True"

        assert (await reason("nodeploy", "Ready", "DeploymentNotFound"))["status"] == "False"
        c = await reason("conflict", "Ready", "ConflictingAutoscaler")
        assert "HorizontalPodAutoscaler hpa" in c["message"]
        assert kube.get(DEPLOYMENTS, NS, "fought")["spec"]["replicas"] == 1  # left alone


async def test_a_job_wakes_a_pool_at_zero_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "mailer", replicas=0)
    kube.jobqueue(NS, "mail", {**spec(store.prefix), "interval": 3600})
    async with operator(kube):
        await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "Ready").get("status") == "True",
            timeout=TIMEOUT,
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        await Queue(store).enqueue(Mail())
        await replicas_become(kube, "mailer", 1)  # the interval is an hour: only NOTIFY did it
        assert loop.time() - began < TIMEOUT


async def test_a_burst_wakes_a_running_pool_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store)
    await queue.enqueue_many(Mail() for _ in range(5))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "mailer", replicas=1)
    kube.jobqueue(NS, "mail", {**spec(store.prefix), "interval": 3600})
    async with operator(kube) as reconciler:
        await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: (o.get("status", {}).get("pools") or [{}])[0].get("currentReplicas") == 1,
            timeout=TIMEOUT,
        )
        delay = reconciler.wake_delay(NS, "mail", "mail")
        assert delay is not None and 0 <= delay <= BURST_WAKE_SECONDS
        assert reconciler.wake_delay(NS, "mail", "report") is None  # no pool serves it
        await queue.enqueue_many(Mail() for _ in range(100))
        # The interval is an hour: only the NOTIFY (deferred to the burst gap) can do this.
        await replicas_become(kube, "mailer", 5)


async def test_many_jobqueues_share_one_database_connection_budget(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """Twelve queues on one database: one LISTEN connection for all of them (a connection per
    queue would exhaust the operator's small pool and starve the stats queries)."""
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    prefixes = [f"{store.prefix}_{i}" for i in range(12)]
    for i, p in enumerate(prefixes):
        await store.with_prefix(p).migrate()
        kube.deployment(NS, f"d{i}", replicas=0)
        kube.jobqueue(NS, f"q{i}", {**spec(p, deployment=f"d{i}"), "interval": 3600})
    async with operator(kube):
        for i in range(12):
            await kube.wait_for(
                JOBQUEUES,
                NS,
                f"q{i}",
                lambda o: condition(o, "Ready").get("status") == "True",
                timeout=TIMEOUT,
            )
        await Queue(store.with_prefix(prefixes[7])).enqueue(Mail())
        await replicas_become(kube, "d7", 1)  # woken through the shared LISTEN connection
        assert kube.get(DEPLOYMENTS, NS, "d3")["spec"]["replicas"] == 0


COST = "controller.kubernetes.io/pod-deletion-cost"


async def claim_for(store: PostgresStore, pod: str, n: int) -> None:
    """Mark `n` pending mail jobs claimed by `pod`, as a worker there would."""
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET status = 'claimed', claimed_pod = $1, "
        "lease_until = now() + interval '1h' WHERE id IN (SELECT id FROM "
        f"{store.prefix}_jobs WHERE status = 'pending' AND kind = 'mail' LIMIT $2)",
        pod,
        n,
    )


async def test_a_scale_in_marks_idle_pods_and_spares_busy_ones(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """Three pods; two hold jobs. The load wants one replica: the operator sets the pods'
    deletion costs to the jobs each holds and scales in by the one idle pod only."""
    await Queue(store).enqueue_many(Mail() for _ in range(3))
    await claim_for(store, "mailer-a", 2)
    await claim_for(store, "mailer-b", 1)
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "mailer", replicas=3)
    for pod in ("mailer-a", "mailer-b", "mailer-c"):
        kube.pod(NS, pod, labels={"app": "mailer"}, annotations={COST: "7"})
    kube.pod(NS, "other", labels={"app": "other"})
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with operator(kube):
        await replicas_become(kube, "mailer", 2)
        costs = {
            p: kube.get(PODS, NS, p)["metadata"]["annotations"].get(COST)
            for p in ("mailer-a", "mailer-b", "mailer-c")
        }
        assert costs == {"mailer-a": "2", "mailer-b": "1", "mailer-c": "0"}
        assert COST not in kube.get(PODS, NS, "other")["metadata"].get("annotations", {})
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: (
                (o.get("status", {}).get("pools") or [{}])[0].get("currentReplicas") == 2
                and o["status"]["pools"][0].get("reason") == "BusyPodsSpared"
            ),
            timeout=TIMEOUT,
        )
        assert "2 pods hold jobs" in jq["status"]["pools"][0]["message"]
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 2
