-- The leader's fold of the sharded counters (`venturi._maintenance.folder`). Writers add to
-- the counter row of their own backend's shard (so concurrent workers rarely wait on each
-- other), and readers sum the shards: with many backends a (queue, kind, status) is kept in
-- up to 16 rows, and a minute's finished jobs per (queue, kind) in up to 16 more, so stats()
-- and the dashboard would add up to 16 times the rows they need. Each fold adds every group's
-- rows into one of them and deletes the rest: the sums are unchanged, and the next writer of
-- a deleted shard simply inserts it again.
--
-- It never waits and never makes a writer wait long: only rows it could lock at once are
-- folded (FOR UPDATE SKIP LOCKED; a row a writer holds stays, for the next fold), and it
-- folds into a row it holds, so it inserts nothing a concurrent insert could conflict with.
-- A writer that reaches a row the fold holds waits for this one call. Each fold is a
-- function (migration 25): one statement locks, the next sums and folds the rows as locked.

-- counts_fold --
-- Fold the live counts' split groups; returns how many rows were folded away (migration 25).
SELECT {prefix}_fold_live_counts() AS folded;

-- minute_counts_fold --
-- The same for the per-minute counts of the minutes from :since on (NULL: all kept), the
-- current one too (migration 26).
SELECT {prefix}_fold_minute_counts(:since::timestamptz) AS folded;

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
