"""SIGTERM while jobs run: cooperative handlers checkpoint (pause with their carry), a
handler that ignores the cooperative cancel is aborted and its job released after the grace
period, one that swallows even the abort is given up on (its job released), a short job
finishes, and the process exits 0 soon after the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from tests.runtime.helpers import running, until
from venturi import Context, JobStatus, Outcome, PostgresStore, Queue, Task, Worker

from .harness import FIGURES, HeldRuns, fleet, read_runs, wait_until
from .worker import Checkpoint, Stubborn, Swallower, Work

GRACE = 2.0


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.slow
async def test_sigterm_mid_run(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    queue = Queue(store)
    ids = {
        "checkpoint": [await queue.enqueue(Checkpoint(i)) for i in range(2)],
        "stubborn": [await queue.enqueue(Stubborn(i)) for i in range(2)],
        "swallower": [await queue.enqueue(Swallower(0))],
        "work": [await queue.enqueue(Work(0, int(GRACE * 500)))],
    }
    args = ["--concurrency", "6", "--shutdown-timeout", str(GRACE)]
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        (proc,) = [await workers.start()]

        async def all_started() -> bool:
            return len(read_runs(tmp_path)) == 6

        await wait_until(all_started, 30, "every job started")
        signalled = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.proc.wait(), GRACE + 30)
        took = time.monotonic() - signalled

    assert code == 0, proc.stderr()
    journal = {name: [await queue.job_journal(i) for i in job_ids] for name, job_ids in ids.items()}
    for entries in journal["checkpoint"]:
        (entry,) = entries
        assert entry.outcome.value == "paused"
        assert entry.note is not None and entry.note.startswith("checkpoint at step")
    for job_id in ids["checkpoint"]:
        job = await queue.job(job_id)
        assert job is not None and job.status.value == "pending" and job.carry["steps"] > 0
    for entries in journal["stubborn"]:
        (entry,) = entries
        assert (entry.outcome.value, entry.note) == (
            "released",
            "aborted at shutdown after the grace period",
        )
        assert not entry.is_failure
    ((swallowed,),) = journal["swallower"]
    assert swallowed.outcome.value == "released"
    assert swallowed.note is not None and "ignored cancellation" in swallowed.note
    ((worked,),) = journal["work"]
    assert worked.outcome.value == "completed"
    how = {r.how for r in read_runs(tmp_path)}
    assert how == {"checkpointed", "aborted", "done", None}  # the swallower never ended
    FIGURES.append(
        f"SIGTERM mid-run: exit {code} {took:.1f}s after the signal (grace {GRACE}s): 2 "
        f"checkpointed, 2 aborted and released, 1 abandoned and released, 1 completed"
    )
    assert took < GRACE + 10


async def test_a_shutdown_behind_a_table_lock_ends_within_its_budget(
    store: PostgresStore, pg_dsn: str
) -> None:
    """Another session holds the jobs table (a migration waiting, a LOCK TABLE) while the
    worker stops: the outcomes it cannot write by the end of the shutdown are left to lease
    recovery, and the worker ends instead of waiting for the lock (it waited, with no bound,
    past its shutdown_timeout and the pod's grace period)."""
    work = HeldRuns(2)
    await Queue(store).enqueue_many(Work(i, 0) for i in range(2))
    worker: Worker[None] = Worker(None, store, concurrency=2, shutdown_timeout=1)
    worker.register(Work, work)
    shutdown = asyncio.Event()
    running_worker = asyncio.create_task(worker.run(shutdown))
    locker = await asyncpg.connect(pg_dsn)
    try:
        await asyncio.wait_for(work.all_started.wait(), 30)
        tx = locker.transaction()
        await tx.start()
        await locker.execute(f"LOCK TABLE {store.prefix}_jobs IN ACCESS EXCLUSIVE MODE")
        shutdown.set()
        work.release.set()
        # Ends while the lock is still held (it is released only below).
        await asyncio.wait_for(running_worker, 30)
        await tx.rollback()
    finally:
        await locker.close()
    rows = await store._pool_or_raise().fetch(f"SELECT status FROM {store.prefix}_jobs")
    assert [r["status"] for r in rows] == ["claimed", "claimed"]  # for lease recovery


async def test_a_claim_behind_a_table_lock_at_shutdown_is_cancelled_not_left_to_commit(
    store: PostgresStore, pg_dsn: str
) -> None:
    """A claim waiting for a table lock when the worker stops: the worker gives it up
    (`CLAIM_STOP_WAIT`) and ends, and the statement is cancelled on the server too. It used
    to be left waiting there (its connection terminated before asyncpg's cancel request went
    out), to commit once the lock was released: jobs claimed by a worker gone, for a lease;
    and the shutdown's check for such a claim waited for the lock with no bound."""
    queue = Queue(store)
    worker: Worker[None] = Worker(None, store, concurrency=2, shutdown_timeout=1)
    worker.register(Work, HeldRuns(3))
    locker = await asyncpg.connect(pg_dsn)
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
        f"AND wait_event_type = 'Lock' AND query LIKE '%{store.prefix}_jobs%'"
    )
    try:
        async with running(worker) as shutdown:
            # Due in a second: well after the lock below is taken.
            ids = [await queue.enqueue_in(Work(i, 0), timedelta(seconds=1)) for i in range(3)]
            tx = locker.transaction()
            await tx.start()
            # Reads pass (the worker's loops go on); a claim's FOR UPDATE waits.
            await locker.execute(f"LOCK TABLE {store.prefix}_jobs IN EXCLUSIVE MODE")

            async def a_claim_waits() -> bool:
                return bool(await store._pool_or_raise().fetchval(waiting_sql))

            await until(a_claim_waits)  # the jobs came due: the claim waits for the lock
            shutdown.set()

        # The worker has ended, the lock still held: nothing of it waits there any more (the
        # last statement it gave up on, the bounded check, is being cancelled as it ends).
        async def none_waits() -> bool:
            return bool(await store._pool_or_raise().fetchval(waiting_sql) == 0)

        await until(none_waits)
        await tx.rollback()
    finally:
        await locker.close()
    for job_id in ids:
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0


async def test_a_settle_already_waiting_for_a_row_lock_at_shutdown_is_bounded_too(
    store: PostgresStore, pg_dsn: str
) -> None:
    """A run ended before the stop, and its settle was sent and waits for a row lock another
    session holds: the bound the shutdown sets applies to that statement too (it applied
    only to statements sent after the stop, and the worker waited for the lock, unbounded)."""
    work = HeldRuns(1)
    (job_id,) = await Queue(store).enqueue_many([Work(0, 0)])
    worker: Worker[None] = Worker(None, store, concurrency=1, shutdown_timeout=1)
    worker.register(Work, work)
    shutdown = asyncio.Event()
    running_worker = asyncio.create_task(worker.run(shutdown))
    locker = await asyncpg.connect(pg_dsn)
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        f"AND query LIKE '%{store.prefix}_jobs%'"
    )
    try:
        await asyncio.wait_for(work.all_started.wait(), 30)
        tx = locker.transaction()
        await tx.start()
        await locker.execute(
            f"SELECT 1 FROM {store.prefix}_jobs WHERE id = $1 FOR UPDATE", job_id.to_uuid()
        )
        work.release.set()  # the run ends; its settle waits for the row

        async def a_settle_waits() -> bool:
            return bool(await store._pool_or_raise().fetchval(waiting_sql))

        await until(a_settle_waits)
        shutdown.set()
        # Ends while the lock is still held (it is released only below).
        await asyncio.wait_for(running_worker, 30)
        await tx.rollback()
    finally:
        await locker.close()
    job = await Queue(store).job(job_id)
    assert job is not None and job.status is JobStatus.CLAIMED  # for lease recovery


async def test_a_full_worker_tells_its_handlers_of_the_stop_at_once(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot taken, the claim loop waits for a freed slot, which a notification must not
    end: the stop did not end it either. The shutdown waited for the loop as for a claim in
    flight (2 s), cancelled it, checked for a claim that might have committed, and only then
    told the handlers. Here that wait is made an hour long: the stop must not need it."""
    monkeypatch.setattr("venturi._producer.CLAIM_STOP_WAIT", 3600.0)
    queue = Queue(store)
    started = asyncio.Event()

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        started.set()
        await ctx.cancelled()  # winds down when told
        return Outcome.completed("wound down")

    job_id = await queue.enqueue(Work(0, 0))
    worker: Worker[None] = Worker(None, store, concurrency=1, shutdown_timeout=600)
    worker.register(Work, handle)
    shutdown = asyncio.Event()
    running_worker = asyncio.create_task(worker.run(shutdown))
    await asyncio.wait_for(started.wait(), 30)
    shutdown.set()
    await asyncio.wait_for(running_worker, 30)
    assert [e.note for e in await queue.job_journal(job_id)] == ["wound down"]


@dataclass
class Overstays(Task):
    """Ignores every cancellation, its timeout's too, until the test lets it end."""

    KIND = "overstays"
    n: int

    def timeout(self) -> float:
        return 1.0


async def test_a_run_whose_timeout_passes_in_the_grace_period_and_is_abandoned_fails(
    store: PostgresStore,
) -> None:
    """The stop came first, the run's timeout during the grace period, and the handler
    ignored both: given up on, it was released (the first reason asked was the shutdown),
    where the same run ended after its timeout is a failed execution; under rolling deploys
    such a job never used an attempt."""
    queue = Queue(store)
    started, done = asyncio.Event(), asyncio.Event()

    async def handle(task: Overstays, ctx: Context[None], app: None) -> Outcome:
        started.set()
        while not done.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await done.wait()
        return Outcome.completed()

    job_id = await queue.enqueue(Overstays(0))
    worker: Worker[None] = Worker(None, store, concurrency=1, shutdown_timeout=3)
    worker._exits_with_run = True  # as `venturi worker`: the job is settled, not left claimed
    worker.register(Overstays, handle)
    shutdown = asyncio.Event()
    running_worker = asyncio.create_task(worker.run(shutdown))
    await asyncio.wait_for(started.wait(), 30)
    shutdown.set()  # before the 1 s timeout, which then passes within the 3 s grace period
    try:
        await asyncio.wait_for(running_worker, 30)
    finally:
        done.set()
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["failed"], journal
    job = await queue.job(job_id)
    assert job is not None and job.failures == 1


async def test_stop_now_cuts_the_grace_period_short(store: PostgresStore) -> None:
    """A shutdown under way waits up to `shutdown_timeout` (10 minutes here) for a handler
    that ignores the cooperative cancel; `stop_now()` aborts it at once; and alone, it shuts
    down without any grace. The job is released both ways."""
    for how in ("after-the-shutdown", "alone"):  # a queue each
        started, asked = asyncio.Event(), asyncio.Event()

        async def handle(
            task: Work,
            ctx: Context[None],
            app: None,
            started: asyncio.Event = started,
            asked: asyncio.Event = asked,
        ) -> Outcome:
            started.set()
            await ctx.cancelled()
            asked.set()
            await asyncio.sleep(3600)  # and ignores it: only an abort ends it
            return Outcome.completed()

        queue = Queue(store, queue=how)
        job_id = await queue.enqueue(Work(0, 0))
        worker: Worker[None] = Worker(None, store, queue=how, concurrency=1, shutdown_timeout=600)
        worker.register(Work, handle)
        shutdown = asyncio.Event()
        running_worker = asyncio.create_task(worker.run(shutdown))
        await asyncio.wait_for(started.wait(), 30)
        if how == "after-the-shutdown":
            shutdown.set()
            await asyncio.wait_for(asked.wait(), 30)  # the grace period has begun
        worker.stop_now()
        await asyncio.wait_for(running_worker, 30)
        assert [e.outcome for e in await queue.job_journal(job_id)] == ["released"], how
