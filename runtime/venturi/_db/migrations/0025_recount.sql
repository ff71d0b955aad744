-- The live counts recounted from the jobs table. On PostgreSQL 18 the leader's fold of the
-- sharded counter rows (then one statement that locked the rows, summed them into one and
-- deleted the others) could leave a row it had summed undeleted when a writer had changed it
-- just before the lock: that group's count was then off for good (stats(), the operator's
-- demand, the metrics and the KEDA function read it). The fold is two statements now (see
-- queries/counts.sql); this mends counts a fold got wrong before, and any other drift (the
-- jobs table truncated alone, say).
--
-- Writers are held off while the jobs are counted (as in migration 0009), so no write falls
-- between the count's snapshot and the new rows: enqueues, claims and settles wait for one
-- scan of the jobs table. The per-minute counts (done and failed in the last hour) are left
-- alone: a minute a fold got wrong leaves the hour's window within the hour.

LOCK TABLE {prefix}_jobs IN SHARE ROW EXCLUSIVE MODE;

DELETE FROM {prefix}_counts;

INSERT INTO {prefix}_counts (queue, kind, status, shard, n, run_at_max)
SELECT queue, kind, status, 0, count(*), max(run_at) FILTER (WHERE status = 'pending')
FROM {prefix}_jobs
GROUP BY queue, kind, status;
