-- Batches (venturi.batches, Queue.batch): the batch row and its callbacks. The counting and
-- the callbacks' release are the member trigger's (migration 0013); these statements only
-- create, read, cancel and prune.

-- batch_insert --
-- The batch row, before its jobs: every member is pending (not finished) at the start.
INSERT INTO {prefix}_batches (id, name, allow_failures, total, pending)
VALUES (:id, :name, :allow_failures, :total, :total);

-- batch_lock --
-- Lock the rows of batches :ids in id order, before a statement that moves members of
-- several of them (a settle, a skip of held members; see Batches.in_batch_order): every such
-- statement takes them in one order.
SELECT id FROM {prefix}_batches WHERE id = ANY (:ids::uuid[]) ORDER BY id FOR UPDATE;

-- batch_hold_callbacks --
-- The callbacks just inserted (with the batch's jobs) wait until the batch decides them.
UPDATE {prefix}_jobs AS j SET status = 'waiting', batch_callback = c.which
FROM unnest(:ids::uuid[], :whiches::text[]) AS c(id, which)
WHERE j.id = c.id;

-- batch_finish --
-- A batch with no members is finished as soon as it exists.
SELECT {prefix}_batch_finish(:id);

-- batch_get --
-- One batch by id.
SELECT id, name, created_at, allow_failures, total, pending, done, failed, cancelled,
       failed_at, cancelled_at, finished_at
FROM {prefix}_batches WHERE id = :id;

-- batch_recent --
-- The newest batches (ids are ULIDs: newest first is the primary key backwards), keyset-paged.
SELECT id, name, created_at, allow_failures, total, pending, done, failed, cancelled,
       failed_at, cancelled_at, finished_at
FROM {prefix}_batches
WHERE (:before_id::uuid IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- batch_mark_cancelled --
-- Mark a batch cancelled unless it has finished; then batch_cancel_members, in the same
-- transaction, skips its members not started yet. No row: no such batch.
UPDATE {prefix}_batches
SET cancelled_at = CASE WHEN finished_at IS NULL THEN coalesce(cancelled_at, now())
                    ELSE cancelled_at END
WHERE id = :id
RETURNING finished_at IS NULL AS open;

-- batch_cancel_members --
-- The members of :id not started yet end 'cancelled', each counted by the member trigger
-- (which finishes the batch once nothing is left running). Returns how many.
SELECT {prefix}_batch_cancel_members(:id) AS skipped;

-- batch_skip_held --
-- Cancel the claimed members a worker holds and has not started (:ids with their claim
-- :tokens), if their batch was cancelled after their claim; returns the ids cancelled. What
-- the worker believes does not matter: a member of a batch still running is left claimed,
-- and the worker starts it; so is one claimed after the cancellation (a member retried since,
-- by hand or after a failure: a cancelled batch stays cancelled, and its retried members
-- run). The claim is undone as a hand-back undoes it (not counted as a run); the member
-- trigger counts each one cancelled and journals why, as for the members skipped pending.
WITH skipped AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'cancelled', finished_at = now(), run_count = j.run_count - 1,
        claim_token = NULL, lease_until = NULL
    FROM unnest(:ids::uuid[], :tokens::uuid[]) AS u(id, token)
    WHERE j.id = u.id AND j.claim_token = u.token AND j.status = 'claimed'
      AND j.batch_callback IS NULL  -- a callback runs when its batch releases it
      AND EXISTS (SELECT 1 FROM {prefix}_batches AS b
                  WHERE b.id = j.batch_id AND j.claimed_at <= b.cancelled_at)
    RETURNING j.id, j.awaited
), finished AS (  -- a Queue.result waiting for one of them is told it ended
    SELECT pg_notify('{prefix}_results', id::text) FROM skipped WHERE awaited
)
SELECT id FROM skipped WHERE (SELECT count(*) FROM finished) >= 0;

-- batch_prune --
-- Delete one bounded batch of batches finished before :finished_before (their jobs stay,
-- for the jobs' own retention). Returns how many.
WITH doomed AS (
    SELECT id FROM {prefix}_batches
    WHERE finished_at < :finished_before
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {prefix}_batches WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*) AS deleted FROM deleted;
