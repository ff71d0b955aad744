-- Failed jobs (status 'dead'): list, retry, forget, flush. Operator and dashboard calls,
-- never on a worker's hot path; the bulk ones work in bounded batches, each its own statement.

-- failed_list --
-- Failed jobs of an optional queue and kind (NULL = any), newest first, keyset-paginated by id.
SELECT id, kind, queue, payload::text AS payload, last_error, finished_at, run_count, failures
FROM {prefix}_jobs
WHERE status = 'dead'
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:kind::text IS NULL OR kind = :kind)
  AND (:before_id::uuid IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- failed_retry --
-- Put one failed job back in its queue, eligible now, with a fresh failure count: its journal
-- is kept and gains a `retried` entry, and its queue's workers are woken (at commit). Returns
-- the job's status before (no row: no such job); only a dead job is changed.
WITH target AS (
    SELECT id, status FROM {prefix}_jobs WHERE id = :id FOR UPDATE
), retried AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'pending',
        run_at = now(),
        finished_at = NULL,
        failures = 0,
        -- A unique job holds its id again (the index refuses it while another job does).
        unique_until = CASE WHEN j.unique_key IS NOT NULL
                            THEN now() + make_interval(secs => j.unique_for_s) END
    FROM target AS t
    WHERE j.id = t.id AND t.status = 'dead'
    RETURNING j.id, j.kind, j.run_count
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note)
    SELECT id, run_count, 'retried', :note FROM retried
), woken AS (
    SELECT pg_notify(:channel, kind) FROM retried
)
SELECT t.status, (SELECT count(*) FROM woken) AS woken FROM target AS t;

-- failed_retry_batch --
-- retry_all: one bounded batch of failed jobs (of an optional queue and kind), oldest first,
-- after the id :after_id (keyset: a job left dead is never looked at twice). Returns how many
-- were retried and the last id looked at (NULL: the batch was empty). Unique jobs are left to
-- failed_unique_ids (each must take its unique id again, which may be held).
WITH batch AS (
    SELECT id FROM {prefix}_jobs
    WHERE status = 'dead' AND unique_key IS NULL
      AND (:queue::text IS NULL OR queue = :queue)
      AND (:kind::text IS NULL OR kind = :kind)
      AND (:after_id::uuid IS NULL OR id > :after_id)
    ORDER BY id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), retried AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'pending',
        run_at = now(),
        finished_at = NULL,
        failures = 0
    WHERE j.id IN (SELECT id FROM batch)
    RETURNING j.id, j.kind, j.run_count
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note)
    SELECT id, run_count, 'retried', :note FROM retried
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM retried) AS kinds
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT id FROM batch ORDER BY id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM woken) AS woken;

-- failed_forget --
-- Delete one failed job and its journal. Returns the job's status (no row: no such job); a
-- job that is not dead is left alone.
WITH target AS (
    SELECT id, status FROM {prefix}_jobs WHERE id = :id FOR UPDATE
), journal AS (
    DELETE FROM {prefix}_journal WHERE job_id IN (SELECT id FROM target WHERE status = 'dead')
), deleted AS (
    DELETE FROM {prefix}_jobs WHERE id IN (SELECT id FROM target WHERE status = 'dead')
    RETURNING 1
)
SELECT t.status, (SELECT count(*) FROM deleted) AS deleted FROM target AS t;

-- failed_flush_batch --
-- Delete one bounded batch of failed jobs (optional queue, kind, failed before :before) and
-- their journal.
WITH doomed AS (
    SELECT id FROM {prefix}_jobs
    WHERE status = 'dead'
      AND (:queue::text IS NULL OR queue = :queue)
      AND (:kind::text IS NULL OR kind = :kind)
      AND (:before::timestamptz IS NULL OR finished_at < :before)
    ORDER BY id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), journal AS (
    DELETE FROM {prefix}_journal WHERE job_id IN (SELECT id FROM doomed)
), deleted AS (
    DELETE FROM {prefix}_jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*) AS deleted FROM deleted;

-- jobs_outstanding --
-- Jobs waiting (pending, due now or later) or running (claimed), from the trigger-kept counts.
SELECT coalesce(sum(n), 0)::bigint AS n FROM {prefix}_counts
WHERE status IN ('pending', 'claimed');
