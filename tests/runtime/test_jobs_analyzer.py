"""The leader analyses the jobs table when the planner's row estimate is far below what the
counters hold, so a fresh backlog is claimed through the claim index from the start."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi._maintenance.analyzer import JobsAnalyzer

from .helpers import running, until


@dataclass
class Ping(Task):
    KIND = "ping"
    n: int


async def estimate(store: PostgresStore) -> float:
    value: float = await store._pool.fetchval(
        "SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)", f"{store.prefix}_jobs"
    )
    return value


async def no_autovacuum(store: PostgresStore) -> None:
    # The test decides when the table is analysed, not autovacuum's timing.
    await store._pool.execute(f"ALTER TABLE {store.prefix}_jobs SET (autovacuum_enabled = false)")


async def test_a_stale_estimate_is_analysed_and_a_fresh_one_left(store: PostgresStore) -> None:
    await no_autovacuum(store)
    await Queue(store).enqueue_many(Ping(i) for i in range(500))
    assert await store.analyze_jobs_if_stale(1000) is False  # too few jobs to matter
    await Queue(store).enqueue_many(Ping(i) for i in range(2500))
    assert await estimate(store) < 300  # never analysed (-1), or from an earlier batch
    assert await store.analyze_jobs_if_stale(1000) is True
    assert await estimate(store) == 3000
    assert await store.analyze_jobs_if_stale(1000) is False  # fresh now


async def test_the_leader_analyses_a_backlog_that_arrived(store: PostgresStore) -> None:
    await no_autovacuum(store)
    await Queue(store, queue="a").enqueue_many(Ping(i) for i in range(3000))

    async def handle(task: Ping, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = Worker(None, store, queues=["b"])  # serves another queue: only the service acts
    worker.register(Ping, handle)

    async def analysed() -> bool:
        return await estimate(store) == 3000

    async with running(worker):
        await until(analysed)


async def test_a_role_that_may_not_analyse_is_told_once(
    store: PostgresStore, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    await no_autovacuum(store)
    await Queue(store).enqueue_many(Ping(i) for i in range(2000))
    role = f"{store.prefix}_plain"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        dsn = pg_dsn.replace("postgres@", f"{role}@", 1)
        plain = await PostgresStore.connect(dsn, prefix=store.prefix)
        try:
            analyzer = JobsAnalyzer()
            caplog.set_level("INFO", logger="venturi.worker")
            assert await plain.analyze_jobs_if_stale(1000) is None
            await analyzer.run_once(plain)
            await analyzer.run_once(plain)  # quiet from then on
        finally:
            await plain.close()
    finally:
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()
    assert await estimate(store) < 0
    told = [r for r in caplog.records if r.name == "venturi.worker" and "jobs-analyze" in r.message]
    assert len(told) == 1 and "may not" in told[0].message


async def test_an_estimate_an_analyse_cannot_mend_is_no_refusal_and_is_tried_less_often(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Counters that hold more than the table (the jobs table alone truncated): the owner's
    ANALYZE leaves the estimate stale. That is not a role that may not ANALYZE, and an
    ANALYZE at every check would not mend it: each next one waits twice as long."""
    await no_autovacuum(store)
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_counts (queue, kind, status, shard, n) "
        "VALUES ('default', 'ping', 'completed', 0, 5000)"
    )
    analysed = 0
    analyse = store.analyze_jobs_if_stale

    async def counted(at_least: int) -> bool | None:
        nonlocal analysed
        done = await analyse(at_least)
        analysed += done is True
        return done

    store.analyze_jobs_if_stale = counted  # type: ignore[method-assign]
    caplog.set_level("INFO", logger="venturi.worker")
    analyzer = JobsAnalyzer()
    for _ in range(5):
        await analyzer.run_once(store)
    assert await estimate(store) == 0  # analysed: empty, not "never analysed" (-1)
    assert analysed == 2  # the second found it stale again: the next waits 20 s
    assert not [r for r in caplog.records if "may not" in r.message]
