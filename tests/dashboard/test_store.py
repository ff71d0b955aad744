"""The dashboard's database access against a real PostgreSQL: retry and forget change dead
jobs only, each in one transaction; retry wakes a waiting worker; reads are read-only and
bounded by the statement timeout."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.dashboard.conftest import Charge, Resize, seed
from venturi import JobStatus, JournalOutcome, PostgresStore, Queue
from venturi.dashboard._store import DashboardStore


def dash(store: PostgresStore, timeout: float = 2.0) -> DashboardStore:
    return DashboardStore(store, statement_timeout=timeout)


async def test_retry_puts_a_dead_job_back_to_pending_with_a_journal_row(
    store: PostgresStore,
) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=2)
    queue = Queue(store)
    target, other = seeded.dead
    before = await queue.job(target)
    assert before is not None

    assert await dash(store).retry([target], actor="ada") == [target]

    job = await queue.job(target)
    assert job is not None and job.status is JobStatus.PENDING
    assert job.finished_at is None and job.run_at >= before.run_at
    assert job.failures == before.failures  # one more run, not a fresh backstop
    journal = await queue.job_journal(target)
    assert [e.outcome for e in journal] == [JournalOutcome.DEAD, JournalOutcome.RELEASED]
    assert journal[-1].note == "retried from the dashboard by ada"
    assert journal[-1].worker == "dashboard"
    untouched = await queue.job(other)
    assert untouched is not None and untouched.status is JobStatus.DEAD
    stats = await queue.stats()
    assert stats.pending_by_kind == {Charge.KIND: 1} and stats.dead == 1


async def test_retry_and_forget_leave_jobs_that_are_not_dead_alone(store: PostgresStore) -> None:
    queue = Queue(store)
    pending = await queue.enqueue(Resize(image=1))
    assert await dash(store).retry([pending], actor="ada") == []
    assert await dash(store).forget([pending]) == []
    job = await queue.job(pending)
    assert job is not None and job.status is JobStatus.PENDING
    assert await queue.job_journal(pending) == []


async def test_retry_wakes_a_listening_worker(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=1)
    woken: asyncio.Queue[str] = asyncio.Queue()
    async with store.listen(woken.put_nowait, lambda: None):
        await dash(store).retry(seeded.dead, actor="ada")
        assert await asyncio.wait_for(woken.get(), 10) == Charge.KIND


async def test_forget_deletes_the_job_and_its_journal(store: PostgresStore) -> None:
    seeded = await seed(store, ready=0, scheduled=0, dead=2)
    queue = Queue(store)
    gone, kept = seeded.dead
    assert await dash(store).forget([gone]) == [gone]
    assert await queue.job(gone) is None
    assert await queue.job_journal(gone) == []
    assert await queue.job(kept) is not None
    assert len(await queue.job_journal(kept)) == 1
    assert (await queue.stats()).dead == 1


async def test_retry_all_takes_the_dead_of_its_moment_in_batches(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from venturi.dashboard import _store

    monkeypatch.setattr(_store, "BATCH", 2)
    seeded = await seed(store, ready=0, scheduled=0, dead=5)
    queue = Queue(store)
    batches: list[int] = []
    n = await dash(store).retry_all(
        cutoff=datetime.now(UTC), kind=None, actor="ada", limit=4, on_batch=batches.append
    )
    assert n == 4 and batches == [2, 4]
    assert (await queue.stats()).dead == 1
    # Those that died after the cutoff wait for the next click.
    assert (
        await dash(store).retry_all(
            cutoff=datetime.now(UTC) - timedelta(hours=1), kind=None, actor="ada"
        )
        == 0
    )
    assert await dash(store).retry_all(cutoff=datetime.now(UTC), kind="other", actor="ada") == 0
    assert await dash(store).retry_all(cutoff=datetime.now(UTC), kind=Charge.KIND, actor="ada") == 1
    for job_id in seeded.dead:
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING


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


async def test_the_counts_and_the_hour_come_from_the_database(store: PostgresStore) -> None:
    await seed(store, ready=3, scheduled=1, dead=2)
    async with dash(store).reading() as reader:
        counts = await reader.counts()
        finished = await reader.finished_since(timedelta(hours=1))
        none_yet = await reader.finished_since(timedelta(0))
    assert counts == {
        Resize.KIND: {JobStatus.PENDING: 4},
        Charge.KIND: {JobStatus.DEAD: 2},
    }
    assert (finished.done, finished.failed) == (0, 2)
    assert (none_yet.done, none_yet.failed) == (0, 0)
