-- A cancelled batch tells the workers, so that members they claimed ahead (prefetched, not
-- started) are skipped too. Cancelling a batch (cancel_batch, or its first failure without
-- allow_failures) skips the members still pending; a worker's prefetch buffer can hold
-- claimed members that have not started, which the cancellation did not see, and they ran.
-- The notice, sent at commit on the jobs channel, makes each worker hand such members to
-- `batch_skip_held`, which cancels them only if their batch is cancelled (the database
-- decides, not the worker's memory). Workers of the release before ignore notices they do
-- not know ("!..."), and run those members as before.
CREATE OR REPLACE FUNCTION {prefix}_batch_cancel_members(batch uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    skipped integer;
BEGIN
    WITH skipped_jobs AS (
        UPDATE {prefix}_jobs SET status = 'cancelled', finished_at = now()
        WHERE batch_id = batch AND batch_callback IS NULL AND status = 'pending'
        RETURNING id, awaited
    ), finished AS (  -- a Queue.result waiting for one of them is told it ended
        SELECT pg_notify('{prefix}_results', id::text) FROM skipped_jobs WHERE awaited
    )
    SELECT count(*) INTO skipped FROM skipped_jobs
    WHERE (SELECT count(*) FROM finished) >= 0;  -- always true: makes the CTE run
    PERFORM pg_notify('{prefix}_jobs', '!batch ' || batch);
    RETURN skipped;
END
$$;
