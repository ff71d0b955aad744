"""``python -m bench.dashboard``: server render time of every dashboard page with 1,000,000
jobs in the table (``--jobs N`` to change; ``--quick`` for 20,000).

A private embedded PostgreSQL (127.0.0.1, stopped at the end) gets N jobs in one INSERT:
90 % completed over the last day (each with a journal row), 8 % pending (a sixteenth of them
scheduled for later), 0.1 % claimed, 1.9 % dead spread through the table, over 8 kinds and 3
queues, ids ULIDs in creation order; one job in a hundred is a link of a chain of three (a
link after one not completed waits); twelve workers, twenty schedules, and two hours of
per-minute counters; a thousand batches, one job in a hundred a member. Each page is
requested in-process (httpx on the ASGI app) 5 times to warm up, then ``--runs`` times; the
figure is the app's own Server-Timing (gate, queries, rendering), median and 95th percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from venturi import PostgresStore, dashboard
from venturi.embedded import EmbeddedPostgres

PREFIX = "dash"

SEED = """
INSERT INTO {p}_jobs (id, kind, queue, status, priority, run_at, created_at, finished_at,
                      payload, run_count, failures, last_error, claimed_at, lease_until,
                      claimed_by, claim_token)
SELECT id, kind, queue, status, 1,
       CASE WHEN status = 'pending' AND i % 16 = 0 THEN now() + interval '1 hour'
            ELSE created END,
       created,
       CASE WHEN status IN ('completed', 'dead') THEN created + interval '2 seconds' END,
       jsonb_build_object('n', i, 'user', 'user-' || (i % 5000), 'note', repeat('x', 40)),
       CASE WHEN status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN status = 'dead' THEN 1 ELSE 0 END,
       CASE WHEN status = 'dead' THEN 'permanent: card declined for order ' || i END,
       CASE WHEN status = 'claimed' THEN now() END,
       CASE WHEN status = 'claimed' THEN now() + interval '1 hour' END,
       CASE WHEN status = 'claimed' THEN 'bench:1' END,
       CASE WHEN status = 'claimed' THEN gen_random_uuid() END
FROM (
    SELECT i, created,
           -- a ULID: the creation millisecond, then random bits
           encode(overlay(uuid_send(gen_random_uuid())
                          PLACING substring(int8send((extract(epoch FROM created) * 1000)::int8)
                                            FROM 3) FROM 1), 'hex')::uuid AS id,
           'kind' || (i % 8) AS kind,
           'queue' || (i % 3) AS queue,
           CASE WHEN i % 1000 < 19 THEN 'dead'
                WHEN i > :total * 0.92 THEN (CASE WHEN i % 80 = 0 THEN 'claimed' ELSE 'pending' END)
                ELSE 'completed' END AS status
    FROM (SELECT i, now() - interval '1 day' + (i * interval '1 day' / :total) AS created
          FROM generate_series(1, :total) AS i) AS t
) AS s
"""

CHAINS = """
UPDATE {p}_jobs AS t SET chain_next = n.next_id
FROM (SELECT id, lead(id) OVER (ORDER BY id) AS next_id, row_number() OVER (ORDER BY id) AS r
      FROM {p}_jobs) AS n
WHERE t.id = n.id AND (n.r / 3) % 33 = 0 AND n.r % 3 < 2
"""
"""Chains of three: one job in a hundred is a link (a chain's first two point at the next)."""

WAITING = """
UPDATE {p}_jobs AS t SET status = 'waiting', finished_at = NULL, last_error = NULL,
       run_count = 0, failures = 0, claimed_at = NULL, lease_until = NULL, claimed_by = NULL,
       claim_token = NULL
FROM {p}_jobs AS p
WHERE p.chain_next = t.id AND p.status <> 'completed' AND t.status <> 'waiting'
"""
"""A link whose previous link has not completed waits (twice: the third link after the second)."""

BATCHES = """
WITH heads AS (
    SELECT id, row_number() OVER (ORDER BY id) - 1 AS b
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS r FROM {p}_jobs
          WHERE chain_next IS NULL AND status <> 'waiting') AS t
    WHERE r % (SELECT greatest(1, count(*) / 1000) FROM {p}_jobs) = 0
), members AS (
    UPDATE {p}_jobs AS j SET batch_id = h.id
    FROM heads AS h
    WHERE j.chain_next IS NULL AND j.status <> 'waiting'
      AND abs(hashtext(j.id::text)) % 100 = 7
      AND abs(hashtext(j.id::text) / 100) % (SELECT count(*) FROM heads) = h.b
    RETURNING j.batch_id, j.status
)
INSERT INTO {p}_batches (id, name, created_at, allow_failures, total, pending, done, failed,
                         finished_at)
SELECT batch_id, 'batch-' || left(batch_id::text, 8), now() - interval '1 day', true, count(*),
       count(*) FILTER (WHERE status IN ('pending', 'claimed')),
       count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'dead'),
       CASE WHEN count(*) FILTER (WHERE status IN ('pending', 'claimed')) = 0 THEN now() END
FROM members GROUP BY batch_id
"""
"""A thousand batches: one job in a hundred (not a chain's) is a member of one."""

REGISTRY = """
INSERT INTO {p}_workers (id, host, pid, queues, kinds, concurrency, heartbeat_s, started_at,
                         last_seen)
SELECT 'host-' || w || ':' || (1000 + w), 'host-' || w, 1000 + w,
       ARRAY['queue' || (w % 3)], ARRAY(SELECT 'kind' || k FROM generate_series(0, 6) AS k),
       16, 5, now() - interval '3 hours', now() - (w % 4) * interval '3 seconds'
FROM generate_series(1, 12) AS w;
INSERT INTO {p}_schedules (name, spec, kind, last_tick, next_tick, enqueued, seen_at, seen_by)
SELECT 'schedule-' || s, 'every ' || s || ' min', 'kind' || (s % 8),
       now() - s * interval '1 minute', now() + s * interval '1 minute', 100 * s, now(),
       'host-1:1001'
FROM generate_series(1, 20) AS s;
INSERT INTO {p}_minute_counts (minute, queue, kind, slot, done, failed)
SELECT date_trunc('minute', now()) - m * interval '1 minute', 'queue' || q, 'kind' || k, slot,
       40 + (m * 7 + k) % 30, CASE WHEN (m + k) % 9 = 0 THEN 1 ELSE 0 END
FROM generate_series(0, 119) AS m, generate_series(0, 2) AS q, generate_series(0, 7) AS k,
     generate_series(0, 3) AS slot;
"""
"""Twelve workers, twenty schedules, and two hours of per-minute counters."""

JOURNAL = """
INSERT INTO {p}_journal (job_id, run, outcome, at, note, duration_s, worker)
SELECT id, 1, status, finished_at, last_error, 0.012, 'bench:1'
FROM {p}_jobs WHERE status IN ('completed', 'dead')
"""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="20,000 jobs, 5 runs")
    args = parser.parse_args()
    total, runs = (20_000, 5) if args.quick else (args.jobs, args.runs)
    async with (
        EmbeddedPostgres() as pg,
        await PostgresStore.connect(pg.dsn, prefix=PREFIX) as store,
    ):
        await store.migrate()
        pool = store._pool_or_raise()
        started = time.perf_counter()
        await pool.execute(SEED.format(p=PREFIX).replace(":total", str(total)))
        await pool.execute(CHAINS.format(p=PREFIX))
        for _ in range(2):
            await pool.execute(WAITING.format(p=PREFIX))
        await pool.execute(f"ANALYZE {PREFIX}_jobs")
        await pool.execute(f"DELETE FROM {PREFIX}_counts")  # the waiting links: count again
        await pool.execute(
            f"INSERT INTO {PREFIX}_counts (queue, kind, status, shard, n)"
            f" SELECT queue, kind, status, 0, count(*) FROM {PREFIX}_jobs"
            " GROUP BY queue, kind, status"
        )
        await pool.execute(BATCHES.format(p=PREFIX))
        await pool.execute(REGISTRY.format(p=PREFIX))
        await pool.execute(JOURNAL.format(p=PREFIX))
        await pool.execute(f"VACUUM ANALYZE {PREFIX}_jobs")
        await pool.execute(f"VACUUM ANALYZE {PREFIX}_journal")
        print(f"seeded {total:,} jobs in {time.perf_counter() - started:.1f} s")
        row = await pool.fetchrow(
            f"SELECT (SELECT id FROM {PREFIX}_jobs WHERE status = 'dead' ORDER BY id"
            f" OFFSET (SELECT count(*) / 2 FROM {PREFIX}_jobs WHERE status = 'dead')"
            f" LIMIT 1) AS dead_id,"
            f" (SELECT id FROM {PREFIX}_jobs ORDER BY id OFFSET {total // 2} LIMIT 1) AS mid,"
            f" (SELECT id FROM {PREFIX}_jobs WHERE chain_next IS NOT NULL"
            f" ORDER BY status = 'dead' DESC, id DESC LIMIT 1) AS held_link,"
            f" (SELECT id FROM {PREFIX}_batches ORDER BY id"
            f" OFFSET (SELECT count(*) / 2 FROM {PREFIX}_batches) LIMIT 1) AS mid_batch"
        )
        assert row is not None
        from ulid import ULID

        dead_id = ULID.from_bytes(row["dead_id"].bytes)
        mid = ULID.from_bytes(row["mid"].bytes)
        held_link = ULID.from_bytes(row["held_link"].bytes)
        mid_batch = ULID.from_bytes(row["mid_batch"].bytes)
        pages = [
            "/",
            "/jobs",
            "/jobs?status=pending",
            "/jobs?status=claimed",
            "/jobs?status=completed",
            "/jobs?status=dead",
            "/jobs?kind=kind3",
            "/jobs?queue=queue2",
            "/jobs?status=dead&kind=kind3",
            f"/jobs?before={mid}",
            f"/jobs?status=completed&before={mid}",
            f"/jobs/{dead_id}",
            "/failed",
            "/failed?kind=kind5",
            f"/failed?before={dead_id}",
            "/queues",
            "/workers",
            "/schedules",
            "/chains",
            f"/chains?before={mid}",
            f"/jobs/{held_link}",
            "/batches",
            f"/batches?before={mid_batch}",
            f"/batches/{mid_batch}",
        ]
        app = dashboard.app(store, gate=lambda request: True)
        transport = httpx.ASGITransport(app=app)
        print(f"{'page':<44} {'median ms':>10} {'p95 ms':>8}")
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            for path in pages:
                times = []
                for i in range(5 + runs):
                    response = await http.get(path)
                    assert response.status_code == 200, (path, response.status_code)
                    timing = response.headers["server-timing"]
                    if i >= 5:
                        times.append(float(timing.partition("dur=")[2]))
                times.sort()
                p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
                shown = path if len(path) <= 44 else path[:41] + "..."
                print(f"{shown:<44} {statistics.median(times):>10.1f} {p95:>8.1f}")


if __name__ == "__main__":
    asyncio.run(main())
