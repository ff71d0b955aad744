-- KEDA's backlog function names a negative cap instead of failing inside it with
-- PostgreSQL's "LIMIT must not be negative" (a NULL cap still means no cap). The same
-- count as migration 0008's, in plpgsql to raise the error; its queries are planned for the
-- arguments of each call, as the SQL function's were once inlined (a generic plan could not
-- use the queue or kinds given to bound its index scans).

CREATE OR REPLACE FUNCTION {prefix}_backlog(
    queue_name text DEFAULT NULL,
    kinds text[] DEFAULT NULL,
    cap bigint DEFAULT 100000
) RETURNS bigint LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    IF cap < 0 THEN
        RAISE EXCEPTION '{prefix}_backlog: cap must be 0 or more (or NULL for no cap), got %', cap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN least(
        (SELECT count(*) FROM (
            SELECT 1 FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.run_at <= now()
              AND (queue_name IS NULL OR j.queue = queue_name)
              AND (kinds IS NULL OR j.kind = ANY(kinds))
              AND NOT EXISTS (
                  SELECT 1 FROM {prefix}_queues AS p
                  WHERE p.name = j.queue AND p.paused_at IS NOT NULL
                    AND (p.paused_until IS NULL OR p.paused_until > now()))
            LIMIT cap) AS due)
        + (SELECT count(*) FROM (
            SELECT 1 FROM {prefix}_jobs AS j
            WHERE j.status = 'claimed'
              AND (queue_name IS NULL OR j.queue = queue_name)
              AND (kinds IS NULL OR j.kind = ANY(kinds))
            LIMIT cap) AS running),
        cap);
END
$$;
