"""PostgreSQL restarted under load (fast shutdown, immediate shutdown, SIGKILL of the
postmaster) while three worker processes drain: no worker exits, claiming resumes within
two seconds of the server accepting connections again, nothing is lost or run twice at
once, and the settlements workers held through the outage are written after it (not left
to lease expiry)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.runtime.helpers import running
from venturi import Context, Outcome, PostgresStore, Queue, Worker
from venturi.embedded import EmbeddedPostgres

from .conftest import SOAK
from .harness import (
    FIGURES,
    HeldRuns,
    fleet,
    journals,
    overlaps,
    read_runs,
    unexplained_reruns,
    wait_until,
)
from .worker import Work

JOBS = 6000 if SOAK else 2000
OUTAGE = 1.5
"""Seconds the server stays down (an outage to live through, not a synchronization)."""
RESUME_LIMIT = 2.0

_prefixes = itertools.count()


async def fetchval(dsn: str, query: str) -> Any:
    """One statement on a fresh connection (the server comes and goes under this test)."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate", "kill"])
async def test_restart_under_load(
    restartable_pg: EmbeddedPostgres, mode: str, tmp_path: Path
) -> None:
    pg = restartable_pg
    prefix = f"r{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    rng = random.Random(mode)
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        await Queue(store).enqueue_many(Work(i, rng.randint(20, 60)) for i in range(JOBS))

    args = ["--concurrency", "8", "--lease", "60"]
    async with fleet(pg.dsn, prefix, tmp_path, args) as workers:
        for _ in range(3):
            await workers.start()

        async def done() -> int:
            n: int = await fetchval(
                pg.dsn, f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'completed'"
            )
            return n

        async def quarter_done() -> bool:
            return await done() >= JOBS // 4

        await wait_until(quarter_done, 60, "a quarter of the jobs done")
        halted = time.time()
        await asyncio.to_thread(pg.halt, mode)
        await asyncio.sleep(OUTAGE)
        await asyncio.to_thread(pg.launch)
        back = time.time()

        async def all_done() -> bool:
            return await done() == JOBS

        await wait_until(all_done, 120, "every job done after the restart")
        assert workers.exited() == []
        codes = await workers.stop()
        assert codes == [0, 0, 0], [p.stderr() for p in workers.procs]

    conn = await asyncpg.connect(pg.dsn)
    try:
        jobs = await conn.fetch(f"SELECT id, status, run_count FROM {prefix}_jobs")
        pool: Any = conn  # journals() needs only fetch()
        journal = await journals(pool, prefix)
    finally:
        await conn.close()
    runs = read_runs(tmp_path)
    resumed = min(r.start for r in runs if r.start > back) - back
    held = [r for r in runs if r.end is not None and halted <= r.end <= back]
    outcomes = {(str(j), e["run"]): e["outcome"] for j, es in journal.items() for e in es}
    stale = [k for k, v in outcomes.items() if v == "stale_recovered"]
    released = [k for k, v in outcomes.items() if v == "released"]
    clashes = overlaps(runs, {})
    lost = [j["id"] for j in jobs if j["status"] != "completed"]
    FIGURES.append(
        f"restart ({mode}): {JOBS} jobs, down {back - halted:.1f}s, claiming resumed "
        f"{resumed:.2f}s after the server was back, {len(held)} settlements held through "
        f"the outage, {len(released)} lost claim replies released, {len(stale)} recovered "
        f"by lease, overlaps {len(clashes)}, lost {len(lost)}"
    )
    assert lost == []
    assert clashes == []
    assert unexplained_reruns(list(jobs), journal) == []
    assert resumed <= RESUME_LIMIT
    assert stale == [], "settlements must be written after the outage, not left to the lease"
    assert held, "some handlers should have finished while the server was down"
    unwritten = [
        (r.job, r.run, [(e["run"], e["outcome"], e["note"]) for e in journal[r.job]])
        for r in held
        if outcomes.get((r.job, r.run)) != "completed"
    ]
    assert unwritten == [], (halted, back, unwritten)


LEASE = 3.0
LONG_OUTAGE = 6.0
"""Seconds down: twice the lease, so every lease held through the outage has expired."""


@pytest.mark.slow
async def test_an_outage_longer_than_the_lease_keeps_what_the_worker_finished(
    restartable_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Jobs that end while the database is down, their leases expiring before it is back:
    the worker writes their outcomes then, and its own rescuer does not recover them first
    (which counted each as failed, and with one attempt, made it dead)."""
    pg = restartable_pg
    prefix = f"r{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        await Queue(store).enqueue_many(Work(i, 1000) for i in range(4))

    async with fleet(
        pg.dsn, prefix, tmp_path, ["--concurrency", "4", "--lease", str(LEASE)]
    ) as workers:
        await workers.start()

        async def all_started() -> bool:
            return len(read_runs(tmp_path)) == 4

        await wait_until(all_started, 30, "the four jobs running")
        await asyncio.to_thread(pg.halt, "fast")
        await asyncio.sleep(LONG_OUTAGE)  # the outage itself, not a synchronization
        await asyncio.to_thread(pg.launch)

        async def settled() -> bool:
            n: int = await fetchval(
                pg.dsn,
                f"SELECT count(*) FROM {prefix}_jobs WHERE status IN ('completed', 'dead') "
                "OR (status = 'pending' AND failures > 0)",
            )
            return n == 4

        await wait_until(settled, 60, "the four jobs settled after the outage")
        assert await workers.stop() == [0]

    conn = await asyncpg.connect(pg.dsn)
    try:
        jobs = await conn.fetch(f"SELECT id, status, run_count, failures FROM {prefix}_jobs")
        journal = await journals(conn, prefix)  # type: ignore[arg-type]
    finally:
        await conn.close()
    runs = read_runs(tmp_path)
    assert len(runs) == 4 and all(r.end is not None for r in runs)  # each ran once, to its end
    assert [(j["status"], j["run_count"], j["failures"]) for j in jobs] == [("completed", 1, 0)] * 4
    assert all([e["outcome"] for e in es] == ["completed"] for es in journal.values())


async def test_a_shutdown_during_an_outage_writes_the_outcomes_when_the_database_is_back(
    restartable_pg: EmbeddedPostgres,
) -> None:
    """SIGTERM while the database is down, jobs ending meanwhile: the worker keeps their
    outcomes and writes them when the server is back within its shutdown_timeout. It used to
    give up after five attempts (about two seconds), and the jobs, finished, came back after
    their leases as failed executions (dead, with one attempt)."""
    pg = restartable_pg
    prefix = f"r{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    work = HeldRuns(4)
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        await Queue(store).enqueue_many(Work(i, 0) for i in range(4))
        worker: Worker[None] = Worker(None, store, concurrency=4, shutdown_timeout=30, lease=60)
        worker.register(Work, work)
        shutdown = asyncio.Event()
        running_worker = asyncio.create_task(worker.run(shutdown))
        await asyncio.wait_for(work.all_started.wait(), 30)
        await asyncio.to_thread(pg.halt, "fast")
        shutdown.set()
        work.release.set()  # the four end while the database is away
        await asyncio.sleep(LONG_OUTAGE)  # the outage itself, not a synchronization
        assert not running_worker.done()  # still holding the outcomes
        await asyncio.to_thread(pg.launch)
        await asyncio.wait_for(running_worker, 60)
    conn = await asyncpg.connect(pg.dsn)
    try:
        jobs = await conn.fetch(f"SELECT status, run_count, failures FROM {prefix}_jobs")
    finally:
        await conn.close()
    assert [tuple(j) for j in jobs] == [("completed", 1, 0)] * 4


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_the_first_enqueue_after_a_restart_succeeds(
    restartable_pg: EmbeddedPostgres, mode: str
) -> None:
    """A store keeps a connection for single enqueues; the server's restart closes it while
    kept. The first enqueue after the restart raised (`InterfaceError: cannot call
    Connection.terminate(): connection has been released back to the pool`) though the
    server was back: it takes a fresh connection, as the pool does for its idle ones."""
    pg = restartable_pg
    prefix = f"r{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        queue = Queue(store)
        await queue.enqueue(Work(0, 1))  # the kept connection is made
        await asyncio.to_thread(pg.halt, mode)
        await asyncio.to_thread(pg.launch)
        after = [await queue.enqueue(Work(i, 1)) for i in range(1, 4)]
        assert len(set(after)) == 3
        assert await queue.pending() == 4


@pytest.mark.parametrize("cut", ["restart", "terminate"])
async def test_a_result_awaited_through_a_lost_connection_still_comes(
    restartable_pg: EmbeddedPostgres, cut: str
) -> None:
    """`queue.result()` listens on a connection; when that connection went away (a server
    restart, its backend terminated) it waited out its whole timeout for a job that had
    finished, then raised asyncpg's InterfaceError. It listens again, and looks again."""
    pg = restartable_pg
    prefix = f"r{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        queue = Queue(store)
        job_id = await queue.enqueue(Work(0, 1))
        waiting = asyncio.create_task(queue.result(job_id, timeout=60))

        async def listening() -> bool:
            n: int = await fetchval(
                pg.dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %results%'"
                " OR query LIKE 'UPDATE%awaited%'",
            )
            return n > 0

        await wait_until(listening, 30, "result() listening")
        if cut == "restart":
            await asyncio.to_thread(pg.halt, "fast")
            await asyncio.to_thread(pg.launch)
        else:
            await fetchval(
                pg.dsn,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN %results%' OR query LIKE 'UPDATE%awaited%'",
            )
        assert not waiting.done()

        async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
            return Outcome.completed(result={"n": task.n})

        worker: Worker[None] = Worker(None, store, concurrency=1)
        worker.register(Work, handle)
        async with running(worker):  # the job finishes after the cut
            assert await asyncio.wait_for(waiting, 60) == {"n": 0}
