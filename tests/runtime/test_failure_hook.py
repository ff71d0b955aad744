"""The failure step of a job that fails for good: the task's `failed` hook, then the worker's
reporters, run once; recorded with the dead outcome, so a step its worker never ran is run by
another worker, and never by two at once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from ulid import ULID

from venturi import (
    Backoff,
    Context,
    FailedJob,
    JobStatus,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi.errors import JobFailed

from .helpers import running, until, until_status


@dataclass
class Hooked:
    """What the hooks and reporters saw, in order."""

    calls: list[tuple[str, Any, BaseException, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, who: str, job: Any, error: BaseException, extra: Any = None) -> None:
        self.calls.append((who, job, error, extra))
        self.changed.set()

    async def count(self, n: int) -> None:
        while len(self.calls) < n:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=20)


@dataclass
class Charge(Task):
    KIND = "charge"
    order: int

    async def failed(self, error: BaseException, ctx: Context[None], app: Hooked) -> None:
        app.add("hook", self, error, (ctx.job_id, ctx.run_count, [e.outcome for e in ctx.history]))


@dataclass
class Plain(Task):
    """No hook of its own: only the reporters hear of its death."""

    KIND = "plain"
    n: int


def reporters(app: Hooked) -> list[Any]:
    def sync_reporter(error: BaseException, job: FailedJob) -> None:
        app.add("sync", job, error)

    async def async_reporter(error: BaseException, job: FailedJob) -> None:
        app.add("async", job, error)

    return [sync_reporter, async_reporter]


async def pending_steps(store: PostgresStore) -> int:
    n: int = await store._pool.fetchval(
        f"SELECT count(*) FROM {store.prefix}_jobs WHERE hook_token IS NOT NULL"
    )
    return n


async def no_pending_step(store: PostgresStore) -> None:
    async def check() -> bool:
        return await pending_steps(store) == 0

    await until(check)


async def test_the_hook_runs_once_with_the_exception_and_the_reporters_hear_of_it(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    raised: list[TaskError] = []

    async def refuse(task: Charge, ctx: Context[None], app: Hooked) -> None:
        raised.append(TaskError.permanent(f"card declined for {task.order}"))
        raise raised[-1]

    worker = Worker(app, store, reporters=reporters(app))
    worker.register(Charge, refuse)
    async with running(worker):
        job_id = await queue.enqueue(Charge(7))
        await app.count(3)
        await no_pending_step(store)
    assert [c[0] for c in app.calls] == ["hook", "sync", "async"]
    _, task, error, (ctx_id, run, history) = app.calls[0]
    assert task == Charge(7) and error is raised[0]
    assert (ctx_id, run, history) == (job_id, 1, ["dead"])
    for _, job, error, _ in app.calls[1:]:
        assert error is raised[0]
        assert isinstance(job, FailedJob)
        assert (job.id, job.kind, job.queue, job.payload) == (
            job_id,
            "charge",
            "default",
            {"order": 7},
        )
        assert job.error == "card declined for 7" and job.failures == 1
    assert worker._undertaker is not None and worker._undertaker.ran == 1


async def test_the_hook_runs_after_the_last_attempt_only(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    raised: list[Exception] = []

    async def flaky(task: Charge, ctx: Context[None], app: Hooked) -> None:
        raised.append(ValueError(f"try {ctx.run_count}"))
        raise raised[-1]

    worker = Worker(app, store, backstop=3, backoff=Backoff(0, 0), poll_max=0.05)
    worker.register(Charge, flaky)
    async with running(worker):
        job_id = await queue.enqueue(Charge(1))
        await until_status(queue, job_id, JobStatus.DEAD)
        await no_pending_step(store)
    assert len(app.calls) == 1 and app.calls[0][2] is raised[2]
    assert app.calls[0][3][1:] == (3, ["failed", "failed", "dead"])


async def test_a_hook_or_reporter_that_raises_is_logged_and_runs_once(
    store: PostgresStore, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    app = Hooked()

    @dataclass
    class Broken(Task):
        KIND = "broken"

        async def failed(self, error: BaseException, ctx: Context[None], app: Hooked) -> None:
            app.add("hook", self, error)
            raise RuntimeError("the hook broke")

    def bad_reporter(error: BaseException, job: FailedJob) -> None:
        app.add("bad", job, error)
        raise RuntimeError("the reporter broke")

    async def refuse(task: Broken, ctx: Context[None], app: Hooked) -> None:
        raise TaskError.permanent("no")

    worker = Worker(app, store, reporters=[bad_reporter, *reporters(app)])
    worker.register(Broken, refuse)
    with caplog.at_level(logging.ERROR, logger="venturi"):
        async with running(worker):
            await queue.enqueue(Broken())
            await app.count(4)
            await no_pending_step(store)
            second = await queue.enqueue(Broken())  # the worker goes on
            await app.count(8)
            await until_status(queue, second, JobStatus.DEAD)
    assert [c[0] for c in app.calls] == ["hook", "bad", "sync", "async"] * 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum("its failure hook raised" in m for m in messages) == 2
    assert sum("reporter" in m and "raised" in m for m in messages) == 2


async def test_an_undecodable_payload_is_reported_without_a_hook(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    job_id = await queue.enqueue(Charge(1))
    await store._pool.execute(
        f'UPDATE {store.prefix}_jobs SET payload = \'{{"order": "one"}}\' WHERE id = $1',
        job_id.to_uuid(),
    )

    async def never(task: Charge, ctx: Context[None], app: Hooked) -> None:
        raise AssertionError("not run")

    worker = Worker(app, store, reporters=reporters(app))
    worker.register(Charge, never)
    async with running(worker):
        await app.count(2)
        await no_pending_step(store)
    assert [c[0] for c in app.calls] == ["sync", "async"]
    error = app.calls[0][2]
    assert isinstance(error, JobFailed)
    assert str(error).startswith("undecodable payload for kind 'charge'")


async def orphan(store: PostgresStore, task: Task, *, error: str, expired: bool = True) -> ULID:
    """A dead job whose failure step its worker never ran (it died after the commit)."""
    job_id = await Queue(store).enqueue(task)
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET status = 'dead', finished_at = now(), failures = 1, "
        f"run_count = 1, last_error = $2, hook_token = gen_random_uuid(), "
        f"hook_lease_until = now() + $3 * interval '1 hour' WHERE id = $1",
        job_id.to_uuid(),
        error,
        -1 if expired else 1,
    )
    return job_id


async def test_a_step_left_by_a_dead_worker_runs_once_in_another(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    job_id = await orphan(store, Charge(3), error="declined")
    held = await orphan(store, Charge(4), error="still leased", expired=False)

    async def unused(task: Charge, ctx: Context[None], app: Hooked) -> None:
        pass

    worker = Worker(app, store, reporters=reporters(app)[:1])
    worker.register(Charge, unused)
    async with running(worker):
        await app.count(2)
        await until(lambda: _step_of(store, job_id, None))
    assert [c[0] for c in app.calls] == ["hook", "sync"]
    assert app.calls[0][1] == Charge(3)
    assert isinstance(app.calls[0][2], JobFailed) and str(app.calls[0][2]) == "declined"
    assert await _step(store, held) is not None  # its lease has not ended: left to its worker


async def _step(store: PostgresStore, job_id: ULID) -> uuid.UUID | None:
    token: uuid.UUID | None = await store._pool.fetchval(
        f"SELECT hook_token FROM {store.prefix}_jobs WHERE id = $1", job_id.to_uuid()
    )
    return token


async def _step_of(store: PostgresStore, job_id: ULID, token: uuid.UUID | None) -> bool:
    return await _step(store, job_id) == token


async def test_workers_racing_for_orphaned_steps_run_each_once(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    ids = [await orphan(store, Charge(i), error=f"e{i}") for i in range(60)]

    async def unused(task: Charge, ctx: Context[None], app: Hooked) -> None:
        pass

    workers = []
    for _ in range(3):
        w = Worker(app, store, poll_max=0.05)
        w.register(Charge, unused)
        workers.append(w)
    async with running(workers[0]), running(workers[1]), running(workers[2]):
        await app.count(60)
        await no_pending_step(store)
    orders = sorted(c[1].order for c in app.calls)
    assert orders == list(range(60)), "a hook ran twice, or never"
    assert sum(w._undertaker.ran for w in workers if w._undertaker) == len(ids)


async def test_a_worker_leaves_steps_of_kinds_it_does_not_run(
    store: PostgresStore, queue: Queue
) -> None:
    job_id = await orphan(store, Charge(1), error="x")
    token = await _step(store, job_id)
    app = Hooked()

    async def unused(task: Plain, ctx: Context[None], app: Hooked) -> None:
        pass

    worker = Worker(app, store, reporters=reporters(app))
    worker.register(Plain, unused)
    async with running(worker):
        await queue.enqueue(Plain(1))
        await until(lambda: _done(queue))
    assert app.calls == [] and await _step(store, job_id) == token


async def _done(queue: Queue) -> bool:
    stats = await queue.stats()
    return stats.completed_by_kind.get("plain") == 1


async def test_a_job_whose_worker_died_during_its_last_attempt_fails_and_its_hook_runs(
    store: PostgresStore, queue: Queue
) -> None:
    app = Hooked()
    job_id = await queue.enqueue(Charge(9))
    # A worker claims the job, then dies: its lease runs out with nobody to renew it.
    (claimed,) = await store.claim(
        queues=["default"],
        kinds=["charge"],
        limit=1,
        worker="gone:1#0",
        pod=None,
        default_lease_s=0.5,
    )
    assert claimed.id == job_id.to_uuid()

    async def unused(task: Charge, ctx: Context[None], app: Hooked) -> None:
        raise AssertionError("not run again")

    worker = Worker(app, store, backstop=1, reporters=reporters(app)[:1])
    worker.register(Charge, unused)
    async with running(worker):
        await app.count(2)
        await no_pending_step(store)
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error is not None
    assert job.last_error.startswith("the worker stopped during the last attempt (lease expired")
    assert [c[0] for c in app.calls] == ["hook", "sync"]
    error = app.calls[0][2]
    assert isinstance(error, JobFailed) and str(error) == job.last_error
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == ["stale_recovered"]


async def test_a_hook_that_runs_out_of_time_leaves_the_reporters_their_turn(
    store: PostgresStore, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """The step's time (a little under the lease) is shared: a hook that hangs is cut short
    where the reporters' part begins, and they still hear of the job."""
    app = Hooked()

    @dataclass
    class Hangs(Task):
        KIND = "hangs"

        async def failed(self, error: BaseException, ctx: Context[None], app: Hooked) -> None:
            app.add("hook", self, error)
            await asyncio.Event().wait()  # until cut short

    async def refuse(task: Hangs, ctx: Context[None], app: Hooked) -> None:
        raise TaskError.permanent("no")

    worker = Worker(app, store, lease=2, reporters=reporters(app))
    worker.register(Hangs, refuse)
    with caplog.at_level(logging.ERROR, logger="venturi"):
        async with running(worker):
            await queue.enqueue(Hangs())
            await app.count(3)
            await no_pending_step(store)
    assert [c[0] for c in app.calls] == ["hook", "sync", "async"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "its failure hook took longer than 1.4s; cut short, the reporters run" in m
        for m in messages
    ), messages


async def test_a_hook_that_could_not_be_called_is_refused_when_its_task_is_registered(
    store: PostgresStore,
) -> None:
    """`task.failed(error, ctx, app)` with the wrong parameters was found when a job died,
    and the hook lost (logged); register() names it instead."""

    @dataclass
    class NoApp(Task):
        KIND = "hook.no_app"

        async def failed(self, error: BaseException, ctx: Context[None]) -> None:
            return None

    @dataclass
    class Static(Task):
        KIND = "hook.static"

        @staticmethod
        async def failed(error: BaseException, ctx: Context[None], app: None) -> None:
            return None

    async def handle(task: Task, ctx: Context[None], app: None) -> None:
        return None

    worker = Worker(None, store)
    refused = (
        r"NoApp\.failed\(self, error, ctx\) cannot be called as failed\(self, error, ctx, app\)"
    )
    with pytest.raises(TypeError, match=rf"^register\(.*NoApp\): .*{refused}"):
        worker.register(NoApp, handle)
    worker.register(Static, handle)  # a staticmethod takes no self
    worker.register(Charge, handle)
    assert worker.kinds == ["hook.static", "charge"]
