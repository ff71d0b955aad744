-- The dashboard's own statements (venturi.dashboard). Reads run in a read-only transaction
-- that dashboard_session bounds first; every read is cheap at any table size (the kept
-- counters, capped counts, index range scans). The actions change dead jobs only.

-- dashboard_session --
-- Bound every statement of this transaction (SET LOCAL, with a parameter): no dashboard query
-- can run long, whatever the table holds. Custom plans always: the dashboard's filters are
-- optional (NULL = any), which a cached generic plan cannot prune.
SELECT set_config('statement_timeout', :timeout_ms, true),
       set_config('plan_cache_mode', 'force_custom_plan', true);

-- dashboard_counts --
-- Jobs by kind and status from the trigger-kept counters (completed included, which stats()
-- leaves out): a few small rows, whatever the backlog.
SELECT kind, status, sum(n)::bigint AS n FROM {prefix}_counts
GROUP BY kind, status HAVING sum(n) > 0
ORDER BY kind, status;

-- dashboard_now --
-- The database's clock (the transaction's start: the moment the page's snapshot shows).
SELECT now() AS now;

-- dashboard_finished_since --
-- Jobs that finished (completed, dead) in the last :ago, each count capped at :cap so it stays a
-- short range scan of {prefix}_jobs_finished_idx however busy the hour was.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM {prefix}_jobs
        WHERE status = 'completed' AND finished_at >= now() - :ago::interval LIMIT :cap) AS d)::bigint AS done,
    (SELECT count(*) FROM (
        SELECT 1 FROM {prefix}_jobs
        WHERE status = 'dead' AND finished_at >= now() - :ago::interval LIMIT :cap) AS f)::bigint AS failed,
    now() AS at;

-- dashboard_dead_ids --
-- Up to :limit dead jobs (of :kind, NULL = any) that died at or before :cutoff, oldest death
-- first, locked for a retry or forget (skipping any another click holds).
SELECT id FROM {prefix}_jobs
WHERE status = 'dead' AND finished_at <= :cutoff AND (:kind::text IS NULL OR kind = :kind)
ORDER BY finished_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- dashboard_job_retry --
-- Dead jobs back to pending, eligible now, with a journal row each and a wake-up per kind, in
-- one statement. Only jobs still dead change (a job retried by another click meanwhile is left
-- alone and not returned). `failures` is kept: a job that died at the backstop gets one more
-- run (a permanent error still ends it at once). Journaled as 'released' (handed back,
-- eligible at once, not a failure) with :note saying who retried it.
WITH retried AS (
    UPDATE {prefix}_jobs SET
        status = 'pending',
        run_at = now(),
        finished_at = NULL
    WHERE id = ANY(:ids::uuid[]) AND status = 'dead'
    RETURNING id, kind, run_count
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, worker)
    SELECT id, run_count, 'released', :note, :actor FROM retried
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM retried) AS kinds
)
SELECT retried.id, (SELECT count(*) FROM woken) AS woken FROM retried;

-- dashboard_job_forget --
-- Delete dead jobs and their journal. Only dead jobs: a pending or running job is never
-- deleted from here.
WITH doomed AS (
    SELECT id FROM {prefix}_jobs WHERE id = ANY(:ids::uuid[]) AND status = 'dead' FOR UPDATE
), journal AS (
    DELETE FROM {prefix}_journal WHERE job_id IN (SELECT id FROM doomed)
)
DELETE FROM {prefix}_jobs WHERE id IN (SELECT id FROM doomed) RETURNING id;

-- dashboard_batch_callbacks --
-- A batch's callback jobs, by name (one probe each of the batch index).
SELECT batch_callback, id, kind, status
FROM {prefix}_jobs
WHERE batch_id = :id AND batch_callback IN ('then', 'catch', 'finally');
