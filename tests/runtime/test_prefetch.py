"""Adaptive prefetch: short jobs are claimed a batch ahead; prefetched jobs that never
started are handed back at shutdown as if never claimed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from venturi import Context, JobStatus, Outcome, PostgresStore, Queue, Task, Worker
from venturi._claims import prefetch_depth

from .helpers import running, until, until_status


@dataclass
class Step(Task):
    KIND = "step"
    n: int


async def claimed_count(queue: Queue) -> int:
    return (await queue.stats()).claimed


async def test_prefetched_jobs_are_returned_unrun_at_shutdown(queue: Queue) -> None:
    release = asyncio.Event()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        if task.n == 20:
            await release.wait()  # long enough to see the buffer, and released at shutdown
        return Outcome.completed()

    ids = await queue.enqueue_many(Step(n) for n in range(22))
    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=0.2)
    worker.register(Step, handle)
    async with running(worker):
        await until_status(queue, ids[19], JobStatus.COMPLETED)

        async def holding_two() -> bool:
            return await claimed_count(queue) == 2  # 1 running + 1 prefetched (concurrency 1)

        await until(holding_two)
    blocked = await queue.job(ids[20])
    prefetched = await queue.job(ids[21])
    assert blocked is not None and prefetched is not None
    assert blocked.status is JobStatus.PENDING
    assert [e.outcome for e in await queue.job_journal(ids[20])] == ["released"]
    assert prefetched.status is JobStatus.PENDING
    assert prefetched.run_count == 0  # its claim is not counted as a run
    assert await queue.job_journal(ids[21]) == []
    assert (await queue.stats()).claimed == 0


async def test_without_prefetch_only_free_slots_are_claimed(queue: Queue) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        if task.n == 20:
            started.set()
            await release.wait()
        return Outcome.completed()

    ids = await queue.enqueue_many(Step(n) for n in range(22))
    worker = Worker(None, queue.store, concurrency=1, prefetch=False)
    worker.register(Step, handle)
    async with running(worker):
        await started.wait()

        async def settled_before() -> bool:
            return await claimed_count(queue) == 1  # earlier jobs' settlements are written

        await until(settled_before)
        job = await queue.job(ids[21])
        assert job is not None and job.status is JobStatus.PENDING and job.run_count == 0
        release.set()
        await until_status(queue, ids[21], JobStatus.COMPLETED)


async def test_a_trickle_of_jobs_costs_one_claim_each(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that empties the queue is the last until a notification: the slot its job
    frees finds nothing more (a job written since notifies). Before, a job that ended within
    the claim's round made the worker claim again at once, for nothing: two claims per job
    at a trickle, the second a round trip and a statement on the server for no job."""
    store = queue.store
    assert isinstance(store, PostgresStore)
    claims: list[int] = []
    looked = asyncio.Event()
    claim = store.claim

    async def counted(**kwargs: Any) -> Any:
        jobs = await claim(**kwargs)
        claims.append(len(jobs))
        looked.set()
        return jobs

    monkeypatch.setattr(store, "claim", counted)
    done = asyncio.Event()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        done.set()
        return Outcome.completed()

    worker = Worker(None, store, concurrency=4)
    worker.register(Step, handle)
    async with running(worker):
        await looked.wait()  # the first look, at start-up, found the queue empty
        assert claims == [0]
        for n in range(5):
            done.clear()
            job_id = await queue.enqueue(Step(n))
            await done.wait()
            await until_status(queue, job_id, JobStatus.COMPLETED)
        assert claims == [0] + [1] * 5


def test_prefetch_depth_covers_one_claim_round_trip_within_bounds() -> None:
    assert prefetch_depth(16, None, 0.002) == 0  # nothing measured yet
    assert prefetch_depth(16, 0.5, 0.002) == 0  # long jobs: other workers should get them
    assert prefetch_depth(16, 0.002, 0.002) == 0  # as long as a claim: no gain
    assert prefetch_depth(16, 0.0015, 0.002) == 22  # 16 slots x 2/1.5 round trips, rounded up
    assert prefetch_depth(16, 0.0019, 0.002) == 17
    assert prefetch_depth(16, 0.00005, 0.002) == 640  # 16 x 40 round trips' worth, under the cap
    assert prefetch_depth(16, 0.00001, 0.002) == 1024  # no-op handlers: capped at 1024
    assert prefetch_depth(1, 0.0, 0.002) == 1024  # few slots: capped at 1024 all the same
    assert prefetch_depth(1, 0.0005, 0.002) == 4  # one round trip's worth, no more
    assert prefetch_depth(64, 0.00005, 0.002) == 1024
    assert prefetch_depth(128, 0.00005, 0.002) == 1024
    assert prefetch_depth(256, 0.00005, 0.002) == 2048  # many slots: capped at 8x slots


async def test_a_claimed_job_starts_before_the_claim_loop_reads_again(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle worker's claim that starts a job lets it run before the loop's next database
    call (here the next-due read after a claim that came back short of its prefetch): that
    call's setup and send used to come first, about 0.2-0.3 ms of every pickup."""
    store = queue.store
    assert isinstance(store, PostgresStore)
    events: list[str] = []
    looked = asyncio.Event()
    claim, next_due = store.claim, store.next_due

    async def claim_logged(**kwargs: Any) -> Any:
        events.append("claim")
        jobs = await claim(**kwargs)
        events.append(f"claimed {len(jobs)}")
        return jobs

    async def next_due_logged(*args: Any, **kwargs: Any) -> Any:
        events.append("next due")
        if "started" in events:
            looked.set()  # the loop's look after this round's run began
        return await next_due(*args, **kwargs)

    monkeypatch.setattr(store, "claim", claim_logged)
    monkeypatch.setattr(store, "next_due", next_due_logged)
    done = asyncio.Event()

    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        events.append("started")
        done.set()
        return Outcome.completed()

    worker = Worker(None, store, concurrency=1)
    worker.register(Step, handle)
    async with running(worker):
        # The first runs warm the prefetch up: then a claim asks for more than one job, and
        # one that comes back with a single job reads the next due time at once.
        for n in range(3):
            looked.clear()
            done.clear()
            events.clear()
            await queue.enqueue(Step(n))
            await done.wait()
            await looked.wait()
    assert events[events.index("claimed 1") + 1] == "started", events


@dataclass
class CappedA(Task):
    KIND = "capped_a"
    n: int


@dataclass
class CappedB(Task):
    KIND = "capped_b"
    n: int


async def test_a_capped_kind_is_never_claimed_ahead_of_a_free_slot(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each capped kind's request of a round was sized from the slots free when the round
    began: an earlier request's job took the one slot, and the next capped kind's job was
    claimed anyway, to wait idle in the prefetch buffer (claimed, so no other worker could
    run it) behind whatever ran. Every capped request is now for slots free when it is sent."""
    from venturi._producer import Producer

    monkeypatch.setattr(Producer, "_prefetch_depth", lambda self: 4)  # a warmed-up worker
    store = queue.store
    worker = Worker(None, store, concurrency=1, shutdown_timeout=1)
    sent: list[tuple[list[str] | None, int, int]] = []  # kinds, limit, slots free then
    real_claim = store.claim

    async def claim(**kwargs: Any) -> Any:
        runner = worker._runner
        assert runner is not None
        sent.append((kwargs["kinds"], kwargs["limit"], runner.free - len(runner.buffer)))
        return await real_claim(**kwargs)

    monkeypatch.setattr(store, "claim", claim)

    started, release = asyncio.Event(), asyncio.Event()

    async def hold(task: CappedA, ctx: Context[None], app: None) -> Outcome:
        started.set()
        await release.wait()  # the one slot is taken while the round goes on
        return Outcome.completed()

    async def handle(task: CappedB, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker.register(CappedA, hold, cap=1)
    worker.register(CappedB, handle, cap=1)
    ids = [await queue.enqueue(CappedA(0)), await queue.enqueue(CappedB(0))]
    async with running(worker):
        await asyncio.wait_for(started.wait(), 30)
        release.set()
        for job_id in ids:
            await until_status(queue, job_id, JobStatus.COMPLETED)
    capped = [(kinds, limit, free) for kinds, limit, free in sent if kinds is not None]
    assert capped, sent
    assert all(limit <= free for _, limit, free in capped), capped
