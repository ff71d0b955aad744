"""Chains against the real PostgreSQL: links run one after another, a link that fails for
good holds the rest until it is retried, the release happens in the completing transaction,
and a chain in a rolled-back transaction leaves nothing."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    Context,
    DedupKey,
    JobStatus,
    Outcome,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi.testing import Jobs, WorkerFactory

from .helpers import running, until_status


@dataclass
class Step(Task):
    KIND = "chain_step"
    name: str


@dataclass
class Merging(Task):
    KIND = "chain_merging"

    def dedup_key(self) -> DedupKey | None:
        return DedupKey("one")


def step_worker(store: PostgresStore, log: list[str], fail: set[str]) -> Worker[None]:
    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        log.append(task.name)
        if task.name in fail:
            raise TaskError.permanent(f"{task.name} failed")
        await asyncio.sleep(0.01)
        return Outcome.completed()

    worker: Worker[None] = Worker(None, store, concurrency=8)
    worker.register(Step, handle)
    return worker


async def statuses(queue: Queue, ids: list[ULID]) -> list[JobStatus]:
    found = []
    for job_id in ids:
        job = await queue.job(job_id)
        assert job is not None
        found.append(job.status)
    return found


async def test_links_run_in_order_one_after_another(queue: Queue) -> None:
    ids = await queue.chain(Step("a"), Step("b"), Step("c"))
    assert await statuses(queue, ids) == [JobStatus.PENDING, JobStatus.WAITING, JobStatus.WAITING]
    log: list[str] = []
    async with running(step_worker(queue.store, log, set())):
        await until_status(queue, ids[2], JobStatus.COMPLETED)
    assert log == ["a", "b", "c"]  # with 8 free slots: only the order holds them back
    journals = [await queue.job_journal(i) for i in ids]
    finished = [j[-1].at for j in journals]
    assert finished == sorted(finished)
    for before, after in itertools.pairwise(ids):
        done = (await queue.job(before)).finished_at  # type: ignore[union-attr]
        started = (await queue.job(after)).claimed_at  # type: ignore[union-attr]
        assert done is not None and started is not None and done <= started


async def test_a_failed_link_holds_the_rest_until_it_is_retried(queue: Queue) -> None:
    ids = await queue.chain(Step("a"), Step("b"), Step("c"))
    log: list[str] = []
    fail = {"b"}
    async with running(step_worker(queue.store, log, fail)):
        await until_status(queue, ids[1], JobStatus.DEAD)
    assert await statuses(queue, ids) == [JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.WAITING]
    fail.clear()
    # Retry the failed link (what the failed-jobs retry does: back to pending).
    await queue.store._pool_or_raise().execute(
        f"UPDATE {queue.store.prefix}_jobs SET status = 'pending', run_at = now(), "
        "finished_at = NULL WHERE id = $1",
        ids[1].to_uuid(),
    )
    async with running(step_worker(queue.store, log, fail)):
        await until_status(queue, ids[2], JobStatus.COMPLETED)
    assert log == ["a", "b", "b", "c"]


async def test_the_next_link_is_released_by_the_completing_transaction(queue: Queue) -> None:
    first, second = await queue.chain(Step("a"), Step("b"))
    pool = queue.store._pool_or_raise()
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            f"UPDATE {queue.store.prefix}_jobs SET status = 'completed', finished_at = now() "
            "WHERE id = $1",
            first.to_uuid(),
        )
        assert (await queue.job(second)).status is JobStatus.WAITING  # type: ignore[union-attr]
        await tx.commit()
    assert (await queue.job(second)).status is JobStatus.PENDING  # type: ignore[union-attr]


async def test_a_chain_in_a_rolled_back_transaction_leaves_nothing(
    queue: Queue, pg_dsn: str
) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await queue.chain(Step("a"), Step("b"), conn=conn)
        await tx.rollback()
    finally:
        await conn.close()
    assert await queue.jobs() == []


async def test_a_link_with_a_dedup_key_is_refused(queue: Queue) -> None:
    with pytest.raises(ValueError, match="Merging has a dedup key or a unique id"):
        await queue.chain(Step("a"), Merging())
    with pytest.raises(ValueError, match="at least one task"):
        await queue.chain()
    assert await queue.jobs() == []


@pytest.fixture
def venturi_worker() -> WorkerFactory:
    def build(store: PostgresStore) -> Worker[None]:
        return step_worker(store, RAN, set())

    return build


RAN: list[str] = []


async def test_run_jobs_runs_a_whole_chain(venturi_queue: Queue, venturi_jobs: Jobs) -> None:
    """With venturi's pytest plugin, as a user's test would: each link released by the one
    before is due, so `run_jobs` runs them all, in order."""
    RAN.clear()
    ids = await venturi_queue.chain(Step("a"), Step("b"), Step("c"))
    await venturi_jobs.assert_enqueued(Step, where=lambda t: t.name == "a", count=1)
    assert await venturi_jobs.run_jobs() == 3
    assert RAN == ["a", "b", "c"]
    assert await statuses(venturi_queue, ids) == [JobStatus.COMPLETED] * 3
