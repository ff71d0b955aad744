-- One pass = :batch jobs through the whole life a queue gives them, as three statements that
-- each commit on their own (a queue cannot merge them: the producer's insert must be visible
-- before a worker can claim it, and the claim must be visible before the handler runs):
--   1. enqueue :batch jobs (one INSERT);
--   2. claim the :batch oldest pending jobs with FOR UPDATE SKIP LOCKED, taking a lease;
--   3. mark exactly those jobs done.
-- jobs/s = pgbench tps * :batch. Run with -M prepared; :batch comes from -D batch=N.
INSERT INTO ceiling_jobs (kind, payload)
SELECT 'noop', jsonb_build_object('enqueued_at', extract(epoch FROM clock_timestamp()))
FROM generate_series(1, :batch);
WITH claimed AS (
    UPDATE ceiling_jobs
    SET status = 'claimed', run_count = run_count + 1,
        claimed_at = now(), lease_until = now() + interval '15 minutes'
    WHERE id IN (
        SELECT id FROM ceiling_jobs
        WHERE status = 'pending' AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
)
SELECT coalesce(array_agg(id), '{}') AS job_ids FROM claimed
\gset
UPDATE ceiling_jobs SET status = 'completed', finished_at = now()
WHERE id = ANY (:job_ids::bigint[]) AND status = 'claimed';
