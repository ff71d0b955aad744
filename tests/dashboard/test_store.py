"""The dashboard's database access against a real PostgreSQL: retry, retry all and forget are
the queue's own (dead jobs only, journaled with who clicked); retry wakes a waiting worker;
reads are read-only and bounded by the statement timeout."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from ulid import ULID

from tests.dashboard.conftest import Charge, Resize, seed
from venturi import JobStatus, JournalOutcome, PostgresStore, Queue
from venturi.dashboard._store import DashboardStore


def dash(store: PostgresStore, timeout: float = 2.0) -> DashboardStore:
    return DashboardStore(store, statement_timeout=timeout)


async def test_retry_is_the_queues_retry_with_who_clicked_in_the_journal(
    store: PostgresStore,
) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=2)
    queue = Queue(store)
    target, other = seeded.dead
    before = await queue.job(target)
    assert before is not None and before.failures == 1

    assert await dash(store).retry(target, actor="ada") is True

    job = await queue.job(target)
    assert job is not None and job.status is JobStatus.PENDING
    assert job.finished_at is None and job.run_at >= before.run_at
    assert job.failures == 0  # as Queue.retry: every attempt again
    journal = await queue.job_journal(target)
    assert [e.outcome for e in journal] == [JournalOutcome.DEAD, JournalOutcome.RETRIED]
    assert journal[-1].note == "retried from the dashboard by ada"
    untouched = await queue.job(other)
    assert untouched is not None and untouched.status is JobStatus.DEAD
    stats = await queue.stats()
    assert stats.pending_by_kind == {Charge.KIND: 1} and stats.dead == 1


async def test_retry_and_forget_leave_jobs_that_are_not_dead_alone(store: PostgresStore) -> None:
    queue = Queue(store)
    pending = await queue.enqueue(Resize(image=1))
    assert await dash(store).retry(pending, actor="ada") is False
    assert await dash(store).forget(pending) is False
    assert await dash(store).retry(ULID(), actor="ada") is False  # no such job
    job = await queue.job(pending)
    assert job is not None and job.status is JobStatus.PENDING
    assert await queue.job_journal(pending) == []


async def test_retry_wakes_a_listening_worker(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    woken: asyncio.Queue[str] = asyncio.Queue()
    async with store.listen(woken.put_nowait, lambda: None):
        await dash(store).retry(seeded.dead[0], actor="ada")
        assert await asyncio.wait_for(woken.get(), 10) == Charge.KIND


async def test_forget_deletes_the_job_and_its_journal(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=2)
    queue = Queue(store)
    gone, kept = seeded.dead
    assert await dash(store).forget(gone) is True
    assert await queue.job(gone) is None
    assert await queue.job_journal(gone) == []
    assert await queue.job(kept) is not None
    assert len(await queue.job_journal(kept)) == 1
    assert (await queue.stats()).dead == 1


async def test_retry_all_is_the_queues_capped_per_click(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=5)
    queue = Queue(store)
    assert await dash(store).retry_all(kind=None, actor="ada", limit=4) == 4
    assert (await queue.stats()).dead == 1
    assert await dash(store).retry_all(kind="other", actor="ada") == 0
    assert await dash(store).retry_all(kind=Charge.KIND, actor="ada") == 1
    for job_id in seeded.dead:
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING and job.failures == 0
        journal = await queue.job_journal(job_id)
        assert journal[-1].outcome is JournalOutcome.RETRIED
        assert journal[-1].note == "retried from the dashboard by ada"


async def test_reads_are_read_only_and_bounded(store: PostgresStore) -> None:
    async with dash(store, timeout=0.25).reading() as reader:
        conn = reader._conn
        assert await conn.fetchval("SHOW statement_timeout") == "250ms"
        assert await conn.fetchval("SHOW transaction_read_only") == "on"
    with pytest.raises(asyncpg.QueryCanceledError):
        async with dash(store, timeout=0.25).reading() as reader:
            await reader._conn.fetchval("SELECT pg_sleep(5)")
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        async with dash(store).reading() as reader:
            await reader._conn.execute(f"DELETE FROM {store.prefix}_jobs")
    # The settings were local to those transactions: the pool's connections are as before.
    assert await store._pool_or_raise().fetchval("SHOW statement_timeout") == "0"


async def test_the_counts_come_from_the_kept_counters(store: PostgresStore) -> None:
    await seed(store, ready=3, scheduled=1, dead=2)
    async with dash(store).reading() as reader:
        counts = await reader.counts()
    assert counts == {
        Resize.KIND: {JobStatus.PENDING: 4},
        Charge.KIND: {JobStatus.DEAD: 2},
    }


async def test_a_unique_job_whose_id_is_held_stays_dead_and_the_click_says_why(
    store: PostgresStore,
) -> None:
    from tests.dashboard.test_app import client, csrf
    from tests.runtime.test_unique import SyncStock
    from venturi import Context, TaskError, Worker, dashboard

    async def refuse(task: SyncStock, ctx: Context[None], app: None) -> None:
        raise TaskError.permanent("no")

    queue = Queue(store)
    failed = await queue.enqueue(SyncStock(1))
    worker = Worker(None, store)
    worker.register(SyncStock, refuse)
    await worker.run(once=True)
    holder = await queue.enqueue(SyncStock(1))  # the failed job let go of its unique id
    origin = {"origin": "http://127.0.0.1:8080"}
    async with client(dashboard.app(store, gate=lambda r: True)) as http:
        token = csrf((await http.get("/failed")).text)
        refused = await http.post(f"/jobs/{failed}/retry", data={"csrf": token}, headers=origin)
    assert refused.status_code == 409
    assert f"is held by job {holder}" in refused.text
    job = await queue.job(failed)
    assert job is not None and job.status is JobStatus.DEAD
