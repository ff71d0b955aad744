-- Live counts by queue, kind and status (they were by kind and status), so stats() can say
-- what each queue holds; and per-minute counts of finished jobs (at the end). The same design as before (migration 0002): statement-level triggers
-- add the deltas, sharded by backend so concurrent workers rarely wait on each other's counter
-- rows, and readers sum the shards. The table is rebuilt under a lock that holds writers off,
-- then backfilled from the jobs themselves.

LOCK TABLE {prefix}_jobs IN SHARE ROW EXCLUSIVE MODE;

DROP TABLE {prefix}_counts;
CREATE TABLE {prefix}_counts (
    queue   text     NOT NULL,
    kind    text     NOT NULL,
    status  text     NOT NULL,
    shard   smallint NOT NULL,
    n       bigint   NOT NULL,
    PRIMARY KEY (queue, kind, status, shard)
);

-- The triggers keep calling this function by name; only its body changes.
CREATE OR REPLACE FUNCTION {prefix}_count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Deltas per (queue, kind, status) from the statement's transition tables, applied in
    -- key order so two transactions never lock counter rows in opposite orders.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n)
        SELECT queue, kind, status, pg_backend_pid() % 16, count(*) FROM new_rows
        GROUP BY queue, kind, status ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n)
        SELECT queue, kind, status, pg_backend_pid() % 16, sum(n) FROM (
            SELECT queue, kind, status, count(*) AS n FROM new_rows GROUP BY queue, kind, status
            UNION ALL
            SELECT queue, kind, status, -count(*) FROM old_rows GROUP BY queue, kind, status
        ) AS delta
        GROUP BY queue, kind, status HAVING sum(n) <> 0 ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSE
        INSERT INTO {prefix}_counts AS c (queue, kind, status, shard, n)
        SELECT queue, kind, status, pg_backend_pid() % 16, -count(*) FROM old_rows
        GROUP BY queue, kind, status ORDER BY queue, kind, status
        ON CONFLICT (queue, kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

INSERT INTO {prefix}_counts (queue, kind, status, shard, n)
SELECT queue, kind, status, 0, count(*) FROM {prefix}_jobs GROUP BY queue, kind, status;

-- Stats per queue and kind: the oldest eligible job and the scheduled ones, one index probe
-- each. The (kind, run_at) index stays: the claim loop's next-due probe is by kind.
CREATE INDEX {prefix}_jobs_pending_queue_kind_idx ON {prefix}_jobs (queue, kind, run_at)
    WHERE status = 'pending';

-- Jobs done and failed (for good) per minute, per queue and kind, for "done and failed in the
-- last hour" and the dashboard's series. Written by the statement that settles or recovers the
-- jobs, so the counters move exactly when the jobs do; sharded by backend like the counts, so
-- workers settling at once rarely share a row (readers sum the slots). Kept two hours: settles
-- prune older minutes now and then, in bounded batches (no leader needed).
CREATE TABLE {prefix}_minute_counts (
    minute  timestamptz NOT NULL,
    queue   text        NOT NULL,
    kind    text        NOT NULL,
    slot    smallint    NOT NULL,
    done    bigint      NOT NULL,
    failed  bigint      NOT NULL,
    PRIMARY KEY (minute, queue, kind, slot)
);
