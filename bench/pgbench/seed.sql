-- A standing backlog, so a claim never finds an empty queue and always takes the oldest jobs.
TRUNCATE ceiling_jobs;
INSERT INTO ceiling_jobs (kind, payload)
SELECT 'noop', jsonb_build_object('enqueued_at', extract(epoch FROM clock_timestamp()))
FROM generate_series(1, 10000);
VACUUM ANALYZE ceiling_jobs;
CHECKPOINT;
