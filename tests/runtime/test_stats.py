"""stats() reads trigger-kept counts: they must always equal a direct count of the table."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from venturi import (
    CleanupCriteria,
    Context,
    Outcome,
    PostgresStore,
    Queue,
    Stats,
    Task,
    TaskError,
    Worker,
    WorkerIdentity,
)
from venturi._db import sql
from venturi._records import ClaimedJob, Recovery, SettledAs, Settlement, StaleJob
from venturi._stats import stats_from_rows

from .helpers import migrate_before, migrations_from, running, until


@dataclass
class Mixed(Task):
    KIND = "mixed"
    action: str


@dataclass
class Other(Task):
    KIND = "other"


async def direct_counts(queue: Queue) -> dict[tuple[str, str], int]:
    pool = queue.store._pool  # the test reads the table directly to check the counters
    rows = await pool.fetch(
        f"SELECT kind, status, count(*) FROM {queue.store.prefix}_jobs GROUP BY 1, 2"
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def test_counts_match_the_table_through_the_whole_lifecycle(queue: Queue) -> None:
    async def handle(task: Mixed, ctx: Context[None], app: None) -> Outcome:
        if task.action == "dead":
            raise TaskError.permanent("no")
        if task.action == "pause" and ctx.run_count == 1:
            return Outcome.pause_in(0)
        return Outcome.completed()

    await queue.enqueue_many(Mixed(a) for a in ["ok", "dead", "pause"] * 20)
    await queue.enqueue_in(Mixed("ok"), timedelta(hours=1))
    await queue.enqueue(Other())
    stats = await queue.stats()
    assert stats.pending_by_kind == {"mixed": 60, "other": 1}
    assert stats.scheduled_by_kind == {"mixed": 1}
    assert stats.oldest_pending_age_by_kind.keys() == {"mixed", "other"}

    worker = Worker(None, queue.store, concurrency=4)
    worker.register(Mixed, handle)
    async with running(worker):

        async def drained() -> bool:
            s = await queue.stats()
            return s.pending_by_kind.get("mixed", 0) == 0 and s.claimed == 0

        await until(drained)

    stats = await queue.stats()
    counts = await direct_counts(queue)
    assert counts == {
        ("mixed", "completed"): 40,
        ("mixed", "dead"): 20,
        ("mixed", "pending"): 1,
        ("other", "pending"): 1,
    }
    assert stats.pending_by_kind == {"other": 1}
    assert stats.scheduled_by_kind == {"mixed": 1}
    # mixed's one pending job is not due yet: no age, where the oldest pending job is probed
    assert stats.oldest_pending_age_by_kind.keys() == {"other"}
    assert stats.dead_by_kind == {"mixed": 20}
    assert stats.completed_by_kind == {"mixed": 40}
    assert (stats.completed, stats.dead) == (40, 20)
    assert stats.claimed_by_kind == {}

    soon = datetime.now(UTC) + timedelta(minutes=1)
    assert await queue.cleanup(CleanupCriteria(finished_before=soon)) == 60
    after = await queue.stats()
    assert (after.dead_by_kind, after.completed_by_kind) == ({}, {})
    assert await direct_counts(queue) == {("mixed", "pending"): 1, ("other", "pending"): 1}


async def test_claimed_by_pod_counts_what_each_pod_holds(queue: Queue) -> None:
    release = asyncio.Event()

    async def hold(task: Other, ctx: Context[None], app: None) -> Outcome:
        await release.wait()
        return Outcome.completed()

    assert await queue.claimed_by_pod() == {}
    await queue.enqueue_many(Other() for _ in range(5))
    workers = [
        Worker(
            None, queue.store, concurrency=c, identity=WorkerIdentity("h", 1, pod), prefetch=False
        )
        for c, pod in ((3, "worker-a"), (2, "worker-b"))
    ]
    outside = Worker(None, queue.store, concurrency=1, identity=WorkerIdentity("h", 2))
    for w in (*workers, outside):
        w.register(Other, hold)
    async with running(workers[0]), running(workers[1]):

        async def claimed() -> bool:
            return (await queue.stats()).claimed == 5

        await until(claimed)
        assert await queue.claimed_by_pod() == {"worker-a": 3, "worker-b": 2}
        release.set()

        async def idle() -> bool:
            return (await queue.stats()).claimed == 0

        await until(idle)
    assert await queue.claimed_by_pod() == {}

    # A worker without a pod name (outside Kubernetes) is nobody's pod.
    release.clear()
    await queue.enqueue(Other())
    async with running(outside):

        async def one_claimed() -> bool:
            return (await queue.stats()).claimed == 1

        await until(one_claimed)
        assert await queue.claimed_by_pod() == {}
        release.set()


# -- by queue ----------------------------------------------------------------------------


async def direct_counts_by_queue(queue: Queue) -> dict[tuple[str, str, str], int]:
    rows = await queue.store._pool.fetch(
        f"SELECT queue, kind, status, count(*) FROM {queue.store.prefix}_jobs GROUP BY 1, 2, 3"
    )
    return {(r[0], r[1], r[2]): r[3] for r in rows}


async def kept_counts_by_queue(queue: Queue) -> dict[tuple[str, str, str], int]:
    """The trigger-kept counters, shards summed (what stats() reads)."""
    rows = await queue.store._pool.fetch(
        f"SELECT queue, kind, status, sum(n)::bigint FROM {queue.store.prefix}_counts "
        "GROUP BY 1, 2, 3 HAVING sum(n) <> 0"
    )
    return {(r[0], r[1], r[2]): r[3] for r in rows}


async def test_stats_by_queue_follow_every_job_and_total_over_queues(store: PostgresStore) -> None:
    high, default = Queue(store, queue="high"), Queue(store)

    async def handle(task: Mixed, ctx: Context[None], app: None) -> Outcome:
        if task.action == "dead":
            raise TaskError.permanent("no")
        return Outcome.completed()

    await high.enqueue_many(Mixed(a) for a in ["ok", "ok", "dead"])
    await high.enqueue(Other())
    await high.enqueue_in(Mixed("ok"), timedelta(hours=1))
    await default.enqueue_many(Mixed("ok") for _ in range(4))
    stats = await default.stats()
    assert stats.queues.keys() == {"high", "default"}
    assert stats.queues["high"].pending_by_kind == {"mixed": 3, "other": 1}
    assert stats.queues["high"].scheduled_by_kind == {"mixed": 1}
    assert stats.queues["default"].pending_by_kind == {"mixed": 4}
    assert stats.queues["default"].scheduled_by_kind == {}
    assert stats.queues["high"].oldest_pending_age_by_kind.keys() == {"mixed", "other"}
    assert stats.queues["default"].oldest_pending_age_by_kind.keys() == {"mixed"}
    # The by-kind fields stay the totals over queues.
    assert stats.pending_by_kind == {"mixed": 7, "other": 1}
    assert stats.scheduled_by_kind == {"mixed": 1}
    assert stats.oldest_pending_age_by_kind["mixed"] == max(
        stats.queues[q].oldest_pending_age_by_kind["mixed"] for q in ("high", "default")
    )
    assert (stats.queues["high"].pending, stats.queues["high"].scheduled) == (4, 1)
    assert not stats.queues["high"].paused

    # A worker of the "high" queue only: the default queue's jobs stay where they are.
    worker = Worker(None, store, concurrency=2, queues=["high"])
    worker.register(Mixed, handle)
    async with running(worker):

        async def drained() -> bool:
            s = await default.stats()
            return s.queues["high"].pending_by_kind.get("mixed", 0) == 0 and s.claimed == 0

        await until(drained)

    stats = await default.stats()
    assert await kept_counts_by_queue(default) == await direct_counts_by_queue(default)
    high_stats = stats.queues["high"]
    assert high_stats.pending_by_kind == {"other": 1}
    assert high_stats.completed_by_kind == {"mixed": 2}
    assert high_stats.dead_by_kind == {"mixed": 1}
    assert high_stats.scheduled_by_kind == {"mixed": 1}
    assert stats.queues["default"].pending_by_kind == {"mixed": 4}
    assert stats.queues["default"].completed_by_kind == {}
    assert stats.completed_by_kind == {"mixed": 2}
    assert stats.pending_by_kind == {"mixed": 4, "other": 1}


async def test_migrating_counts_the_jobs_already_there_by_queue(pg_dsn: str, prefix: str) -> None:
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        async with store._pool.acquire() as conn, conn.transaction():
            # The schema as the previous release left it, with jobs in three queues ...
            counts_v = await migrate_before(conn, prefix, "counts_by_queue")
            await conn.execute(
                f"INSERT INTO {prefix}_jobs (id, kind, queue, status, payload) "
                "SELECT gen_random_uuid(), k, q, s, '{}' FROM unnest($1::text[], $2::text[], "
                "$3::text[]) AS r(k, q, s), generate_series(1, 3)",
                ["a", "a", "b", "a", "b"],
                ["high", "default", "default", "low", "low"],
                ["pending", "pending", "dead", "claimed", "completed"],
            )
        applied = await store.migrate()
        assert applied == migrations_from(counts_v)
        queue = Queue(store)
        assert await kept_counts_by_queue(queue) == {
            ("high", "a", "pending"): 3,
            ("default", "a", "pending"): 3,
            ("default", "b", "dead"): 3,
            ("low", "a", "claimed"): 3,
            ("low", "b", "completed"): 3,
        }
        stats = await queue.stats()
        assert stats.queues["high"].pending_by_kind == {"a": 3}
        assert stats.queues["default"].dead_by_kind == {"b": 3}
        assert stats.queues["low"].claimed_by_kind == {"a": 3}
        assert stats.pending_by_kind == {"a": 6}
        # ... and the triggers keep them from then on.
        await Queue(store, queue="low").enqueue(Other())
        assert await kept_counts_by_queue(queue) == await direct_counts_by_queue(queue)


def test_stats_rows_fold_into_queues_and_totals() -> None:
    def row(queue: str, kind: str, **figures: float | None) -> dict[str, Any]:
        columns = ("pending", "scheduled", "oldest_s", "claimed", "dead", "completed")
        return {
            "queue": queue,
            "kind": kind,
            **dict.fromkeys((*columns, "done", "failed")),
            "paused": False,
            **figures,
        }

    def paused(queue: str) -> dict[str, Any]:
        return {**row(queue, ""), "paused": True}

    stats = stats_from_rows(
        [
            row("q1", "a", pending=5, scheduled=2, oldest_s=3.0, claimed=4, completed=9, done=11),
            row("q2", "a", pending=1, oldest_s=-0.001, claimed=1, done=1),  # clock skew
            row("q2", "b", pending=2, scheduled=2, dead=7),  # all scheduled: none eligible
            row("q3", "c", failed=2),  # a queue with nothing left but its counts
            row("q5", "d", pending=0, claimed=0, completed=0),  # all counted away: not shown
            paused("q2"),
            paused("q4"),  # paused and empty: no QueueStats
        ]
    )
    assert list(stats.queues) == ["q1", "q2", "q3"]
    assert stats.paused_queues == {"q2", "q4"}
    assert stats.queues["q2"].paused and not stats.queues["q1"].paused
    assert stats.paused_by_kind == {"a": 1, "b": 2}
    assert stats.queues["q1"].done_last_hour_by_kind == {"a": 11}
    assert stats.queues["q3"].failed_last_hour_by_kind == {"c": 2}
    assert stats.queues["q3"].pending_by_kind == {}
    assert (stats.done_last_hour_by_kind, stats.failed_last_hour) == ({"a": 12}, 2)
    q1, q2 = stats.queues["q1"], stats.queues["q2"]
    assert (q1.pending_by_kind, q1.scheduled_by_kind) == ({"a": 3}, {"a": 2})
    assert q1.oldest_pending_age_by_kind == {"a": 3.0}
    assert (q2.pending_by_kind, q2.scheduled_by_kind) == ({"a": 1}, {"b": 2})
    assert q2.oldest_pending_age_by_kind == {"a": 0.0}
    assert stats.pending_by_kind == {"a": 4}
    assert stats.scheduled_by_kind == {"a": 2, "b": 2}
    assert stats.claimed_by_kind == {"a": 5}
    assert stats.dead_by_kind == {"b": 7}
    assert stats.completed_by_kind == {"a": 9}
    assert stats.oldest_pending_age_by_kind == {"a": 3.0}
    assert (stats.pending, stats.claimed, stats.oldest_pending_age) == (4, 5, 3.0)
    assert stats_from_rows([]) == Stats()


# -- the scheduled mark (counts.run_at_max) ------------------------------------------------


async def direct_pending(queue: Queue) -> dict[tuple[str, str], tuple[datetime, int]]:
    """Per (queue, kind) with pending jobs: the latest run_at, and how many are scheduled."""
    rows = await queue.store._pool.fetch(
        f"SELECT queue, kind, max(run_at), count(*) FILTER (WHERE run_at > now()) "
        f"FROM {queue.store.prefix}_jobs WHERE status = 'pending' GROUP BY 1, 2"
    )
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


async def kept_marks(queue: Queue) -> dict[tuple[str, str], datetime | None]:
    rows = await queue.store._pool.fetch(
        f"SELECT queue, kind, max(run_at_max) FROM {queue.store.prefix}_counts "
        "WHERE status = 'pending' GROUP BY 1, 2 HAVING sum(n) > 0"
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def assert_marks_bound_the_pending_jobs(queue: Queue) -> None:
    """The counts equal a recount, every pending job's run_at is at most its (queue, kind)'s
    mark, and stats() counts exactly the scheduled jobs a direct count finds."""
    assert await kept_counts_by_queue(queue) == await direct_counts_by_queue(queue)
    direct, marks = await direct_pending(queue), await kept_marks(queue)
    assert marks.keys() == direct.keys()
    for key, (latest, _) in direct.items():
        mark = marks[key]
        assert mark is not None and mark >= latest, key
    stats = await queue.stats()
    scheduled = {
        (name, kind): n
        for name, q in stats.queues.items()
        for kind, n in q.scheduled_by_kind.items()
    }
    assert scheduled == {key: n for key, (_, n) in direct.items() if n}


async def claim(store: PostgresStore, queue: str, n: int) -> list[ClaimedJob]:
    return await store.claim(
        queues=[queue], kinds=None, limit=n, worker="w", pod=None, default_lease_s=60
    )


async def test_the_scheduled_mark_bounds_every_pending_job_under_concurrent_writers(
    store: PostgresStore,
) -> None:
    queues = {name: Queue(store, queue=name) for name in ("a", "b")}
    outcomes: list[SettledAs] = ["completed", "dead", "failed", "paused", "released"]

    async def enqueue(name: str, rounds: int) -> None:
        q = queues[name]
        for i in range(rounds):
            await q.enqueue_many([Mixed("ok"), Other(), Mixed("ok")])
            if i % 3 == 0:
                await q.enqueue_in(Other(), timedelta(hours=1))

    async def work(name: str, rounds: int) -> None:
        for i in range(rounds):
            jobs = await claim(store, name, 3)
            await store.settle(
                [
                    # Retries and pauses re-pend into the future (a backoff, a snooze), or now.
                    Settlement.of(job, outcomes[(i + j) % 5], delay_s=3600.0 * ((i + j) % 2))
                    for j, job in enumerate(jobs)
                ],
                worker="w",
            )

    async def recover(name: str, rounds: int) -> None:
        def decide(stale: list[StaleJob]) -> list[Recovery]:
            return [
                Recovery(s.id, k % 3 == 0, 1800.0 * (k % 2), "gone") for k, s in enumerate(stale)
            ]

        for _ in range(rounds):
            jobs = await claim(store, name, 2)
            await store._pool.execute(
                f"UPDATE {store.prefix}_jobs SET lease_until = now() - interval '1 second' "
                "WHERE id = ANY($1::uuid[])",
                [job.id for job in jobs],
            )
            await store.recover_stale(decide, queues=[name], worker="w")

    # Every trigger path at once, from several connections (so several counter shards).
    await asyncio.gather(
        *(enqueue(name, 12) for name in queues),
        *(work(name, 10) for name in queues),
        *(recover(name, 4) for name in queues),
    )
    await assert_marks_bound_the_pending_jobs(queues["a"])

    # A reschedule keeps a job pending (no count moves) but must raise the mark.
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET run_at = now() + interval '2 hours' "
        f"WHERE id = (SELECT id FROM {store.prefix}_jobs WHERE status = 'pending' "
        "AND queue = 'a' AND run_at <= now() LIMIT 1)"
    )
    await assert_marks_bound_the_pending_jobs(queues["a"])

    # Scheduled jobs that came due (their time passed) count as eligible although the mark
    # is still ahead; and deleted jobs leave the counts.
    await store._pool.execute(
        f"UPDATE {store.prefix}_jobs SET run_at = now() - interval '1 second'"
    )
    await assert_marks_bound_the_pending_jobs(queues["a"])
    assert (await queues["a"].stats()).scheduled == 0
    soon = datetime.now(UTC) + timedelta(minutes=1)
    assert await queues["a"].cleanup(CleanupCriteria(finished_before=soon)) > 0
    await store._pool.execute(f"DELETE FROM {store.prefix}_jobs WHERE queue = 'b'")
    await assert_marks_bound_the_pending_jobs(queues["a"])


def scheduled_probes(plan: Any) -> list[int]:
    """The loops of every scan in an EXPLAIN (ANALYZE, FORMAT JSON) plan that counts
    scheduled jobs (an index condition on run_at > now())."""
    found = []
    if "run_at > now()" in plan.get("Index Cond", ""):
        found.append(plan["Actual Loops"])
    for child in plan.get("Plans", []):
        found += scheduled_probes(child)
    return found


async def test_stats_counts_scheduled_jobs_only_where_one_was_written_for_the_future(
    queue: Queue,
) -> None:
    text = sql.queries(queue.store.prefix)["stats"].text

    async def probes() -> int:
        [plan] = json.loads(
            await queue.store._pool.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}")
        )
        return sum(scheduled_probes(plan["Plan"]))

    await queue.enqueue_many(Mixed("ok") for _ in range(3))
    await Queue(queue.store, queue="high").enqueue(Other())
    assert await probes() == 0  # nothing was ever due later than now: no probe
    await queue.enqueue_in(Other(), timedelta(hours=1))
    assert await probes() == 1  # only (default, other) may hold scheduled jobs
    assert (await queue.stats()).scheduled_by_kind == {"other": 1}


async def test_migrating_marks_the_jobs_already_pending(pg_dsn: str, prefix: str) -> None:
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        async with store._pool.acquire() as conn, conn.transaction():
            await migrate_before(conn, prefix, "scheduled_high_water")
            # Jobs of the previous release: due, scheduled, and finished.
            await conn.execute(
                f"INSERT INTO {prefix}_jobs (id, kind, queue, status, payload, run_at) "
                "SELECT gen_random_uuid(), k, q, s, '{}', now() + make_interval(secs => d) "
                "FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[]) AS r(k, q, s, d)",
                ["a", "a", "a", "b", "b"],
                ["high", "high", "low", "low", "low"],
                ["pending", "pending", "pending", "pending", "completed"],
                [-5.0, 3600.0, -1.0, 7200.0, 9000.0],
            )
        await store.migrate()
        queue = Queue(store)
        stats = await queue.stats()
        assert stats.queues["high"].scheduled_by_kind == {"a": 1}
        assert stats.queues["low"].scheduled_by_kind == {"b": 1}
        assert stats.queues["low"].pending_by_kind == {"a": 1}
        await assert_marks_bound_the_pending_jobs(queue)


async def test_a_write_that_leaves_pending_jobs_due_leaves_the_counter_rows_alone(
    queue: Queue,
) -> None:
    pool, prefix = queue.store._pool, queue.store.prefix
    await queue.enqueue_many(Mixed("ok") for _ in range(3))
    counters = (
        f"SELECT queue, kind, status, shard, xmin::text FROM {prefix}_counts ORDER BY 1, 2, 3, 4"
    )
    before = await pool.fetch(counters)
    # What an await or a merge does: pending jobs stay pending, their run_at unchanged.
    await pool.execute(f"UPDATE {prefix}_jobs SET awaited = true WHERE status = 'pending'")
    assert await pool.fetch(counters) == before  # not rewritten (no churn on the counters)
    await assert_marks_bound_the_pending_jobs(queue)
