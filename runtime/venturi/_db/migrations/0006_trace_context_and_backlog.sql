-- The W3C trace context (`traceparent`) an enqueue ran under, when the producer traces
-- (venturi.otel): the worker's span of each run links to it. NULL for every job enqueued
-- without tracing; adding a nullable column without a default rewrites nothing.
ALTER TABLE {prefix}_jobs ADD COLUMN trace_context text;

-- What the operator scales on, as one number, for KEDA's `postgresql` scaler and anyone else
-- who autoscales workers without venturi's operator: the jobs that need a worker now in the
-- queue `queue_name` (NULL: every queue), of the kinds `kinds` (NULL: every kind), that is,
-- pending jobs that are due (not those scheduled for later) plus claimed (running) jobs.
-- Each part is a scan of a partial index stopped at `cap` rows, and the sum is capped there
-- too, so a huge backlog costs a bounded read; set `cap` at or above the replicas' maximum
-- times the target per replica and the cap never changes a decision.
--     SELECT {prefix}_backlog('default', ARRAY['send_email']);
CREATE FUNCTION {prefix}_backlog(
    queue_name text DEFAULT NULL,
    kinds text[] DEFAULT NULL,
    cap bigint DEFAULT 100000
) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT least(
        (SELECT count(*) FROM (
            SELECT 1 FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.run_at <= now()
              AND (queue_name IS NULL OR j.queue = queue_name)
              AND (kinds IS NULL OR j.kind = ANY(kinds))
            LIMIT cap) AS due)
        + (SELECT count(*) FROM (
            SELECT 1 FROM {prefix}_jobs AS j
            WHERE j.status = 'claimed'
              AND (queue_name IS NULL OR j.queue = queue_name)
              AND (kinds IS NULL OR j.kind = ANY(kinds))
            LIMIT cap) AS running),
        cap)
$$;
