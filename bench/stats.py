"""``python -m bench.stats``: what `Queue.stats()` costs at a big backlog, in the shapes a busy
deployment leaves its counters in, on a private server.

The backlog: ``--pending`` jobs (1,000,000) over 20 kinds and 5 queues, written as
`python -m bench` does (the API writes a template, one INSERT ... SELECT clones it). Then
stats() is timed (median of ``--calls``, after a warm-up) with the counters:

* ``clean``: as that backlog leaves them (a few writers: a few shards per group);
* ``busy``: as an hour of many backends leaves them: every (queue, kind, status) of
  pending, claimed, completed and dead in 16 shards, and two hours of per-minute counts in
  16 slots (the sums unchanged: the shards are spread, not added);
* ``busy, minutes folded``: the same after the leader's fold, with the counters written
  again since (the worst case between two folds under a heavy load on every queue and kind:
  the live counts back in 16 shards, the current minute in 16 slots);
* ``folded``: right after a fold with nothing written since;
* ``folded, a run_at per job``: the same counters, each pending job's run_at its own, as
  single enqueues write them (the clones share one per queue and kind).

The busy shapes are synthetic (a real hour of 16 busy backends would take an hour); the
rows are the ones those writers would leave, and their sums are those of the backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import asyncpg

from venturi import PostgresStore, Queue, Task
from venturi.embedded import EmbeddedPostgres

KINDS, QUEUES = 20, 5
TASKS = [
    dataclasses.make_dataclass(
        f"Noop{i}", [("n", int)], bases=(Task,), namespace={"KIND": f"noop{i}"}
    )
    for i in range(KINDS)
]


async def _preload(store: PostgresStore, conn: asyncpg.Connection, pending: int) -> None:
    per_cell = max(1, min(1000, pending // (KINDS * QUEUES)))
    for q in range(QUEUES):
        queue = Queue(store, queue=f"q{q}")
        for k in range(KINDS):
            await queue.enqueue_many(TASKS[k](n=i) for i in range(per_cell))
    have = int(await conn.fetchval(f"SELECT count(*) FROM {store.prefix}_jobs"))
    columns = [
        r["attname"]
        for r in await conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
            "AND NOT attisdropped",
            f"{store.prefix}_jobs",
        )
    ]
    sources = ", ".join("gen_random_uuid()" if c == "id" else f"t.{c}" for c in columns)
    if pending > have:
        await conn.execute(
            f"INSERT INTO {store.prefix}_jobs ({', '.join(columns)}) SELECT {sources} "
            f"FROM {store.prefix}_jobs AS t CROSS JOIN generate_series(1, "
            f"{-(-(pending - have) // have)}) AS g ORDER BY g, t.ctid LIMIT {pending - have}"
        )
    await conn.execute("ANALYZE")
    await conn.execute("CHECKPOINT")


async def _spread(conn: asyncpg.Connection, prefix: str) -> None:
    """The busy shape: each group's count in 16 shards, claimed/completed/dead rows in 16
    shards too, two hours of per-minute counts in 16 slots."""
    async with conn.transaction():
        await conn.execute(
            f"CREATE TEMP TABLE totals ON COMMIT DROP AS SELECT queue, kind, status, "
            f"sum(n) AS n, max(run_at_max) AS run_at_max FROM {prefix}_counts GROUP BY 1, 2, 3"
        )
        await conn.execute(f"DELETE FROM {prefix}_counts")
        await conn.execute(
            f"INSERT INTO {prefix}_counts (queue, kind, status, shard, n, run_at_max) "
            "SELECT queue, kind, status, s, CASE WHEN s = 0 THEN n - 15 * (n / 16) "
            "ELSE n / 16 END, run_at_max FROM totals, generate_series(0, 15) AS s"
        )
        await conn.execute(
            f"INSERT INTO {prefix}_counts (queue, kind, status, shard, n) "
            "SELECT queue, kind, st, s, CASE WHEN st = 'claimed' THEN (s % 2) * 2 - 1 "
            "ELSE 50 END FROM (SELECT DISTINCT queue, kind FROM totals) AS g, "
            "unnest(ARRAY['claimed', 'completed', 'dead']) AS st, generate_series(0, 15) AS s"
        )
    await conn.execute(
        f"INSERT INTO {prefix}_minute_counts (minute, queue, kind, slot, done, failed) "
        "SELECT date_trunc('minute', now()) - make_interval(mins => m), queue, kind, s, 7, 1 "
        f"FROM (SELECT DISTINCT queue, kind FROM {prefix}_counts) AS g, "
        "generate_series(0, 119) AS m, generate_series(0, 15) AS s ON CONFLICT DO NOTHING"
    )
    await conn.execute(f"ANALYZE {prefix}_counts")
    await conn.execute(f"ANALYZE {prefix}_minute_counts")


async def _respread_live(conn: asyncpg.Connection, prefix: str) -> None:
    """After a fold: the live counts written again from 16 backends, and the current minute
    from 16 slots (the worst a heavy load leaves between two folds)."""
    await _spread_counts_only(conn, prefix)
    await conn.execute(
        f"INSERT INTO {prefix}_minute_counts (minute, queue, kind, slot, done, failed) "
        "SELECT date_trunc('minute', now()), queue, kind, s, 7, 1 "
        f"FROM (SELECT DISTINCT queue, kind FROM {prefix}_counts) AS g, "
        "generate_series(1, 15) AS s ON CONFLICT DO NOTHING"
    )


async def _spread_counts_only(conn: asyncpg.Connection, prefix: str) -> None:
    # +1 in shards 1..15 and -15 in the kept row: 16 rows a group, the same sums.
    await conn.execute(
        f"INSERT INTO {prefix}_counts (queue, kind, status, shard, n) "
        "SELECT queue, kind, status, 100 + s, CASE WHEN s = 0 THEN -15 ELSE 1 END "
        f"FROM (SELECT DISTINCT queue, kind, status FROM {prefix}_counts) AS g, "
        "generate_series(0, 15) AS s"
    )


async def _fold(store: PostgresStore, conn: asyncpg.Connection, prefix: str) -> None:
    """The leader's fold, then the vacuum autovacuum would soon run: the first fold of a busy
    hour deletes most rows of the table, and their dead versions would be scanned until
    then (later folds delete a few rows at a time)."""
    await store.fold_counts()
    await conn.execute(f"VACUUM ANALYZE {prefix}_counts, {prefix}_minute_counts")


async def time_stats(queue: Queue, calls: int) -> float:
    """The median of `calls` timed stats() calls, in ms (after one untimed call)."""
    await queue.stats()
    ms = []
    for _ in range(calls):
        began = time.perf_counter()
        await queue.stats()
        ms.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(ms)


async def _rows(conn: asyncpg.Connection, prefix: str) -> tuple[int, int]:
    """The counter rows and the per-minute rows stats() reads (those after the leader's sum
    of the window's minutes, or all of the window's without one)."""
    counts = int(await conn.fetchval(f"SELECT count(*) FROM {prefix}_counts"))
    minutes = int(
        await conn.fetchval(
            f"SELECT count(*) FROM {prefix}_minute_counts WHERE minute > greatest("
            "now() - interval '1 hour', (SELECT through FROM "
            f"{prefix}_hour_marks WHERE window_start = date_trunc('minute', now() - "
            "interval '1 hour') + interval '1 minute'))"
        )
    )
    return counts, minutes


async def _clean(store: PostgresStore, conn: asyncpg.Connection) -> None:
    """As the preload left them."""


async def _busy(store: PostgresStore, conn: asyncpg.Connection) -> None:
    await _spread(conn, store.prefix)


async def _between_folds(store: PostgresStore, conn: asyncpg.Connection) -> None:
    await _fold(store, conn, store.prefix)
    await _respread_live(conn, store.prefix)


async def _folded(store: PostgresStore, conn: asyncpg.Connection) -> None:
    await _fold(store, conn, store.prefix)


async def _run_at_per_job(store: PostgresStore, conn: asyncpg.Connection) -> None:
    """Each pending job's run_at its own (spread over the hour before), as single enqueues
    leave them: the clones share one per queue and kind, which the pending index stores once
    (deduplicated), so each oldest-pending probe reads a page of a few entries; with a run_at
    per job it reads a page of a few hundred. Rebuilt, as an index grown in order is packed."""
    await conn.execute(
        f"UPDATE {store.prefix}_jobs SET run_at = run_at - random() * interval '1 hour' "
        "WHERE status = 'pending'"
    )
    await conn.execute(f"VACUUM FULL ANALYZE {store.prefix}_jobs")


SHAPES: list[tuple[str, Callable[[PostgresStore, asyncpg.Connection], Awaitable[None]]]] = [
    ("clean", _clean),
    ("busy", _busy),
    ("busy, minutes folded", _between_folds),
    ("folded", _folded),
    ("folded, a run_at per job", _run_at_per_job),
]


async def _main(pending: int, calls: int) -> None:
    prefix = "benst"
    results: list[tuple[str, float, int, int]] = []
    async with EmbeddedPostgres() as pg:
        conn = await asyncpg.connect(pg.dsn)
        async with await PostgresStore.connect(pg.dsn, prefix=prefix) as store:
            await store.migrate()
            await _preload(store, conn, pending)
            queue = Queue(store)
            # Each shape is made from the one before it.
            for label, make in SHAPES:
                await make(store, conn)
                ms = await time_stats(queue, calls)
                results.append((label, ms, *await _rows(conn, prefix)))
        await conn.close()
    load = os.getloadavg()[0]
    print(
        f"stats() at {pending:,} pending over {KINDS} kinds and {QUEUES} queues "
        f"(median of {calls} calls; load {load:.2f})"
    )
    print(f"{'counters':>26}  {'stats() ms':>10}  {'count rows':>10}  {'minute rows read':>16}")
    for label, ms, counts, minutes in results:
        print(f"{label:>26}  {ms:10.3f}  {counts:10,}  {minutes:16,}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stats", description=__doc__)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.pending, args.calls))


if __name__ == "__main__":
    main()
