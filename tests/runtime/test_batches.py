"""Batches against the real PostgreSQL: members counted in the transaction that settles them,
then / catch / finally released exactly once, cancellation, allow_failures, pruning, the
caller's transaction, and `ctx.batch_id`."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    BatchStatus,
    Context,
    DedupKey,
    JobStatus,
    JournalOutcome,
    Outcome,
    PostgresStore,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi.testing import Jobs, WorkerFactory

from .helpers import running, until, until_status


@dataclass
class Part(Task):
    KIND = "batch_part"
    name: str


@dataclass
class Then(Task):
    KIND = "batch_then"


@dataclass
class Catch(Task):
    KIND = "batch_catch"


@dataclass
class Finally(Task):
    KIND = "batch_finally"


@dataclass
class Merging(Task):
    KIND = "batch_merging"

    def dedup_key(self) -> DedupKey | None:
        return DedupKey("one")


class Log:
    def __init__(self) -> None:
        self.ran: list[tuple[str, ULID | None]] = []
        self.gate = asyncio.Event()
        self.gate.set()


def batch_worker(store: PostgresStore, log: Log, fail: set[str]) -> Worker[None]:
    async def part(task: Part, ctx: Context[None], app: None) -> Outcome:
        if task.name in fail:  # at once, gate or not
            log.ran.append((task.name, ctx.batch_id))
            raise TaskError.permanent(f"{task.name} failed")
        await log.gate.wait()
        log.ran.append((task.name, ctx.batch_id))
        return Outcome.completed()

    def callback(name: str) -> Callable[[Any, Context[None], None], Awaitable[Outcome]]:
        async def handle(task: Any, ctx: Context[None], app: None) -> Outcome:
            log.ran.append((name, ctx.batch_id))
            return Outcome.completed()

        return handle

    worker: Worker[None] = Worker(None, store, concurrency=4)
    worker.register(Part, part)
    worker.register(Then, callback("then"))
    worker.register(Catch, callback("catch"))
    worker.register(Finally, callback("finally"))
    return worker


async def callback_statuses(store: PostgresStore, batch_id: ULID) -> dict[str, str]:
    rows = await store._pool_or_raise().fetch(
        f"SELECT batch_callback, status FROM {store.prefix}_jobs "
        "WHERE batch_id = $1 AND batch_callback IS NOT NULL",
        batch_id.to_uuid(),
    )
    return {r["batch_callback"]: r["status"] for r in rows}


async def finished(queue: Queue, batch_id: ULID) -> BatchStatus:
    async def check() -> bool:
        status = await queue.batch_status(batch_id)
        return status is not None and status.finished

    await until(check)
    status = await queue.batch_status(batch_id)
    assert status is not None
    return status


async def test_then_and_finally_run_once_after_every_member_completed(queue: Queue) -> None:
    batch = queue.batch("statements").add(*(Part(f"p{i}") for i in range(20)))
    batch_id = await batch.then(Then()).catch(Catch()).finally_(Finally()).enqueue()
    status = await queue.batch_status(batch_id)
    assert status is not None
    assert (status.total, status.pending, status.done, status.percent) == (20, 20, 0, 0)
    assert await callback_statuses(queue.store, batch_id) == {
        "then": "waiting",
        "catch": "waiting",
        "finally": "waiting",
    }
    log = Log()
    async with running(batch_worker(queue.store, log, set())):
        status = await finished(queue, batch_id)

        async def callbacks_ran() -> bool:
            return {"then", "finally"} <= {name for name, _ in log.ran}

        await until(callbacks_ran)
    assert (status.done, status.failed, status.cancelled, status.pending) == (20, 0, 0, 0)
    assert status.percent == 100 and status.failed_at is None and status.cancelled_at is None
    names = [name for name, _ in log.ran]
    assert sorted(names) == sorted([f"p{i}" for i in range(20)] + ["then", "finally"])
    # Callbacks only after the last member; every run saw its batch.
    assert set(names[-2:]) == {"then", "finally"}
    assert {b for _, b in log.ran} == {batch_id}
    assert await callback_statuses(queue.store, batch_id) == {
        "then": "completed",
        "catch": "cancelled",
        "finally": "completed",
    }


async def test_first_failure_runs_catch_and_cancels_members_not_started(queue: Queue) -> None:
    """Without allow_failures: `catch` at the first failure, the members not started yet
    end cancelled (journaled), `then` never runs, `finally` runs once nothing is running."""
    batch = queue.batch("fragile").add(Part("bad"), *(Part(f"p{i}") for i in range(30)))
    batch_id = await batch.then(Then()).catch(Catch()).finally_(Finally()).enqueue()
    log = Log()
    log.gate.clear()  # the good members hold until "bad" has failed and cancelled the rest
    async with running(batch_worker(queue.store, log, {"bad"})):

        async def stopped() -> bool:
            s = await queue.batch_status(batch_id)
            return s is not None and s.cancelled_at is not None

        await until(stopped)
        log.gate.set()
        status = await finished(queue, batch_id)

        async def callbacks_ran() -> bool:
            # Both released (catch at the failure, finally at the end): either may start
            # first, and the worker must not stop between them.
            return {"catch", "finally"} <= {n for n, _ in log.ran}

        await until(callbacks_ran)
    assert status.failed == 1 and status.failed_at is not None
    assert status.cancelled_at is not None and status.state == "failed"
    assert status.done + status.failed + status.cancelled == 31
    # Only what the worker held when "bad" failed ran: its 4 slots and what it prefetched.
    assert status.cancelled >= 31 - 1 - 8 and status.done == 31 - 1 - status.cancelled
    names = [n for n, _ in log.ran]
    assert names.count("catch") == 1 and names.count("finally") == 1 and "then" not in names
    assert await callback_statuses(queue.store, batch_id) == {
        "then": "cancelled",
        "catch": "completed",
        "finally": "completed",
    }
    cancelled = await queue.store._pool_or_raise().fetch(
        f"SELECT id FROM {queue.store.prefix}_jobs WHERE batch_id = $1 AND status = 'cancelled' "
        "AND batch_callback IS NULL",
        batch_id.to_uuid(),
    )
    assert len(cancelled) == status.cancelled
    journal = await queue.job_journal(ULID.from_bytes(cancelled[0]["id"].bytes))
    assert [e.outcome for e in journal] == [JournalOutcome.CANCELLED]
    # The batch's id as everything else shows it (a ULID), not the uuid column's text.
    assert journal[0].note == f"batch {batch_id} cancelled"


async def test_allow_failures_keeps_going_and_then_does_not_run(queue: Queue) -> None:
    batch = queue.batch("tolerant").add(*(Part(f"p{i}") for i in range(10)), Part("bad"))
    batch_id = await (
        batch.then(Then()).catch(Catch()).finally_(Finally()).allow_failures().enqueue()
    )
    log = Log()
    async with running(batch_worker(queue.store, log, {"bad"})):
        status = await finished(queue, batch_id)

        async def callbacks_ran() -> bool:
            return {"catch", "finally"} <= {n for n, _ in log.ran}  # either may start first

        await until(callbacks_ran)
    assert (status.done, status.failed, status.cancelled) == (10, 1, 0)
    assert status.cancelled_at is None and status.failed_at is not None
    names = [n for n, _ in log.ran]
    assert names.count("catch") == 1 and names.count("finally") == 1 and "then" not in names


async def test_cancel_batch_skips_members_not_started(queue: Queue) -> None:
    batch_id = await (
        queue.batch("cancelled")
        .add(*(Part(f"p{i}") for i in range(50)))
        .then(Then())
        .finally_(Finally())
        .enqueue()
    )
    assert await queue.cancel_batch(batch_id) == 50
    status = await queue.batch_status(batch_id)
    assert status is not None and status.finished
    assert (status.cancelled, status.pending, status.percent) == (50, 0, 100)
    assert await callback_statuses(queue.store, batch_id) == {
        "then": "cancelled",
        "finally": "pending",
    }
    assert await queue.cancel_batch(batch_id) == 0  # finished: nothing more to skip
    with pytest.raises(LookupError, match="no such batch"):
        await queue.cancel_batch(ULID())
    with pytest.raises(ValueError, match="expected a ULID"):
        await queue.cancel_batch("not-an-id")


async def test_cancel_while_members_run_finishes_when_they_do(queue: Queue) -> None:
    batch_id = await (
        queue.batch("midway").add(*(Part(f"p{i}") for i in range(12))).finally_(Finally())
    ).enqueue()
    log = Log()
    log.gate.clear()  # handlers hold until released
    worker = batch_worker(queue.store, log, set())

    async def four_running() -> bool:
        n = await queue.store._pool_or_raise().fetchval(
            f"SELECT count(*) FROM {queue.store.prefix}_jobs WHERE batch_id = $1 "
            "AND status = 'claimed'",
            batch_id.to_uuid(),
        )
        return bool(n >= 4)

    async with running(worker):
        await until(four_running)
        skipped = await queue.cancel_batch(batch_id)
        mid = await queue.batch_status(batch_id)
        assert mid is not None and not mid.finished and mid.pending == 12 - skipped
        log.gate.set()
        status = await finished(queue, batch_id)

        async def finally_ran() -> bool:
            return "finally" in [n for n, _ in log.ran]

        await until(finally_ran)
    assert status.done == 12 - skipped and status.cancelled == skipped
    assert skipped <= 8  # the 4 running (and any prefetched) were not skipped


def one_slot_worker(
    store: PostgresStore, log: Log, holds: dict[str, asyncio.Event], fail: str | None = None
) -> Worker[None]:
    """One slot, prefetch on (the default): the members named in `holds` wait for their
    event once started (`fail` then fails for good); the others are done at once, so the
    worker learns to claim ahead of its slot."""

    async def part(task: Part, ctx: Context[None], app: None) -> Outcome:
        log.ran.append((task.name, ctx.batch_id))
        if task.name in holds:
            await holds[task.name].wait()
        if task.name == fail:
            raise TaskError.permanent(f"{task.name} failed")
        return Outcome.completed()

    worker: Worker[None] = Worker(None, store, concurrency=1)
    worker.register(Part, part)
    return worker


def prefetched_behind(
    queue: Queue, batch_id: ULID, log: Log, name: str
) -> Callable[[], Awaitable[bool]]:
    """`name` runs, and later members wait claimed (prefetched) behind it."""

    async def check() -> bool:
        n = await queue.store._pool_or_raise().fetchval(
            f"SELECT count(*) FROM {queue.store.prefix}_jobs WHERE batch_id = $1 "
            "AND status = 'claimed'",
            batch_id.to_uuid(),
        )
        return name in [n for n, _ in log.ran] and bool(n >= 2)

    return check


def pending_left(queue: Queue, batch_id: ULID, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        status = await queue.batch_status(batch_id)
        return status is not None and status.pending == n

    return check


async def test_cancel_batch_skips_the_members_a_worker_claimed_ahead(queue: Queue) -> None:
    """Members prefetched (claimed, not started) when the batch is cancelled never run: the
    worker hears the cancellation and the database cancels them."""
    batch_id = await queue.batch("ahead").add(*(Part(f"p{i}") for i in range(40))).enqueue()
    log = Log()
    release = asyncio.Event()
    async with running(one_slot_worker(queue.store, log, {"p5": release})):
        await until(prefetched_behind(queue, batch_id, log, "p5"))
        skipped = await queue.cancel_batch(batch_id)
        await until(pending_left(queue, batch_id, 1))  # p5 alone, still running
        release.set()
        status = await finished(queue, batch_id)
    assert [n for n, _ in log.ran] == [f"p{i}" for i in range(6)]
    assert (status.done, status.failed, status.cancelled) == (6, 0, 34)
    assert status.state == "cancelled"
    assert skipped < 34  # the prefetched ones were claimed, not pending: the worker's part
    rows = await queue.store._pool_or_raise().fetch(
        f"SELECT run_count, claim_token FROM {queue.store.prefix}_jobs "
        "WHERE batch_id = $1 AND status = 'cancelled'",
        batch_id.to_uuid(),
    )
    assert len(rows) == 34
    assert all(r["run_count"] == 0 and r["claim_token"] is None for r in rows)


async def test_a_first_failure_skips_the_members_a_worker_claimed_ahead(queue: Queue) -> None:
    batch_id = await queue.batch("ahead").add(*(Part(f"p{i}") for i in range(40))).enqueue()
    log = Log()
    fail_now, finish_p6 = asyncio.Event(), asyncio.Event()
    worker = one_slot_worker(queue.store, log, {"p5": fail_now, "p6": finish_p6}, fail="p5")
    async with running(worker):
        await until(prefetched_behind(queue, batch_id, log, "p5"))
        fail_now.set()  # p5 fails for good; p6 takes the slot and holds it
        await until(pending_left(queue, batch_id, 1))  # p6 alone: the rest were skipped
        finish_p6.set()
        status = await finished(queue, batch_id)
    assert [n for n, _ in log.ran] == [f"p{i}" for i in range(7)]
    assert (status.done, status.failed, status.cancelled) == (6, 1, 33)


async def test_a_member_retried_after_its_batch_stopped_runs_on_a_worker_that_heard_the_stop(
    queue: Queue,
) -> None:
    """The worker remembers the batch's cancellation (for members whose claim's reply comes
    late), but a member retried since is claimed after it, and runs."""
    batch_id = await queue.batch("again").add(Part("bad"), Part("p1")).enqueue()
    failing = {"bad"}
    ran: list[str] = []

    async def part(task: Part, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.name)
        if task.name in failing:
            raise TaskError.permanent(f"{task.name} failed")
        return Outcome.completed()

    worker: Worker[None] = Worker(None, queue.store, concurrency=1)
    worker.register(Part, part)
    async with running(worker):
        status = await finished(queue, batch_id)
        assert status.state == "failed"
        (bad,) = await queue.failed()
        failing.clear()
        await queue.retry(bad.id)
        await until_status(queue, bad.id, JobStatus.COMPLETED)
    assert ran.count("bad") == 2


async def test_retrying_a_failed_member_recounts_it_and_runs_no_callback_twice(
    queue: Queue,
) -> None:
    batch_id = await (
        queue.batch("retry")
        .add(Part("bad"), Part("good"))
        .then(Then())
        .catch(Catch())
        .finally_(Finally())
        .allow_failures()
        .enqueue()
    )
    log = Log()
    fail = {"bad"}
    async with running(batch_worker(queue.store, log, fail)):
        status = await finished(queue, batch_id)
        assert (status.done, status.failed) == (1, 1)
        bad = (await queue.failed())[0]
        fail.clear()
        assert status.state == "failed"
        await queue.retry(bad.id)
        again = await queue.batch_status(batch_id)
        assert again is not None and (again.failed, again.pending) == (0, 1)
        assert again.state == "running"  # not "succeeded" while a member is to run

        async def recounted() -> bool:
            s = await queue.batch_status(batch_id)
            return s is not None and s.done == 2

        await until(recounted)
        end = await queue.batch_status(batch_id)
        assert end is not None and end.state == "succeeded"
    names = [n for n, _ in log.ran]
    # Decided once, at the first finish: then stays dropped, nothing ran twice.
    assert names.count("catch") == 1 and names.count("finally") == 1 and "then" not in names


async def test_an_empty_batch_finishes_at_once(queue: Queue) -> None:
    batch_id = await queue.batch("empty").then(Then()).catch(Catch()).enqueue()
    status = await queue.batch_status(batch_id)
    assert status is not None and status.finished and status.percent == 100
    assert await callback_statuses(queue.store, batch_id) == {
        "then": "pending",
        "catch": "cancelled",
    }


async def test_a_rolled_back_transaction_leaves_no_batch(queue: Queue, pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        batch_id = await queue.batch("tx").add(Part("a"), Part("b")).then(Then()).enqueue(conn=conn)
        await tx.rollback()
    finally:
        await conn.close()
    assert await queue.batch_status(batch_id) is None
    assert await queue.jobs() == []


async def test_bad_batches_are_refused_with_nothing_stored(queue: Queue) -> None:
    with pytest.raises(ValueError, match="batch name"):
        queue.batch("  ")
    with pytest.raises(ValueError, match="without NUL"):  # was asyncpg's error, at enqueue
        queue.batch("nul:\x00:end")
    with pytest.raises(TypeError, match=r"expected a venturi\.Task"):
        queue.batch("x").add("not a task")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="then is set already"):
        queue.batch("x").then(Then()).then(Then())
    with pytest.raises(ValueError, match="dedup key"):
        await queue.batch("x").add(Part("a"), Merging()).enqueue()
    batch = queue.batch("once").add(Part("a"))
    await batch.enqueue()
    with pytest.raises(RuntimeError, match="enqueued already"):
        await batch.enqueue()
    with pytest.raises(RuntimeError, match="enqueued already"):
        batch.add(Part("late"))  # would be silently left out
    assert len(await queue.jobs()) == 1
    assert len(await queue.recent_batches(10)) == 1


async def test_recent_batches_newest_first_and_pruning(queue: Queue) -> None:
    ids = [await queue.batch(f"b{i}").add(Part(f"p{i}")).enqueue() for i in range(5)]
    recent = await queue.recent_batches(3)
    assert [b.id for b in recent] == ids[::-1][:3]
    page = await queue.recent_batches(3, before=recent[-1].id)
    assert [b.id for b in page] == ids[::-1][3:]
    for batch_id in ids[:3]:
        await queue.cancel_batch(batch_id)  # finished now
    assert await queue.prune_batches(timedelta(hours=1)) == 0
    await queue.store._pool_or_raise().execute(
        f"UPDATE {queue.store.prefix}_batches SET finished_at = now() - interval '2 hours' "
        "WHERE finished_at IS NOT NULL"
    )
    assert await queue.prune_batches(timedelta(hours=1)) == 3
    assert [b.id for b in await queue.recent_batches(10)] == ids[::-1][:2]
    # The jobs of a pruned batch stay; settling them counts nothing anywhere.
    assert len(await queue.jobs()) == 5


@pytest.fixture
def venturi_worker() -> WorkerFactory:
    def build(store: PostgresStore) -> Worker[None]:
        return batch_worker(store, RAN, set())

    return build


RAN = Log()


async def test_run_jobs_runs_a_batch_and_its_callbacks(
    venturi_queue: Queue, venturi_jobs: Jobs
) -> None:
    RAN.ran.clear()
    await (
        venturi_queue.batch("t")
        .add(Part("a"), Part("b"))
        .then(Then())
        .finally_(Finally())
        .enqueue()
    )
    assert await venturi_jobs.run_jobs() == 4
    assert sorted(n for n, _ in RAN.ran) == ["a", "b", "finally", "then"]
    assert (await venturi_jobs.queued_jobs()) == []


async def test_result_of_a_cancelled_member_or_dropped_callback_ends_the_wait(
    queue: Queue,
) -> None:
    from venturi import JobStateError

    batch_id = await queue.batch("awaited").add(Part("a")).then(Then()).enqueue()
    member = (await queue.jobs())[-1]
    then = next(j for j in await queue.jobs() if j.kind == Then.KIND)
    assert member.kind == Part.KIND and then.batch_id == batch_id == member.batch_id
    waits = [
        asyncio.create_task(queue.result(member.id, timeout=30)),
        asyncio.create_task(queue.result(then.id, timeout=30)),
    ]

    async def both_awaited() -> bool:
        n = await queue.store._pool_or_raise().fetchval(
            f"SELECT count(*) FROM {queue.store.prefix}_jobs WHERE awaited"
        )
        return bool(n == 2)

    await until(both_awaited)
    assert await queue.cancel_batch(batch_id) == 1
    for wait in waits:
        with pytest.raises(JobStateError, match="cancelled"):
            await wait


async def test_retention_prunes_finished_batches_and_cancelled_jobs(queue: Queue) -> None:
    from venturi import Retention
    from venturi._maintenance.cleaner import RetentionCleaner

    old = await queue.batch("old").add(Part("a"), Part("b")).enqueue()
    new = await queue.batch("new").add(Part("c")).enqueue()
    await queue.cancel_batch(old)
    await queue.cancel_batch(new)
    pool = queue.store._pool_or_raise()
    prefix = queue.store.prefix
    await pool.execute(
        f"UPDATE {prefix}_batches SET finished_at = now() - interval '3 days' WHERE id = $1",
        old.to_uuid(),
    )
    await pool.execute(
        f"UPDATE {prefix}_jobs SET finished_at = now() - interval '3 days' WHERE batch_id = $1",
        old.to_uuid(),
    )
    await RetentionCleaner(Retention(completed=timedelta(days=1))).run_once(queue.store)
    assert len(await queue.recent_batches(10)) == 2  # neither named: both kept
    assert len(await queue.jobs()) == 3
    cleaner = RetentionCleaner(Retention(batches=timedelta(days=1), cancelled=timedelta(days=1)))
    await cleaner.run_once(queue.store)
    assert [b.id for b in await queue.recent_batches(10)] == [new]
    assert [j.batch_id for j in await queue.jobs()] == [new]


SEEN_BY_HOOK: list[ULID | None] = []


@dataclass
class Fragile(Task):
    KIND = "batch_fragile"

    async def failed(self, error: BaseException, ctx: Context[None], app: None) -> None:
        SEEN_BY_HOOK.append(ctx.batch_id)


async def test_the_failure_hook_of_a_member_sees_its_batch(queue: Queue) -> None:
    async def fail(task: Fragile, ctx: Context[None], app: None) -> Outcome:
        raise TaskError.permanent("no")

    SEEN_BY_HOOK.clear()
    batch_id = await queue.batch("hooked").add(Fragile()).enqueue()
    worker: Worker[None] = Worker(None, queue.store, concurrency=1)
    worker.register(Fragile, fail)
    async with running(worker):
        await finished(queue, batch_id)

        async def hook_ran() -> bool:
            return bool(SEEN_BY_HOOK)

        await until(hook_ran)
    assert [batch_id] == SEEN_BY_HOOK


@dataclass
class Shuffled(Task):
    KIND = "batch_shuffled"
    n: int


async def test_settles_spanning_several_batches_never_deadlock(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Six batches whose members run interleaved on three workers: settles that span the
    same batches lock their rows in one order (without it, PostgreSQL saw deadlocks here in
    most runs, and the settles were retried as an outage)."""
    rng = random.Random(7)
    ids = [
        await queue.batch(f"b{b}").add(*(Shuffled(i) for i in range(300))).enqueue()
        for b in range(6)
    ]
    await queue.store._pool_or_raise().execute(  # the batches' members interleave in claims
        f"UPDATE {queue.store.prefix}_jobs SET run_at = now() - random() * interval '1 minute'"
    )

    async def handle(task: Shuffled, ctx: Context[None], app: None) -> Outcome:
        await asyncio.sleep(rng.random() * 0.004)  # so they finish out of order
        return Outcome.completed()

    workers: list[Worker[None]] = []
    for _ in range(3):
        worker: Worker[None] = Worker(None, queue.store, concurrency=16)
        worker.register(Shuffled, handle)
        workers.append(worker)
    caplog.set_level(logging.WARNING)
    async with running(workers[0]), running(workers[1]), running(workers[2]):
        for batch_id in ids:
            status = await finished(queue, batch_id)
            assert status.done == 300
    assert [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage()] == []


def _status(**figures: Any) -> BatchStatus:
    at = datetime(2026, 12, 6, tzinfo=UTC)
    base: dict[str, Any] = dict(
        id=ULID(),
        name="b",
        created_at=at,
        allow_failures=False,
        total=2,
        pending=0,
        done=0,
        failed=0,
        cancelled=0,
        failed_at=None,
        cancelled_at=None,
        finished_at=at,
    )
    for name, value in figures.items():
        base[name] = at if value is True else value
    return BatchStatus(**base)


@pytest.mark.parametrize(
    ("figures", "state"),
    [
        (dict(pending=2, finished_at=None), "running"),
        (dict(done=2), "succeeded"),
        (dict(done=1, failed=1, failed_at=True, cancelled_at=True), "failed"),
        # ... its failed member retried: running again, then what it ends as. The first
        # failure skipped nothing (the other member had started): nothing was cancelled.
        (dict(done=1, pending=1, failed_at=True, cancelled_at=True), "running"),
        (dict(done=2, failed_at=True, cancelled_at=True), "succeeded"),
        # The first failure skipped a member: cancelling while one runs, cancelled at the end
        # once the failed one is retried and completed.
        (dict(pending=1, cancelled=1, failed_at=True, cancelled_at=True), "cancelling"),
        (dict(done=1, cancelled=1, failed_at=True, cancelled_at=True), "cancelled"),
        # cancel_batch by hand: cancelled even when every member had started by then.
        (dict(pending=1, done=1, cancelled_at=True, finished_at=None), "cancelling"),
        (dict(done=2, cancelled_at=True), "cancelled"),
    ],
)
def test_a_batch_s_state_reads_its_members_as_they_stand(
    figures: dict[str, Any], state: str
) -> None:
    assert _status(**figures).state == state
