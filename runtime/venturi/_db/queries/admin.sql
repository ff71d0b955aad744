-- Reading and pruning: what the CLI, the operator and dashboards use. None of these is on a
-- worker's hot path.

-- job_get --
-- One job by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text AS payload, carry::text AS carry,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error,
       result::text AS result, progress::text AS progress, batch_id
FROM {prefix}_jobs WHERE id = :id;

-- job_list --
-- Jobs matching optional filters (NULL = any), newest first, keyset-paginated by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text AS payload, carry::text AS carry,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error,
       result::text AS result, progress::text AS progress, batch_id
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
    WHERE status IN ('completed', 'dead', 'cancelled') AND finished_at < :finished_before
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
-- backlog: totals by queue, kind and status from the trigger-kept counts; per queue and kind
-- with pending jobs, one index probe for the oldest eligible job (the oldest pending one, if
-- it is due) and, only where the latest run_at written for a pending job (the counts'
-- run_at_max) is still ahead, a range count of the scheduled ones (jobs waiting for a future
-- run_at); as rows of the statuses 'done_last_hour' and 'failed_last_hour', the jobs finished
-- in the minutes that began in the last hour (the leader's sum of most of them, and a range
-- of the minute counts' primary key for the rest); and a row of status 'paused' per queue
-- paused now (QueueStats.paused), so that stats() is one round trip.
WITH totals AS (
    SELECT queue, kind, status, sum(n)::bigint AS n, max(run_at_max) AS run_at_max
    FROM {prefix}_counts
    WHERE status IN ('pending', 'claimed', 'dead', 'completed')
    GROUP BY queue, kind, status HAVING sum(n) > 0
), mark AS (
    -- The leader's sum of this window's minutes through `through`, if it took one (see
    -- migration 0016); the window of the minutes that began in the last hour starts at:
    SELECT through FROM {prefix}_hour_marks
    WHERE window_start = date_trunc('minute', now() - interval '1 hour') + interval '1 minute'
), finished AS (
    SELECT queue, kind, sum(done)::bigint AS done, sum(failed)::bigint AS failed
    FROM (
        SELECT queue, kind, done, failed FROM {prefix}_hour_counts
        WHERE window_start = date_trunc('minute', now() - interval '1 hour')
                             + interval '1 minute'
        UNION ALL
        -- The minutes after the sum (all of the window's without one). The upper bound
        -- holds every row; with it the planner sees a range, and scans the key for it.
        SELECT queue, kind, done, failed FROM {prefix}_minute_counts
        WHERE minute > greatest(now() - interval '1 hour', (SELECT through FROM mark))
          AND minute < now() + interval '1 minute'
    ) AS minutes
    GROUP BY queue, kind
)
SELECT t.queue, t.status, t.kind, t.n,
       CASE WHEN t.status = 'pending' AND t.run_at_max > now() THEN (
           SELECT count(*) FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.queue = t.queue AND j.kind = t.kind
             AND j.run_at > now()
       ) ELSE 0 END AS scheduled,
       -- The oldest pending job, eligible or not: if it is not yet due, none is. Without a
       -- bound on run_at the probe checks two keys per index entry, not three (PostgreSQL
       -- before 17 checks every entry of the leaf page it lands on).
       CASE WHEN t.status = 'pending' THEN (
           SELECT CASE WHEN j.run_at <= now() THEN date_part('epoch', now() - j.run_at) END
           FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.queue = t.queue AND j.kind = t.kind
           ORDER BY j.run_at LIMIT 1
       ) END AS oldest_s
FROM totals AS t
UNION ALL
SELECT queue, 'done_last_hour', kind, done, 0, NULL FROM finished WHERE done > 0
UNION ALL
SELECT queue, 'failed_last_hour', kind, failed, 0, NULL FROM finished WHERE failed > 0
UNION ALL
SELECT name, 'paused', '', 0, 0, NULL FROM {prefix}_queues
WHERE paused_at IS NOT NULL AND (paused_until IS NULL OR paused_until > now());

-- minute_counts_list --
-- Jobs done and failed for good per minute, per queue and kind, for the minutes that began
-- in the last two hours (all that is kept), oldest first; :queue NULL = every queue. Minutes
-- in which no job of a queue and kind finished have no row.
SELECT minute, queue, kind, sum(done)::bigint AS done, sum(failed)::bigint AS failed
FROM {prefix}_minute_counts
WHERE minute > now() - interval '2 hours' AND (:queue::text IS NULL OR queue = :queue)
GROUP BY minute, queue, kind
ORDER BY minute, queue, kind;

-- claimed_by_pod --
-- Claimed jobs per pod (claimed_pod; jobs of workers outside Kubernetes have none), for the
-- operator's pod-deletion-cost: a range over the partial lease index, one row per busy pod.
SELECT claimed_pod, count(*)::bigint AS n FROM {prefix}_jobs
WHERE status = 'claimed' AND claimed_pod IS NOT NULL
GROUP BY claimed_pod;

-- database_now --
-- The database's clock: ages ("finished more than 7 days ago") are measured on it, as every
-- time venturi stores is, not on the clock of the host that asks.
SELECT now() AS now;
