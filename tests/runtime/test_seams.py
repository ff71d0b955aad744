"""The runtime's seams, against a real PostgreSQL: one worker serving several queues in
order, the claim planner as plain functions, lifecycle hooks, middleware, and why a run was
cancelled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from venturi import (
    Backoff,
    CallNext,
    CancelReason,
    Context,
    Hooks,
    JobFilter,
    JobStatus,
    JournalOutcome,
    Outcome,
    Priority,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi._claims import at_cap, claim_groups, claim_room
from venturi.hooks import (
    Claimed,
    Dead,
    Enqueued,
    Finished,
    Recovered,
    Settled,
    Started,
)

from .helpers import running, until, until_status


@dataclass
class Step(Task):
    KIND = "seams.step"
    queue: str
    n: int
    tier: int = 1


async def drain(queue: Queue, worker: Worker[None], seen: list[Any], total: int) -> None:
    async with running(worker):

        async def done() -> bool:
            return len(seen) == total

        await until(done)


# -- several queues, in order ----------------------------------------------------------------


async def test_a_worker_empties_its_queues_in_order(queue: Queue) -> None:
    """Jobs of `default` enqueued first, then `high`'s: the worker takes every `high` job
    before any `default` one, and within a queue, priority tiers still lead."""
    store = queue.store
    await Queue(store, queue="default").enqueue_many(Step("default", i) for i in range(20))
    await Queue(store, queue="high").enqueue_many(Step("high", i) for i in range(15))
    await Queue(store, queue="high").enqueue(Step("high", 99, tier=2), priority=Priority.HIGH)
    await Queue(store, queue="other").enqueue(Step("other", 0))  # not served by this worker
    seen: list[tuple[str, int]] = []
    queues_seen: list[str] = []

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        seen.append((task.queue, task.n))
        queues_seen.append(ctx.queue)
        return Outcome.completed()

    worker = Worker(None, store, concurrency=1, queues=["high", "default"], prefetch=False)
    worker.register(Step, handle)
    await drain(queue, worker, seen, 36)
    assert [q for q, _ in seen] == ["high"] * 16 + ["default"] * 20
    assert seen[0] == ("high", 99)  # the HIGH job of the first queue came first
    assert queues_seen == [q for q, _ in seen]  # ctx.queue is the job's queue
    (other,) = await queue.jobs(JobFilter(queue="other"))
    assert other.status is JobStatus.PENDING


async def test_a_later_queue_is_served_at_once_when_the_first_is_empty(queue: Queue) -> None:
    seen: list[tuple[str, int]] = []

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        seen.append((task.queue, task.n))
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=2, queues=["high", "default", "low"])
    worker.register(Step, handle)
    async with running(worker):
        job_id = await Queue(queue.store, queue="low").enqueue(Step("low", 1))
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [("low", 1)]


def test_claim_room_and_groups() -> None:
    # Free slots plus prefetch room; none while the buffer covers the next slots.
    assert claim_room(free=4, depth=0, buffered=0, concurrency=4) == 4
    assert claim_room(free=0, depth=8, buffered=2, concurrency=4) == 6
    assert claim_room(free=0, depth=8, buffered=7, concurrency=4) == 0
    caps = {"a": None, "b": 2, "c": 1}
    running = {"b": 1, "c": 1}
    assert at_cap("c", caps, running) and not at_cap("b", caps, running)
    assert claim_groups(kinds=["a", "b", "c"], caps=caps, running=running, free=3, limit=10) == [
        (["a"], 10),
        (["b"], 1),  # its cap leaves one
    ]
    # A capped kind is never claimed beyond the free slots (never prefetched).
    assert claim_groups(kinds=["b"], caps=caps, running={}, free=1, limit=10) == [(["b"], 1)]
    assert claim_groups(kinds=["b"], caps=caps, running={}, free=0, limit=10) == []


# -- hooks -----------------------------------------------------------------------------------


class Recording(Hooks):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def enqueued(self, event: Enqueued) -> None:
        self.events.append(event)

    def claimed(self, event: Claimed) -> None:
        self.events.append(event)

    def started(self, event: Started) -> None:
        self.events.append(event)

    def finished(self, event: Finished) -> None:
        self.events.append(event)

    def settled(self, event: Settled) -> None:
        self.events.append(event)

    def dead(self, event: Dead) -> None:
        self.events.append(event)

    def recovered(self, event: Recovered) -> None:
        self.events.append(event)


class Broken(Hooks):
    def settled(self, event: Settled) -> None:
        raise RuntimeError("a hook's own bug")


async def test_hooks_see_each_point_of_the_lifecycle_in_order(queue: Queue) -> None:
    hooks = Recording()
    producer = Queue(queue.store, hooks=[hooks])
    ok = await producer.enqueue(Step("default", 1))
    bad = await producer.enqueue(Step("default", 2))

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        if task.n == 2:
            raise TaskError.permanent("no")
        return Outcome.completed(note="fine")

    worker = Worker(None, queue.store, concurrency=1, hooks=[Broken(), hooks], prefetch=False)
    worker.register(Step, handle)
    async with running(worker):
        await until_status(queue, ok, JobStatus.COMPLETED)
        await until_status(queue, bad, JobStatus.DEAD)

        async def both_settled() -> bool:
            return sum(isinstance(e, Settled) for e in hooks.events) == 2

        await until(both_settled)

    def of(job_id: object) -> list[str]:
        return [type(e).__name__ for e in hooks.events if e.id == job_id]

    assert of(ok) == ["Enqueued", "Claimed", "Started", "Finished", "Settled"]
    assert of(bad) == ["Enqueued", "Claimed", "Started", "Finished", "Settled", "Dead"]
    settled = [e for e in hooks.events if isinstance(e, Settled) and e.id == ok]
    assert settled == [Settled(ok, Step.KIND, "default", 1, "completed", "fine", True)]
    (dead,) = [e for e in hooks.events if isinstance(e, Dead)]
    assert (dead.queue, dead.run, dead.reason) == ("default", 1, "no")


async def test_hooks_must_be_hooks(queue: Queue) -> None:
    with pytest.raises(TypeError, match=r"hooks: expected venturi.Hooks instances"):
        Worker(None, queue.store, hooks=[object()])  # type: ignore[list-item]


# -- middleware ------------------------------------------------------------------------------


async def test_middleware_wraps_runs_outermost_first_and_may_short_circuit(queue: Queue) -> None:
    calls: list[str] = []

    async def outer(task: Step, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        calls.append(f"outer>{task.n}")
        result = await call_next()
        calls.append(f"outer<{task.n}")
        return result

    async def gate(task: Step, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        if task.n == 2 and ctx.run_count == 1:
            return Outcome.pause_in(0, note="not yet")  # the handler does not run
        return await call_next()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        calls.append(f"handler {task.n}")
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, middleware=[outer, gate], prefetch=False)
    worker.register(Step, handle)
    first = await queue.enqueue(Step("default", 1))
    async with running(worker):
        await until_status(queue, first, JobStatus.COMPLETED)
        second = await queue.enqueue(Step("default", 2))
        await until_status(queue, second, JobStatus.COMPLETED)
    assert calls == [
        "outer>1",
        "handler 1",
        "outer<1",
        "outer>2",  # paused by the gate, inside outer
        "outer<2",
        "outer>2",  # run 2: through
        "handler 2",
        "outer<2",
    ]
    journal = [(e.outcome, e.note) for e in await queue.job_journal(second)]
    assert journal == [(JournalOutcome.PAUSED, "not yet"), (JournalOutcome.COMPLETED, None)]


async def test_an_exception_in_middleware_fails_the_run(queue: Queue) -> None:
    async def broken(task: Step, ctx: Context[Any], call_next: CallNext) -> Outcome | None:
        raise ValueError("middleware bug")

    worker = Worker(None, queue.store, concurrency=1, middleware=[broken], backstop=1)
    worker.register(Step, lambda task, ctx, app: asyncio.sleep(0))
    job_id = await queue.enqueue(Step("default", 1))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.last_error is not None and "middleware bug" in job.last_error


async def test_a_handler_or_middleware_that_cannot_take_its_arguments_is_refused_at_once(
    queue: Queue,
) -> None:
    async def two(task: Step, ctx: Context[None]) -> None:
        return None

    async def handle(task: Step, ctx: Context[None], app: None) -> None:
        return None

    async def no_next(task: Step, ctx: Context[Any]) -> None:
        return None

    worker = Worker(None, queue.store)
    call = r"\.two\(task, ctx\) cannot be called as"
    with pytest.raises(TypeError, match=rf"^register\(Step\): .*{call} handler\(task, ctx, app\)"):
        worker.register(Step, two)  # type: ignore[arg-type]
    refused = r"\.no_next\(task, ctx\) cannot be called as \(task, ctx, call_next\)"
    with pytest.raises(TypeError, match=rf"^middleware: .*{refused}"):
        Worker(None, queue.store, middleware=[no_next])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=rf"^register\(Step\), middleware: .*{refused}"):
        worker.register(Step, handle, middleware=[no_next])  # type: ignore[list-item]
    assert worker.kinds == []


async def test_a_plain_def_handler_fails_its_run_saying_to_define_it_async(queue: Queue) -> None:
    ran: list[int] = []

    def plain(task: Step, ctx: Context[None], app: None) -> None:
        ran.append(task.n)

    worker = Worker(None, queue.store, concurrency=1, backstop=1)
    worker.register(Step, plain)  # type: ignore[arg-type]
    job_id = await queue.enqueue(Step("default", 1))
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    job = await queue.job(job_id)
    assert job is not None and job.last_error is not None
    assert "plain returned None, which cannot be awaited: define it with `async def`" in (
        job.last_error
    )
    assert ran == [1]


# -- why a run was cancelled -----------------------------------------------------------------


async def test_the_context_says_why_it_was_cancelled(queue: Queue, pg_dsn: str) -> None:
    reasons: list[CancelReason | None] = []
    started = asyncio.Event()

    async def wait(task: Step, ctx: Context[None], app: None) -> Outcome:
        started.set()
        try:
            await ctx.cancelled()  # shutdown asks first; a lost lease aborts at once
        finally:
            reasons.append(ctx.cancel_reason)
        return Outcome.pause_in(0)

    worker = Worker(None, queue.store, concurrency=1, lease=1.5, backoff=Backoff(0, 0))
    worker.register(Step, wait)
    job_id = await queue.enqueue(Step("default", 1))
    async with running(worker):
        await asyncio.wait_for(started.wait(), 10)
        # Another worker "recovers" the job: this worker's next renewal finds it lost.
        started.clear()
        await queue.store._pool_or_raise().execute(
            f"UPDATE {queue.store.prefix}_jobs SET claim_token = gen_random_uuid(), "
            "lease_until = now() + interval '1 hour' WHERE id = $1",
            job_id.to_uuid(),
        )

        async def lost() -> bool:
            return reasons == [CancelReason.LEASE_LOST]

        await until(lost)
        await queue.enqueue(Step("default", 2))
        await asyncio.wait_for(started.wait(), 10)
    # Leaving the block shut the worker down: the second run was asked to stop for that.
    assert reasons == [CancelReason.LEASE_LOST, CancelReason.SHUTDOWN]


async def test_a_job_claimed_again_waits_until_its_aborted_run_has_stopped(queue: Queue) -> None:
    """A run aborted because its lease was lost can take a while to stop (its handler cleans
    up after the cancellation). If the job is recovered and this same worker claims it again
    meanwhile, the new run waits for the old one to end: two runs of a job never overlap in
    one worker, and the new run is still tracked (its lease renewed, its outcome written).
    Before, the new run replaced the old one in the worker's books, the old one's end then
    removed the new one's entry, and the job was recovered and run a third time."""
    store = queue.store
    active: list[int] = []
    overlapped = False
    cleaning, cleaned = asyncio.Event(), asyncio.Event()
    claims: list[int] = []
    claimed_again = asyncio.Event()

    class Watch(Hooks):
        def claimed(self, event: Claimed) -> None:
            claims.append(event.run)
            if event.run == 2:
                claimed_again.set()

    async def slow_to_stop(task: Step, ctx: Context[None], app: None) -> Outcome:
        nonlocal overlapped
        overlapped = overlapped or bool(active)
        active.append(ctx.run_count)
        try:
            if ctx.run_count == 1:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cleaning.set()
                    await cleaned.wait()  # cleanup that outlasts the abort
                    raise
            return Outcome.completed()
        finally:
            active.remove(ctx.run_count)

    worker = Worker(None, store, concurrency=4, lease=1.5, hooks=[Watch()])
    worker.register(Step, slow_to_stop)
    job_id = await queue.enqueue(Step("default", 1))
    async with running(worker):

        async def first_run_started() -> bool:
            return active == [1]

        await until(first_run_started)
        # Another worker's rescuer recovered the job (pending again, its claim gone): this
        # worker's next renewal finds the lease lost and aborts run 1, which keeps cleaning up.
        pool = store._pool_or_raise()
        await pool.execute(
            f"UPDATE {store.prefix}_jobs SET status = 'pending', claim_token = NULL, "
            "lease_until = NULL, run_at = now() WHERE id = $1",
            job_id.to_uuid(),
        )
        await asyncio.wait_for(cleaning.wait(), 10)
        await pool.execute("SELECT pg_notify($1, $2)", store.channel, Step.KIND)
        await asyncio.wait_for(claimed_again.wait(), 10)
        for _ in range(10):  # whatever the claim started is under way after these turns
            await asyncio.sleep(0)
        assert not overlapped, "run 2 ran while run 1 was still running"
        assert active == [1] and worker.in_flight == 1
        # Longer than run 2's lease: it is renewed while it waits.
        await asyncio.sleep(2.5)
        cleaned.set()
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert not overlapped and claims == [1, 2]
    outcomes = [e.outcome for e in await queue.job_journal(job_id)]
    assert outcomes == [JournalOutcome.COMPLETED], outcomes
