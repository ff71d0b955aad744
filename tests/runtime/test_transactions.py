"""The caller's connection and transaction: a job enqueued with `conn=` exists, and wakes a
worker, only if the caller's transaction commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from venturi import (
    Context,
    DedupKey,
    JobFilter,
    JobStatus,
    Merge,
    Pending,
    PostgresStore,
    Queue,
    Task,
    Worker,
)

from .helpers import running, until, until_status


@dataclass
class Signup(Task):
    KIND = "signup"
    user: int


@dataclass
class Welcome(Task):
    KIND = "welcome"
    user: int


@dataclass
class Digest(Task):
    KIND = "digest"
    user: int
    items: list[str] = field(default_factory=list)

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.user)

    def merge(self, existing: Pending[Any]) -> Merge:
        return Merge.with_(Digest(self.user, sorted({*existing.task.items, *self.items})))


@pytest.fixture(params=["connection", "pool"])
async def conn(request: pytest.FixtureRequest, pg_dsn: str) -> AsyncIterator[Any]:
    """A connection the caller holds: asyncpg's own, or one acquired from the caller's pool."""
    if request.param == "connection":
        own = await asyncpg.connect(pg_dsn)
        try:
            yield own
        finally:
            await own.close()
    else:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            async with pool.acquire() as proxied:
                yield proxied
        finally:
            await pool.close()


async def stored(store: PostgresStore, kind: str) -> int:
    """Jobs of `kind` in the table, read on another connection (the committed state)."""
    value: int = await store._pool.fetchval(
        f"SELECT count(*) FROM {store.prefix}_jobs WHERE kind = $1", kind
    )
    return value


async def test_a_job_enqueued_in_a_committed_transaction_runs(queue: Queue, conn: Any) -> None:
    ran = asyncio.Event()

    async def handle(task: Signup, ctx: Context[None], app: None) -> None:
        ran.set()

    worker = Worker(None, queue.store, poll_max=30.0)
    worker.register(Signup, handle)
    async with running(worker):
        async with conn.transaction():
            job_id = await queue.enqueue(Signup(7), conn=conn)
            # Written by the caller's transaction: nobody else sees it before the commit ...
            assert await queue.job(job_id) is None
            assert await Queue(queue.store.using(conn)).job(job_id) is not None
        # ... and the NOTIFY delivered at the commit wakes the idle worker (poll_max is 30 s,
        # the test's timeout is shorter).
        await asyncio.wait_for(ran.wait(), timeout=20)
        await until_status(queue, job_id, JobStatus.COMPLETED)


async def test_a_rolled_back_transaction_leaves_no_job_and_wakes_no_worker(
    store: PostgresStore, queue: Queue, conn: Any
) -> None:
    notified: list[str] = []
    welcome = asyncio.Event()

    def on_notify(_prefix: str, kind: str) -> None:
        notified.append(kind)
        if kind == "welcome":
            welcome.set()

    async with store.listen_queues([store.prefix], on_notify, lambda: None):

        class Abandon(Exception):
            pass

        async def enqueue_then_roll_back() -> None:
            async with conn.transaction():
                await queue.enqueue(Signup(1), conn=conn)
                await queue.enqueue_many([Signup(2), Signup(3), Digest(1, ["a"])], conn=conn)
                await queue.enqueue_in(Signup(4), 0, conn=conn)
                await queue.enqueue(Digest(1, ["b"]), conn=conn)
                raise Abandon

        with pytest.raises(Abandon):
            await enqueue_then_roll_back()
        # Notifications arrive in commit order: once the committed one is here, any of the
        # rolled-back transaction would have arrived before it.
        await queue.enqueue(Welcome(1))
        await asyncio.wait_for(welcome.wait(), timeout=20)
    assert notified == ["welcome"]
    assert await stored(store, "signup") == 0
    assert await stored(store, "digest") == 0
    assert (await queue.stats()).pending_by_kind == {"welcome": 1}


async def test_a_connection_outside_a_transaction_is_refused(
    store: PostgresStore, queue: Queue, conn: Any
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    calls = [
        queue.enqueue(Signup(1), conn=conn),
        queue.enqueue_at(Signup(1), later, conn=conn),
        queue.enqueue_in(Signup(1), 60, conn=conn),
        queue.enqueue_many([Signup(1), Signup(2)], conn=conn),
        queue.enqueue(Digest(1, ["a"]), conn=conn),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="not in a transaction"):
            await call
    assert await stored(store, "signup") == 0
    assert await stored(store, "digest") == 0
    with pytest.raises(ValueError, match="autocommit=True applies to a caller's connection"):
        await queue.enqueue(Signup(1), autocommit=True)


async def test_autocommit_commits_each_enqueue_at_once(
    store: PostgresStore, queue: Queue, conn: Any
) -> None:
    job_id = await queue.enqueue(Signup(1), conn=conn, autocommit=True)
    ids = await queue.enqueue_many([Signup(2), Digest(1, ["a"])], conn=conn, autocommit=True)
    merged = await queue.enqueue(Digest(1, ["b"]), conn=conn, autocommit=True)
    assert not conn.is_in_transaction()
    assert await queue.job(job_id) is not None  # seen from the pool: committed
    assert merged == ids[1]
    digest = await queue.job(merged)
    assert digest is not None and digest.payload["items"] == ["a", "b"]
    assert await stored(store, "signup") == 2


async def test_deduplication_inside_the_callers_transaction(
    store: PostgresStore, queue: Queue, conn: Any
) -> None:
    async with conn.transaction():
        first = await queue.enqueue(Digest(1, ["a"]), conn=conn)
        assert await queue.enqueue(Digest(1, ["b"]), conn=conn) == first  # sees its own job
        # The key's lock is the caller's until its transaction ends: a producer elsewhere
        # waits for it, then merges into the committed job.
        elsewhere = asyncio.create_task(queue.enqueue(Digest(1, ["c"])))

        async def waiting_on_the_lock() -> bool:
            waiting: int = await store._pool.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            return waiting == 1

        await until(waiting_on_the_lock)
        assert not elsewhere.done()
    assert await elsewhere == first
    job = await queue.job(first)
    assert job is not None and job.payload["items"] == ["a", "b", "c"]
    assert await stored(store, "digest") == 1


async def test_a_failed_deduplicated_enqueue_leaves_the_callers_transaction_usable(
    pg_dsn: str, store: PostgresStore, queue: Queue, conn: Any
) -> None:
    holder = await asyncpg.connect(pg_dsn)
    try:
        async with holder.transaction():
            await queue.enqueue(Digest(1, ["held"]), conn=holder)  # holds the key's lock
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '100ms'")
                await queue.enqueue(Signup(1), conn=conn)
                with pytest.raises(asyncpg.LockNotAvailableError):
                    await queue.enqueue(Digest(1, ["mine"]), conn=conn)
                # Only the failed enqueue was rolled back (to its savepoint): the caller's
                # transaction goes on and commits what it did before and after.
                await queue.enqueue(Signup(2), conn=conn)
    finally:
        await holder.close()
    assert await stored(store, "signup") == 2
    [digest] = await queue.jobs(JobFilter(kind="digest"))
    assert digest.kind == "digest" and digest.payload["items"] == ["held"]


async def test_a_transaction_begun_by_a_statement_of_the_callers(
    store: PostgresStore, queue: Queue, conn: Any
) -> None:
    """asyncpg's nested `transaction()` refuses a transaction begun with BEGIN; venturi's
    savepoint does not."""
    await conn.execute("BEGIN")
    await queue.enqueue(Digest(1, ["a"]), conn=conn)
    await queue.enqueue(Digest(1, ["b"]), conn=conn)
    await conn.execute("ROLLBACK")
    assert await stored(store, "digest") == 0
    await conn.execute("BEGIN")
    await queue.enqueue(Digest(1, ["a"]), conn=conn)
    await queue.enqueue(Digest(1, ["b"]), conn=conn)
    await conn.execute("COMMIT")
    assert await stored(store, "digest") == 1


async def test_what_is_not_a_connection(store: PostgresStore, queue: Queue, pg_dsn: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
    try:
        with pytest.raises(TypeError, match=r"expected an asyncpg connection .* got Pool"):
            await queue.enqueue(Signup(1), conn=pool)  # type: ignore[arg-type]
        async with pool.acquire() as conn:
            with pytest.raises(TypeError, match="cannot LISTEN"):
                async with store.using(conn).listen_queues([store.prefix], print, print):
                    pass
    finally:
        await pool.close()
