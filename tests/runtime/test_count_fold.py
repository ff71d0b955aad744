"""The leader's fold of the sharded counters: every sum readers take stays exact, each group
ends in one row, rows a writer holds are skipped without waiting, and the leader runs it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Stats, Worker
from venturi._db import sql
from venturi._records import Settlement

from .helpers import migrate_before, migrations_from, running, until
from .test_stats import (
    Mixed,
    Other,
    assert_marks_bound_the_pending_jobs,
    claim,
    direct_counts_by_queue,
    kept_counts_by_queue,
)

WAIT = 10.0  # a fold that waited on a writer would hang until the writer commits


async def rows_per_group(store: PostgresStore) -> dict[tuple[str, str, str], int]:
    rows = await store._pool.fetch(
        f"SELECT queue, kind, status, count(*) FROM {store.prefix}_counts GROUP BY 1, 2, 3"
    )
    return {(r[0], r[1], r[2]): r[3] for r in rows}


async def split_rows(store: PostgresStore, queue: str, kind: str, status: str) -> None:
    """Spread a group over more shards without changing its sum (+5 here, -5 there), as
    writers on several backends leave it."""
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_counts (queue, kind, status, shard, n) "
        "VALUES ($1, $2, $3, 101, 5), ($1, $2, $3, 102, -5), ($1, $2, $3, 103, 0)",
        queue,
        kind,
        status,
    )


def counted(stats: Stats) -> dict[str, Any]:
    """Everything stats() says but the ages (which grow between two calls)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "oldest" not in str(k)}
        return value

    return strip(dataclasses.asdict(stats))  # type: ignore[no-any-return]


async def minute_sums(store: PostgresStore) -> dict[tuple[datetime, str, str], tuple[int, int]]:
    rows = await store._pool.fetch(
        f"SELECT minute, queue, kind, sum(done)::bigint, sum(failed)::bigint "
        f"FROM {store.prefix}_minute_counts GROUP BY 1, 2, 3"
    )
    return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}


# Rounds: a fold that lost a row under a concurrent writer (PostgreSQL 18.1 did, when the fold
# was one statement) shows in about half of them.
@pytest.mark.parametrize("round_", range(8))
async def test_folds_under_concurrent_writers_keep_every_sum(
    store: PostgresStore, round_: int
) -> None:
    queues = {name: Queue(store, queue=name) for name in ("a", "b")}
    await split_rows(store, "a", "mixed", "pending")
    stop = asyncio.Event()
    folds = 0

    async def enqueue(name: str) -> None:
        for i in range(15):
            await queues[name].enqueue_many([Mixed("ok"), Other(), Mixed("ok")])
            if i % 4 == 0:
                await queues[name].enqueue_in(Other(), timedelta(hours=1))

    async def work(name: str) -> None:
        for i in range(12):
            jobs = await claim(store, name, 3)
            await store.settle(
                [
                    Settlement.of(job, ("completed", "dead", "failed")[(i + j) % 3])
                    for j, job in enumerate(jobs)
                ],
                worker="w",
            )

    async def fold() -> None:
        nonlocal folds
        while not stop.is_set():
            await store.fold_counts()
            folds += 1
            await asyncio.sleep(0)

    folding = asyncio.create_task(fold())
    await asyncio.gather(*(enqueue(n) for n in queues), *(work(n) for n in queues))
    stop.set()
    await folding
    assert folds > 1
    await assert_marks_bound_the_pending_jobs(queues["a"])

    # Quiet now: one more fold leaves one row per group, with the same sums.
    before = await kept_counts_by_queue(queues["a"])
    await store.fold_counts()
    assert set((await rows_per_group(store)).values()) == {1}
    assert await kept_counts_by_queue(queues["a"]) == before
    assert before == await direct_counts_by_queue(queues["a"])
    await assert_marks_bound_the_pending_jobs(queues["a"])


async def test_a_fold_folds_every_split_group_into_one_row(store: PostgresStore) -> None:
    queue = Queue(store, queue="a")
    await queue.enqueue_many(Mixed("ok") for _ in range(3))
    await queue.enqueue_in(Mixed("ok"), timedelta(hours=1))
    await split_rows(store, "a", "mixed", "pending")
    await split_rows(store, "a", "mixed", "claimed")
    split = await rows_per_group(store)
    assert split[("a", "mixed", "pending")] > 1
    stats = counted(await queue.stats())

    assert await store.fold_counts() == sum(n - 1 for n in split.values())
    assert set((await rows_per_group(store)).values()) == {1}
    assert counted(await queue.stats()) == stats
    assert await store.fold_counts() == 0  # nothing left to fold
    await assert_marks_bound_the_pending_jobs(queue)


async def test_a_fold_skips_the_rows_a_writer_holds_and_does_not_wait(
    store: PostgresStore, pg_dsn: str
) -> None:
    queue = Queue(store, queue="a")
    await queue.enqueue_many(Mixed("ok") for _ in range(3))
    await split_rows(store, "a", "mixed", "pending")
    writer = await asyncpg.connect(pg_dsn)
    try:
        await queue.enqueue(Mixed("ok"), conn=writer, autocommit=True)  # its shard's row
        # A caller's transaction enqueues and stays open: it holds that counter row.
        tx = writer.transaction()
        await tx.start()
        await queue.enqueue(Mixed("ok"), conn=writer)
        folded = await asyncio.wait_for(store.fold_counts(), WAIT)
        # The other rows of the group were folded, the writer's was left to it.
        assert folded >= 2
        assert (await rows_per_group(store))[("a", "mixed", "pending")] == 2
        assert (await queue.stats()).pending == 4  # the open insert is not visible yet
        await tx.commit()
    finally:
        await writer.close()
    assert (await queue.stats()).pending == 5
    await store.fold_counts()
    assert (await rows_per_group(store))[("a", "mixed", "pending")] == 1
    assert await kept_counts_by_queue(queue) == await direct_counts_by_queue(queue)


async def test_a_fold_folds_every_minute_the_current_one_too(
    store: PostgresStore,
) -> None:
    queue = Queue(store, queue="a")
    now = await store._pool.fetchval("SELECT date_trunc('minute', now())")
    # A busy hour's shape: every minute of it written from four backends' slots, the
    # current one too.
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_minute_counts (minute, queue, kind, slot, done, failed) "
        "SELECT $1::timestamptz - make_interval(mins => m), 'a', k, s, m + s, s % 2 "
        "FROM generate_series(0, 70) AS m, generate_series(0, 3) AS s, "
        "unnest(ARRAY['mixed', 'other']) AS k",
        now,
    )
    sums = await minute_sums(store)
    per_minute = await queue.finished_per_minute()
    stats = await queue.stats()

    assert await store.fold_counts() == 71 * 2 * 3
    assert await minute_sums(store) == sums
    assert await queue.finished_per_minute() == per_minute
    assert (await queue.stats()).done_last_hour == stats.done_last_hour > 0
    rows = await store._pool.fetch(
        f"SELECT minute, count(*) AS n FROM {store.prefix}_minute_counts GROUP BY 1"
    )
    assert {r["minute"]: r["n"] for r in rows} == {now - timedelta(minutes=m): 2 for m in range(71)}
    # `since` limits a fold to the minutes from then on.
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_minute_counts (minute, queue, kind, slot, done, failed) "
        "SELECT $1::timestamptz - make_interval(mins => m), 'a', 'mixed', 9, 1, 0 "
        "FROM generate_series(1, 10) AS m",
        now,
    )
    assert await store.fold_counts(now - timedelta(minutes=5)) == 5
    assert await store.fold_counts() == 5


async def test_the_leader_folds_the_counters(store: PostgresStore) -> None:
    queue = Queue(store, queue="a")
    await queue.enqueue_many(Mixed("ok") for _ in range(2))
    await split_rows(store, "a", "mixed", "pending")
    assert (await rows_per_group(store))[("a", "mixed", "pending")] == 4

    async def handle(task: Mixed, ctx: Context[None], app: None) -> Outcome:
        return Outcome.completed()

    worker = Worker(None, store, queues=["b"])  # serves another queue: only the fold acts
    worker.register(Mixed, handle)

    async def folded() -> bool:
        return (await rows_per_group(store))[("a", "mixed", "pending")] == 1

    async with running(worker):
        await until(folded)
    assert (await queue.stats()).pending == 2


async def last_hour_direct(store: PostgresStore) -> dict[tuple[str, str], tuple[int, int]]:
    """Done and failed per (queue, kind) over the minutes that began in the last hour,
    summed from the per-minute rows (what stats() reported before the leader's sums)."""
    rows = await store._pool.fetch(
        f"SELECT queue, kind, sum(done)::bigint, sum(failed)::bigint "
        f"FROM {store.prefix}_minute_counts WHERE minute > now() - interval '1 hour' "
        "GROUP BY 1, 2"
    )
    return {(r[0], r[1]): (r[2], r[3]) for r in rows if r[2] or r[3]}


def last_hour_of(stats: Stats) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        (name, kind): (
            q.done_last_hour_by_kind.get(kind, 0),
            q.failed_last_hour_by_kind.get(kind, 0),
        )
        for name, q in stats.queues.items()
        for kind in q.done_last_hour_by_kind.keys() | q.failed_last_hour_by_kind.keys()
    }


async def add_minutes(store: PostgresStore, ago: range, slots: int, kind: str = "mixed") -> None:
    await store._pool.execute(
        f"INSERT INTO {store.prefix}_minute_counts (minute, queue, kind, slot, done, failed) "
        "SELECT date_trunc('minute', now()) - make_interval(mins => m), q, $4, s, m + s + 1, "
        "(m + s) % 3 FROM generate_series($1::int, $2::int) AS m, "
        "generate_series(0, $3::int - 1) AS s, unnest(ARRAY['a', 'b']) AS q "
        "ON CONFLICT (minute, queue, kind, slot) DO UPDATE "
        "SET done = excluded.done + 1000",  # a write to a row there already
        ago.start,
        ago.stop - 1,
        slots,
        kind,
    )


async def test_the_last_hour_is_the_same_from_the_leaders_sums(store: PostgresStore) -> None:
    queue = Queue(store)
    # Two hours of minutes from four slots, the current minute and the last two too; none at
    # the window's edge (55-65 minutes ago), so a minute passing during the test moves no
    # row in or out of it.
    await add_minutes(store, range(0, 56), 4)
    await add_minutes(store, range(65, 120), 4)
    await add_minutes(store, range(3, 40), 2, kind="other")
    expected = await last_hour_direct(store)
    assert expected and last_hour_of(await queue.stats()) == expected  # no sums yet: the minutes

    await store.fold_counts()
    marks = await store._pool.fetch(f"SELECT window_start, through FROM {store.prefix}_hour_marks")
    assert len(marks) == 2
    assert await store._pool.fetchval(f"SELECT count(*) FROM {store.prefix}_hour_counts") > 0
    assert last_hour_of(await queue.stats()) == expected

    # Writes after the sum: to the minutes it left to stats() (counted at once), and a late
    # one to a minute it summed (counted from the next fold on).
    await add_minutes(store, range(0, 2), 6)
    await add_minutes(store, range(10, 11), 1)
    expected = await last_hour_direct(store)
    await store.fold_counts()
    assert last_hour_of(await queue.stats()) == expected

    # Sums of another window (a leader gone, or behind) are not used.
    await store._pool.execute(
        f"UPDATE {store.prefix}_hour_marks SET window_start = window_start - interval '5 minutes'"
    )
    await store._pool.execute(
        f"UPDATE {store.prefix}_hour_counts SET window_start = window_start - interval '5 minutes'"
    )
    assert last_hour_of(await queue.stats()) == expected


async def test_with_the_leaders_sums_stats_reads_only_the_minutes_after_them(
    store: PostgresStore,
) -> None:
    await add_minutes(store, range(0, 120), 4)
    await store.fold_counts()
    text = sql.queries(store.prefix)["stats"].text
    plan = json.loads(await store._pool.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}"))[0][
        "Plan"
    ]
    scans = minute_scans(plan)
    # The minutes after the sum's last (the current one and the two before it: 2 queues
    # each), not the hour's 120 rows per queue.
    assert scans and sum(rows for rows in scans) <= 2 * 3 * 4


def minute_scans(plan: dict[str, Any]) -> list[int]:
    """Rows read (returned plus filtered out) by every scan of the minute counts."""
    found = []
    if plan.get("Relation Name", "").endswith("_minute_counts"):
        loops = plan.get("Actual Loops", 1)
        found.append((plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops)
    for child in plan.get("Plans", []):
        found += minute_scans(child)
    return found


async def test_migrating_recounts_counts_a_fold_got_wrong_on_postgresql_18(
    pg_dsn: str, prefix: str
) -> None:
    async with await PostgresStore.connect(pg_dsn, prefix=prefix) as store:
        async with store._pool.acquire() as conn, conn.transaction():
            recount_v = await migrate_before(conn, prefix, "fold_functions_and_recount")
        queue = Queue(store)
        await queue.enqueue_many([Mixed("ok"), Other(), Mixed("ok")])
        await queue.enqueue_in(Other(), timedelta(hours=1))
        truth = await direct_counts_by_queue(queue)
        # What the one-statement fold left on PostgreSQL 18: a row summed into its group's
        # kept row and not deleted (counted twice), and a group without the row it summed.
        # (Shard 99: writers use 0-15, by backend, so the enqueues above may hold any of those.)
        await store._pool.execute(
            f"INSERT INTO {prefix}_counts (queue, kind, status, shard, n) VALUES "
            "('default', 'mixed', 'pending', 99, 2), ('default', 'other', 'pending', 99, -1)"
        )
        drifted = await kept_counts_by_queue(queue)
        assert drifted != truth
        assert await store.migrate() == migrations_from(recount_v)
        version = int(await store._pool.fetchval("SHOW server_version_num"))
        if version >= 180000:  # where a fold could drift: recounted
            assert await kept_counts_by_queue(queue) == truth
            await assert_marks_bound_the_pending_jobs(queue)
        else:  # never drifted there: the jobs table is not scanned under a lock
            assert await kept_counts_by_queue(queue) == drifted
        assert (await queue.stats()).queues["default"].scheduled_by_kind == {"other": 1}
        # The fold now runs in the functions the migration made.
        assert await store.fold_counts() >= 0
