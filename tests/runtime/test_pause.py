"""Pausing and resuming named queues, against a real PostgreSQL: the pause is stored (it
survives restarts), checked inside the claim, announced to every worker at once, and ends by
itself at its `until`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from venturi import (
    Context,
    JobFilter,
    JobStatus,
    Outcome,
    PostgresStore,
    Queue,
    QueueState,
    Task,
    Worker,
)

from .helpers import WAIT_TIMEOUT, Claims, running, until_status
from .test_cli import venturi


@dataclass
class Job(Task):
    KIND = "pause.job"
    n: int


def recording(store: PostgresStore, seen: list[tuple[str, int]], **settings: Any) -> Worker[None]:
    started = settings.pop("started", None)

    async def handle(task: Job, ctx: Context[None], app: None) -> Outcome:
        seen.append((ctx.queue, task.n))
        if started is not None:
            started.set()
        return Outcome.completed()

    worker = Worker(None, store, **settings)
    worker.register(Job, handle)
    return worker


async def statuses(queue: Queue) -> dict[int, JobStatus]:
    return {j.payload["n"]: j.status for j in await queue.jobs(JobFilter(limit=1000))}


async def test_a_pause_survives_a_worker_restart_and_a_new_store(queue: Queue, pg_dsn: str) -> None:
    state = await queue.pause("mail", reason="provider down")
    assert (state.name, state.paused, state.reason, state.until) == (
        "mail",
        True,
        "provider down",
        None,
    )
    await queue.enqueue(Job(1), queue="mail")
    seen: list[tuple[str, int]] = []
    for _ in range(2):  # two workers one after the other, each on a store of its own
        async with await PostgresStore.connect(pg_dsn, prefix=queue.store.prefix) as store:
            await recording(store, seen, queue="mail", concurrency=2).run(once=True)
    assert seen == []
    assert await statuses(queue) == {1: JobStatus.PENDING}  # waiting, not lost, not claimed
    assert await queue.resume("mail") is True
    await recording(queue.store, seen, queue="mail", concurrency=2).run(once=True)
    assert seen == [("mail", 1)]
    assert await queue.resume("mail") is False  # not paused any more


async def test_a_resume_wakes_an_idle_worker(queue: Queue) -> None:
    """The worker saw the queue paused and went idle (poll_max an hour: only a notification
    can wake it); the resume's announcement wakes it."""
    await queue.pause("mail")
    job_id = await queue.enqueue(Job(1), queue="mail")
    claims = Claims(queue.store)
    started = asyncio.Event()
    seen: list[tuple[str, int]] = []
    worker = recording(queue.store, seen, queue="mail", poll_max=3600, started=started)
    async with running(worker):
        await claims.empty_one()
        assert await statuses(queue) == {1: JobStatus.PENDING}
        assert await queue.resume("mail") is True
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert seen == [("mail", 1)]


async def test_a_pause_ends_by_itself_at_its_until(queue: Queue) -> None:
    """An idle worker whose queue is paused until a time claims again at that time, without
    any notification (poll_max an hour)."""
    until = datetime.now(UTC) + timedelta(seconds=2)
    state = await queue.pause("mail", reason="maintenance", until=until)
    assert state.until == until
    job_id = await queue.enqueue(Job(1), queue="mail")
    claims = Claims(queue.store)
    started = asyncio.Event()
    seen: list[tuple[str, int]] = []
    worker = recording(queue.store, seen, queue="mail", poll_max=3600, started=started)
    async with running(worker):
        await claims.empty_one()  # it saw the pause
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
    job = await queue.job(job_id)
    assert job is not None and job.claimed_at is not None and job.claimed_at >= until
    (listed,) = await queue.queues()
    assert listed == QueueState("mail", False)  # a pause past its until is no pause


async def test_the_claim_treats_a_pause_past_its_until_as_resumed(queue: Queue) -> None:
    await queue.pause("mail", until=datetime.now(UTC) + timedelta(hours=1))
    await queue.enqueue(Job(1), queue="mail")
    seen: list[tuple[str, int]] = []
    await recording(queue.store, seen, queue="mail").run(once=True)
    assert seen == []
    # Time passes (as far as the stored pause can tell): nothing else has to happen.
    await queue.store._pool_or_raise().execute(
        f"UPDATE {queue.store.prefix}_queues SET paused_until = now() - interval '1 second'"
    )
    await recording(queue.store, seen, queue="mail").run(once=True)
    assert seen == [("mail", 1)]


async def test_pausing_one_queue_of_an_ordered_list_leaves_the_others_served(
    queue: Queue,
) -> None:
    store = queue.store
    await queue.enqueue_many([Job(1), Job(2)], queue="high")
    await queue.enqueue_many([Job(3), Job(4)], queue="default")
    await queue.enqueue(Job(5), queue="low")
    await queue.pause("high")
    seen: list[tuple[str, int]] = []
    order = ["high", "default", "low"]
    await recording(store, seen, queues=order, concurrency=1, prefetch=False).run(once=True)
    assert seen == [("default", 3), ("default", 4), ("low", 5)]
    assert await statuses(queue) == {
        1: JobStatus.PENDING,
        2: JobStatus.PENDING,
        3: JobStatus.COMPLETED,
        4: JobStatus.COMPLETED,
        5: JobStatus.COMPLETED,
    }
    stats = await queue.stats()
    assert stats.paused_queues == {"high"} and stats.pending_by_kind == {Job.KIND: 2}
    assert stats.paused_by_kind == {Job.KIND: 2} and stats.paused == 2  # counted as paused
    assert stats.queues["high"].paused and not stats.queues["default"].paused
    await queue.resume("high")
    await recording(store, seen, queues=order, concurrency=1).run(once=True)
    assert seen[3:] == [("high", 1), ("high", 2)]
    after = await queue.stats()
    assert after.paused_queues == frozenset() and after.paused == 0


async def test_a_pause_applies_at_once_to_running_workers(queue: Queue) -> None:
    """A worker that is running when the pause is made stops claiming from that queue: the
    pause is checked in the claim, so a job enqueued after it waits."""
    seen: list[tuple[str, int]] = []
    started = asyncio.Event()
    worker = recording(queue.store, seen, queues=["mail", "other"], started=started)
    async with running(worker):
        await queue.enqueue(Job(1), queue="mail")
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
        await queue.pause("mail")
        held = await queue.enqueue(Job(2), queue="mail")
        started.clear()
        await queue.enqueue(Job(3), queue="other")  # claimed after the held one was enqueued
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
        await until_status(queue, held, JobStatus.PENDING)
    assert seen == [("mail", 1), ("other", 3)]


async def test_queues_lists_paused_queues_and_queues_with_jobs(queue: Queue) -> None:
    assert await queue.queues() == []
    await queue.enqueue(Job(1))
    await queue.enqueue(Job(2), queue="reports")
    paused = await queue.pause("not-created-yet", reason="later")  # an unknown queue is fine
    assert paused.since is not None
    again = await queue.pause("not-created-yet", reason="still later")
    assert (again.since, again.reason) == (paused.since, "still later")  # since is kept
    listed = await queue.queues()
    assert [(s.name, s.paused, s.reason) for s in listed] == [
        ("default", False, None),
        ("not-created-yet", True, "still later"),
        ("reports", False, None),
    ]


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201, "*"])
async def test_an_invalid_queue_name_is_a_clear_error(queue: Queue, bad: str) -> None:
    with pytest.raises(ValueError, match=r"pause\(name\): invalid queue name"):
        await queue.pause(bad)
    with pytest.raises(ValueError, match=r"resume\(name\): invalid queue name"):
        await queue.resume(bad)
    assert await queue.queues() == []


async def test_bad_pause_arguments_are_clear_errors_and_store_nothing(queue: Queue) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    cases: Sequence[tuple[dict[str, Any], type[Exception], str]] = [
        ({"until": past}, ValueError, "has passed"),
        ({"until": datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
        ({"until": "tomorrow"}, TypeError, "expected a timezone-aware datetime"),
        ({"until": datetime.now(UTC) + timedelta(days=4000)}, ValueError, "within 10 years"),
        ({"reason": 7}, TypeError, r"reason=\): expected a str"),
        ({"reason": "x" * 1001}, ValueError, "at most 1000 characters"),
        ({"reason": "a\x00b"}, ValueError, "NUL"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            await queue.pause("mail", **kwargs)
    assert await queue.queues() == []


async def test_the_previous_claim_function_still_runs(queue: Queue) -> None:
    """Workers of the previous release call the previous claim function during a rolling
    deploy: it is kept (and does not know about pauses)."""
    await queue.enqueue(Job(1), queue="mail")
    rows = await queue.store._pool_or_raise().fetch(
        f"SELECT id FROM {queue.store.prefix}_claim_v1("
        "ARRAY['mail'], ARRAY['pause.job'], 1, 0, 0, 'old-worker', NULL, 60, NULL, 'x')"
    )
    assert len(rows) == 1


async def test_the_queue_commands(queue: Queue, pg_dsn: str) -> None:
    prefix = queue.store.prefix
    run = venturi("queue", "pause", "mail", "--reason", "provider down", "--for", "1h",
                  dsn=pg_dsn, prefix=prefix)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("paused mail until ") and "provider down" in run.stdout
    listed = json.loads(venturi("queue", "list", "--json", dsn=pg_dsn, prefix=prefix).stdout)
    assert [(q["name"], q["paused"], q["reason"]) for q in listed] == [
        ("mail", True, "provider down")
    ]
    until = datetime.fromisoformat(listed[0]["until"])
    assert timedelta(minutes=59) < until - datetime.now(UTC) <= timedelta(hours=1)
    text = venturi("queue", "list", dsn=pg_dsn, prefix=prefix).stdout
    assert text.splitlines()[1].split()[:2] == ["mail", "paused"]
    stats = venturi("stats", dsn=pg_dsn, prefix=prefix).stdout
    assert "paused queues: mail" in stats
    assert venturi("queue", "resume", "mail", dsn=pg_dsn, prefix=prefix).stdout == "resumed mail\n"
    again = venturi("queue", "resume", "mail", dsn=pg_dsn, prefix=prefix)
    assert again.stdout == "mail was not paused\n"
    bad = venturi("queue", "pause", "no spaces", dsn=pg_dsn, prefix=prefix)
    assert bad.returncode == 2 and "invalid queue name" in bad.stderr
    naive = venturi("queue", "pause", "mail", "--until", "2030-01-01T00:00", dsn=pg_dsn,
                    prefix=prefix)  # fmt: skip
    assert naive.returncode == 2 and "UTC offset" in naive.stderr
    assert json.loads(venturi("queue", "list", "--json", dsn=pg_dsn, prefix=prefix).stdout) == [
        {"name": "mail", "paused": False, "reason": None, "since": None, "until": None}
    ]
