"""Shared test helpers: run a worker in the background and wait on database state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from ulid import ULID

from venturi import JobStatus, PostgresStore, Queue, Worker
from venturi._db import sql
from venturi._records import ClaimedJob

WAIT_TIMEOUT = 30.0


@asynccontextmanager
async def running(worker: Worker[Any]) -> AsyncIterator[asyncio.Event]:
    """Run `worker` in the background until the block exits; yields its shutdown event."""
    shutdown = asyncio.Event()
    task = asyncio.create_task(worker.run(shutdown))
    ready = asyncio.create_task(worker.ready.wait())
    done, _ = await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        task.result()
    try:
        yield shutdown
    finally:
        shutdown.set()
        await asyncio.wait_for(task, timeout=WAIT_TIMEOUT + 30)


class Claims:
    """Wraps the store's claim (the real one) to let a test await the worker's claims."""

    def __init__(self, store: PostgresStore) -> None:
        self.results: list[list[ClaimedJob]] = []
        self.changed = asyncio.Event()
        real = store.claim

        async def claim(**kwargs: Any) -> list[ClaimedJob]:
            found = await real(**kwargs)
            self.results.append(found)
            self.changed.set()
            return found

        store.claim = claim  # type: ignore[method-assign]

    async def empty_one(self) -> None:
        """Wait for a claim that found nothing (the worker then waits, idle)."""
        while not (self.results and self.results[-1] == []):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), WAIT_TIMEOUT)

    async def made_within(self, seconds: float) -> int:
        """How many claims the worker makes in the next `seconds`. For "no claim": there is
        no event to await for something that does not happen, so this is a window; callers
        make it as long as two backoff steps of the look they rule out (0.25 s, then 0.5 s)."""
        seen = len(self.results)
        await asyncio.sleep(seconds)
        return len(self.results) - seen

    async def another(self) -> list[ClaimedJob]:
        """Wait for the next claim the worker makes from now on; what it found."""
        seen = len(self.results)
        while len(self.results) == seen:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), WAIT_TIMEOUT)
        return self.results[seen]


async def until(check: Callable[[], Awaitable[bool]], limit: float = WAIT_TIMEOUT) -> None:
    """Poll a database condition. The database is the event source here: there is nothing
    in-process to await, so this polls with a short interval and a hard timeout."""
    deadline = asyncio.get_running_loop().time() + limit
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {limit}s")
        await asyncio.sleep(0.02)


async def until_status(queue: Queue, job_id: ULID, *statuses: JobStatus) -> None:
    async def check() -> bool:
        job = await queue.job(job_id)
        return job is not None and job.status in statuses

    await until(check)


async def claim(
    store: PostgresStore,
    n: int,
    *,
    queue: str = "default",
    kinds: list[str] | None = None,
    pod: str | None = None,
    traced: bool = False,
    worker: str = "w",
    lease_s: float = 60,
) -> list[ClaimedJob]:
    """Claim up to `n` jobs of `queue` (`kinds`, None: every kind) as `worker`, with a lease
    of `lease_s`, as a worker's claim loop would: the store's own claim, no worker around it
    (a worker that then dies, for recovery tests)."""
    return await store.claim(
        queues=[queue],
        kinds=kinds,
        limit=n,
        worker=worker,
        pod=pod,
        default_lease_s=lease_s,
        traced=traced,
    )


def all_migrations() -> list[int]:
    """Every migration version this release ships (what migrate() applies to a new prefix)."""
    return [m.version for m in sql.migrations("x")]


async def migrate_before(
    conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy[Any], prefix: str, name: str
) -> int:
    """Make `prefix`'s schema what the release before migration `name` left: every earlier
    migration applied and recorded, on `conn` (so in its transaction, if it has one).
    Returns `name`'s version; `store.migrate()` then applies it and those after it."""
    (version,) = (m.version for m in sql.migrations(prefix) if m.name == name)
    queries = sql.queries(prefix)
    await conn.execute(queries["migration_table_create"].text)
    record = queries["migration_record"]
    for migration in sql.migrations(prefix):
        if migration.version < version:
            await conn.execute(migration.sql)
            values = {"version": migration.version, "name": migration.name}
            await conn.execute(record.text, *record.args(values))
    return version


def migrations_from(version: int) -> list[int]:
    """The versions `migrate()` applies to a schema migrated up to just before `version`."""
    return [v for v in all_migrations() if v >= version]
