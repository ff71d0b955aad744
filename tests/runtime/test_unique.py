"""Unique jobs: while a job holds its unique id (queued or running, within `unique_for`), an
enqueue of the same id stores nothing and returns the holder's id; the hold ends when the job
finishes, or after `unique_for`. Enforced by a unique index, race-free under many producers,
and never aborting the caller's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    Context,
    DedupKey,
    JobStateError,
    JobStatus,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)

from .helpers import running, until, until_status


@dataclass
class SyncStock(Task):
    KIND = "sync_stock"
    shop: int
    note: str = ""

    def unique_for(self) -> timedelta:
        return timedelta(minutes=10)

    def unique_id(self) -> str:
        return str(self.shop)


@dataclass
class Other(Task):
    """Another KIND with the same ids: ids are unique within a KIND only."""

    KIND = "other"
    shop: int

    def unique_for(self) -> float:
        return 600

    def unique_id(self) -> str:
        return str(self.shop)


async def rows(store: PostgresStore, kind: str = "sync_stock") -> list[asyncpg.Record]:
    return list(
        await store._pool.fetch(
            f"SELECT id, payload::text AS payload, status, unique_key, unique_until IS NOT NULL "
            f"AS holds FROM {store.prefix}_jobs WHERE kind = $1 ORDER BY id",
            kind,
        )
    )


async def expire(store: PostgresStore, job_id: ULID) -> None:
    """Let `unique_for` pass for this job (as the database clock would)."""
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET unique_until = now() - interval '1 second' WHERE id = $1",
        job_id.to_uuid(),
    )


async def test_a_second_dispatch_while_queued_returns_the_holder_and_stores_nothing(
    store: PostgresStore, queue: Queue
) -> None:
    first = await queue.enqueue(SyncStock(1, note="first"))
    assert await queue.enqueue(SyncStock(1, note="second")) == first
    assert await queue.enqueue_in(SyncStock(1), 60) == first
    assert await Queue(store, queue="elsewhere").enqueue(SyncStock(1)) == first  # any queue
    other_shop = await queue.enqueue(SyncStock(2))
    other_kind = await queue.enqueue(Other(1))
    assert len({first, other_shop, other_kind}) == 3
    found = await rows(store)
    assert [r["id"] for r in found] == [first.to_uuid(), other_shop.to_uuid()]
    assert '"first"' in found[0]["payload"]  # the holder is left as it was
    assert [r["unique_key"] for r in found] == ["1", "2"]

    ids = await queue.enqueue_many([SyncStock(1), SyncStock(3), SyncStock(3), Other(2)])
    assert ids[0] == first and ids[1] == ids[2] and len(set(ids)) == 3
    assert len(await rows(store)) == 3


async def test_the_hold_ends_when_the_job_finishes_and_lasts_while_it_runs(
    store: PostgresStore, queue: Queue
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handle(task: SyncStock, ctx: Context[None], app: None) -> None:
        if task.note == "block":
            started.set()
            await release.wait()
        if task.note == "fail":
            raise TaskError.permanent("no")

    worker = Worker(None, store)
    worker.register(SyncStock, handle)
    async with running(worker):
        running_job = await queue.enqueue(SyncStock(1, note="block"))
        await asyncio.wait_for(started.wait(), timeout=20)
        assert await queue.enqueue(SyncStock(1)) == running_job  # running: still held
        release.set()
        await until_status(queue, running_job, JobStatus.COMPLETED)
        after_done = await queue.enqueue(SyncStock(1, note="fail"))
        assert after_done != running_job  # completed: the id is free
        await until_status(queue, after_done, JobStatus.DEAD)
        after_dead = await queue.enqueue(SyncStock(1))
        assert after_dead not in (running_job, after_done)  # failed for good: free too
        await until_status(queue, after_dead, JobStatus.COMPLETED)
    assert [r["holds"] for r in await rows(store)] == [False, False, False]


async def test_the_hold_ends_after_unique_for_even_if_the_job_still_waits(
    store: PostgresStore, queue: Queue
) -> None:
    waiting = await queue.enqueue_in(SyncStock(1), timedelta(hours=1))
    assert await queue.enqueue(SyncStock(1)) == waiting
    await expire(store, waiting)
    fresh = await queue.enqueue(SyncStock(1))
    assert fresh != waiting
    found = {r["id"]: r for r in await rows(store)}
    assert found[waiting.to_uuid()]["status"] == "pending"  # still waits, holds no more
    assert not found[waiting.to_uuid()]["holds"] and found[fresh.to_uuid()]["holds"]
    assert await queue.enqueue(SyncStock(1)) == fresh


async def test_the_hold_ends_by_the_database_clock(store: PostgresStore, queue: Queue) -> None:
    @dataclass
    class Brief(Task):
        KIND = "brief"

        def unique_for(self) -> float:
            return 0.05

        def unique_id(self) -> str:
            return "one"

    first = await queue.enqueue(Brief())
    passed = await store._pool.fetchval(
        f"SELECT unique_until - now() <= interval '0.05 second' AND unique_until > now() - "
        f"interval '1 minute' FROM {store.prefix}_jobs WHERE id = $1",
        first.to_uuid(),
    )
    assert passed

    async def replaced() -> bool:  # held until 50 ms have passed
        return await queue.enqueue(Brief()) != first

    await until(replaced)
    assert len(await rows(store, "brief")) == 2


@pytest.mark.parametrize(
    ("unique_for", "unique_id", "message"),
    [
        (60, None, r"Brief\.unique_for\(\) is set but Brief\.unique_id\(\) returned None"),
        (None, "x", r"Brief\.unique_id\(\) is set but Brief\.unique_for\(\) returned None"),
        (0, "x", r"Brief\.unique_for\(\): expected a duration from 0\.001 s"),
        (float("nan"), "x", r"Brief\.unique_for\(\): expected a duration"),
        (60, "a\x00b", r"Brief\.unique_id\(\): the id holds a NUL character"),
        (60, "x" * 2001, r"Brief\.unique_id\(\): the id is 2,001 bytes of UTF-8"),
    ],
)
async def test_bad_unique_settings_are_clear_errors_and_store_nothing(
    store: PostgresStore, queue: Queue, unique_for: Any, unique_id: Any, message: str
) -> None:
    @dataclass
    class Brief(Task):
        KIND = "brief"

        def unique_for(self) -> Any:
            return unique_for

        def unique_id(self) -> Any:
            return unique_id

    with pytest.raises(ValueError, match=message):
        await queue.enqueue(Brief())
    with pytest.raises(ValueError, match=message):
        await queue.enqueue_many([SyncStock(1), Brief()])
    assert await rows(store, "brief") == [] and await rows(store) == []


async def test_unique_and_dedup_are_alternatives(store: PostgresStore, queue: Queue) -> None:
    @dataclass
    class Both(SyncStock):
        KIND = "both"

        def dedup_key(self) -> DedupKey:
            return DedupKey(self.shop)

    with pytest.raises(ValueError, match=r"Both: unique_for\(\)/unique_id\(\) and dedup_key"):
        await queue.enqueue(Both(1))
    assert await rows(store, "both") == []


@pytest.fixture
async def wide_store(pg_dsn: str, store: PostgresStore) -> AsyncIterator[PostgresStore]:
    """The test's queue with a pool wide enough for 50 producers at once."""
    wide = await PostgresStore.connect(pg_dsn, prefix=store.prefix, max_size=55)
    try:
        yield wide
    finally:
        await wide.close()


async def at_once(n: int, make: Any) -> list[ULID]:
    """Run `n` producers, released together."""
    go = asyncio.Event()

    async def one(i: int) -> ULID:
        await go.wait()
        result: ULID = await make(i)
        return result

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0)  # every producer is waiting on `go`
    go.set()
    return await asyncio.gather(*tasks)


async def test_fifty_concurrent_producers_store_one_job(wide_store: PostgresStore) -> None:
    queue = Queue(wide_store)
    ids = await at_once(50, lambda i: queue.enqueue(SyncStock(1, note=str(i))))
    found = await rows(wide_store)
    assert len(found) == 1 and set(ids) == {ULID.from_bytes(found[0]["id"].bytes)}

    # The holder's time is up: of 50 producers racing to replace it, one does.
    await expire(wide_store, ids[0])
    ids = await at_once(50, lambda i: queue.enqueue(SyncStock(1, note=str(i))))
    found = await rows(wide_store)
    assert len(found) == 2 and [r["holds"] for r in found] == [False, True]
    assert set(ids) == {ULID.from_bytes(found[1]["id"].bytes)}

    # Ten ids, five producers each, mixed single and bulk enqueues.
    async def mixed(i: int) -> ULID:
        task = SyncStock(100 + i % 10, note=str(i))
        if i % 2:
            return await queue.enqueue(task)
        (job_id,) = await queue.enqueue_many([task])
        return job_id

    ids = await at_once(50, mixed)
    holders = {r["unique_key"]: r["id"] for r in await rows(wide_store) if r["holds"]}
    assert len(holders) == 11  # shop 1 and the ten new ones
    for i, job_id in enumerate(ids):
        assert job_id.to_uuid() == holders[str(100 + i % 10)]
    assert len(await rows(wide_store)) == 12


async def test_a_failed_unique_job_is_retried_only_while_its_id_is_free(
    store: PostgresStore, queue: Queue
) -> None:
    async def refuse(task: SyncStock, ctx: Context[None], app: None) -> None:
        raise TaskError.permanent("no")

    worker = Worker(None, store)
    worker.register(SyncStock, refuse)
    failed = await queue.enqueue(SyncStock(1))
    also_failed = await queue.enqueue(SyncStock(2))
    await worker.run(once=True)
    holder = await queue.enqueue(SyncStock(1))  # the failed job let go of the id
    assert holder != failed

    with pytest.raises(JobStateError, match=rf"its unique id '1' is held by job {holder}"):
        await queue.retry(failed)
    job = await queue.job(failed)
    assert job is not None and job.status is JobStatus.DEAD
    assert await queue.retry_all() == 1  # shop 2's; shop 1's stays failed
    assert [f.id for f in await queue.failed()] == [failed]
    assert await queue.enqueue(SyncStock(2)) == also_failed  # retried: it holds its id again

    await expire(store, holder)  # the holder's time is up: the failed job takes the id back
    await queue.retry(failed)
    assert await queue.enqueue(SyncStock(1)) == failed


async def test_a_unique_insert_stores_the_row_a_plain_insert_does(
    store: PostgresStore, queue: Queue
) -> None:
    @dataclass
    class Plain(Task):
        KIND = "sync_stock"  # the same KIND, not unique
        shop: int
        note: str = ""

        def lease(self) -> float:
            return 30

    @dataclass
    class Unique(Plain):
        KIND = "sync_stock_u"

        def unique_for(self) -> float:
            return 60

        def unique_id(self) -> str:
            return "x"

    a = await queue.enqueue_in(Plain(1), 5)
    b = await queue.enqueue_in(Unique(1), 5)
    columns = await store._pool.fetch(
        f"SELECT * FROM {store.prefix}_jobs WHERE id = ANY($1::uuid[]) ORDER BY id",
        [a.to_uuid(), b.to_uuid()],
    )
    plain, unique = (dict(r) for r in columns)
    differ = {k for k in plain if plain[k] != unique[k]}
    assert differ == {
        "id",
        "kind",
        "run_at",
        "created_at",
        "unique_key",
        "unique_for_s",
        "unique_until",
    }
    assert unique["run_at"] - unique["created_at"] == plain["run_at"] - plain["created_at"]


async def test_a_collision_never_aborts_the_callers_transaction(
    store: PostgresStore, queue: Queue, pg_dsn: str
) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            first = await queue.enqueue(SyncStock(1), conn=conn)
            assert await queue.enqueue(SyncStock(1), conn=conn) == first
            assert await queue.enqueue_many([SyncStock(1)], conn=conn) == [first]
            assert await conn.fetchval("SELECT 41 + 1") == 42  # the transaction goes on
        assert [r["id"] for r in await rows(store)] == [first.to_uuid()]

        # REPEATABLE READ: a holder committed after the snapshot cannot be returned (the
        # snapshot does not see it), so the enqueue raises, but the transaction goes on.
        async with conn.transaction(isolation="repeatable_read"):
            await conn.fetchval("SELECT 1")  # the snapshot is taken
            other = await queue.enqueue(SyncStock(2))
            with pytest.raises(asyncpg.SerializationError):
                await queue.enqueue(SyncStock(2), conn=conn)
            assert await conn.fetchval("SELECT 41 + 1") == 42
            await conn.execute(
                f"UPDATE {store.prefix}_jobs SET priority = 2 WHERE id = $1", first.to_uuid()
            )
        job = await queue.job(first)
        assert job is not None and job.priority == 2  # committed
        assert [r["id"] for r in await rows(store)] == [first.to_uuid(), other.to_uuid()]
    finally:
        await conn.close()
