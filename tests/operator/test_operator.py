"""The operator end to end in-process: kopf handlers against an API that behaves like
Kubernetes (kmock, in kube_harness.py), with a real PostgreSQL for the queue's stats."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from kube_harness import (
    DEPLOYMENTS,
    JOBQUEUES,
    LEASES,
    PODS,
    SECRETS,
    KubeHarness,
    kube_fixture,
    run_operator,
)

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker, WorkerIdentity
from venturi.embedded import free_port
from venturi_operator import __main__ as cli
from venturi_operator import scalein
from venturi_operator import status as status_conditions
from venturi_operator.__main__ import JsonFormatter as OperatorJsonFormatter
from venturi_operator.__main__ import Logging, parse_args
from venturi_operator.cadence import BURST_WAKE_SECONDS
from venturi_operator.config import OperatorConfig
from venturi_operator.databases import DatabaseError, Databases
from venturi_operator.handlers import build_registry
from venturi_operator.kube import SCALE_ANNOTATION, Kube, KubeError, PodState
from venturi_operator.leadership import LEASE_SECONDS
from venturi_operator.metrics import OperatorMetrics
from venturi_operator.reconcile import Reconciler, TickResult

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


def worker(kube: KubeHarness, name: str, jobqueue: str, replicas: int) -> None:
    """A worker Deployment that opted in to being scaled by the JobQueue `jobqueue`."""
    kube.deployment(NS, name, replicas=replicas, annotations={SCALE_ANNOTATION: jobqueue})


@asynccontextmanager
async def operator(kube: KubeHarness, **config: Any) -> AsyncIterator[Reconciler]:
    settings = OperatorConfig(metrics_port=None, liveness_endpoint=None, **config)
    databases = Databases(settings)
    with kube.api_client() as api:
        reconciler = Reconciler(
            Kube(api), databases, OperatorMetrics(), max_replicas=settings.max_replicas
        )
        async with run_operator(kube, build_registry(reconciler), namespaces=[NS]):
            yield reconciler


def condition(jq: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in jq.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


async def ready_becomes(kube: KubeHarness, status: str, name: str = "mail") -> dict[str, Any]:
    """The JobQueue `name` once its Ready condition has `status` ("True", "False")."""
    return await kube.wait_for(
        JOBQUEUES,
        NS,
        name,
        lambda o: condition(o, "Ready").get("status") == status,
        timeout=TIMEOUT,
    )


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
    worker(kube, "mailer", "mail", replicas=0)
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
        for kind in status_conditions.CONDITION_TYPES:
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
        unserved = condition(jq, "UnservedKinds")
        assert (unserved["status"], unserved["reason"]) == ("True", "KindsUnserved")
        assert unserved["message"] == "no pool serves pending or claimed report"
        scaled = [e for e in kube.events(NS, involved="mail") if e["reason"] == "Scaled"]
        assert scaled and "from 0 to 3" in scaled[0]["message"]
        assert scaled[0]["type"] == "Normal"

        # Work drains (the test deletes the jobs, as finishing workers would): back to zero.
        await store._pool.execute(f"DELETE FROM {store.prefix}_jobs WHERE kind = 'mail'")
        await replicas_become(kube, "mailer", 0)
        # Written as a merge patch, the maps by kind dropped no kind: "mail" stayed at 25.
        await kube.wait_for(
            JOBQUEUES, NS, "mail",
            lambda o: o["status"]["stats"]["pendingByKind"] == {"report": 7},
            timeout=TIMEOUT,
        )  # fmt: skip
        # The operator remembers the pool is at zero (that is what a NOTIFY wakes up).
        await kube.wait_until(lambda: reconciler.pools_at_zero_for(NS, "mail", "mail"))


async def test_a_tick_that_fails_is_a_condition_and_a_warning_not_ready(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that makes every tick of a JobQueue raise (a ZeroDivisionError in the policy,
    once) left its status reading Ready from before, with no Event: the pool was no longer
    scaled and nothing said so but the log."""
    queue = Queue(store)
    await queue.enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube) as reconciler:
        await replicas_become(kube, "mailer", 3)
        await ready_becomes(kube, "True")
        broken, failures, thrice = True, [], asyncio.Event()
        tick = reconciler._tick

        async def failing(*args: Any, **kwargs: Any) -> TickResult:
            if broken:
                failures.append(1)
                if len(failures) >= 3:
                    thrice.set()
                raise ZeroDivisionError("float division by zero")
            return await tick(*args, **kwargs)

        monkeypatch.setattr(reconciler, "_tick", failing)
        jq = await ready_becomes(kube, "False")
        ready = condition(jq, "Ready")
        assert ready["reason"] == "ReconcileFailed"
        assert "ZeroDivisionError" in ready["message"] and "division" not in ready["message"]
        await asyncio.wait_for(thrice.wait(), TIMEOUT)  # failing on: still one Warning
        warned = [e for e in kube.events(NS, involved="mail") if e["reason"] == "ReconcileFailed"]
        assert len(warned) == 1 and warned[0]["type"] == "Warning"
        broken = False
        await ready_becomes(kube, "True")


async def test_every_tick_is_stamped_also_one_that_fails(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of each tick is a metric (venturi_jobqueue_last_tick_timestamp_seconds), so an
    alert sees a loop that stopped ticking; a tick that fails still ends, and is stamped."""
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube) as reconciler:
        stamps: asyncio.Queue[tuple[str, str, float, float]] = asyncio.Queue()
        ticked = reconciler.metrics.ticked

        def stamped(namespace: str, name: str, *, at: float, interval: float) -> None:
            ticked(namespace, name, at=at, interval=interval)
            stamps.put_nowait((namespace, name, at, interval))

        monkeypatch.setattr(reconciler.metrics, "ticked", stamped)
        first = await asyncio.wait_for(stamps.get(), TIMEOUT)
        assert first[:2] == (NS, "mail") and first[3] == 1.0  # spec(): interval 1

        async def failing(*args: Any, **kwargs: Any) -> TickResult:
            raise ZeroDivisionError("float division by zero")

        monkeypatch.setattr(reconciler, "_tick", failing)
        await ready_becomes(kube, "False")  # written by a failing tick: every later one fails
        while not stamps.empty():
            stamps.get_nowait()
        later = await asyncio.wait_for(stamps.get(), TIMEOUT)  # a failed tick, stamped
        assert later[2] > first[2]
        exposed = {
            sample.name: sample.value
            for family in reconciler.metrics.collect()
            for sample in family.samples
            if sample.labels == {"jobqueue_namespace": NS, "jobqueue": "mail"}
        }
        assert exposed["venturi_jobqueue_last_tick_timestamp_seconds"] >= later[2]
        assert exposed["venturi_jobqueue_interval_seconds"] == 1.0


async def test_pools_by_queue_scale_from_their_own_queues_jobs(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    await Queue(store, queue="high").enqueue_many(Mail() for _ in range(25))
    await Queue(store).enqueue_many(Mail() for _ in range(12))
    await Queue(store, queue="bulk").enqueue_many(Report() for _ in range(7))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "urgent", "mail", replicas=0)
    worker(kube, "mailer", "mail", replicas=0)
    body = spec(store.prefix, deployment="urgent", queues=["high"])
    del body["pools"][0]["kinds"]  # every kind of queue "high"
    body["pools"].append(dict(spec(store.prefix)["pools"][0]))  # "mail", in every other queue
    kube.jobqueue(NS, "mail", body)

    async with operator(kube):
        await replicas_become(kube, "urgent", 3)  # ceil(25 / 10): the high queue's mail
        await replicas_become(kube, "mailer", 2)  # ceil(12 / 10): the default queue's
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: (
                [p.get("currentReplicas") for p in o.get("status", {}).get("pools", [])] == [3, 2]
            ),
            timeout=TIMEOUT,
        )
        status = jq["status"]
        assert [(p["deployment"], p["pending"]) for p in status["pools"]] == [
            ("urgent", 25),
            ("mailer", 12),
        ]
        assert status["stats"]["pendingByKind"] == {"mail": 37, "report": 7}
        assert status["stats"]["unservedKinds"] == ["report"]  # queue "bulk" has no pool


async def test_never_zero_while_jobs_are_claimed(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store)
    [_job] = await queue.enqueue_many([Mail()])
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET status = 'claimed', lease_until = now() + interval '1h'"
    )
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=1)
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
    worker(kube, "mailer", "good", replicas=0)
    worker(kube, "fallback", "downdb", replicas=0)
    worker(kube, "fought", "conflict", replicas=1)
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
        assert "127.0.0.1:1/none" in c["message"]  # where, and never who (or the password)
        assert "nobody" not in c["message"]
        await replicas_become(kube, "fallback", 2)  # fallbackReplicas works from zero
        # In fallback: "FallbackReplicas" on the tick that raised it, "StatsUnavailable"
        # (keeping 2) on the ticks after; which one a look finds depends on its timing.
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "downdb",
            lambda o: condition(o, "Fallback").get("status") == "True",
            timeout=TIMEOUT,
        )
        assert condition(jq, "Fallback")["reason"] in ("FallbackReplicas", "StatsUnavailable")

        assert (await reason("nodeploy", "Ready", "DeploymentNotFound"))["status"] == "False"
        c = await reason("conflict", "Ready", "ConflictingAutoscaler")
        assert "HorizontalPodAutoscaler hpa" in c["message"]
        assert kube.get(DEPLOYMENTS, NS, "fought")["spec"]["replicas"] == 1  # left alone


async def test_a_job_wakes_a_pool_at_zero_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", {**spec(store.prefix), "interval": 3600})
    async with operator(kube):
        await ready_becomes(kube, "True")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await Queue(store).enqueue(Mail())
        await replicas_become(kube, "mailer", 1)  # the interval is an hour: only NOTIFY did it
        assert loop.time() - began < TIMEOUT


async def test_a_job_wakes_a_pool_by_queue_at_zero_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """A job's NOTIFY names its kind, not its queue: a pool that serves queue "high" only
    waited for its interval (the wake looked up the pool of the kind in the default queue)."""
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "urgent", "mail", replicas=0)
    body = {**spec(store.prefix, deployment="urgent", queues=["high"]), "interval": 3600}
    kube.jobqueue(NS, "mail", body)
    async with operator(kube) as reconciler:
        await ready_becomes(kube, "True")
        # The pool is at zero: a NOTIFY for its kind ticks at once.
        assert reconciler.pools_at_zero_for(NS, "mail", "mail")
        assert reconciler.wake_delay(NS, "mail", "mail") == 0
        await Queue(store, queue="high").enqueue(Mail())
        await replicas_become(kube, "urgent", 1)


async def test_resuming_a_queue_wakes_its_pool_at_zero_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused queue's jobs are not demand; its resume is announced on the jobs channel,
    which the operator heard only for jobs: the pool waited for its interval."""
    queue = Queue(store)
    await queue.pause("default")
    await queue.enqueue_many(Mail() for _ in range(5))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", {**spec(store.prefix), "interval": 3600})
    async with operator(kube) as reconciler:
        await ready_becomes(kube, "True")
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 0  # paused: no demand
        woken = asyncio.Event()
        wake_delay = reconciler.wake_delay

        def watched(namespace: str, name: str, kind: str) -> float | None:
            delay = wake_delay(namespace, name, kind)
            if kind == "" and delay == 0:
                woken.set()
            return delay

        monkeypatch.setattr(reconciler, "wake_delay", watched)
        await queue.resume("default")
        await asyncio.wait_for(woken.wait(), TIMEOUT)  # the notice, not the hourly interval
        await replicas_become(kube, "mailer", 1)


async def test_a_burst_wakes_a_running_pool_without_waiting_for_the_interval(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store)
    await queue.enqueue_many(Mail() for _ in range(5))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=1)
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
        worker(kube, f"d{i}", f"q{i}", replicas=0)
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


# --- least privilege: what creating a JobQueue lets its author do ---------------------------------


async def test_a_deployment_must_opt_in_to_its_jobqueue(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """Naming a Deployment is not enough: it is scaled only if it names the JobQueue."""
    await Queue(store).enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    kube.deployment(NS, "plain", replicas=0)
    worker(kube, "theirs", "other", replicas=0)
    kube.jobqueue(NS, "grab", spec(store.prefix, deployment="plain"))
    kube.jobqueue(NS, "steal", spec(store.prefix, deployment="theirs"))
    async with operator(kube):
        for name, deployment, says in (
            ("grab", "plain", f"annotate deployment plain {SCALE_ANNOTATION}=grab"),
            ("steal", "theirs", "opted in to scaling by JobQueue 'other', not 'steal'"),
        ):
            jq = await kube.wait_for(
                JOBQUEUES,
                NS,
                name,
                lambda o: condition(o, "Ready").get("reason") == "NotOptedIn",
                timeout=TIMEOUT,
            )
            assert condition(jq, "Ready")["status"] == "False"
            assert says in condition(jq, "Ready")["message"]
            [pool] = jq["status"]["pools"]
            assert pool["reason"] == "NotOptedIn"
            assert "desiredReplicas" not in pool
            assert jq["status"]["stats"]["pending"] == 25  # the stats were read: only refused
            assert kube.get(DEPLOYMENTS, NS, deployment)["spec"]["replicas"] == 0

            # kopf posts Events in the background: await it.
            def warned(about: str = name) -> list[dict[str, Any]]:
                return [e for e in kube.events(NS, involved=about) if e["type"] == "Warning"]

            warnings = await kube.wait_until(warned, timeout=TIMEOUT)
            assert [e["reason"] for e in warnings] == ["NotOptedIn"]

        # Whoever may edit the Deployment opts it in: from then on it is scaled.
        kube.patch(
            DEPLOYMENTS, NS, "plain", {"metadata": {"annotations": {SCALE_ANNOTATION: "grab"}}}
        )
        await replicas_become(kube, "plain", 3)
        assert kube.get(DEPLOYMENTS, NS, "theirs")["spec"]["replicas"] == 0


async def test_max_replicas_above_the_operators_limit_is_refused(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    await Queue(store).enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    worker(kube, "bounded", "bounded", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix, maxReplicas=5))
    kube.jobqueue(NS, "bounded", spec(store.prefix, deployment="bounded", maxReplicas=4))
    async with operator(kube, max_replicas=4):
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "Ready").get("reason") == "MaxReplicasAboveLimit",
            timeout=TIMEOUT,
        )
        message = condition(jq, "Ready")["message"]
        assert "maxReplicas 5 is above the operator's limit of 4" in message
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 0
        await replicas_become(kube, "bounded", 3)  # at the limit is fine


async def test_a_missing_key_is_named_without_the_secrets_other_keys(
    kube: KubeHarness, store: PostgresStore
) -> None:
    kube.secret(NS, "db", string_data={"url": "x", "admin-password": "y"})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "Ready").get("reason") == "SecretKeyMissing",
            timeout=TIMEOUT,
        )
        # kopf posts Events in the background: await the Warning.
        [event] = await kube.wait_until(lambda: kube.events(NS, involved="mail"), timeout=TIMEOUT)
    message = condition(jq, "Ready")["message"]
    assert message == f"Secret {NS}/db has no key 'dsn'"
    assert event["message"] == message


# --- DSN secrecy -------------------------------------------------------------------------------


def leaky_dsns(pg_dsn: str) -> dict[str, tuple[str, list[str]]]:
    """JobQueue name -> (a DSN with a password where asyncpg's parser would quote it, the
    password's pieces that must never show). Each piece is unique, so a hit names its case."""
    where = pg_dsn.removeprefix("postgresql://postgres@")  # 127.0.0.1:PORT/postgres
    host = where.split("/")[0]
    return {
        # "#" starts a fragment: the port becomes "Alpha1hush", which int() quotes.
        "fragment": (
            f"postgresql://postgres:Alpha1hush#Alpha2hush@{where}",
            ["Alpha1hush", "Alpha2hush"],
        ),
        # "/" starts the path: the port is "Bravo1hush" and the database the rest.
        "slash": (
            f"postgresql://postgres:Bravo1hush/Bravo2hush@{where}",
            ["Bravo1hush", "Bravo2hush"],
        ),
        # "?" starts the query: "Charlie2hush@..." is a query field without "=".
        "query-mark": (
            f"postgresql://postgres:Charlie1hush?Charlie2hush@{where}",
            ["Charlie1hush", "Charlie2hush"],
        ),
        # An "@" in the password: the host becomes "Delta2hush@127.0.0.1".
        "at-sign": (
            f"postgresql://postgres:Delta1hush@Delta2hush@{where}",
            ["Delta1hush", "Delta2hush"],
        ),
        # A numeric first piece: a valid port, and the database name holds the rest.
        "numeric": (f"postgresql://postgres:4321/Echo2hush@{where}", ["Echo2hush"]),
        # In the query string, with an unescaped "&": "Foxtrot2hush" is a bad query field.
        "query": (
            f"postgresql://postgres@{where}?password=Foxtrot1hush&Foxtrot2hush",
            ["Foxtrot1hush", "Foxtrot2hush"],
        ),
        # No scheme: asyncpg quotes what it took for one.
        "no-scheme": (f"Golf1hush:Golf2hush@{where}", ["Golf1hush", "Golf2hush"]),
        # A "%" that is not an escape (the server trusts us: this one connects).
        "percent": (
            f"postgresql://postgres:Hotel1hush%zzHotel2hush@{where}",
            ["Hotel1hush", "Hotel2hush"],
        ),
        # libpq key=value with an unquoted space in the password.
        "conninfo": (
            f"host={host.split(':')[0]} port={host.split(':')[1]} dbname=postgres user=postgres "
            "password=India1hush India2hush",
            ["India1hush", "India2hush"],
        ),
        # A bad option next to the password in the query.
        "bad-option": (
            f"postgresql://postgres@{where}?password=Juliet1hush&sslmode=Juliet2hush",
            ["Juliet1hush", "Juliet2hush"],
        ),
    }


async def test_no_part_of_a_dsn_but_host_port_and_database_is_ever_shown(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cases = leaky_dsns(pg_dsn)
    for i, (name, (dsn, _)) in enumerate(cases.items()):
        kube.secret(NS, f"db-{name}", string_data={"dsn": dsn})
        worker(kube, f"w{i}", name, replicas=0)
        kube.jobqueue(
            NS,
            name,
            spec(store.prefix, secret=f"db-{name}", deployment=f"w{i}", fallbackReplicas=1),
        )
    async with operator(kube):
        for name in cases:
            await kube.wait_for(
                JOBQUEUES,
                NS,
                name,
                lambda o: condition(o, "DatabaseReachable").get("reason") is not None,
                timeout=TIMEOUT,
            )
        statuses = {name: kube.get(JOBQUEUES, NS, name)["status"] for name in cases}
        failing = {
            n for n, s in statuses.items() if condition({"status": s}, "Ready")["status"] == "False"
        }

        def warned() -> bool:  # kopf posts Events in the background: await every Warning
            about = {e["involvedObject"]["name"] for e in kube.events(NS) if e["type"] == "Warning"}
            return failing <= about

        await kube.wait_until(warned, timeout=TIMEOUT)
        events = kube.events(NS)
    shown = json.dumps(statuses) + json.dumps([e["message"] for e in events]) + caplog.text
    for name, (_, pieces) in cases.items():
        for piece in pieces:
            assert piece.lower() not in shown.lower(), f"{name}: {piece} was shown"
    reasons = {
        name: condition({"status": status}, "DatabaseReachable")["reason"]
        for name, status in statuses.items()
    }
    assert reasons["percent"] == "StatsRead"  # the control: the server trusts us, it connects
    for name in ("fragment", "slash", "query-mark", "query", "bad-option"):
        assert reasons[name] == "InvalidDSN", (name, statuses[name])
    for name in ("at-sign", "numeric"):  # they parse, but the "host" holds half the password
        assert reasons[name] == "ConnectionFailed", (name, statuses[name])
        message = condition({"status": statuses[name]}, "DatabaseReachable")["message"]
        assert "does not say unambiguously where it is" in message, message
    assert set(reasons.values()) <= {"StatsRead", "InvalidDSN", "ConnectionFailed"}, reasons


async def test_json_logs_name_the_jobqueue_and_never_a_password(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    where = pg_dsn.removeprefix("postgresql://postgres@")
    marker = f"Pw{uuid.uuid4().hex}"
    cases = {  # the server trusts us: any password connects
        "good": f"postgresql://postgres:{marker}good@{where}",
        "slash": f"postgresql://postgres:{marker}one/{marker}two@{where}",
        "at-sign": f"postgresql://postgres:{marker}three@{marker}four@{where}",
        "unreachable": f"postgresql://postgres:{marker}five@127.0.0.1:1/postgres",
    }
    for i, (name, dsn) in enumerate(cases.items()):
        kube.secret(NS, f"db-{name}", string_data={"dsn": dsn})
        worker(kube, f"w{i}", name, replicas=0)
        kube.jobqueue(
            NS,
            name,
            spec(store.prefix, secret=f"db-{name}", deployment=f"w{i}", fallbackReplicas=1),
        )
    await Queue(store).enqueue(Mail())
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OperatorJsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        async with operator(kube):
            for i in range(len(cases)):  # "good" scales for its job, the others to fallback
                await replicas_become(kube, f"w{i}", 1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text = out.getvalue()
    assert marker.lower() not in text.lower()
    records = [json.loads(line) for line in text.splitlines()]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records), (
        records
    )
    assert {r["logger"].split(".")[0] for r in records} >= {"kopf", "venturi_operator"}
    about = {
        (r.get("namespace"), r.get("jobqueue")) for r in records if r["logger"] == "kopf.objects"
    }
    assert {(NS, name) for name in cases} <= about, about
    scaled = [r for r in records if "scaled" in r["message"] and r["logger"].startswith("venturi_")]
    assert {(r["namespace"], r["jobqueue"]) for r in scaled} == {(NS, name) for name in cases}


async def test_the_operator_command_logs_json_lines_once_each(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    where = pg_dsn.removeprefix("postgresql://postgres@")
    marker = f"Pw{uuid.uuid4().hex}"
    kube.secret(NS, "db", string_data={"dsn": f"postgresql://postgres:{marker}@{where}"})
    kube.secret(NS, "db-bad", string_data={"dsn": f"postgresql://postgres:{marker}/x@{where}"})
    worker(kube, "mailer", "mail", replicas=0)
    worker(kube, "other", "bad", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    kube.jobqueue(NS, "bad", spec(store.prefix, secret="db-bad", deployment="other"))
    await Queue(store).enqueue(Mail())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "KUBE"))}
    env |= {"KUBECONFIG": str(kube.kubeconfig_path), "VENTURI_LOG_FORMAT": "json"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi_operator",
        f"--namespace={NS}",
        "--metrics-port=0",
        "--liveness=",
        "--log-level=debug",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await replicas_become(kube, "mailer", 1)
        await kube.wait_for(
            JOBQUEUES,
            NS,
            "bad",
            lambda o: condition(o, "DatabaseReachable").get("reason") == "InvalidDSN",
            timeout=TIMEOUT,
        )
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    text = stdout.decode() + stderr.decode()
    assert marker.lower() not in text.lower()
    records = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    started = [
        r
        for r in records
        if r["message"] == "Activity 'build_registry.<locals>.configure' succeeded."
    ]
    assert len(started) == 1, "each record once (kopf's handler is not added too)"
    assert any(r["level"] == "debug" and r["logger"].startswith("kopf") for r in records)
    about = {r.get("jobqueue") for r in records if r["logger"] == "kopf.objects"}
    assert about == {"mail", "bad"}, about


async def test_two_operators_elect_one_leader_and_the_other_takes_over_from_a_killed_one(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, tmp_path: Path
) -> None:
    """Two `venturi-operator --leader-elect` processes: one leads and scales, the other waits
    (its liveness endpoint answering, its leader gauge at 0); the leader SIGKILLed, the other
    takes the lease once it has gone unrenewed for its 15 s, and scales; stopped, it gives
    the lease up."""
    kube.namespace("venturi-system")
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    queue = Queue(store)
    await queue.enqueue(Mail())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "KUBE", "POD_"))}
    env |= {"KUBECONFIG": str(kube.kubeconfig_path), "POD_NAMESPACE": "venturi-system"}
    procs: dict[str, asyncio.subprocess.Process] = {}
    ports: dict[str, tuple[int, int]] = {}
    for name in ("op-a", "op-b"):
        ports[name] = (free_port(), free_port())
        with (tmp_path / f"{name}.log").open("wb") as log:  # the process keeps its own copy
            procs[name] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "venturi_operator",
                f"--namespace={NS}",
                "--leader-elect",
                f"--metrics-port={ports[name][0]}",
                "--metrics-host=127.0.0.1",
                f"--liveness=http://127.0.0.1:{ports[name][1]}/healthz",
                env=env | {"POD_NAME": name},
                stdout=log,
                stderr=log,
            )

    def lease_holder() -> str | None:
        found = kube.find(LEASES, "venturi-system", "venturi-operator")
        name: str | None = (found or {}).get("spec", {}).get("holderIdentity")
        return name

    async def get(port: int, path: str) -> str:
        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                body: bytes = r.read()
                return body.decode()

        return await asyncio.to_thread(fetch)

    try:
        holder = await kube.wait_until(lease_holder, timeout=TIMEOUT)
        leader = holder.split("_")[0]
        follower = "op-b" if leader == "op-a" else "op-a"
        await replicas_become(kube, "mailer", 1)  # the leader acts
        await kube.wait_for(  # a later tick saw it: the one that scaled has ended, stamped
            JOBQUEUES,
            NS,
            "mail",
            lambda o: o.get("status", {}).get("pools", [{}])[0].get("currentReplicas") == 1,
            timeout=TIMEOUT,
        )
        ticked = "venturi_jobqueue_last_tick_timestamp_seconds{"
        leading = await get(ports[leader][0], "/metrics")
        assert "venturi_operator_leader 1.0" in leading and ticked in leading
        following = await get(ports[follower][0], "/metrics")
        assert "venturi_operator_leader 0.0" in following
        assert ticked not in following  # it ticks no JobQueue: it does nothing
        assert "following" in await get(ports[follower][1], "/healthz")

        procs[leader].kill()  # SIGKILL: no lease given up
        await procs[leader].wait()
        await queue.enqueue_many(Mail() for _ in range(24))  # 25 outstanding: 3 replicas
        taken = await kube.wait_until(
            lambda: (h := lease_holder()) is not None and h.startswith(follower) and h,
            timeout=LEASE_SECONDS + 3 * TIMEOUT,
        )
        await replicas_become(kube, "mailer", 3)  # the new leader acts
        lease = kube.get(LEASES, "venturi-system", "venturi-operator")
        assert lease["spec"]["leaseTransitions"] == 1
        assert "venturi_operator_leader 1.0" in await get(ports[follower][0], "/metrics")
        assert "following" not in await get(ports[follower][1], "/healthz")  # kopf's, now

        procs[follower].send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(procs[follower].wait(), TIMEOUT) == 0
        assert lease_holder() is None, taken  # given up: a successor need not wait it out
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in procs}
    assert "following: Lease venturi-system/venturi-operator is held by" in logs[follower]
    assert "leading: Lease venturi-system/venturi-operator is now held by" in logs[follower]


def test_log_options_come_from_flags_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["-n", NS])[1] == Logging("text", "info")
    monkeypatch.setenv("VENTURI_LOG_FORMAT", "json")
    monkeypatch.setenv("VENTURI_LOG_LEVEL", "WARNING")
    assert parse_args(["-n", NS])[1] == Logging("json", "warning")
    assert parse_args(["-n", NS, "--log-format=text", "--log-level=debug"])[1] == Logging(
        "text", "debug"
    )
    monkeypatch.setenv("VENTURI_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit):
        parse_args(["-n", NS])


def test_leader_election_takes_its_namespace_from_a_flag_the_environment_or_the_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("POD_NAME", "venturi-7d9f-abcde")
    monkeypatch.setattr(cli, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    assert parse_args(["-n", NS])[0].leader_election is None  # off unless asked
    with pytest.raises(SystemExit):  # not in a pod, and not told: refused, not guessed
        parse_args(["-n", NS, "--leader-elect"])
    (tmp_path / "namespace").write_text("ops\n")
    monkeypatch.setattr(cli, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    first = parse_args(["-n", NS, "--leader-elect"])[0].leader_election
    assert first is not None and (first.namespace, first.name) == ("ops", "venturi-operator")
    monkeypatch.setenv("POD_NAMESPACE", "venturi-system")
    again = parse_args(["-n", NS, "--leader-elect", "--leader-election-name=mine"])[0]
    assert again.leader_election is not None
    assert (again.leader_election.namespace, again.leader_election.name) == (
        "venturi-system",
        "mine",
    )
    # The pod's name, and a suffix of its own: a restarted container is not the leader it was.
    assert first.identity.startswith("venturi-7d9f-abcde_")
    assert again.leader_election.identity.startswith("venturi-7d9f-abcde_")
    assert first.identity != again.leader_election.identity
    flagged = parse_args(["-n", NS, "--leader-elect", "--leader-election-namespace=x"])[0]
    assert flagged.leader_election is not None and flagged.leader_election.namespace == "x"


def test_the_pooler_comes_from_a_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["-n", NS])[0].pooler == "none"
    assert parse_args(["-n", NS, "--pooler", "transaction"])[0].pooler == "transaction"
    monkeypatch.setenv("VENTURI_OPERATOR_POOLER", "transaction")
    assert parse_args(["-n", NS])[0].pooler == "transaction"
    monkeypatch.setenv("VENTURI_OPERATOR_POOLER", "pgbouncer")
    with pytest.raises(SystemExit):
        parse_args(["-n", NS])


async def test_a_changed_dsn_or_a_deleted_jobqueue_closes_what_no_one_uses(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The pool and LISTEN connection of a DSN no JobQueue uses any more are closed (counted in
    pg_stat_activity by the operator's application_name), and a shared one is kept."""
    app = f"venturi-operator-{uuid.uuid4().hex[:8]}"
    other = f"{pg_dsn}?sslmode=disable"  # the same server under another DSN: another pool

    async def backends() -> set[int]:
        rows = await store._pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app
        )
        return {r["pid"] for r in rows}

    async def eventually(what: str, check: Callable[[set[int]], bool]) -> set[int]:
        # pg_stat_activity has no change feed to await: poll it, with a deadline.
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while not check(pids := await backends()):
            assert asyncio.get_running_loop().time() < deadline, f"{what}: not so ({pids})"
            await asyncio.sleep(0.1)
        return pids

    async def ready(name: str) -> None:
        await kube.wait_for(
            JOBQUEUES,
            NS,
            name,
            lambda o: condition(o, "Ready").get("status") == "True",
            timeout=TIMEOUT,
        )

    kube.secret(NS, "one", string_data={"dsn": pg_dsn})
    kube.secret(NS, "two", string_data={"dsn": pg_dsn})
    worker(kube, "d1", "q1", replicas=0)
    worker(kube, "d2", "q2", replicas=0)
    kube.jobqueue(NS, "q1", spec(store.prefix, secret="one", deployment="d1"))
    kube.jobqueue(NS, "q2", spec(store.prefix, secret="two", deployment="d2"))
    async with operator(kube, application_name=app):
        await ready("q1")
        await ready("q2")
        # One pool and one LISTEN connection for both (min_size 1: at least two backends).
        first = await eventually("the first pool", lambda pids: len(pids) >= 2)

        # q1 moves to another DSN while q2 still uses the first: both pools are open.
        kube.patch(SECRETS, NS, "one", {"stringData": {"dsn": other}})
        both = await eventually("a second pool", lambda pids: bool(pids - first))
        assert first <= both, "the first pool is still in use by q2"

        # q2 moves too: no one uses the first DSN, so its connections go.
        kube.patch(SECRETS, NS, "two", {"stringData": {"dsn": other}})
        second = await eventually("the first pool closed", lambda pids: not pids & first)
        assert second, "the second DSN's pool stays open"
        await ready("q2")

        # Deleting one JobQueue keeps the pool the other uses; deleting the last closes it.
        kube.delete(JOBQUEUES, NS, "q1")
        await kube.wait_until(lambda: kube.find(JOBQUEUES, NS, "q1") is None, timeout=TIMEOUT)
        await ready("q2")
        assert await backends() & second, "q2's pool was closed with q1"
        kube.delete(JOBQUEUES, NS, "q2")
        await kube.wait_until(lambda: kube.find(JOBQUEUES, NS, "q2") is None, timeout=TIMEOUT)
        await eventually("every pool closed", lambda pids: not pids)


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


async def mailer_pool(
    kube: KubeHarness,
    store: PostgresStore,
    pg_dsn: str,
    *,
    pods: int,
    jobs: int,
    claims: Mapping[str, int],
    annotations: Mapping[str, str] | None = None,
) -> None:
    """The "mailer" Deployment with `pods` replicas and pods mailer-a, mailer-b, ...; its
    database holds `jobs` mail jobs, `claims` of them claimed per pod (no JobQueue yet)."""
    await Queue(store).enqueue_many(Mail() for _ in range(jobs))
    for pod, n in claims.items():
        await claim_for(store, pod, n)
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=pods)
    for pod in ("mailer-a", "mailer-b", "mailer-c")[:pods]:
        kube.pod(NS, pod, labels={"app": "mailer"}, annotations=annotations)


async def until_fenced(store: PostgresStore, pods: list[str]) -> None:
    """Poll the database (the operator writes fences there; nothing here to await)."""
    queue = Queue(store)
    for _ in range(int(TIMEOUT / 0.05)):
        if await queue.fenced_pods() == pods:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fenced pods never became {pods}: {await queue.fenced_pods()}")


async def test_a_scale_in_marks_idle_pods_and_spares_busy_ones(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three pods; two hold jobs. The load wants one replica: the operator sets the pods'
    deletion costs to the jobs each holds, fences the idle pod (cost -1, below the others'),
    and scales in by that pod only. Once the ReplicaSet has had its time, the fence is
    lifted (here at the next tick: FENCE_SETTLE set to 0)."""
    monkeypatch.setattr(scalein, "FENCE_SETTLE", 0.0)
    await mailer_pool(
        kube,
        store,
        pg_dsn,
        pods=3,
        jobs=3,
        claims={"mailer-a": 2, "mailer-b": 1},
        annotations={COST: "7"},
    )
    kube.pod(NS, "other", labels={"app": "other"})
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with operator(kube):
        await replicas_become(kube, "mailer", 2)
        costs = {
            p: kube.get(PODS, NS, p)["metadata"]["annotations"].get(COST)
            for p in ("mailer-a", "mailer-b", "mailer-c")
        }
        assert costs == {"mailer-a": "2", "mailer-b": "1", "mailer-c": "-1"}
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
        # The scale-in's fence, lifted at a later tick (kmock has no ReplicaSet: mailer-c
        # is still there, and may claim again).
        await until_fenced(store, [])


async def test_a_deployment_selecting_its_pods_by_expressions_spares_busy_ones(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The same scale-in for a Deployment whose selector has matchExpressions: its pods are
    listed by them, marked and fenced. It used to skip all of that (its selector was not
    read), and the ReplicaSet took pods at random, busy or not."""
    await Queue(store).enqueue_many(Mail() for _ in range(3))
    await claim_for(store, "mailer-a", 2)
    await claim_for(store, "mailer-b", 1)
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    labels = {"app": "mailer", "tier": "jobs"}
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "mailer",
                "namespace": NS,
                "labels": labels,
                "annotations": {SCALE_ANNOTATION: "mail"},
            },
            "spec": {
                "replicas": 3,
                "selector": {
                    "matchLabels": {"app": "mailer"},
                    "matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["jobs", "batch"]},
                        {"key": "canary", "operator": "DoesNotExist"},
                    ],
                },
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "worker", "image": "venturi-worker:t"}]},
                },
            },
            "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 1},
        }
    )
    for pod in ("mailer-a", "mailer-b", "mailer-c"):
        kube.pod(NS, pod, labels=labels)
    kube.pod(NS, "mailer-canary", labels={**labels, "canary": "yes"})  # not the Deployment's
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        await replicas_become(kube, "mailer", 2)
        costs = {
            p: kube.get(PODS, NS, p)["metadata"].get("annotations", {}).get(COST)
            for p in ("mailer-a", "mailer-b", "mailer-c", "mailer-canary")
        }
        assert costs == {"mailer-a": "2", "mailer-b": "1", "mailer-c": "-1", "mailer-canary": None}


async def test_a_scale_in_whose_busy_pods_cannot_be_known_waits(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load wants one replica of three, but the pods cannot be listed (no RBAC for pods,
    the API server failing): no scale-in, since the ReplicaSet would take pods at random,
    busy or not. It used to go ahead unspared."""
    await mailer_pool(kube, store, pg_dsn, pods=3, jobs=3, claims={"mailer-a": 2})

    async def forbidden(self: Kube, namespace: str, selector: str) -> dict[str, Any]:
        raise KubeError("Forbidden", f"listing pods {selector} in {namespace}: HTTP 403")

    monkeypatch.setattr(Kube, "pods", forbidden)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        jq = await kube.wait_for(
            JOBQUEUES, NS, "mail",
            lambda o: (o.get("status", {}).get("pools") or [{}])[0].get("reason")
            == "BusyPodsUnknown",
            timeout=TIMEOUT,
        )  # fmt: skip
        pool = jq["status"]["pools"][0]
        assert (pool["currentReplicas"], pool["desiredReplicas"]) == (3, 3)
        assert "which pods hold jobs is not known (listing pods app=mailer" in pool["message"]
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 3
        # Once no job is claimed at all, no pod can be busy: the scale-in goes ahead.
        await store._pool.execute(f"UPDATE {store.prefix}_jobs SET status = 'completed'")
        await kube.wait_for(
            DEPLOYMENTS, NS, "mailer", lambda d: d["spec"]["replicas"] < 3, timeout=TIMEOUT
        )


async def test_fences_an_operator_before_left_are_lifted_from_the_pods_still_there(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator died between fencing mailer-c and scaling in: the pod is still there,
    idle, and claims nothing. The operator that follows lifts that fence as it lifts its own
    (FENCE_SETTLE later: here 0), instead of leaving the pod idle for the fence's TTL. A
    fenced pod of another Deployment is left alone."""
    monkeypatch.setattr(scalein, "FENCE_SETTLE", 0.0)
    await mailer_pool(kube, store, pg_dsn, pods=3, jobs=30, claims={})  # 3 replicas wanted
    await Queue(store).fence_pods(["mailer-c", "elsewhere-x"], ttl=600)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        await until_fenced(store, ["elsewhere-x"])
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 3


async def test_a_busy_pod_that_is_not_ready_holds_back_a_scale_in(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The ReplicaSet deletes pods that are not ready before any other, whatever their cost:
    with busy mailer-a not ready, a scale-in by the fenced idle mailer-b would take mailer-a
    and interrupt its jobs. The operator keeps both."""
    await Queue(store).enqueue_many(Mail() for _ in range(2))
    await claim_for(store, "mailer-a", 2)
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=2)
    kube.pod(NS, "mailer-a", labels={"app": "mailer"})  # no Ready condition: not ready
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mailer-b", "namespace": NS, "labels": {"app": "mailer"}},
            "spec": {"containers": [{"name": "worker", "image": "venturi-worker:test"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    kube.jobqueue(NS, "mail", spec(store.prefix))  # 2 claimed at 10 a replica: 1 is enough
    async with operator(kube):
        jq = await kube.wait_for(
            JOBQUEUES, NS, "mail",
            lambda o: (o.get("status", {}).get("pools") or [{}])[0].get("reason")
            == "BusyPodsSpared",
            timeout=TIMEOUT,
        )  # fmt: skip
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 2, jq["status"]
        costs = {
            p: kube.get(PODS, NS, p)["metadata"].get("annotations", {}).get(COST)
            for p in ("mailer-a", "mailer-b")
        }
        assert costs["mailer-a"] == "2"


async def claim_first_in(pg_dsn: str, prefix: str, pod: str) -> None:
    """Claim a pending job for `pod` on a connection of the caller's event loop (the
    operator's, inside a wrapped call of it)."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f"UPDATE {prefix}_jobs SET status = 'claimed', claimed_pod = $1, "
            "lease_until = now() + interval '1h' WHERE id = (SELECT id FROM "
            f"{prefix}_jobs WHERE status = 'pending' LIMIT 1)",
            pod,
        )
    finally:
        await conn.close()


async def test_of_two_victims_the_one_that_raced_its_fence_is_kept(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """Three pods, one busy; the load wants one replica, so the scale-in would take both idle
    pods. One claims a job just before its fence: the operator takes only the other (scaled
    to two), with cost -1, and the one that raced keeps its job and is not fenced."""
    await mailer_pool(kube, store, pg_dsn, pods=3, jobs=4, claims={"mailer-a": 2})
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with operator(kube) as reconciler:
        fence = reconciler.databases.fence_pods
        calls: list[list[str]] = []

        async def b_claims_first(dsn: str, prefix: str, pods: list[str], ttl: float) -> None:
            if not calls:
                await claim_first_in(pg_dsn, prefix, "mailer-b")
            calls.append(list(pods))
            await fence(dsn, prefix, pods, ttl)

        reconciler.databases.fence_pods = b_claims_first  # type: ignore[method-assign]
        await replicas_become(kube, "mailer", 2)
        assert calls[0] == ["mailer-b", "mailer-c"]
        costs = {
            p: kube.get(PODS, NS, p)["metadata"]["annotations"].get(COST)
            for p in ("mailer-a", "mailer-b", "mailer-c")
        }
        assert costs == {"mailer-a": "2", "mailer-b": "1", "mailer-c": "-1"}
        assert "mailer-b" not in await Queue(store).fenced_pods()


async def test_a_scale_in_waits_when_its_pods_cannot_be_fenced(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The fence cannot be written this tick (the database refuses it): the operator takes no
    pod it has not fenced, and says why."""
    await mailer_pool(kube, store, pg_dsn, pods=2, jobs=2, claims={"mailer-a": 1})
    kube.jobqueue(NS, "mail", spec(store.prefix) | {"interval": 300})

    async with operator(kube) as reconciler:

        async def refused(dsn: str, prefix: str, pods: list[str], ttl: float) -> None:
            raise DatabaseError("QueryFailed", "fencing pods failed: the server said no")

        reconciler.databases.fence_pods = refused  # type: ignore[method-assign]
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: (
                (o.get("status", {}).get("pools") or [{}])[0].get("reason") == "BusyPodsSpared"
            ),
            timeout=TIMEOUT,
        )
        message = jq["status"]["pools"][0]["message"]
        assert "1 pod holds jobs and 1 idle one could not be fenced" in message, message
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 2


async def test_without_the_fences_table_a_scale_in_spares_by_cost_as_before(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """A database not migrated to 18 yet (its fences table is missing) does not stop scale-ins:
    busy pods are spared by their deletion cost alone, as before the fence."""
    await mailer_pool(kube, store, pg_dsn, pods=2, jobs=2, claims={"mailer-a": 1})
    await store._pool.execute(f"DROP TABLE {store.prefix}_fences CASCADE")
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with operator(kube):
        await replicas_become(kube, "mailer", 1)
        costs = {
            p: kube.get(PODS, NS, p)["metadata"]["annotations"].get(COST)
            for p in ("mailer-a", "mailer-b")
        }
        assert costs == {"mailer-a": "1", "mailer-b": "0"}


async def test_pods_are_listed_with_their_cost_and_readiness(kube: KubeHarness) -> None:
    """What a scale-in's choice reads: terminating and finished pods are left out, and a pod
    is ready only when its Ready condition is True."""
    kube.pod(NS, "starting", labels={"app": "mailer"}, annotations={COST: "3"})
    kube.pod(NS, "done", labels={"app": "mailer"}, phase="Succeeded")
    for name, ready in (("up", "True"), ("probing", "False")):
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": {"app": "mailer"}},
                "spec": {"containers": [{"name": "worker", "image": "venturi-worker:test"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
            }
        )
    with kube.api_client() as api:
        pods = await Kube(api).pods(NS, "app=mailer")
    assert pods == {
        "starting": PodState(cost="3", ready=False),
        "up": PodState(cost=None, ready=True),
        "probing": PodState(cost=None, ready=False),
    }


async def test_a_pod_that_claims_a_job_as_it_is_fenced_is_kept(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The race the fence closes: the idle pod a scale-in would take claims a job in the
    moment before its fence (here: the claim commits just before the fence is written). The
    operator reads the claims again after the fence, keeps that pod, lifts its fence, and
    scales in by no pod it has not fenced."""
    await mailer_pool(kube, store, pg_dsn, pods=2, jobs=4, claims={"mailer-a": 2})
    kube.jobqueue(NS, "mail", spec(store.prefix) | {"interval": 300})

    async with operator(kube) as reconciler:
        fence = reconciler.databases.fence_pods
        raced: list[list[str]] = []

        async def claimed_first(dsn: str, prefix: str, pods: list[str], ttl: float) -> None:
            if not raced:
                # A claim in flight, committed first (on the operator's own event loop).
                await claim_first_in(pg_dsn, prefix, pods[0])
            raced.append(list(pods))
            await fence(dsn, prefix, pods, ttl)

        reconciler.databases.fence_pods = claimed_first  # type: ignore[method-assign]
        held = asyncio.Event()
        tick = reconciler.tick

        async def counted(*args: Any, **kwargs: Any) -> TickResult:
            result = await tick(*args, **kwargs)
            if raced and result.spared:
                held.set()
            return result

        reconciler.tick = counted  # type: ignore[method-assign]
        await asyncio.wait_for(held.wait(), TIMEOUT)
        assert raced[0] == ["mailer-b"]
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 2
        assert await Queue(store).fenced_pods() == []
        assert kube.get(PODS, NS, "mailer-b")["metadata"]["annotations"].get(COST) == "1"


async def test_a_scale_in_held_back_by_busy_pods_looks_again_within_seconds(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """Two pods hold jobs and the load wants one replica: held at two (BusyPodsSpared). When
    one pod's job goes, the scale-in follows at the next tick, which comes within seconds
    (cadence.next_wait), not after the JobQueue's interval of five minutes -- nothing else
    (no NOTIFY, no spec change) wakes the loop here."""
    await mailer_pool(kube, store, pg_dsn, pods=2, jobs=2, claims={"mailer-a": 1, "mailer-b": 1})
    kube.jobqueue(NS, "mail", spec(store.prefix) | {"interval": 300})

    async with operator(kube) as reconciler:
        # Two ticks in a row that held the scale-in back: the first may be one the JobQueue's
        # appearance or its own status patch woke at once; the second comes this soon only
        # because the wait after a held-back scale-in is short.
        held = asyncio.Event()
        spared: list[bool] = []
        tick = reconciler.tick

        async def counted(*args: Any, **kwargs: Any) -> TickResult:
            result = await tick(*args, **kwargs)
            spared.append(result.spared)
            if spared[-2:] == [True, True]:
                held.set()
            return result

        reconciler.tick = counted  # type: ignore[method-assign]
        await asyncio.wait_for(held.wait(), TIMEOUT)
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 2
        await store._pool.execute(f"DELETE FROM {store.prefix}_jobs WHERE claimed_pod = 'mailer-b'")
        await replicas_become(kube, "mailer", 1)
        costs = {
            p: kube.get(PODS, NS, p)["metadata"]["annotations"].get(COST)
            for p in ("mailer-a", "mailer-b")
        }
        assert costs == {"mailer-a": "1", "mailer-b": "-1"}  # mailer-b fenced, then taken


@asynccontextmanager
async def registered(store: PostgresStore, pod: str, task: type[Task]) -> AsyncIterator[None]:
    """A real worker in `pod`, serving only `task`'s kind: listed in the worker registry."""

    async def run(job: Task, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    identity = WorkerIdentity(host="test", pid=os.getpid(), pod=pod)
    worker: Worker[None] = Worker(None, store, concurrency=1, identity=identity)
    worker.register(task, run)
    shutdown = asyncio.Event()
    running = asyncio.create_task(worker.run(shutdown))
    await asyncio.wait_for(worker.ready.wait(), TIMEOUT)
    try:
        yield
    finally:
        shutdown.set()
        await asyncio.wait_for(running, TIMEOUT)


async def ticks(reconciler: Reconciler, n: int) -> None:
    """Wait for `n` more ticks to finish."""
    done = asyncio.Event()
    seen: list[None] = []
    tick = reconciler.tick

    async def counted(*args: Any, **kwargs: Any) -> TickResult:
        result = await tick(*args, **kwargs)
        seen.append(None)
        if len(seen) >= n:
            done.set()
        return result

    reconciler.tick = counted  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(done.wait(), TIMEOUT)
    finally:
        reconciler.tick = tick  # type: ignore[method-assign]


async def test_kinds_the_pools_workers_do_not_serve_are_a_condition_not_demand(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """25 mail jobs wait; the pool's one pod runs a worker that registered only `report`.
    They are no demand: the pool goes to zero, the JobQueue says why (a condition and a
    Warning), and it stays asleep for them, until a new pod template (a release) may serve
    them: then it wakes for them as for any job."""
    await Queue(store).enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=1)
    kube.pod(NS, "mailer-a", labels={"app": "mailer"})
    kube.jobqueue(NS, "mail", spec(store.prefix))

    async with registered(store, "mailer-a", Report), operator(kube) as reconciler:
        await replicas_become(kube, "mailer", 0)
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "UnservedKinds").get("status") == "True",
            timeout=TIMEOUT,
        )
        said = condition(jq, "UnservedKinds")
        assert said["reason"] == "KindsUnserved"
        assert "pool mailer: pending mail (queue default)" in said["message"]
        assert jq["status"]["pools"][0]["unservedKinds"] == ["mail"]
        assert jq["status"]["pools"][0]["pending"] == 25
        [warning] = await kube.wait_until(
            lambda: [e for e in kube.events(NS, involved="mail") if e["reason"] == "KindsUnserved"],
            timeout=TIMEOUT,
        )
        assert warning["type"] == "Warning"
        assert "mail (queue default)" in warning["message"]
        # A NOTIFY for such a job wakes nothing (at zero, any other job would tick at once).
        assert reconciler.wake_delay(NS, "mail", "mail") is None
        # The pod goes: the condition now says what its workers served when last seen. The
        # same kinds wait unserved, so no second Warning says so in other words.
        kube.delete(PODS, NS, "mailer-a")
        await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: "when last seen" in condition(o, "UnservedKinds").get("message", ""),
            timeout=TIMEOUT,
        )
        await ticks(reconciler, 2)
        warnings = [e for e in kube.events(NS, involved="mail") if e["reason"] == "KindsUnserved"]
        assert [e["message"] for e in warnings] == [warning["message"]]

    # The registry row is gone too: the pool stays at zero for those jobs, by what its
    # workers of this template served.
    async with operator(kube) as reconciler:
        await ticks(reconciler, 1)  # a new operator knows nothing: it wakes the pool once
        await replicas_become(kube, "mailer", 3)
        kube.pod(NS, "mailer-b", labels={"app": "mailer"})
        async with registered(store, "mailer-b", Report):
            await replicas_become(kube, "mailer", 0)
        kube.delete(PODS, NS, "mailer-b")
        await ticks(reconciler, 3)
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 0
        said = condition(kube.get(JOBQUEUES, NS, "mail"), "UnservedKinds")
        assert said["status"] == "True"
        assert "which its workers did not register when last seen" in said["message"]
        # A new template: what its pods serve is not known yet. One replica finds out (not
        # ceil(25 / 10) for jobs the new pods may not serve either) ...
        kube.patch(
            DEPLOYMENTS,
            NS,
            "mailer",
            {"spec": {"template": {"metadata": {"annotations": {"release": "2"}}}}},
        )
        await replicas_become(kube, "mailer", 1)
        await ticks(reconciler, 2)
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 1
        [pool] = kube.get(JOBQUEUES, NS, "mail")["status"]["pools"]
        assert "1 replica to learn whether the new one's do" in pool["message"]
        # ... whose worker, of the new template, serves them: the condition clears.
        kube.pod(NS, "mailer-c", labels={"app": "mailer"})
        async with registered(store, "mailer-c", Mail):
            await kube.wait_for(
                JOBQUEUES,
                NS,
                "mail",
                lambda o: condition(o, "UnservedKinds").get("status") == "False",
                timeout=TIMEOUT,
            )


async def test_a_pool_whose_workers_write_no_registry_rows_scales_as_before(
    kube: KubeHarness, store: PostgresStore, pg_dsn: str
) -> None:
    """The registry speaks only for the pods whose workers wrote a row: a live worker of
    another pod that serves none of this pool's kinds says nothing about this pool."""
    await Queue(store).enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pg_dsn})
    worker(kube, "mailer", "mail", replicas=1)
    kube.pod(NS, "mailer-a", labels={"app": "mailer"})  # its worker writes no registry row
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with registered(store, "reporter-a", Report), operator(kube):
        await replicas_become(kube, "mailer", 3)  # ceil(25 / 10)
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "UnservedKinds").get("status") == "False",
            timeout=TIMEOUT,
        )
        assert "unservedKinds" not in jq["status"]["pools"][0]


async def test_scales_through_pgbouncer_in_transaction_mode(
    kube: KubeHarness, store: PostgresStore, pgbouncer_dsn: str
) -> None:
    """The JobQueue's DSN goes through PgBouncer (transaction pooling): with pooler=transaction
    the operator reads the stats through it, and, unable to LISTEN there, ticks on its
    interval. Without it, PgBouncer refuses the operator's statement timeout."""
    await Queue(store).enqueue_many(Mail() for _ in range(25))
    kube.secret(NS, "db", string_data={"dsn": pgbouncer_dsn})
    worker(kube, "mailer", "mail", replicas=0)
    kube.jobqueue(NS, "mail", spec(store.prefix))
    async with operator(kube):
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "DatabaseReachable").get("status") == "False",
            timeout=TIMEOUT,
        )
        assert "unsupported startup parameter" not in json.dumps(jq)  # never the server's text
        assert kube.get(DEPLOYMENTS, NS, "mailer")["spec"]["replicas"] == 0
    async with operator(kube, pooler="transaction"):
        await replicas_become(kube, "mailer", 3)  # ceil(25 / 10), read through PgBouncer
        jq = await kube.wait_for(
            JOBQUEUES,
            NS,
            "mail",
            lambda o: condition(o, "DatabaseReachable").get("status") == "True",
            timeout=TIMEOUT,
        )
        assert jq["status"]["stats"]["pendingByKind"] == {"mail": 25}
