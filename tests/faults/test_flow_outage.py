"""Flow control through a database outage (`venturi.flow`): a key or a rate window the
database cannot be asked about puts the job back without running it and without using an
attempt, as a wait does; it was a failed execution (and, on a last attempt, a dead job whose
handler never ran)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

import pytest

from tests.runtime.helpers import running, until
from venturi import (
    Context,
    JobStatus,
    JournalOutcome,
    Outcome,
    PostgresStore,
    Queue,
    Task,
    Worker,
)
from venturi.embedded import EmbeddedPostgres
from venturi.flow import rate_limited, without_overlapping
from venturi.middleware import CallNext, Middleware

OUTAGE = 1.0
"""Seconds the server stays down (an outage to live through, not a synchronization)."""

_prefixes = itertools.count()


@dataclass
class Once(Task):
    KIND = "flow.once"

    def max_attempts(self) -> int:
        return 1  # a flow check that counted as a failure would make it dead


def halting_once(pg: EmbeddedPostgres, relaunched: asyncio.Event) -> Middleware:
    """Outermost: at the first run, stops the server before the flow check asks it, and
    starts it again OUTAGE later."""
    halted: list[bool] = []

    async def relaunch() -> None:
        await asyncio.sleep(OUTAGE)
        await asyncio.to_thread(pg.launch)
        relaunched.set()

    async def middleware(task: Task, ctx: Context[None], call_next: CallNext) -> Outcome | None:
        if not halted:
            halted.append(True)
            await asyncio.to_thread(pg.halt, "fast")
            asyncio.get_running_loop().create_task(relaunch())
        return await call_next()

    return middleware


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(without_overlapping("one"), id="without_overlapping"),
        pytest.param(rate_limited("one", 10, per=1), id="rate_limited"),
    ],
)
async def test_an_outage_during_the_check_uses_no_attempt(
    restartable_pg: EmbeddedPostgres, check: Middleware
) -> None:
    pg = restartable_pg
    prefix = f"fo{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    ran: list[int] = []

    async def handle(task: Once, ctx: Context[None], app: None) -> Outcome:
        ran.append(ctx.run_count)
        return Outcome.completed()

    relaunched = asyncio.Event()
    async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
        await store.migrate()
        queue = Queue(store)
        job_id = await queue.enqueue(Once())
        worker: Worker[None] = Worker(None, store, concurrency=1)
        worker.register(Once, handle, middleware=[halting_once(pg, relaunched), check])
        async with running(worker):
            await asyncio.wait_for(relaunched.wait(), 60)

            async def completed() -> bool:
                job = await queue.job(job_id)
                return job is not None and job.status is JobStatus.COMPLETED

            await until(completed, limit=60)
        job = await queue.job(job_id)
        journal = await queue.job_journal(job_id)
    assert job is not None and job.failures == 0
    assert ran == [2]  # the handler ran once: at the claim after the put-back
    assert [e.outcome for e in journal] == [JournalOutcome.PAUSED, JournalOutcome.COMPLETED]
    assert "the database could not be asked" in (journal[0].note or "")
