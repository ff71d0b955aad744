"""Bad input gets a clear error that names what is wrong, and loses nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

import pytest

from venturi import (
    AttachmentTooLarge,
    Context,
    DuplicateKindError,
    JobStatus,
    Outcome,
    PayloadError,
    PostgresStore,
    Priority,
    Queue,
    Task,
    Worker,
)
from venturi.context import ATTACHMENT_MAX_BYTES

from .helpers import running, until_status


@dataclass
class Order(Task):
    KIND = "order"
    order_id: int


@pytest.mark.parametrize(
    "bad", ["", "Venturi", "1abc", "a-b", "a b", "x" * 40, "jobs;drop table x", None]
)
async def test_invalid_prefix_is_rejected_before_any_sql(bad: object) -> None:
    # An unreachable DSN: if any connection were attempted, the error would differ.
    with pytest.raises(ValueError, match="invalid table prefix"):
        await PostgresStore.connect("postgresql://nobody@127.0.0.1:1/none", prefix=bad)  # type: ignore[arg-type]


async def test_longest_valid_prefix_works(pg_dsn: str) -> None:
    prefix = "p" + "x" * 38
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        assert await store.migrate() == [1, 2]
        assert await store.migrate() == []


async def test_concurrent_migrations_apply_once(pg_dsn: str, prefix: str) -> None:
    stores = [await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=1) for _ in range(8)]
    try:
        results = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert sorted(results) == [[]] * 7 + [[1, 2]]


async def test_unencodable_payload_names_the_field(queue: Queue) -> None:
    @dataclass
    class Bad(Task):
        KIND = "bad"
        fine: int
        handle_: object

    with pytest.raises(PayloadError, match=r"field 'handle_' \(object\)"):
        await queue.enqueue(Bad(fine=1, handle_=object()))
    with pytest.raises(PayloadError, match="handle_"):
        await queue.enqueue_many([Order(order_id=1), Bad(fine=1, handle_=object())])
    assert (await queue.stats()).pending == 0  # nothing stored, not even the good one


async def test_task_must_be_a_dataclass_with_a_kind(queue: Queue) -> None:
    class NotData(Task):
        KIND = "not_data"

    @dataclass
    class NoKind(Task):
        x: int = 0

    @dataclass
    class BadKind(Task):
        KIND = "has space"

    with pytest.raises(TypeError, match="must be a dataclass"):
        await queue.enqueue(NotData())
    with pytest.raises(TypeError, match="must define KIND"):
        await queue.enqueue(NoKind())
    with pytest.raises(TypeError, match="must be a dataclass"):
        await queue.enqueue_many([Order(order_id=1), NotData()])
    with pytest.raises(TypeError, match="must define KIND"):
        await queue.enqueue_many([NoKind()])
    assert (await queue.stats()).pending == 0  # a bad task in a batch stores nothing
    with pytest.raises(ValueError, match="KIND 'has space' is invalid"):
        Worker(None, queue.store).register(BadKind, lambda t, c, a: None)  # type: ignore[arg-type,return-value]


async def test_duplicate_kind_fails_at_registration(store: PostgresStore) -> None:
    @dataclass
    class Other(Task):
        KIND = "order"

    async def handle(task: Task, ctx: Context[None], app: None) -> None:
        return None

    worker = Worker(None, store)
    worker.register(Order, handle)
    with pytest.raises(DuplicateKindError, match=r"'order' is already registered by .*Order"):
        worker.register(Other, handle)


async def test_naive_datetime_is_rejected(queue: Queue) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await queue.enqueue_at(Order(order_id=1), datetime(2030, 1, 1))


@dataclass
class Urgent(Task):
    KIND = "urgent"

    def priority(self) -> Priority:
        return 7  # type: ignore[return-value]  # what a typo in user code looks like


async def test_invalid_priority_is_rejected_and_nothing_is_stored(queue: Queue) -> None:
    with pytest.raises(ValueError, match="7 is not a valid Priority"):
        await queue.enqueue(Order(order_id=1), priority=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="7 is not a valid Priority"):
        await queue.enqueue_many([Order(order_id=2), Order(order_id=3)], priority=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="7 is not a valid Priority"):
        await queue.enqueue(Urgent())
    assert (await queue.stats()).pending == 0


async def test_undecodable_payload_goes_dead_with_the_reason(queue: Queue) -> None:
    # A producer on an older release enqueued a string where the worker expects an int.
    @dataclass
    class OldOrder(Task):
        KIND = "order"
        order_id: str

    ran: list[int] = []

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.order_id)
        return Outcome.completed()

    bad = await queue.enqueue(OldOrder(order_id="abc"))
    good = await queue.enqueue(Order(order_id=2))
    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    async with running(worker):
        await until_status(queue, bad, JobStatus.DEAD)
        await until_status(queue, good, JobStatus.COMPLETED)
    [entry] = await queue.job_journal(bad)
    assert entry.note is not None and "undecodable payload" in entry.note
    assert "$.order_id" in entry.note
    assert ran == [2]
    job = await queue.job(bad)
    assert job is not None and job.payload == {"order_id": "abc"}  # kept for inspection


async def test_unknown_kind_is_left_pending_for_a_worker_that_knows_it(queue: Queue) -> None:
    """A worker claims only kinds it registered: a job for a kind no running worker knows
    (say, enqueued by a newer producer during a rolling deploy) waits, and is not lost."""

    @dataclass
    class NewKind(Task):
        KIND = "new_kind"

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    unknown = await queue.enqueue(NewKind())
    known = await queue.enqueue(Order(order_id=1))
    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    async with running(worker):
        await until_status(queue, known, JobStatus.COMPLETED)
    job = await queue.job(unknown)
    assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0
    assert (await queue.stats()).pending_by_kind == {"new_kind": 1}


async def test_attachment_cap(queue: Queue) -> None:
    errors: list[str] = []

    async def handle(task: Order, ctx: Context[None], app: None) -> Outcome:
        try:
            ctx.attach("x" * ATTACHMENT_MAX_BYTES)
        except AttachmentTooLarge as exc:
            errors.append(str(exc))
        ctx.attach({"ok": True})
        return Outcome.completed()

    worker = Worker(None, queue.store)
    worker.register(Order, handle)
    job_id = await queue.enqueue(Order(order_id=1))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert len(errors) == 1 and "over the 65536-byte cap" in errors[0]
    [entry] = await queue.job_journal(job_id)
    assert entry.attachment == {"ok": True}


async def test_worker_settings_are_validated(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Worker(None, store, concurrency=0)
    with pytest.raises(ValueError, match="backstop"):
        Worker(None, store, backstop=0)
    with pytest.raises(ValueError, match="lease"):
        Worker(None, store, lease=0)
    with pytest.raises(ValueError, match="no task registered"):
        await Worker(None, store).run(asyncio.Event())


async def test_closed_store_says_so(pg_dsn: str, prefix: str) -> None:
    from venturi import StoreClosedError

    store = await PostgresStore.connect(pg_dsn, prefix=prefix)
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreClosedError, match="closed"):
        await store.stats()
