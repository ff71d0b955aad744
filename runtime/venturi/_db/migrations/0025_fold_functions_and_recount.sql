-- The leader's fold of the sharded counter rows, as two statements in a function, and on
-- PostgreSQL 18 the live counts recounted.
--
-- The fold was one statement that locked a group's counter rows, summed them into one and
-- deleted the others. On PostgreSQL 18.1, when writers had just changed some of those rows,
-- that statement left rows it had summed undeleted (or lost a writer's increment), so the
-- group's count was wrong from then on (stats(), the operator's demand, the metrics and the
-- KEDA function read it); never seen on 14, 15 or 17. Each fold is now a function: it locks
-- the rows (FOR UPDATE SKIP LOCKED), then, in a statement of its own (a volatile function's
-- statements each take a new snapshot), sums, updates and deletes exactly the rows it locked,
-- as they were locked: nobody can change them in between, so nothing is re-checked. Being
-- one call, the locks are never held across a round trip to the leader.

CREATE FUNCTION {prefix}_fold_live_counts() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    held_queues text[];
    held_kinds text[];
    held_statuses text[];
    held_shards smallint[];
    folded bigint;
BEGIN
    WITH split AS (
        SELECT queue, kind, status FROM {prefix}_counts
        GROUP BY queue, kind, status HAVING count(*) > 1
    ), held AS (
        SELECT c.queue, c.kind, c.status, c.shard
        FROM {prefix}_counts AS c JOIN split USING (queue, kind, status)
        FOR UPDATE OF c SKIP LOCKED
    )
    SELECT array_agg(queue), array_agg(kind), array_agg(status), array_agg(shard)
    INTO held_queues, held_kinds, held_statuses, held_shards
    FROM held;
    IF held_queues IS NULL THEN
        RETURN 0;
    END IF;
    WITH held AS (
        SELECT c.queue, c.kind, c.status, c.shard, c.n, c.run_at_max
        FROM {prefix}_counts AS c
        JOIN unnest(held_queues, held_kinds, held_statuses, held_shards)
             AS h (queue, kind, status, shard) USING (queue, kind, status, shard)
    ), ranked AS (
        -- Each held row with its group's sums and the shard kept (a window, not a join of
        -- the held rows with their groups: those have no index, and would be a nested loop).
        SELECT queue, kind, status, shard, count(*) OVER g AS rows, min(shard) OVER g AS keep,
               sum(n) OVER g AS n, max(run_at_max) OVER g AS run_at_max
        FROM held WINDOW g AS (PARTITION BY queue, kind, status)
    ), kept AS (
        UPDATE {prefix}_counts AS c SET n = r.n, run_at_max = r.run_at_max
        FROM ranked AS r
        WHERE r.rows > 1 AND r.shard = r.keep
          AND c.queue = r.queue AND c.kind = r.kind AND c.status = r.status
          AND c.shard = r.shard
    ), dropped AS (
        DELETE FROM {prefix}_counts AS c
        USING ranked AS r
        WHERE r.rows > 1 AND r.shard <> r.keep
          AND c.queue = r.queue AND c.kind = r.kind AND c.status = r.status
          AND c.shard = r.shard
        RETURNING 1
    )
    SELECT count(*) INTO folded FROM dropped;
    RETURN folded;
END
$$;

-- The same for the per-minute counts of minutes that have ended (the current one is where
-- settles write; folding it would only churn its rows), from `since` on (NULL: all kept).
CREATE FUNCTION {prefix}_fold_minute_counts(since timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held_minutes timestamptz[];
    held_queues text[];
    held_kinds text[];
    held_slots smallint[];
    folded bigint;
BEGIN
    WITH split AS (
        SELECT minute, queue, kind FROM {prefix}_minute_counts
        WHERE minute < date_trunc('minute', now()) AND (since IS NULL OR minute >= since)
        GROUP BY minute, queue, kind HAVING count(*) > 1
    ), held AS (
        SELECT m.minute, m.queue, m.kind, m.slot
        FROM {prefix}_minute_counts AS m JOIN split USING (minute, queue, kind)
        FOR UPDATE OF m SKIP LOCKED
    )
    SELECT array_agg(minute), array_agg(queue), array_agg(kind), array_agg(slot)
    INTO held_minutes, held_queues, held_kinds, held_slots
    FROM held;
    IF held_minutes IS NULL THEN
        RETURN 0;
    END IF;
    WITH held AS (
        SELECT m.minute, m.queue, m.kind, m.slot, m.done, m.failed
        FROM {prefix}_minute_counts AS m
        JOIN unnest(held_minutes, held_queues, held_kinds, held_slots)
             AS h (minute, queue, kind, slot) USING (minute, queue, kind, slot)
    ), ranked AS (
        SELECT minute, queue, kind, slot, count(*) OVER g AS rows, min(slot) OVER g AS keep,
               sum(done) OVER g AS done, sum(failed) OVER g AS failed
        FROM held WINDOW g AS (PARTITION BY minute, queue, kind)
    ), kept AS (
        UPDATE {prefix}_minute_counts AS m SET done = r.done, failed = r.failed
        FROM ranked AS r
        WHERE r.rows > 1 AND r.slot = r.keep
          AND m.minute = r.minute AND m.queue = r.queue AND m.kind = r.kind AND m.slot = r.slot
    ), dropped AS (
        DELETE FROM {prefix}_minute_counts AS m
        USING ranked AS r
        WHERE r.rows > 1 AND r.slot <> r.keep
          AND m.minute = r.minute AND m.queue = r.queue AND m.kind = r.kind AND m.slot = r.slot
        RETURNING 1
    )
    SELECT count(*) INTO folded FROM dropped;
    RETURN folded;
END
$$;

-- On PostgreSQL 18, counts a fold got wrong are mended: recounted from the jobs table, with
-- writers held off meanwhile (as in migration 0009) so that no write falls between the
-- count's snapshot and the new rows: enqueues, claims and settles wait for one scan of the
-- jobs table. The per-minute counts are left alone: a minute a fold got wrong leaves the
-- hour's window within the hour. Older servers never drifted: nothing is held up there.
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 180000 THEN
        LOCK TABLE {prefix}_jobs IN SHARE ROW EXCLUSIVE MODE;
        DELETE FROM {prefix}_counts;
        INSERT INTO {prefix}_counts (queue, kind, status, shard, n, run_at_max)
        SELECT queue, kind, status, 0, count(*), max(run_at) FILTER (WHERE status = 'pending')
        FROM {prefix}_jobs
        GROUP BY queue, kind, status;
    END IF;
END
$$;
