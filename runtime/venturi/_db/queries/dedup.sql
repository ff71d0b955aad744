-- Deduplicated enqueue: one transaction (a savepoint inside the caller's) per job with a
-- dedup key. Lock the key, look for a pending duplicate, then merge into it or insert
-- (job_insert).

-- dedup_lock --
-- Serialize enqueues of one (queue, kind, dedup key) across producers until the transaction
-- ends.
SELECT pg_advisory_xact_lock(:key);

-- job_find_pending_duplicate --
-- The oldest pending job of :kind and :dedup_key in :queue, locked for the merge decision: a
-- job of another queue is never a candidate (no worker of this queue would run it). A job
-- being claimed right now stops matching once the claim commits (it is no longer pending).
SELECT id, payload::text AS payload, carry::text AS carry, run_count
FROM {prefix}_jobs
WHERE status = 'pending' AND kind = :kind AND dedup_key = :dedup_key AND queue = :queue
ORDER BY id
LIMIT 1
FOR UPDATE;

-- job_merge --
-- Apply a merge decision to the existing pending job and journal it (:payload NULL: keep).
WITH merged AS (
    UPDATE {prefix}_jobs SET
        payload = coalesce(:payload::text::jsonb, payload),
        carry = CASE WHEN :set_carry THEN :carry::text::jsonb ELSE carry END,
        priority = coalesce(:priority, priority)
    WHERE id = :id AND status = 'pending'
    RETURNING id, run_count
)
INSERT INTO {prefix}_journal (job_id, run, outcome, note)
SELECT id, run_count, 'merged', :action FROM merged;
