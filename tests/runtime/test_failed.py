"""Failed jobs: what failed for good is listed, retried (a fresh failure count, its journal
kept), forgotten and flushed, from code and from the command line."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from ulid import ULID

from venturi import (
    Context,
    FailedJob,
    JobStateError,
    JobStatus,
    JournalOutcome,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)

from .helpers import running, until_status
from .test_cli import venturi


@dataclass
class Charge(Task):
    KIND = "charge"
    order: int
    card: str


@dataclass
class Ship(Task):
    KIND = "ship"
    order: int


async def refuse(task: Charge | Ship, ctx: Context[None], app: None) -> None:
    raise TaskError.permanent(f"bad card for order {task.order}")


async def fail(store: PostgresStore, *tasks: Charge | Ship, queue: str = "default") -> list[ULID]:
    """Enqueue `tasks` into `queue` and run them once: each fails for good."""
    q = Queue(store, queue=queue)
    ids = [await q.enqueue(t) for t in tasks]
    worker = Worker(None, store, queue=queue)
    worker.register(Charge, refuse)
    worker.register(Ship, refuse)
    await worker.run(once=True)
    for job_id in ids:
        job = await q.job(job_id)
        assert job is not None and job.status is JobStatus.DEAD
    return ids


async def test_failed_lists_what_failed_for_good_newest_first(
    store: PostgresStore, queue: Queue
) -> None:
    a, b = await fail(store, Charge(1, "x"), Charge(2, "y"))
    (c,) = await fail(store, Ship(3), queue="shipping")
    await queue.enqueue(Charge(4, "fine"))  # pending: not failed

    listed = await queue.failed()
    assert [f.id for f in listed] == [c, b, a]
    first = listed[-1]
    assert isinstance(first, FailedJob)
    assert (first.queue, first.kind, first.payload) == (
        "default",
        "charge",
        {"order": 1, "card": "x"},
    )
    assert first.error == "bad card for order 1"
    job = await queue.job(a)
    assert job is not None and first.failed_at == job.finished_at
    assert (first.run_count, first.failures) == (1, 1)

    assert [f.id for f in await queue.failed(queue="shipping")] == [c]
    assert [f.id for f in await queue.failed(kind="charge")] == [b, a]
    assert [f.id for f in await queue.failed(kind=Ship)] == [c]
    assert [f.id for f in await queue.failed(limit=2)] == [c, b]
    assert [f.id for f in await queue.failed(limit=2, before_id=b)] == [a]
    assert await queue.failed(before_id=a) == []


async def test_retry_puts_a_failed_job_back_with_a_fresh_count_and_its_journal(
    store: PostgresStore, queue: Queue
) -> None:
    (job_id,) = await fail(store, Charge(1, "x"))
    await queue.retry(job_id)

    job = await queue.job(job_id)
    assert job is not None
    assert (job.status, job.failures, job.finished_at) == (JobStatus.PENDING, 0, None)
    assert await queue.failed() == []
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [JournalOutcome.DEAD, JournalOutcome.RETRIED]
    assert journal[1].note == "retried by hand" and journal[1].run == 1

    ran = asyncio.Event()

    async def succeed(task: Charge, ctx: Context[None], app: None) -> None:
        assert [e.outcome for e in ctx.history] == ["dead", "retried"]
        ran.set()

    worker = Worker(None, store, poll_max=30.0)
    worker.register(Charge, succeed)
    async with running(worker):
        await asyncio.wait_for(ran.wait(), timeout=20)
        await until_status(queue, job_id, JobStatus.COMPLETED)
    job = await queue.job(job_id)
    assert job is not None and (job.run_count, job.failures) == (2, 0)


async def test_retry_wakes_an_idle_worker(store: PostgresStore, queue: Queue) -> None:
    (job_id,) = await fail(store, Charge(1, "x"))
    ran = asyncio.Event()

    async def succeed(task: Charge, ctx: Context[None], app: None) -> None:
        ran.set()

    # Idle (its poll is 30 s, longer than the wait below) when the retry comes: woken by it.
    worker = Worker(None, store, poll_max=30.0)
    worker.register(Charge, succeed)
    async with running(worker):
        await queue.retry(job_id)
        await asyncio.wait_for(ran.wait(), timeout=20)


async def test_retrying_or_forgetting_a_job_that_has_not_failed_is_an_error(
    queue: Queue,
) -> None:
    job_id = await queue.enqueue(Charge(1, "x"))
    with pytest.raises(JobStateError, match=rf"job {job_id} is pending, not failed") as info:
        await queue.retry(job_id)
    assert info.value.status == "pending"
    with pytest.raises(JobStateError, match="is pending, not failed: only failed"):
        await queue.forget(job_id)
    missing = ULID()
    with pytest.raises(JobStateError, match=rf"no job {missing}") as info:
        await queue.retry(missing)
    assert info.value.status is None
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.PENDING
    assert await queue.job_journal(job_id) == []


async def test_retry_all_by_kind_and_queue(store: PostgresStore, queue: Queue) -> None:
    a, b = await fail(store, Charge(1, "x"), Ship(2))
    (c,) = await fail(store, Charge(3, "z"), queue="other")

    with pytest.raises(ValueError, match="queue: invalid queue name 'no such queue'"):
        await queue.retry_all(queue="no such queue")
    with pytest.raises(ValueError, match="kind: invalid KIND"):
        await queue.retry_all(kind="")
    with pytest.raises(ValueError, match=r"retry_all\(queue='defualt'\): unknown queue"):
        await queue.retry_all(queue="defualt")  # a typo: nothing names that queue
    assert len(await queue.failed()) == 3  # nothing changed
    assert await queue.retry_all(queue="default", kind="ship_nothing") == 0  # known: no error

    assert await queue.retry_all(kind="charge", queue="default") == 1
    assert {f.id for f in await queue.failed()} == {b, c}
    assert await queue.retry_all(queue="other") == 1
    assert [f.id for f in await queue.failed()] == [b]
    assert await queue.retry_all() == 1
    assert await queue.failed() == []
    for job_id in (a, b, c):
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING and job.failures == 0


async def test_retry_all_works_through_batches(store: PostgresStore, queue: Queue) -> None:
    ids = await fail(store, *(Charge(i, "x") for i in range(7)))
    assert await store.retry_all_failed(queue=None, kind=None, note="n", batch_size=3) == 7
    for job_id in ids:
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING


async def test_forget_and_flush(store: PostgresStore, queue: Queue) -> None:
    a, b, _ = await fail(store, Charge(1, "x"), Charge(2, "y"), Ship(3))
    (d,) = await fail(store, Ship(4), queue="other")
    await queue.forget(a)
    assert await queue.job(a) is None and await queue.job_journal(a) == []
    with pytest.raises(JobStateError, match=rf"no job {a}"):
        await queue.forget(a)

    with pytest.raises(ValueError, match="timezone-aware"):
        await queue.flush(before=datetime.now())
    assert await queue.flush(before=datetime.now(UTC) - timedelta(hours=1)) == 0
    assert await queue.flush(kind=Ship, queue="default") == 1
    assert {f.id for f in await queue.failed()} == {b, d}
    assert await queue.flush() == 2
    assert await queue.failed() == []
    assert await queue.job_journal(b) == []


async def test_flush_works_through_batches(store: PostgresStore, queue: Queue) -> None:
    await fail(store, *(Charge(i, "x") for i in range(5)))
    keep = await queue.enqueue(Charge(9, "pending"))
    assert await store.flush_failed(queue=None, kind=None, before=None, batch_size=2) == 5
    assert await queue.failed() == []
    assert await queue.job(keep) is not None


async def test_pending_counts_waiting_and_running_jobs(store: PostgresStore, queue: Queue) -> None:
    assert await queue.pending() == 0
    await fail(store, Charge(0, "x"))
    await queue.enqueue(Charge(1, "x"))
    await queue.enqueue_in(Charge(2, "x"), timedelta(hours=1))
    await Queue(store, queue="other").enqueue(Ship(3))
    assert await queue.pending() == 3

    started = asyncio.Event()
    release = asyncio.Event()

    async def hold(task: Ship, ctx: Context[None], app: None) -> None:
        started.set()
        await release.wait()

    worker = Worker(None, store, queue="other")
    worker.register(Ship, hold)
    async with running(worker):
        await asyncio.wait_for(started.wait(), timeout=20)
        assert await queue.pending() == 3  # the running one still counts
        release.set()
    assert await queue.pending() == 2


async def test_failed_commands(store: PostgresStore, queue: Queue, pg_dsn: str) -> None:
    prefix = store.prefix
    a, b, c = await fail(store, Charge(1, "x"), Charge(2, "y"), Ship(3))

    def cli(*args: str) -> str:
        run = venturi("failed", *args, dsn=pg_dsn, prefix=prefix)
        assert run.returncode == 0, run.stderr
        return run.stdout

    listed = json.loads(cli("list", "--json"))
    assert [f["id"] for f in listed] == [str(c), str(b), str(a)]
    assert listed[2]["error"] == "bad card for order 1"
    assert listed[2]["payload"] == {"order": 1, "card": "x"}
    text = cli("list", "--kind", "charge").splitlines()
    assert text[0].split() == ["ID", "QUEUE", "KIND", "FAILED", "AT", "RUNS", "ERROR"]
    assert [line.split()[0] for line in text[1:]] == [str(b), str(a)]
    assert [f["id"] for f in json.loads(cli("list", "--json", "--before", str(b)))] == [str(a)]

    assert cli("retry", str(a)).strip() == "retried 1 failed job"
    job = await queue.job(a)
    assert job is not None and job.status is JobStatus.PENDING

    # An id given twice is one id: the message does not say it was "not tried".
    bad = venturi("failed", "retry", str(a), str(a).lower(), dsn=pg_dsn, prefix=prefix)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"venturi: failed retry: job {a} is pending, not failed: only failed (dead) jobs can be "
        f"retried (retried before it: none; not tried: none)"
    )
    bad = venturi("failed", "retry-all", "--queue", "a b", dsn=pg_dsn, prefix=prefix)
    assert bad.returncode == 2 and "invalid queue name 'a b'" in bad.stderr
    assert len(await queue.failed()) == 2  # nothing changed

    assert json.loads(cli("retry-all", "--kind", "ship", "--json")) == {"retried": 1}
    assert cli("forget", str(b)).strip() == "forgotten 1 failed job"
    assert await queue.job(b) is None
    await fail(store, Ship(4))  # the worker fails the two retried ones again too
    assert cli("flush", "--older-than", "1h").strip() == "deleted 0 failed jobs"
    assert cli("flush").strip() == "deleted 3 failed jobs"
    assert cli("list").strip() == "no failed jobs"


async def test_failed_retry_of_several_says_what_it_changed_before_a_refusal(
    store: PostgresStore, queue: Queue, pg_dsn: str
) -> None:
    a, c = await fail(store, Ship(11), Ship(13))
    b = await queue.enqueue(Ship(12))  # pending: not failed
    run = venturi("failed", "retry", str(a), str(b), str(c), dsn=pg_dsn, prefix=store.prefix)
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"venturi: failed retry: job {b} is pending, not failed: only failed (dead) jobs can be "
        f"retried (retried before it: {a}; not tried: {c})"
    )
    statuses = [(await queue.job(i)) for i in (a, b, c)]
    assert [j.status if j else None for j in statuses] == [
        JobStatus.PENDING,
        JobStatus.PENDING,
        JobStatus.DEAD,
    ]


async def test_retry_and_retry_all_journal_the_note_given_and_retry_all_stops_at_limit(
    store: PostgresStore,
) -> None:
    queue = Queue(store)
    ids = await fail(store, *(Ship(order=i) for i in range(4)))
    await queue.retry(ids[0], note="retried by ada after the fix")
    journal = await queue.job_journal(ids[0])
    assert (journal[-1].outcome, journal[-1].note) == (
        JournalOutcome.RETRIED,
        "retried by ada after the fix",
    )
    assert await queue.retry_all(note="bulk retry by ada", limit=2) == 2
    assert (await queue.stats()).dead == 1
    assert await queue.retry_all(note="the rest") == 1
    notes = [(await queue.job_journal(i))[-1].note or "" for i in ids[1:]]
    assert sorted(notes) == ["bulk retry by ada", "bulk retry by ada", "the rest"]
    for bad in ("", "  ", "x" * 1001):
        with pytest.raises(ValueError, match="note="):
            await queue.retry(ids[0], note=bad)
    with pytest.raises(TypeError, match=r"retry\(note=\): expected a str, got 123"):
        await queue.retry_all(note=123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit="):
        await queue.retry_all(limit=0)


async def test_flush_of_a_queue_nothing_names_is_refused_as_a_typo(
    store: PostgresStore, queue: Queue
) -> None:
    """As `retry_all`: a flush deletes, and a typo in its queue said "deleted 0"."""
    (a,) = await fail(store, Charge(1, "x"))
    with pytest.raises(ValueError, match=r"flush\(queue='defualt'\): unknown queue"):
        await queue.flush(queue="defualt")
    assert [f.id for f in await queue.failed()] == [a]  # nothing changed
    assert await queue.flush(queue="default", kind="ship") == 0  # known: no error
    assert await queue.flush(queue="default") == 1
