-- Batches (venturi.batches, Queue.batch): the batch row and its callbacks. The counting and
-- the callbacks' release are the member trigger's (migration 0013); these statements only
-- create, read, cancel and prune.

-- batch_insert --
-- The batch row, before its jobs: every member is pending (not finished) at the start.
INSERT INTO {prefix}_batches (id, name, allow_failures, total, pending)
VALUES (:id, :name, :allow_failures, :total, :total);

-- batch_lock --
-- Lock the rows of batches :ids in id order, before a settle of their members (see
-- PostgresStore.settle): every settle takes them in one order.
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
