"""Run modes: a worker that ends on its own (the jobs due now, until empty, a number of
jobs, a time), in process and through `venturi worker`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from venturi import Context, JobFilter, JobStatus, Outcome, Queue, Task, Worker
from venturi._producer import Producer
from venturi._records import NextDue

from .cli_app import Echo

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item(Task):
    KIND = "modes.item"
    n: int
    pause_first: bool = False


def counting_worker(queue: Queue, seen: list[int], **kwargs: object) -> Worker[None]:
    async def handle(task: Item, ctx: Context[None], app: None) -> Outcome:
        seen.append(task.n)
        if task.pause_first and ctx.run_count == 1:
            return Outcome.pause_in(0.5)  # due again later, as a retry after backoff would be
        return Outcome.completed()

    worker = Worker(None, queue.store, **kwargs)  # type: ignore[arg-type]
    worker.register(Item, handle)
    return worker


async def statuses(queue: Queue) -> dict[int, JobStatus]:
    return {j.payload["n"]: j.status for j in await queue.jobs(JobFilter(limit=1000))}


async def test_once_runs_what_is_due_now_and_returns(queue: Queue) -> None:
    await queue.enqueue_many(Item(i) for i in range(30))
    later = await queue.enqueue_in(Item(100), 3600)
    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=4)
    await asyncio.wait_for(worker.run(once=True), 30)
    assert sorted(seen) == list(range(30))
    job = await queue.job(later)
    assert job is not None and job.status is JobStatus.PENDING  # not due: left for later


@dataclass
class Again(Task):
    KIND = "modes.again"


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_once_returns_though_a_job_keeps_putting_itself_back(
    queue: Queue, concurrency: int
) -> None:
    """A job that pauses itself due at once is due again as soon as it settles: a claim
    that keeps finding it (or a stream of new jobs) is full every time. `once` runs the jobs
    due when it began, and stops at a claim of only jobs that came due since."""
    await queue.enqueue_many(Item(i) for i in range(10))
    # More of them than a claim asks for (the free slots and the prefetch): every claim
    # would be full.
    again = await queue.enqueue_many(Again() for _ in range(2 * concurrency + 8))
    runs: list[int] = []

    async def forever(task: Again, ctx: Context[None], app: None) -> Outcome:
        runs.append(ctx.run_count)
        return Outcome.pause_in(0)

    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=concurrency)
    worker.register(Again, forever)
    await asyncio.wait_for(worker.run(once=True), 30)
    assert sorted(seen) == list(range(10))
    # Each ran at its first claim (due at the start); a claim may take runs that came due
    # since beside the jobs due at the start, and stops the run when it takes only those.
    assert runs.count(1) == len(again) and len(runs) <= 3 * len(again), runs
    for job_id in again:
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING


async def test_once_with_nothing_due_returns_at_once(queue: Queue) -> None:
    worker = counting_worker(queue, [], concurrency=2)
    await asyncio.wait_for(worker.run(once=True), 30)


async def test_stop_when_empty_waits_for_retries_and_what_runs(queue: Queue) -> None:
    """A job due again half a second after its first run: `stop_when_empty` waits for it
    (`once` would return and leave it pending)."""
    await queue.enqueue_many([Item(1), Item(2, pause_first=True), Item(3)])
    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=2)
    await asyncio.wait_for(worker.run(stop_when_empty=True), 60)
    assert sorted(seen) == [1, 2, 2, 3]
    assert set((await statuses(queue)).values()) == {JobStatus.COMPLETED}


async def test_stop_when_empty_looks_at_its_own_queues_only(queue: Queue) -> None:
    """A job of the same kind scheduled an hour from now in another queue is not this
    worker's to wait for: it returns once its own queue is done."""
    await queue.enqueue_many([Item(1), Item(2)])
    elsewhere = await Queue(queue.store, queue="elsewhere").enqueue_in(Item(3), 3600)
    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=2)
    await asyncio.wait_for(worker.run(stop_when_empty=True), 30)
    assert sorted(seen) == [1, 2]
    job = await queue.job(elsewhere)
    assert job is not None and job.status is JobStatus.PENDING


async def test_stop_when_empty_does_not_wait_for_a_paused_queue_s_jobs(queue: Queue) -> None:
    """The jobs of a paused queue, due now or scheduled, are not work the worker can do: it
    returns once the rest is done (it used to wait until the scheduled one came due)."""
    await queue.enqueue_many([Item(1), Item(2)])
    held = Queue(queue.store, queue="held")
    now, later = await held.enqueue(Item(3)), await held.enqueue_in(Item(4), 3600)
    await held.pause("held")
    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=2, queues=["default", "held"])
    await asyncio.wait_for(worker.run(stop_when_empty=True), 30)
    assert sorted(seen) == [1, 2]
    for job_id in (now, later):
        job = await queue.job(job_id)
        assert job is not None and job.status is JobStatus.PENDING


async def test_stop_when_empty_returns_when_the_last_run_ends_during_a_look(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last run ends while the claim loop reads the next due time (after the claim that
    came back short, before its wait): the worker returns then, not a `poll_max` later (it
    once waited out poll_max at the end of most drains)."""
    gate = asyncio.Event()

    async def handle(task: Item, ctx: Context[None], app: None) -> Outcome:
        await gate.wait()
        return Outcome.completed()

    next_due = Producer._next_due

    async def look_while_the_last_run_ends(self: Producer, kinds: list[str]) -> NextDue:
        gate.set()
        await self._runner.idle.wait()  # the run has ended meanwhile
        return await next_due(self, kinds)

    monkeypatch.setattr(Producer, "_next_due", look_while_the_last_run_ends)
    job_id = await queue.enqueue(Item(1))
    worker = Worker(None, queue.store, concurrency=2, poll_max=120)
    worker.register(Item, handle)
    await asyncio.wait_for(worker.run(stop_when_empty=True), 20)
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED


async def test_max_jobs_claims_that_many_and_lets_them_finish(queue: Queue) -> None:
    await queue.enqueue_many(Item(i) for i in range(20))
    seen: list[int] = []
    worker = counting_worker(queue, seen, concurrency=4, prefetch=False)
    await asyncio.wait_for(worker.run(max_jobs=7), 30)
    assert len(seen) == 7
    found = await statuses(queue)
    assert sum(s is JobStatus.COMPLETED for s in found.values()) == 7
    assert sum(s is JobStatus.PENDING for s in found.values()) == 13  # none left claimed


async def test_max_time_shuts_down_gracefully(queue: Queue) -> None:
    worker = counting_worker(queue, [], concurrency=1)
    await asyncio.wait_for(worker.run(max_time=0.3), 30)


async def test_run_modes_are_validated(queue: Queue) -> None:
    for kwargs, message in (
        ({"once": True, "stop_when_empty": True}, "not both"),
        ({"max_jobs": 0}, "max_jobs: expected an int >= 1"),
        ({"max_time": -1}, "max_time"),
    ):
        worker = counting_worker(queue, [], concurrency=1)
        with pytest.raises(ValueError, match=message):
            await worker.run(**kwargs)


async def test_the_worker_command_runs_once_from_the_queues_it_is_given(
    queue: Queue, pg_dsn: str
) -> None:
    store = queue.store
    await Queue(store, queue="high").enqueue_many(Echo(text=f"h{i}") for i in range(3))
    await Queue(store, queue="other").enqueue(Echo(text="o"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENTURI_")}
    env |= {"VENTURI_DSN": pg_dsn, "VENTURI_PREFIX": store.prefix}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_worker",
        "--queue",
        "high,default",
        "--once",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    jobs = await queue.jobs(JobFilter(limit=10))
    assert {(j.queue, j.status) for j in jobs} == {
        ("high", JobStatus.COMPLETED),
        ("other", JobStatus.PENDING),
    }


async def test_the_worker_command_refuses_bad_queue_names(queue: Queue, pg_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENTURI_")}
    env |= {"VENTURI_DSN": pg_dsn, "VENTURI_PREFIX": queue.store.prefix}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "venturi",
        "worker",
        "tests.runtime.cli_app:make_worker",
        "--queue",
        "high,bad name",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert await asyncio.wait_for(proc.wait(), timeout=60) == 2
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert "--queue: invalid queue name 'bad name'" in err
