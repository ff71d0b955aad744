-- Reading and pruning: what the CLI, the operator and dashboards use. None of these is on a
-- worker's hot path.

-- job_get --
-- One job by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text AS payload, carry::text AS carry,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error,
       result::text AS result, progress::text AS progress
FROM {prefix}_jobs WHERE id = :id;

-- job_list --
-- Jobs matching optional filters (NULL = any), newest first, keyset-paginated by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text AS payload, carry::text AS carry,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error,
       result::text AS result, progress::text AS progress
FROM {prefix}_jobs
WHERE (:status::text IS NULL OR status = :status)
  AND (:kind::text IS NULL OR kind = :kind)
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:before_id::uuid IS NULL OR id < :before_id)
  AND (:created_after::timestamptz IS NULL OR created_at >= :created_after)
  AND (:created_before::timestamptz IS NULL OR created_at < :created_before)
ORDER BY id DESC
LIMIT :limit;

-- job_cleanup_batch --
-- Delete one bounded batch of finished jobs and their journal (short locks, short WAL bursts).
WITH doomed AS (
    SELECT id FROM {prefix}_jobs
    WHERE status IN ('completed', 'dead') AND finished_at < :finished_before
      AND (:kind::text IS NULL OR kind = :kind)
      AND (:status::text IS NULL OR status = :status)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), journal AS (
    DELETE FROM {prefix}_journal WHERE job_id IN (SELECT id FROM doomed)
), deleted AS (
    DELETE FROM {prefix}_jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*) AS deleted FROM deleted;

-- stats --
-- The live state counters cannot reconstruct, in one statement that stays cheap at any
-- backlog: totals by kind and status from the trigger-kept counts; per kind with pending
-- jobs, one index probe for the oldest eligible job and a range count of the scheduled ones
-- (jobs waiting for a future run_at, usually few).
WITH totals AS (
    SELECT kind, status, sum(n)::bigint AS n FROM {prefix}_counts
    WHERE status IN ('pending', 'claimed', 'dead', 'completed')
    GROUP BY kind, status HAVING sum(n) > 0
)
SELECT t.status, t.kind, t.n,
       CASE WHEN t.status = 'pending' THEN (
           SELECT count(*) FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.kind = t.kind AND j.run_at > now()
       ) ELSE 0 END AS scheduled,
       CASE WHEN t.status = 'pending' THEN (
           SELECT extract(epoch FROM now() - j.run_at)::float8 FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.kind = t.kind AND j.run_at <= now()
           ORDER BY j.run_at LIMIT 1
       ) END AS oldest_s
FROM totals AS t;

-- claimed_by_pod --
-- Claimed jobs per pod (claimed_pod; jobs of workers outside Kubernetes have none), for the
-- operator's pod-deletion-cost: a range over the partial lease index, one row per busy pod.
SELECT claimed_pod, count(*)::bigint AS n FROM {prefix}_jobs
WHERE status = 'claimed' AND claimed_pod IS NOT NULL
GROUP BY claimed_pod;
