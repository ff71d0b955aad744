"""Through PgBouncer in transaction pooling mode (`pooler="transaction"`): the harness starts
Debian's `pgbouncer` in front of the test PostgreSQL, and everything a deployment does goes
through it: migrations, enqueue (plain, batched, deduplicated, in the caller's transaction),
claim and settle by a worker (polling, or woken by LISTEN on a direct `listen_dsn`), a real
`venturi worker` process, the operator's reads (stats, claims per pod), unique jobs, pause and
resume, failed jobs and their retry, leader election and periodic schedules."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from venturi import (
    Backoff,
    Context,
    DedupKey,
    JobStatus,
    Outcome,
    PostgresStore,
    Queue,
    Schedule,
    Task,
    TaskError,
    Worker,
)
from venturi._db import sql
from venturi.embedded import pgbouncer_settings, pgbouncer_version

from .cli_app import Echo
from .helpers import running, until, until_status

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Step(Task):
    KIND = "pooler.step"
    n: int


@dataclass
class Keyed(Task):
    KIND = "pooler.keyed"
    key: str
    n: int = 0

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.key)


@pytest.fixture
async def pooled(pgbouncer_dsn: str, prefix: str) -> AsyncIterator[PostgresStore]:
    """A store through PgBouncer, migrated through it, with a statement timeout (which it
    can only set per transaction there)."""
    store = await PostgresStore.connect(
        pgbouncer_dsn, prefix=prefix, pooler="transaction", statement_timeout=30, max_size=10
    )
    try:
        assert await store.migrate()  # every migration, under a transaction-scoped lock
        yield store
    finally:
        await store.close()


async def _bouncer_connection(dsn: str) -> asyncpg.Connection[Any]:
    return await asyncpg.connect(dsn, statement_cache_size=0)


async def test_the_harness_pools_by_transaction(pgbouncer_dsn: str) -> None:
    """What venturi must not rely on: session state set by one client of PgBouncer is seen
    by another, and a named prepared statement is gone in the next transaction."""
    first, second = await _bouncer_connection(pgbouncer_dsn), await asyncpg.connect(pgbouncer_dsn)
    try:
        await first.execute("SET application_name = 'leaked'")
        # PgBouncer hands out its most recently used server connection: the first's.
        assert await second.fetchval("SELECT current_setting('application_name')") == "leaked"

        # asyncpg's named statement, prepared on the server connection the second client had,
        # used again while the first client holds that connection in a transaction: PgBouncer
        # sends it to another server connection, which never saw it.
        assert await second.fetchval("SELECT $1::int", 1) == 1
        async with first.transaction():
            await first.execute("SELECT 1")
            with pytest.raises(asyncpg.PostgresError, match="prepared statement"):
                await second.fetchval("SELECT $1::int", 2)
    finally:
        await first.close()
        await second.close()


def test_the_harness_turns_prepared_statement_tracking_off_where_pgbouncer_has_it() -> None:
    """PgBouncer 1.21+ can track prepared statements in transaction mode (on by default from
    1.24): the harness turns it off, so the test above holds, on any version."""
    assert pgbouncer_version("PgBouncer 1.18.0\nlibevent 2.1.12-stable\n") == (1, 18, 0)
    assert pgbouncer_version("PgBouncer 1.24.1\n") == (1, 24, 1)
    assert pgbouncer_version("pgbouncer: unknown\n") is None
    assert pgbouncer_settings((1, 18, 0)) == ""
    assert pgbouncer_settings(None) == ""
    for newer in ((1, 21, 0), (1, 24, 1), (2, 0)):
        assert pgbouncer_settings(newer) == "max_prepared_statements = 0\n"


async def test_statement_timeout_is_set_per_transaction(pgbouncer_dsn: str, prefix: str) -> None:
    # As a startup parameter (what a direct connection gets) PgBouncer refuses it outright.
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
        await PostgresStore.connect(pgbouncer_dsn, prefix=prefix, statement_timeout=2)
    store = await PostgresStore.connect(
        pgbouncer_dsn, prefix=prefix, pooler="transaction", statement_timeout=0.5
    )
    probe = sql.compile_statement("probe", "SELECT current_setting('statement_timeout')")
    sleep = sql.compile_statement("sleep", "SELECT pg_sleep(5)")
    try:
        assert await store._run.fetchval(probe) == "500ms"
        async with store._run.transaction() as tx:
            assert await tx.fetchval(probe) == "500ms"
        with pytest.raises(asyncpg.QueryCanceledError):
            await store._run.fetchval(sleep)
        # ... and never outlives its transaction on the server connection others get next.
        other = await _bouncer_connection(pgbouncer_dsn)
        try:
            assert await other.fetchval(probe.text) == "0"
        finally:
            await other.close()
    finally:
        await store.close()


async def test_enqueue_claim_settle_and_dedup_through_the_pooler(pooled: PostgresStore) -> None:
    queue = Queue(pooled)
    ran: list[int] = []

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.n)
        return Outcome.completed(note=str(task.n))

    async def keyed(task: Keyed, ctx: Context[None], app: None) -> None:
        pass

    first = await queue.enqueue(Keyed("k", 1))
    assert await queue.enqueue(Keyed("k", 2)) == first  # merged into the pending job
    [job] = [j for j in await queue.jobs() if j.kind == Keyed.KIND]
    assert job.payload == {"key": "k", "n": 2}
    single = await queue.enqueue(Step(0))
    many = await queue.enqueue_many([Step(n) for n in range(1, 200)])
    stats = await queue.stats()
    assert stats.pending_by_kind == {Step.KIND: 200, Keyed.KIND: 1}

    worker = Worker(None, pooled, concurrency=8, poll_max=0.2)
    worker.register(Step, handle)
    worker.register(Keyed, keyed)
    assert pooled.can_listen is False
    async with running(worker):

        async def drained() -> bool:
            s = await queue.stats()
            return not s.pending_by_kind and not s.claimed_by_kind

        await until(drained)
    assert sorted(ran) == list(range(200))
    for job_id in (single, *many, first):
        fetched = await queue.job(job_id)
        assert fetched is not None and fetched.status is JobStatus.COMPLETED
    assert (await queue.stats()).completed_by_kind == {Step.KIND: 200, Keyed.KIND: 1}
    assert await queue.claimed_by_pod() == {}


async def test_transactional_enqueue_through_the_pooler(
    pooled: PostgresStore, pgbouncer_dsn: str
) -> None:
    queue = Queue(pooled)
    conn = await _bouncer_connection(pgbouncer_dsn)
    try:
        async with conn.transaction():
            kept = await queue.enqueue(Step(1), conn=conn)
            await queue.enqueue(Keyed("t"), conn=conn)
            assert await queue.job(kept) is None  # not committed yet
        dropped = None
        try:
            async with conn.transaction():
                dropped = await queue.enqueue(Step(2), conn=conn)
                raise RuntimeError("undo")
        except RuntimeError:
            pass
        assert dropped is not None
    finally:
        await conn.close()
    assert (job := await queue.job(kept)) is not None and job.status is JobStatus.PENDING
    assert await queue.job(dropped) is None
    assert (await queue.stats()).pending_by_kind == {Step.KIND: 1, Keyed.KIND: 1}


async def test_listen_dsn_wakes_a_worker_behind_the_pooler(
    pgbouncer_dsn: str, pg_dsn: str, prefix: str
) -> None:
    store = await PostgresStore.connect(
        pgbouncer_dsn, prefix=prefix, pooler="transaction", listen_dsn=pg_dsn
    )
    try:
        await store.migrate()
        assert store.can_listen and store.listens_outside_pool
        ran = asyncio.Event()

        async def handle(task: Step, ctx: Context[None], app: None) -> None:
            ran.set()

        # poll_max longer than the test's timeout: only the NOTIFY, sent through PgBouncer
        # and heard on the direct connection, can wake the idle worker in time.
        worker = Worker(None, store, poll_max=120.0)
        worker.register(Step, handle)
        async with running(worker):
            await Queue(store).enqueue(Step(1))
            await asyncio.wait_for(ran.wait(), timeout=30)
    finally:
        await store.close()


async def test_results_are_awaited_behind_the_pooler(
    pooled: PostgresStore, pgbouncer_dsn: str, pg_dsn: str, prefix: str
) -> None:
    """Without listen_dsn, `result` looks at the job (reading only) until it finishes; with
    one, it LISTENs on a direct connection of its own. Both through PgBouncer otherwise."""
    listening = await PostgresStore.connect(
        pgbouncer_dsn, prefix=prefix, pooler="transaction", listen_dsn=pg_dsn
    )
    release = asyncio.Event()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        await release.wait()  # finishes only after each result() began to wait
        return Outcome.completed(result={"double": 2 * task.n})

    worker = Worker(None, pooled, poll_max=0.2, concurrency=2)
    worker.register(Step, handle)
    try:
        async with running(worker):
            for store, n in ((pooled, 1), (listening, 2)):
                queue = Queue(store)
                job_id = await queue.enqueue(Step(n))
                waiting = asyncio.create_task(queue.result(job_id, timeout=30))
                await until_status(queue, job_id, JobStatus.CLAIMED)
                assert not waiting.done()
                release.set()
                assert await waiting == {"double": 2 * n}
                release.clear()
    finally:
        await listening.close()


async def test_without_listen_dsn_the_store_refuses_to_listen(pooled: PostgresStore) -> None:
    with pytest.raises(TypeError, match="listen_dsn"):
        async with pooled.listen(lambda _kind: None, lambda: None):
            pass
    with pytest.raises(ValueError, match="pooler: expected one of none, transaction"):
        await PostgresStore.connect("postgresql://x@127.0.0.1:1/x", pooler="pgbouncer")  # type: ignore[arg-type]


async def test_a_venturi_worker_process_drains_through_the_pooler(
    pooled: PostgresStore, pgbouncer_dsn: str
) -> None:
    queue = Queue(pooled)
    ids = await queue.enqueue_many([Echo(text=str(n)) for n in range(50)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VENTURI_", "PG"))}
    env |= {
        "VENTURI_DSN": pgbouncer_dsn,
        "VENTURI_PREFIX": pooled.prefix,
        "VENTURI_POOLER": "transaction",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_worker",
        "--stop-when-empty",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    assert "pooler=transaction" in stderr and "by polling" in stderr, stderr
    for job_id in ids:
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert (await queue.stats()).completed_by_kind == {Echo.KIND: 50}


@dataclass
class Once(Task):
    KIND = "pooler.once"
    key: str

    def unique_for(self) -> float | None:
        return 3600.0

    def unique_id(self) -> str | None:
        return self.key


async def test_unique_jobs_pauses_and_failed_jobs_through_the_pooler(
    pooled: PostgresStore,
) -> None:
    queue = Queue(pooled)
    first = await queue.enqueue(Once("invoice-7"))
    assert await queue.enqueue(Once("invoice-7")) == first  # held: nothing stored
    await queue.pause("default", reason="through the pooler")
    assert (await queue.stats()).paused_queues == {"default"}
    ran: list[str] = []

    async def handle(task: Once, ctx: Context[None], app: None) -> None:
        ran.append(task.key)
        if len(ran) == 1:
            raise TaskError.permanent("first run fails for good")

    probe = {"queues": ["default"], "kinds": [Once.KIND], "limit": 1, "pod": None}
    claimed = await pooled.claim(**probe, worker="probe", default_lease_s=30)  # type: ignore[arg-type]
    assert claimed == []  # the claim, through the pooler, sees the pause
    worker = Worker(None, pooled, concurrency=2, poll_max=0.2)
    worker.register(Once, handle)
    async with running(worker):
        await queue.resume("default")
        await until_status(queue, first, JobStatus.DEAD)
        [failed] = await queue.failed()
        assert failed.id == first and failed.error == "first run fails for good"
        await queue.retry(first)
        await until_status(queue, first, JobStatus.COMPLETED)
    assert ran == ["invoice-7", "invoice-7"]
    assert await queue.enqueue(Once("invoice-7")) != first  # the hold ended with the job


async def test_leadership_and_schedules_through_the_pooler(pooled: PostgresStore) -> None:
    every_second = Schedule("pooler-tick", Step(0), every=timedelta(seconds=1))
    workers = [
        Worker(None, pooled, concurrency=1, poll_max=0.2, schedules=[every_second])
        for _ in range(2)
    ]
    for w in workers:
        w.register(Step, lambda task, ctx, app: asyncio.sleep(0))
    queue = Queue(pooled)

    async def leaders() -> list[str]:
        return [w.id for w in await queue.workers() if w.leader and w.live]

    async with running(workers[0]):
        async with running(workers[1]):
            await until(lambda: _one(leaders))
            (first_leader,) = await leaders()
            await until(lambda: _ticked(queue, 2))
        # The second worker stopped cleanly: whoever remains leads (perhaps already did).
        await until(lambda: _is(leaders, [str(workers[0].identity)]), limit=30)
    infos = await queue.schedules()
    assert [i.name for i in infos] == ["pooler-tick"] and infos[0].enqueued >= 2
    assert first_leader in {str(w.identity) for w in workers}


async def _one(leaders: Callable[[], Awaitable[list[str]]]) -> bool:
    return len(await leaders()) == 1


async def _is(leaders: Callable[[], Awaitable[list[str]]], expected: list[str]) -> bool:
    return await leaders() == expected


async def _ticked(queue: Queue, n: int) -> bool:
    infos = await queue.schedules()
    return bool(infos) and infos[0].enqueued >= n


async def test_a_polling_worker_wakes_itself_for_what_it_wrote(pooled: PostgresStore) -> None:
    """Without LISTEN a worker learns of new work only when it polls; what it wrote itself (a
    chain's next link released by its settlement, a retry's new time, a tick's job) it knows
    of: it looks again at once. poll_max is an hour: only that can run these in time."""
    ran: list[tuple[int, int]] = []

    async def handle(task: Step, ctx: Context[None], app: None) -> None:
        ran.append((task.n, ctx.run_count))
        if task.n == 3 and ctx.run_count == 1:
            raise TaskError.retryable("once more")

    queue = Queue(pooled)
    # Stored before the worker starts: its first claim finds the first link, and nothing but
    # its own writes can tell it of the rest within the hour.
    _, _, third = await queue.chain(Step(1), Step(2), Step(3))
    worker = Worker(None, pooled, concurrency=1, poll_max=3600.0, backoff=Backoff(0.05, 0.05))
    worker.register(Step, handle)
    async with running(worker):
        await until_status(queue, third, JobStatus.COMPLETED)
    assert ran == [(1, 1), (2, 1), (3, 1), (3, 2)]

    every_second = Schedule("pooler-self-tick", Step(9), every=timedelta(seconds=1))
    ticking = Worker(None, pooled, concurrency=1, poll_max=3600.0, schedules=[every_second])
    ticking.register(Step, handle)
    async with running(ticking):
        await until(lambda: _ran_tick(ran))


async def _ran_tick(ran: list[tuple[int, int]]) -> bool:
    return any(n == 9 for n, _ in ran)
