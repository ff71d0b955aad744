"""Stored results and progress: `Outcome.completed(result=...)`, `Queue.result` (woken by the
settle's notification), `ctx.progress` (written with lease renewals and at settle)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from ulid import ULID

from venturi import (
    Backoff,
    Context,
    JobFailed,
    JobStatus,
    Outcome,
    PostgresStore,
    Queue,
    ResultTooLarge,
    Task,
    TaskError,
    Worker,
)
from venturi.outcome import RESULT_MAX_BYTES

from .helpers import running, until, until_status


@dataclass
class Compute(Task):
    KIND = "results.compute"
    n: int
    mode: str = "ok"


async def compute(task: Compute, ctx: Context[None], app: Any) -> Outcome | None:
    if task.mode == "none":
        return None
    if task.mode == "permanent":
        raise TaskError.permanent(f"cannot compute {task.n}")
    if task.mode == "huge":
        return Outcome.completed(result="x" * RESULT_MAX_BYTES)
    if task.mode == "unencodable":
        return Outcome.completed(result={"when": object()})
    return Outcome.completed(result={"square": task.n * task.n, "of": [task.n]})


def worker_for(store: PostgresStore, **kwargs: Any) -> Worker[None]:
    worker: Worker[None] = Worker(None, store, concurrency=2, backstop=1, **kwargs)
    worker.register(Compute, compute)
    return worker


async def awaited(store: PostgresStore, job_id: ULID) -> bool:
    row = await store._pool_or_raise().fetchval(
        f"SELECT awaited FROM {store.prefix}_jobs WHERE id = $1", job_id.to_uuid()
    )
    return bool(row)


async def test_a_result_is_stored_with_the_job_and_awaited_without_polling(
    store: PostgresStore, queue: Queue
) -> None:
    job_id = await queue.enqueue(Compute(7))
    waiting = asyncio.create_task(queue.result(job_id, timeout=60))
    # The waiter is parked on its notification before any worker runs the job: only the
    # settle's NOTIFY can wake it.
    await until(lambda: awaited(store, job_id))
    assert not waiting.done()
    async with running(worker_for(store)):
        assert await waiting == {"square": 49, "of": [7]}
    job = await queue.job(job_id)
    assert job is not None and job.result == {"square": 49, "of": [7]}
    # Finished already: answered at once, from the row.
    assert await queue.result(job_id, timeout=1) == {"square": 49, "of": [7]}


async def test_no_result_is_none(store: PostgresStore, queue: Queue) -> None:
    job_id = await queue.enqueue(Compute(1, "none"))
    async with running(worker_for(store)):
        assert await queue.result(job_id, timeout=60) is None


async def test_waiting_times_out(queue: Queue) -> None:
    job_id = await queue.enqueue(Compute(1))  # no worker runs it
    with pytest.raises(
        TimeoutError, match=rf"result\({job_id}\): the job did not finish within 0.2s"
    ):
        await queue.result(job_id, timeout=0.2)
    with pytest.raises(LookupError, match="no such job"):
        await queue.result(ULID(), timeout=1)


async def test_a_job_that_fails_for_good_raises_naming_it(
    store: PostgresStore, queue: Queue
) -> None:
    job_id = await queue.enqueue(Compute(3, "permanent"))
    waiting = asyncio.create_task(queue.result(job_id, timeout=60))
    await until(lambda: awaited(store, job_id))
    async with running(worker_for(store)):
        with pytest.raises(JobFailed, match=f"job {job_id} \\(results.compute\\) failed") as err:
            await waiting
    assert err.value.job_id == str(job_id)
    assert err.value.error == "cannot compute 3"


async def test_a_result_that_cannot_be_stored_fails_the_run_clearly(
    store: PostgresStore, queue: Queue
) -> None:
    huge = await queue.enqueue(Compute(1, "huge"))
    odd = await queue.enqueue(Compute(2, "unencodable"))
    async with running(worker_for(store)):
        with pytest.raises(JobFailed, match=f"over the {RESULT_MAX_BYTES}-byte cap"):
            await queue.result(huge, timeout=60)
        with pytest.raises(JobFailed, match="not JSON-serializable"):
            await queue.result(odd, timeout=60)
    with pytest.raises(ResultTooLarge):
        Outcome.completed(result=[0] * RESULT_MAX_BYTES)
    with pytest.raises(ValueError, match="only a completed outcome has a result"):
        Outcome("paused", None, 1.0, "1")


@dataclass
class Crawl(Task):
    KIND = "results.crawl"
    pages: int


async def test_progress_is_written_with_lease_renewals_and_at_settle(
    store: PostgresStore, queue: Queue
) -> None:
    proceed = asyncio.Event()

    async def crawl(task: Crawl, ctx: Context[None], app: Any) -> Outcome:
        ctx.progress({"done": 1, "of": task.pages})
        await proceed.wait()
        ctx.progress({"done": task.pages, "of": task.pages})
        return Outcome.completed()

    worker: Worker[None] = Worker(None, store, concurrency=1, lease=1.5)  # renewed every 0.5 s
    worker.register(Crawl, crawl)
    job_id = await queue.enqueue(Crawl(3))
    async with running(worker):

        async def progressed() -> bool:
            job = await queue.job(job_id)
            return job is not None and job.progress == {"done": 1, "of": 3}

        await until(progressed)  # while the run goes on: sent with a renewal
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.CLAIMED
        proceed.set()
        await until_status(queue, job_id, JobStatus.COMPLETED)
    job = await queue.job(job_id)
    assert job is not None and job.progress == {"done": 3, "of": 3}  # the last, at settle


def test_progress_values_are_checked_where_they_are_made() -> None:
    from venturi.context import PROGRESS_MAX_BYTES, Cancellation

    ctx: Context[None] = Context(
        job_id=ULID(),
        kind="k",
        queue="q",
        run_count=1,
        history=(),
        carry=None,
        cancellation=Cancellation(),
    )
    with pytest.raises(ResultTooLarge, match=r"ctx\.progress"):
        ctx.progress("x" * PROGRESS_MAX_BYTES)
    with pytest.raises(ValueError, match="NaN"):
        ctx.progress(float("nan"))
    ctx.progress(0.5)
    assert ctx.progress_json == "0.5"


async def test_a_job_that_dies_in_lease_recovery_wakes_its_waiter(
    store: PostgresStore, queue: Queue
) -> None:
    job_id = await queue.enqueue(Compute(5))
    # Claimed by a "worker" that then vanishes: nothing renews the lease.
    (_claimed,) = await store.claim(
        queues=["default"],
        kinds=[Compute.KIND],
        limit=1,
        worker="gone",
        pod=None,
        default_lease_s=0.5,
    )
    waiting = asyncio.create_task(queue.result(job_id, timeout=60))
    await until(lambda: awaited(store, job_id))
    async with running(worker_for(store)):  # backstop=1: its rescuer kills the stale job
        with pytest.raises(JobFailed, match=f"job {job_id} \\(results.compute\\) failed"):
            await waiting
    journal = await store.journal(job_id)
    assert [e.outcome for e in journal] == ["stale_recovered"]


@dataclass
class Secret(Task):
    KIND = "results.secret"
    ENCRYPTED = True
    mode: str


async def test_an_encrypted_task_stores_no_plaintext_result_or_progress(
    store: PostgresStore,
) -> None:
    from venturi.encryption import KeyRing, SealedCodec, new_key

    codec = SealedCodec(KeyRing({"k1": new_key()}))
    queue = Queue(store, codec=codec)

    async def secret(task: Secret, ctx: Context[None], app: Any) -> Outcome:
        if task.mode == "progress":
            ctx.progress({"card": "4242"})
        return Outcome.completed(result={"card": "4242"})

    worker: Worker[None] = Worker(None, store, concurrency=1, backstop=1, codec=codec)
    worker.register(Secret, secret)
    with_result = await queue.enqueue(Secret("result"))
    with_progress = await queue.enqueue(Secret("progress"))
    async with running(worker):
        with pytest.raises(JobFailed, match="encrypted task: its results are not stored"):
            await queue.result(with_result, timeout=60)
        with pytest.raises(JobFailed, match="encrypted task; progress is not stored"):
            await queue.result(with_progress, timeout=60)
    stored = await store._pool_or_raise().fetch(f"SELECT result, progress FROM {store.prefix}_jobs")
    assert [(r["result"], r["progress"]) for r in stored] == [(None, None), (None, None)]


async def test_an_encrypted_task_returning_a_result_is_not_run_again(store: PostgresStore) -> None:
    """Its work is done when the result is refused: a retry would do it again (a card charged
    twice), so the run fails for good even where the worker would retry a failure."""
    from venturi.encryption import KeyRing, SealedCodec, new_key

    codec = SealedCodec(KeyRing({"k1": new_key()}))
    queue = Queue(store, codec=codec)
    charged: list[str] = []

    async def charge(task: Secret, ctx: Context[None], app: Any) -> Outcome:
        charged.append(task.mode)
        return Outcome.completed(result={"charged": True})

    worker: Worker[None] = Worker(
        None, store, concurrency=1, backoff=Backoff(0.01, 0.01), codec=codec
    )
    worker.register(Secret, charge)
    job_id = await queue.enqueue(Secret("card"))
    async with running(worker):
        with pytest.raises(JobFailed, match=r"its results are not stored \(the run is not retried"):
            await queue.result(job_id, timeout=60)
    assert charged == ["card"]
    job = await queue.job(job_id)
    assert job is not None and job.run_count == 1 and job.status is JobStatus.DEAD
