-- The leader's fold of the sharded counters (`venturi._maintenance.folder`). Writers add to
-- the counter row of their own backend's shard (so concurrent workers rarely wait on each
-- other), and readers sum the shards: with many backends a (queue, kind, status) is kept in
-- up to 16 rows, and a minute's finished jobs per (queue, kind) in up to 16 more, so stats()
-- and the dashboard would add up to 16 times the rows they need. Each fold adds every group's
-- rows into one of them and deletes the rest, in one short transaction of two statements:
-- the sums are unchanged, and the next writer of a deleted shard simply inserts it again.
--
-- It never waits and never makes a writer wait long: only rows it could lock at once are
-- folded (FOR UPDATE SKIP LOCKED; a row a writer holds stays, for the next fold), and it
-- folds into a row it holds, so it inserts nothing a concurrent insert could conflict with.
-- A writer that reaches a row the fold holds waits for this transaction.
--
-- The first statement locks (a row a writer changed after its snapshot is locked at its
-- newest version); the second, with a snapshot taken after the locks, sums and folds the
-- rows it names by key, each as locked: nobody can change them in between.

-- counts_fold_lock --
-- Lock the counter rows of each (queue, kind, status) kept in more than one shard, and name
-- them; the fold's next statement (counts_fold) sums and folds exactly these.
WITH split AS (
    SELECT queue, kind, status FROM {prefix}_counts
    GROUP BY queue, kind, status HAVING count(*) > 1
), held AS (
    SELECT c.queue, c.kind, c.status, c.shard
    FROM {prefix}_counts AS c JOIN split USING (queue, kind, status)
    FOR UPDATE OF c SKIP LOCKED
)
SELECT coalesce(array_agg(queue), '{}') AS queues, coalesce(array_agg(kind), '{}') AS kinds,
       coalesce(array_agg(status), '{}') AS statuses, coalesce(array_agg(shard), '{}') AS shards
FROM held;

-- counts_fold --
-- Fold the rows counts_fold_lock locked (in this transaction) into the lowest shard of each
-- group; returns how many rows were folded away. A statement of its own: its snapshot sees
-- the rows as locked, so it reads, updates and deletes them with no re-check of rows changed
-- under it (on PostgreSQL 18 that re-check, in one statement that locked and deleted, left
-- some locked rows undeleted after summing them).
WITH held AS (
    SELECT c.queue, c.kind, c.status, c.shard, c.n, c.run_at_max
    FROM {prefix}_counts AS c
    JOIN unnest(:queues::text[], :kinds::text[], :statuses::text[], :shards::smallint[])
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
      AND c.queue = r.queue AND c.kind = r.kind AND c.status = r.status AND c.shard = r.shard
), dropped AS (
    DELETE FROM {prefix}_counts AS c
    USING ranked AS r
    WHERE r.rows > 1 AND r.shard <> r.keep
      AND c.queue = r.queue AND c.kind = r.kind AND c.status = r.status AND c.shard = r.shard
    RETURNING 1
)
SELECT count(*) AS folded FROM dropped;

-- minute_counts_fold_lock --
-- The same for the per-minute counts of minutes that have ended (the current one is where
-- settles write; folding it would only churn its rows), from :since on (NULL: all kept).
WITH split AS (
    SELECT minute, queue, kind FROM {prefix}_minute_counts
    WHERE minute < date_trunc('minute', now())
      AND (:since::timestamptz IS NULL OR minute >= :since)
    GROUP BY minute, queue, kind HAVING count(*) > 1
), held AS (
    SELECT m.minute, m.queue, m.kind, m.slot
    FROM {prefix}_minute_counts AS m JOIN split USING (minute, queue, kind)
    FOR UPDATE OF m SKIP LOCKED
)
SELECT coalesce(array_agg(minute), '{}') AS minutes, coalesce(array_agg(queue), '{}') AS queues,
       coalesce(array_agg(kind), '{}') AS kinds, coalesce(array_agg(slot), '{}') AS slots
FROM held;

-- minute_counts_fold --
WITH held AS (
    SELECT m.minute, m.queue, m.kind, m.slot, m.done, m.failed
    FROM {prefix}_minute_counts AS m
    JOIN unnest(:minutes::timestamptz[], :queues::text[], :kinds::text[], :slots::smallint[])
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
SELECT count(*) AS folded FROM dropped;

-- hour_counts_refresh --
-- Sum the ended minutes of the last hour's window and the next one, per queue and kind, for
-- stats()'s done and failed in the last hour (migration 0016).
SELECT {prefix}_hour_counts_refresh() AS summed;

-- jobs_analyze_due --
-- Whether the planner's row estimate of the jobs table is far below what the counters say it
-- holds (never analysed: -1, or a backlog that arrived since the last ANALYZE). Until
-- autovacuum's next ANALYZE, a generic plan of the claim then expects one matching row and
-- sorts the whole backlog instead of reading the claim index in order (100+ ms a claim at
-- 100,000 pending jobs); `venturi._maintenance.analyzer` asks for an ANALYZE at once.
SELECT c.reltuples < greatest(t.total, 0) / 10.0 AND t.total >= :at_least AS due
FROM pg_class AS c,
     (SELECT coalesce(sum(n), 0) AS total FROM {prefix}_counts) AS t
WHERE c.oid = to_regclass('{prefix}_jobs');

-- jobs_may_analyze --
-- Whether this role may ANALYZE the jobs table: a superuser, its owner or the database's
-- (through membership too), or from PostgreSQL 17 on a holder of MAINTAIN on it. Others'
-- ANALYZE is skipped with a warning, not refused.
SELECT r.rolsuper
       OR pg_has_role(c.relowner, 'USAGE')
       OR pg_has_role(d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000  -- no MAINTAIN before
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS may
FROM pg_class AS c, pg_roles AS r, pg_database AS d
WHERE c.oid = to_regclass('{prefix}_jobs') AND r.rolname = current_user
  AND d.datname = current_database();

-- jobs_analyze --
ANALYZE {prefix}_jobs;
