"""Which named queue a job goes to, against a real PostgreSQL: the enqueue call's `queue=`,
else the task class's `QUEUE`, else the `Queue`'s own; names are validated before anything
is stored."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from venturi import Context, DedupKey, JobFilter, JobStatus, Outcome, Queue, Task, Worker

from .helpers import running, until_status


@dataclass
class Plain(Task):
    KIND = "nq.plain"
    n: int


@dataclass
class Urgent(Task):
    KIND = "nq.urgent"
    QUEUE = "high"
    n: int


@dataclass
class Reports(Task):
    KIND = "nq.reports"
    QUEUE = "reports"
    n: int


@dataclass
class Keyed(Task):
    KIND = "nq.keyed"
    QUEUE = "high"
    key: str

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.key)


@dataclass
class BadQueue(Task):
    KIND = "nq.bad"
    QUEUE = "no spaces allowed"
    n: int


async def queues_of(queue: Queue) -> dict[int, str]:
    """Job payload `n` -> the queue it was stored in."""
    return {j.payload["n"]: j.queue for j in await queue.jobs(JobFilter(limit=1000))}


async def test_the_call_names_the_queue_over_the_task_and_the_queue(queue: Queue) -> None:
    emails = Queue(queue.store, queue="emails")
    soon = datetime.now(UTC) + timedelta(hours=1)
    await emails.enqueue(Plain(1))  # the Queue's
    await emails.enqueue(Urgent(2))  # the task's QUEUE over the Queue's
    await emails.enqueue(Urgent(3), queue="bulk")  # the call's over both
    await emails.enqueue_at(Urgent(4), soon, queue="bulk")
    await emails.enqueue_in(Plain(5), 60, queue="bulk")
    await emails.enqueue_at(Urgent(6), soon)
    await emails.enqueue_in(Plain(7), 60)
    await emails.enqueue_many([Plain(8), Urgent(9)], queue="bulk")
    assert await queues_of(queue) == {
        1: "emails",
        2: "high",
        3: "bulk",
        4: "bulk",
        5: "bulk",
        6: "high",
        7: "emails",
        8: "bulk",
        9: "bulk",
    }


async def test_a_batch_spans_the_queues_of_its_tasks(queue: Queue) -> None:
    """One enqueue_many of tasks naming different queues stores each in its own, and a
    worker serving those queues runs them all, `high` first."""
    ids = await queue.enqueue_many([Plain(1), Urgent(2), Reports(3), Plain(4), Urgent(5)])
    assert await queues_of(queue) == {
        1: "default",
        2: "high",
        3: "reports",
        4: "default",
        5: "high",
    }
    seen: list[tuple[str, int]] = []

    async def handle(task: Plain | Urgent | Reports, ctx: Context[None], app: None) -> Outcome:
        seen.append((ctx.queue, task.n))
        return Outcome.completed()

    worker = Worker(
        None, queue.store, concurrency=1, queues=["high", "default", "reports"], prefetch=False
    )
    worker.register(Plain, handle)
    worker.register(Urgent, handle)
    worker.register(Reports, handle)
    async with running(worker):
        for job_id in ids:
            await until_status(queue, job_id, JobStatus.COMPLETED)
    assert [q for q, _ in seen] == ["high", "high", "default", "default", "reports"]


async def test_deduplication_happens_in_the_tasks_queue(queue: Queue) -> None:
    first = await queue.enqueue(Keyed("k"))
    assert await queue.enqueue(Keyed("k")) == first  # merged into the pending job of `high`
    other = await queue.enqueue(Keyed("k"), queue="default")  # another queue: not a candidate
    assert other != first
    assert {j.id: j.queue for j in await queue.jobs()} == {first: "high", other: "default"}
    # enqueue_many takes the same path for keyed tasks.
    assert await queue.enqueue_many([Keyed("k"), Plain(1)]) == [first, (await queue.jobs())[0].id]


@pytest.mark.parametrize("bad", ["", "a b", "x" * 201, "-leading", "semi;colon"])
async def test_a_bad_queue_name_in_the_call_is_a_clear_error(queue: Queue, bad: str) -> None:
    for call in (
        queue.enqueue(Plain(1), queue=bad),
        queue.enqueue_in(Plain(1), 5, queue=bad),
        queue.enqueue_at(Plain(1), datetime.now(UTC), queue=bad),
        queue.enqueue_many([Plain(1), Plain(2)], queue=bad),
    ):
        with pytest.raises(ValueError, match=r"enqueue\(queue=\): invalid queue name"):
            await call
    with pytest.raises(TypeError, match=r"enqueue\(queue=\): expected a queue name"):
        await queue.enqueue(Plain(1), queue=7)  # type: ignore[arg-type]
    assert await queue.jobs() == []


async def test_a_bad_task_queue_is_a_clear_error_and_stores_nothing(queue: Queue) -> None:
    with pytest.raises(ValueError, match=r"BadQueue.QUEUE: invalid queue name 'no spaces"):
        await queue.enqueue(BadQueue(1))
    with pytest.raises(ValueError, match=r"BadQueue.QUEUE"):
        await queue.enqueue_many([Plain(1), BadQueue(2)])  # the good one is not stored either
    assert await queue.jobs() == []
    # A call that names a valid queue does not consult the task's.
    await queue.enqueue(BadQueue(3), queue="fine")
    assert await queues_of(queue) == {3: "fine"}
