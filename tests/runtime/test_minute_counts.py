"""Jobs done and failed per minute: counted by the statement that settles or recovers them,
sharded by backend, summed on read, pruned after two hours by whoever settles."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, TaskError, Worker
from venturi._records import ClaimedJob, Recovery, Settlement, StaleJob

from .helpers import running, until


@dataclass
class Step(Task):
    KIND = "step"
    action: str


@dataclass
class Other(Task):
    KIND = "other"


async def claim(store: PostgresStore, queue: str, kinds: list[str], n: int) -> list[ClaimedJob]:
    return await store.claim(
        queues=[queue], kinds=kinds, limit=n, worker="w", pod=None, default_lease_s=60
    )


async def minute_rows(store: PostgresStore) -> list[asyncpg.Record]:
    return list(
        await store._pool.fetch(
            f"SELECT minute, queue, kind, slot, done, failed FROM {store.prefix}_minute_counts "
            "ORDER BY minute, queue, kind, slot"
        )
    )


async def test_a_workers_outcomes_are_counted_per_queue_and_kind(store: PostgresStore) -> None:
    async def handle(task: Step, ctx: Context[None], app: None) -> Outcome:
        if task.action == "dead":
            raise TaskError.permanent("no")
        if task.action == "retry" and ctx.run_count == 1:
            raise RuntimeError("once")  # a failed execution that runs again: not "failed"
        return Outcome.completed()

    async def done(task: Other, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    high, default = Queue(store, queue="high"), Queue(store)
    await high.enqueue_many(Step(a) for a in ["ok", "ok", "ok", "dead", "retry"])
    await high.enqueue(Other())
    await default.enqueue_many(Step(a) for a in ["ok", "dead", "dead"])
    assert (await default.stats()).done_last_hour == 0

    worker = Worker(None, store, concurrency=4, queues=["high", "default"])
    worker.register(Step, handle)
    worker.register(Other, done)
    async with running(worker):

        async def finished() -> bool:
            s = await default.stats()
            return s.completed + s.dead == 9

        await until(finished)

    stats = await default.stats()
    h, d = stats.queues["high"], stats.queues["default"]
    assert h.done_last_hour_by_kind == {"step": 4, "other": 1}
    assert h.failed_last_hour_by_kind == {"step": 1}
    assert d.done_last_hour_by_kind == {"step": 1}
    assert d.failed_last_hour_by_kind == {"step": 2}
    assert (stats.done_last_hour, stats.failed_last_hour) == (6, 3)
    assert stats.done_last_hour_by_kind == {"step": 5, "other": 1}

    series = await default.finished_per_minute()
    assert sum(m.done for m in series) == 6 and sum(m.failed for m in series) == 3
    assert {(m.queue, m.kind) for m in series} == {
        ("high", "step"),
        ("high", "other"),
        ("default", "step"),
    }
    assert all(m.minute.second == 0 and m.minute.microsecond == 0 for m in series)
    with pytest.raises(ValueError, match="invalid queue name 'no spaces'"):
        await default.finished_per_minute("no spaces")
    only_high = await default.finished_per_minute("high")
    assert {m.queue for m in only_high} == {"high"}
    assert sum(m.done for m in only_high) == 5

    # The counts outlive the jobs: a cleanup lowers completed, not the last hour's throughput.
    await store._pool.execute(f"DELETE FROM {store.prefix}_jobs")
    after = await default.stats()
    assert (after.completed, after.done_last_hour, after.failed_last_hour) == (0, 6, 3)


async def test_counts_are_written_by_the_settle_itself_in_its_backends_slot(
    store: PostgresStore,
) -> None:
    await Queue(store).enqueue_many(Step("ok") for _ in range(3))
    jobs = await claim(store, "default", ["step"], 3)
    async with store._pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        tx = conn.transaction()
        await tx.start()
        mine = store.using(conn)
        owned = await mine.settle(
            [Settlement.of(jobs[0], "completed"), Settlement.of(jobs[1], "dead")], worker="w"
        )
        assert len(owned) == 2
        # Rolled back with the settle: the jobs are claimed still, and nothing was counted.
        await tx.rollback()
        assert await minute_rows(store) == []
        tx = conn.transaction()
        await tx.start()
        await mine.settle(
            [Settlement.of(jobs[0], "completed"), Settlement.of(jobs[1], "dead")], worker="w"
        )
        await tx.commit()
    [row] = await minute_rows(store)
    assert (row["queue"], row["kind"], row["done"], row["failed"]) == ("default", "step", 1, 1)
    assert row["slot"] == pid % 16  # this backend's slot: not a row every worker writes
    # A job handed back unrun or paused is neither done nor failed.
    await store.settle([Settlement.of(jobs[2], "paused")], worker="w")
    rows = await minute_rows(store)
    assert sum(r["done"] + r["failed"] for r in rows) == 2


async def test_a_job_the_backstop_kills_counts_as_failed(store: PostgresStore) -> None:
    await Queue(store, queue="bulk").enqueue(Step("hang"))
    await claim(store, "bulk", ["step"], 1)
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET lease_until = now() - interval '1 second'"
    )

    def kill(stale: list[StaleJob]) -> list[Recovery]:
        return [Recovery(s.id, True, 0.0, "backstop") for s in stale]

    [recovered] = await store.recover_stale(kill, queues=["bulk"], worker="w")
    assert recovered.status == "dead"
    stats = await Queue(store).stats()
    assert stats.queues["bulk"].failed_last_hour_by_kind == {"step": 1}
    assert stats.queues["bulk"].done_last_hour == 0


async def test_old_minutes_leave_the_hour_then_are_pruned_by_a_settle(
    store: PostgresStore,
) -> None:
    table = f"{store.prefix}_minute_counts"
    await store._pool.execute(
        f"INSERT INTO {table} (minute, queue, kind, slot, done, failed) VALUES "
        "(date_trunc('minute', now()) - interval '3 hours', 'default', 'step', 1, 50, 5), "
        "(date_trunc('minute', now()) - interval '90 minutes', 'default', 'step', 2, 7, 1), "
        "(date_trunc('minute', now()) - interval '10 minutes', 'default', 'step', 3, 2, 0)"
    )
    queue = Queue(store)
    stats = await queue.stats()
    assert (stats.done_last_hour, stats.failed_last_hour) == (2, 0)  # the hour's minutes only
    series = await queue.finished_per_minute()
    assert [(m.done, m.failed) for m in series] == [(7, 1), (2, 0)]  # two hours, oldest first
    assert series[1].minute - series[0].minute == timedelta(minutes=80)

    await queue.enqueue_many(Step("ok") for _ in range(2))
    jobs = await claim(store, "default", ["step"], 2)
    store._prune_due = float("inf")  # not due: settles leave old minutes alone
    await store.settle([Settlement.of(jobs[0], "completed")], worker="w")
    assert len([r for r in await minute_rows(store) if r["done"] == 50]) == 1
    store._prune_due = 0.0  # due: this settle deletes what is older than two hours
    await store.settle([Settlement.of(jobs[1], "completed")], worker="w")
    rows = await minute_rows(store)
    assert [(r["slot"], r["done"]) for r in rows if r["slot"] in (1, 2, 3)][:2] == [(2, 7), (3, 2)]
    assert sum(r["done"] for r in rows) == 7 + 2 + 2  # the 3-hour-old minute is gone
    assert store._prune_due > 0.0  # the next prune waits a while
