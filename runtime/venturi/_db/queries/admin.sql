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
-- backlog, as one row per queue and kind (fewer rows to send and fold than one per status):
-- the totals by status from the trigger-kept counts; where pending jobs are, one index
-- probe for the oldest eligible job (the oldest pending one, if it is due) and, only where
-- the latest run_at written for a pending job (the counts' run_at_max) is still ahead, a
-- range count of the scheduled ones (jobs waiting for a future run_at); the jobs finished in
-- the minutes that began in the last hour (the leader's sum of most of them, and a range of
-- the minute counts' primary key for the rest); and a row with `paused` true per queue
-- paused now (QueueStats.paused), so that stats() is one round trip.
WITH totals AS (
    SELECT queue, kind,
           sum(n) FILTER (WHERE status = 'pending')::bigint AS pending,
           sum(n) FILTER (WHERE status = 'claimed')::bigint AS claimed,
           sum(n) FILTER (WHERE status = 'dead')::bigint AS dead,
           sum(n) FILTER (WHERE status = 'completed')::bigint AS completed,
           max(run_at_max) FILTER (WHERE status = 'pending') AS run_at_max
    FROM {prefix}_counts
    WHERE status IN ('pending', 'claimed', 'dead', 'completed')
    GROUP BY queue, kind
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
SELECT queue, kind, t.pending, t.claimed, t.dead, t.completed, f.done, f.failed,
       CASE WHEN t.pending > 0 AND t.run_at_max > now() THEN (
           SELECT count(*) FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.queue = t.queue AND j.kind = t.kind
             AND j.run_at > now()
       ) END AS scheduled,
       -- The oldest pending job, eligible or not: if it is not yet due, none is. Without a
       -- bound on run_at the probe checks two keys per index entry, not three (PostgreSQL
       -- before 17 checks every entry of the leaf page it lands on).
       CASE WHEN t.pending > 0 THEN (
           SELECT CASE WHEN j.run_at <= now() THEN date_part('epoch', now() - j.run_at) END
           FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.queue = t.queue AND j.kind = t.kind
           ORDER BY j.run_at LIMIT 1
       ) END AS oldest_s,
       false AS paused
FROM totals AS t FULL JOIN finished AS f USING (queue, kind)
UNION ALL
SELECT name, '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true FROM {prefix}_queues
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
