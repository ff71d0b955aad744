-- The latest run_at ever written for a pending job, per counter row (queue, kind, 'pending',
-- shard), so stats() can skip the per-(queue, kind) count of scheduled jobs where none can
-- exist: a pending job is scheduled only if its run_at is after now(), and every pending
-- job's run_at was written by an INSERT or UPDATE the counting trigger saw, so when the
-- largest run_at written is not after now(), no job is scheduled. It only grows (a mark,
-- not a count: nothing has to be taken back when a job leaves pending), so it is exact
-- whatever the reader's clock, and costs the trigger one greatest() on the upsert it already
-- does. Jobs due when enqueued leave it at about their enqueue time, so the probe runs only
-- while some job was written for the future (enqueue_in, a retry's backoff, a snooze).
--
-- Old workers keep running during a rolling deploy: the column is nullable and only this
-- trigger writes it; the trigger function is the database's, so their writes keep it too.
-- Writers are held off while the function changes and the mark is backfilled, so no write
-- falls between the backfill's snapshot and the new trigger.

LOCK TABLE {prefix}_jobs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE {prefix}_counts ADD COLUMN run_at_max timestamptz;

CREATE OR REPLACE FUNCTION {prefix}_count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Deltas per (queue, kind, status) from the statement's transition tables, applied in
    -- key order so two transactions never lock counter rows in opposite orders; pending rows
    -- also raise the counter row's run_at_max to the latest run_at they carry.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n, run_at_max)
        SELECT queue, kind, status, pg_backend_pid() % 16, count(*),
               max(run_at) FILTER (WHERE status = 'pending')
        FROM new_rows
        GROUP BY queue, kind, status ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE
            SET n = c.n + excluded.n, run_at_max = greatest(c.run_at_max, excluded.run_at_max);
    ELSIF TG_OP = 'UPDATE' THEN
        -- A statement that leaves a job pending but moves its run_at (a reschedule) changes
        -- no count, yet may raise the mark: such groups are kept too, and the counter row is
        -- written only if its count moves or its mark rises (a merge or an await of a
        -- pending job leaves it as it was).
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n, run_at_max)
        SELECT queue, kind, status, pg_backend_pid() % 16, sum(n), max(run_at_max) FROM (
            SELECT queue, kind, status, count(*) AS n,
                   max(run_at) FILTER (WHERE status = 'pending') AS run_at_max
            FROM new_rows GROUP BY queue, kind, status
            UNION ALL
            SELECT queue, kind, status, -count(*), NULL FROM old_rows GROUP BY queue, kind, status
        ) AS delta
        GROUP BY queue, kind, status
        HAVING sum(n) <> 0 OR max(run_at_max) IS NOT NULL
        ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE
            SET n = c.n + excluded.n, run_at_max = greatest(c.run_at_max, excluded.run_at_max)
            WHERE excluded.n <> 0
               OR excluded.run_at_max > coalesce(c.run_at_max, '-infinity'::timestamptz);
    ELSE
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n)
        SELECT queue, kind, status, pg_backend_pid() % 16, -count(*) FROM old_rows
        GROUP BY queue, kind, status ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

-- The jobs already pending: one backward probe of the (queue, kind, run_at) index per
-- counter row.
UPDATE {prefix}_counts AS c SET run_at_max = (
    SELECT max(j.run_at) FROM {prefix}_jobs AS j
    WHERE j.status = 'pending' AND j.queue = c.queue AND j.kind = c.kind
)
WHERE c.status = 'pending';
