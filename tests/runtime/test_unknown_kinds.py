"""Jobs of a kind a worker has no task for, against the real database: by default they
stay pending (a rolling deploy may not have reached every worker yet) and are visible as
unserved; with `unknown_kinds="fail"` the worker claims every kind of its queues and fails
those at once, for good, with "no task registered for kind X" (caps, queues and the run
modes still hold), also from `venturi worker --unknown-kinds fail`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import pytest

from venturi import (
    Context,
    Hooks,
    JobStatus,
    JournalOutcome,
    Outcome,
    PostgresStore,
    Queue,
    Task,
    Worker,
)
from venturi.hooks import Dead

from .cli_app import Echo
from .helpers import Claims, running, until, until_status
from .test_cli import venturi


@dataclass
class Known(Task):
    KIND = "unknown.known"
    n: int = 0


@dataclass
class Stranger(Task):
    """No worker here registers it."""

    KIND = "unknown.stranger"
    n: int = 0


@dataclass
class Slow(Task):
    KIND = "unknown.slow"
    n: int = 0


async def done(task: Task, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


class DeadHook(Hooks):
    def __init__(self) -> None:
        self.dead_events: list[Dead] = []

    def dead(self, event: Dead) -> None:
        self.dead_events.append(event)


async def test_by_default_an_unknown_kind_stays_pending_and_is_unserved(queue: Queue) -> None:
    stranger = await queue.enqueue(Stranger())
    known = await queue.enqueue(Known())
    worker = Worker(None, queue.store)
    worker.register(Known, done)
    async with running(worker):
        await until_status(queue, known, JobStatus.COMPLETED)
        assert await queue.unserved_kinds() == {"default": ["unknown.stranger"]}
        [info] = await queue.workers()
        assert info.unknown_kinds == "wait"
    job = await queue.job(stranger)
    assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0
    assert await queue.job_journal(stranger) == []


async def test_a_worker_that_fails_unknown_kinds_fails_them_for_good_at_once(
    queue: Queue,
) -> None:
    hook = DeadHook()
    stranger = await queue.enqueue(Stranger())
    known = await queue.enqueue(Known())
    elsewhere = await Queue(queue.store, queue="elsewhere").enqueue(Stranger())
    worker = Worker(None, queue.store, unknown_kinds="fail", hooks=[hook])
    worker.register(Known, done)
    async with running(worker):
        await until_status(queue, stranger, JobStatus.DEAD)
        await until_status(queue, known, JobStatus.COMPLETED)
        [info] = await queue.workers()
        assert info.unknown_kinds == "fail"
        # It serves every kind of its queue; the other queue's job waits for its own workers.
        assert await queue.unserved_kinds() == {"elsewhere": ["unknown.stranger"]}
    job = await queue.job(stranger)
    assert job is not None
    assert job.last_error == "no task registered for kind 'unknown.stranger'"
    assert (job.run_count, job.failures) == (1, 1)
    [entry] = await queue.job_journal(stranger)
    assert entry.outcome is JournalOutcome.DEAD and entry.note == job.last_error
    assert [e.id for e in hook.dead_events] == [stranger]
    other = await queue.job(elsewhere)
    assert other is not None and other.status is JobStatus.PENDING


async def test_failing_unknown_kinds_keeps_the_caps_of_known_ones(queue: Queue) -> None:
    release = asyncio.Event()
    running_now = 0
    most = 0

    async def slow(task: Slow, ctx: Context[None], app: None) -> Outcome:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await release.wait()
        running_now -= 1
        return Outcome.completed()

    slow_ids = [await queue.enqueue(Slow(i)) for i in range(3)]
    worker = Worker(None, queue.store, concurrency=4, unknown_kinds="fail")
    worker.register(Slow, slow, cap=1)
    async with running(worker):

        async def one_running() -> bool:
            return running_now == 1

        await until(one_running)
        stranger = await queue.enqueue(Stranger())
        await until_status(queue, stranger, JobStatus.DEAD)
        # The claim of "every kind" skipped the capped kind: two of its jobs still wait.
        states = [(await queue.job(i)).status for i in slow_ids]  # type: ignore[union-attr]
        assert sorted(states) == [JobStatus.CLAIMED, JobStatus.PENDING, JobStatus.PENDING]
        release.set()
        for i in slow_ids:
            await until_status(queue, i, JobStatus.COMPLETED)
    assert most == 1


async def test_a_capped_kind_at_its_cap_sends_no_claims_while_it_stays_there(
    queue: Queue,
) -> None:
    """The jobs of a kind at its cap are due, but not passed over by a held row: the worker
    waits for the freed slot (or a notification), it does not claim again and again."""
    release = asyncio.Event()

    async def slow(task: Slow, ctx: Context[None], app: None) -> Outcome:
        await release.wait()
        return Outcome.completed()

    claims = Claims(queue.store)
    for i in range(3):
        await queue.enqueue(Slow(i))
    worker = Worker(None, queue.store, concurrency=4, unknown_kinds="fail")
    worker.register(Slow, slow, cap=1)
    async with running(worker):
        # The first round: one claim for the capped kind (one Slow), one for every other
        # kind (none).
        while len(claims.results) < 2:
            await claims.another()
        assert sorted(len(found) for found in claims.results) == [0, 1]
        assert await claims.made_within(0.8) == 0  # the capped jobs are not taken for held ones
        release.set()


async def test_stop_when_empty_waits_for_a_scheduled_job_of_an_unknown_kind(
    queue: Queue,
) -> None:
    later = await queue.enqueue_in(Stranger(), timedelta(seconds=0.5))
    worker = Worker(None, queue.store, unknown_kinds="fail")
    worker.register(Known, done)
    await asyncio.wait_for(worker.run(stop_when_empty=True), 60)
    job = await queue.job(later)
    assert job is not None and job.status is JobStatus.DEAD


async def test_the_worker_command_fails_unknown_kinds_when_asked(
    store: PostgresStore, queue: Queue, pg_dsn: str
) -> None:
    stranger = await queue.enqueue(Stranger())
    echo = await queue.enqueue(Echo(text="hi"))
    args = ("worker", "tests.runtime.cli_app:make_worker", "--stop-when-empty")
    run = await asyncio.to_thread(
        venturi, *args, "--unknown-kinds", "fail", dsn=pg_dsn, prefix=store.prefix
    )
    assert run.returncode == 0, run.stderr
    assert (await queue.job(echo)).status is JobStatus.COMPLETED  # type: ignore[union-attr]
    job = await queue.job(stranger)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error == "no task registered for kind 'unknown.stranger'"
    bad = await asyncio.to_thread(
        venturi, *args, "--unknown-kinds", "explode", dsn=pg_dsn, prefix=store.prefix
    )
    assert bad.returncode == 2 and "--unknown-kinds: invalid choice: 'explode'" in bad.stderr


def test_unknown_kinds_takes_wait_or_fail(store: PostgresStore) -> None:
    with pytest.raises(ValueError, match="unknown_kinds: expected 'wait' or 'fail', got 'drop'"):
        Worker(None, store, unknown_kinds="drop")  # type: ignore[arg-type]
