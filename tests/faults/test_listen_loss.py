"""The LISTEN connection killed (`pg_terminate_backend`) and left half-open (its backend
SIGSTOPped, so nothing arrives and nothing fails): the worker listens again and picks up a
new job well within `poll_max` (60 s here), which alone would otherwise bound the wait."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.runtime.helpers import running
from venturi import Context, Outcome, PostgresStore, Queue, Worker

from .harness import FIGURES, fleet, read_runs, wait_until
from .worker import Work

POLL_MAX = 60.0


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


async def listen_backend(pool: asyncpg.Pool, name: str, other_than: int | None = None) -> int:
    """The pid of the worker's LISTEN connection (its application_name ends in ' listen')."""
    found: list[int] = []

    async def check() -> bool:
        pid = await pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2",
            f"{name} listen",
            other_than or 0,
        )
        if pid is not None:
            found.append(pid)
        return pid is not None

    await wait_until(check, 30, f"a LISTEN connection of {name}")
    return found[0]


async def pickup(queue: Queue, pool: asyncpg.Pool, prefix: str, runs_dir: Path, n: int) -> float:
    """Enqueue one job and return seconds until its handler started."""
    enqueued = time.time()
    job_id = await queue.enqueue(Work(n, 1))

    async def done() -> bool:
        status = await pool.fetchval(
            f"SELECT status FROM {prefix}_jobs WHERE id = $1", job_id.to_uuid()
        )
        return bool(status == "completed")

    await wait_until(done, POLL_MAX, "the job picked up")
    (run,) = [r for r in read_runs(runs_dir) if r.job == str(job_id.to_uuid())]
    return run.start - enqueued


@pytest.mark.slow
async def test_listen_connection_terminated_and_half_open(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    queue = Queue(store)
    name = f"listen-{uuid.uuid4().hex[:8]}"
    args = ["--concurrency", "2", "--poll-max", str(POLL_MAX), "--name", name]
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        await workers.start()
        baseline = await pickup(queue, pool, prefix, tmp_path, 0)

        first = await listen_backend(pool, name)
        await pool.execute("SELECT pg_terminate_backend($1)", first)
        after_kill = await pickup(queue, pool, prefix, tmp_path, 1)

        second = await listen_backend(pool, name, other_than=first)
        os.kill(second, signal.SIGSTOP)
        try:
            after_stop = await pickup(queue, pool, prefix, tmp_path, 2)
            third = await listen_backend(pool, name, other_than=second)
        finally:
            os.kill(second, signal.SIGCONT)
            await pool.execute("SELECT pg_terminate_backend($1)", second)
        after_both = await pickup(queue, pool, prefix, tmp_path, 3)
        assert workers.exited() == []
        assert await workers.stop() == [0]

    FIGURES.append(
        f"LISTEN loss (poll_max {POLL_MAX:.0f}s): pickup {baseline * 1000:.0f} ms before, "
        f"{after_kill * 1000:.0f} ms after pg_terminate_backend, {after_stop:.1f}s with the "
        f"LISTEN backend SIGSTOPped (found by the probe), {after_both * 1000:.0f} ms after"
    )
    assert third not in (first, second)
    assert after_kill < 5.0
    assert after_stop < POLL_MAX / 4
    assert after_both < 5.0


@pytest.mark.slow
async def test_a_batch_cancelled_while_listen_was_down_skips_the_members_held_ahead(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str
) -> None:
    """The cancellation's notice is lost (the LISTEN backend is stopped; the probe finds it
    and the worker listens anew): on reconnecting, the worker asks about the batch members it
    holds unstarted, and the cancelled batch's never run."""
    queue = Queue(store)
    name = f"skip-{uuid.uuid4().hex[:8]}"
    batch_id = await queue.batch("unheard").add(*(Work(i, 1) for i in range(20))).enqueue()
    release = asyncio.Event()
    ran: list[int] = []

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.n)
        if task.n == 5:
            await release.wait()
        return Outcome.completed()

    async def prefetched_behind_5() -> bool:
        n = await pool.fetchval(
            f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'claimed' AND batch_id = $1",
            batch_id.to_uuid(),
        )
        return 5 in ran and bool(n >= 2)

    async def only_5_left() -> bool:
        status = await queue.batch_status(batch_id)
        return status is not None and status.pending == 1

    async with await PostgresStore.connect(pg_dsn, prefix=prefix, application_name=name) as own:
        worker = Worker(None, own, concurrency=1)
        worker.register(Work, handle)
        async with running(worker):
            await wait_until(prefetched_behind_5, 30, "job 5 running, later ones claimed")
            stopped = await listen_backend(pool, name)
            os.kill(stopped, signal.SIGSTOP)
            try:
                await queue.cancel_batch(batch_id)  # its notice is never delivered
                await listen_backend(pool, name, other_than=stopped)
                await wait_until(only_5_left, 30, "the held members skipped on reconnect")
            finally:
                os.kill(stopped, signal.SIGCONT)
                await pool.execute("SELECT pg_terminate_backend($1)", stopped)
            release.set()

            async def finished() -> bool:
                status = await queue.batch_status(batch_id)
                return status is not None and status.finished

            await wait_until(finished, 30, "the batch finished")
    status = await queue.batch_status(batch_id)
    assert status is not None and (status.done, status.cancelled) == (6, 14)
    assert ran == list(range(6))
