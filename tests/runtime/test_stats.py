"""stats() reads trigger-kept counts: they must always equal a direct count of the table."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from venturi import (
    CleanupCriteria,
    Context,
    Outcome,
    Queue,
    Task,
    TaskError,
    Worker,
    WorkerIdentity,
)

from .helpers import running, until


@dataclass
class Mixed(Task):
    KIND = "mixed"
    action: str


@dataclass
class Other(Task):
    KIND = "other"


async def direct_counts(queue: Queue) -> dict[tuple[str, str], int]:
    pool = queue.store._pool  # the test reads the table directly to check the counters
    rows = await pool.fetch(
        f"SELECT kind, status, count(*) FROM {queue.store.prefix}_jobs GROUP BY 1, 2"
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def test_counts_match_the_table_through_the_whole_lifecycle(queue: Queue) -> None:
    async def handle(task: Mixed, ctx: Context[None], app: None) -> Outcome:
        if task.action == "dead":
            raise TaskError.permanent("no")
        if task.action == "pause" and ctx.run_count == 1:
            return Outcome.pause_in(0)
        return Outcome.completed()

    await queue.enqueue_many(Mixed(a) for a in ["ok", "dead", "pause"] * 20)
    await queue.enqueue_in(Mixed("ok"), timedelta(hours=1))
    await queue.enqueue(Other())
    stats = await queue.stats()
    assert stats.pending_by_kind == {"mixed": 60, "other": 1}
    assert stats.scheduled_by_kind == {"mixed": 1}
    assert stats.oldest_pending_age_by_kind.keys() == {"mixed", "other"}

    worker = Worker(None, queue.store, concurrency=4)
    worker.register(Mixed, handle)
    async with running(worker):

        async def drained() -> bool:
            s = await queue.stats()
            return s.pending_by_kind.get("mixed", 0) == 0 and s.claimed == 0

        await until(drained)

    stats = await queue.stats()
    counts = await direct_counts(queue)
    assert counts == {
        ("mixed", "completed"): 40,
        ("mixed", "dead"): 20,
        ("mixed", "pending"): 1,
        ("other", "pending"): 1,
    }
    assert stats.pending_by_kind == {"other": 1}
    assert stats.scheduled_by_kind == {"mixed": 1}
    assert stats.dead_by_kind == {"mixed": 20}
    assert stats.completed_by_kind == {"mixed": 40}
    assert (stats.completed, stats.dead) == (40, 20)
    assert stats.claimed_by_kind == {}

    soon = datetime.now(UTC) + timedelta(minutes=1)
    assert await queue.cleanup(CleanupCriteria(finished_before=soon)) == 60
    after = await queue.stats()
    assert (after.dead_by_kind, after.completed_by_kind) == ({}, {})
    assert await direct_counts(queue) == {("mixed", "pending"): 1, ("other", "pending"): 1}


async def test_claimed_by_pod_counts_what_each_pod_holds(queue: Queue) -> None:
    release = asyncio.Event()

    async def hold(task: Other, ctx: Context[None], app: None) -> Outcome:
        await release.wait()
        return Outcome.completed()

    assert await queue.claimed_by_pod() == {}
    await queue.enqueue_many(Other() for _ in range(5))
    workers = [
        Worker(
            None, queue.store, concurrency=c, identity=WorkerIdentity("h", 1, pod), prefetch=False
        )
        for c, pod in ((3, "worker-a"), (2, "worker-b"))
    ]
    outside = Worker(None, queue.store, concurrency=1, identity=WorkerIdentity("h", 2))
    for w in (*workers, outside):
        w.register(Other, hold)
    async with running(workers[0]), running(workers[1]):

        async def claimed() -> bool:
            return (await queue.stats()).claimed == 5

        await until(claimed)
        assert await queue.claimed_by_pod() == {"worker-a": 3, "worker-b": 2}
        release.set()

        async def idle() -> bool:
            return (await queue.stats()).claimed == 0

        await until(idle)
    assert await queue.claimed_by_pod() == {}

    # A worker without a pod name (outside Kubernetes) is nobody's pod.
    release.clear()
    await queue.enqueue(Other())
    async with running(outside):

        async def one_claimed() -> bool:
            return (await queue.stats()).claimed == 1

        await until(one_claimed)
        assert await queue.claimed_by_pod() == {}
        release.set()
