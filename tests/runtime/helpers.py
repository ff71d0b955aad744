"""Shared test helpers: run a worker in the background and wait on database state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from ulid import ULID

from venturi import JobStatus, Queue, Worker

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


def all_migrations() -> list[int]:
    """Every migration version this release ships (what migrate() applies to a new prefix)."""
    from venturi._db import sql

    return [m.version for m in sql.migrations("x")]
