-- claim_v5: claim_v4 with the skipped kinds' filter written so a generic plan can estimate
-- it. The claim runs on generic plans (planning was most of a claim's cost), and a generic
-- plan estimates `kind <> ALL($skip_kinds)` as 1 - 1/ndistinct(kind) per element: with one
-- kind in the table (ANALYZE says so, as it does for most single-task deployments) that is
-- 0, so the planner expected one matching row and chose a sequential scan of the table and
-- a sort of every pending job over the claim index's ordered range: 35 ms a claim at 100,000
-- pending jobs, 0.04 ms with this form (tests/runtime/test_plans.py). Nearly every claim
-- skips no kind (only capped kinds are skipped), so `cardinality(...) = 0` decides it.
-- claim_v4 stays for workers of the previous release during a rolling deploy.

CREATE FUNCTION {prefix}_claim_v5(
    queues text[],
    kinds text[],
    skip_kinds text[],
    n integer,
    reserved_low integer,
    reserved_normal integer,
    worker text,
    pod text,
    default_lease_s double precision,
    held_lease_s double precision,
    channel text
) RETURNS TABLE (
    id uuid,
    kind text,
    queue text,
    payload text,
    carry text,
    run_count integer,
    failures integer,
    claim_token uuid,
    lease_s double precision,
    backoff_base_s double precision,
    backoff_cap_s double precision,
    waited_s double precision,
    history text,
    max_attempts integer,
    timeout_s double precision,
    batch_id uuid
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    q text;
    taken integer := 0;
    got integer;
    low integer;
    normal integer;
BEGIN
    FOREACH q IN ARRAY queues LOOP
        EXIT WHEN taken >= n;
        -- A paused queue is skipped (its jobs stay pending), unless its pause has run out.
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM {prefix}_queues AS p
            WHERE p.name = q AND p.paused_at IS NOT NULL
              AND (p.paused_until IS NULL OR p.paused_until > now())
        );
        low := reserved_low * (n - taken) / n;
        normal := reserved_normal * (n - taken) / n;
        RETURN QUERY
        WITH p0 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND (cardinality(skip_kinds) = 0 OR j.kind <> ALL(skip_kinds))
              AND j.priority <= 0 AND j.run_at <= now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low
            FOR UPDATE SKIP LOCKED
        ), p1 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND (cardinality(skip_kinds) = 0 OR j.kind <> ALL(skip_kinds))
              AND j.priority <= 1 AND j.run_at <= now() AND j.id NOT IN (SELECT id FROM p0)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low + normal - (SELECT count(*) FROM p0)
            FOR UPDATE SKIP LOCKED
        ), p2 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND (cardinality(skip_kinds) = 0 OR j.kind <> ALL(skip_kinds))
              AND j.run_at <= now()
              AND j.id NOT IN (SELECT id FROM p0 UNION ALL SELECT id FROM p1)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT n - taken - (SELECT count(*) FROM p0) - (SELECT count(*) FROM p1)
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT id, true AS reserved FROM p0 UNION ALL SELECT id, true FROM p1
            UNION ALL SELECT id, false FROM p2
        ), claimed AS (
            UPDATE {prefix}_jobs AS j SET
                status = 'claimed',
                run_count = j.run_count + 1,
                claim_token = gen_random_uuid(),
                claimed_at = now(),
                claimed_by = worker,
                claimed_pod = pod,
                lease_until = now() + make_interval(secs => least(2592000, greatest(
                    coalesce(j.lease_s, default_lease_s), j.timeout_s + 60)))
            -- = ANY(ARRAY(...)) rather than a join: the planner cannot estimate the CTEs' row
            -- counts (their LIMITs are expressions) and would hash-join a scan of the table.
            WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING j.id, j.kind, j.queue, j.payload, j.carry, j.run_count, j.failures,
                      j.claim_token,
                      least(2592000, greatest(coalesce(j.lease_s, default_lease_s),
                                              j.timeout_s + 60)) AS lease_s,
                      j.backoff_base_s, j.backoff_cap_s, j.priority, j.run_at, j.dedup_key,
                      j.max_attempts, j.timeout_s, j.batch_id
        ), announced AS (
            SELECT pg_notify(channel, '!lease ' || min(c.lease_s)::text || ' ' || q)
            FROM claimed AS c
            HAVING count(*) > 0 AND (held_lease_s IS NULL OR min(c.lease_s) < held_lease_s)
        )
        -- In claim order, which a worker that holds jobs back (prefetch) starts them in: the
        -- jobs the tier reservations picked from below the claim's top tier are spread evenly
        -- among the others (not all after them), so a deep prefetch keeps the reserved share
        -- in every stretch of runs. Everything else is in priority, then FIFO order, as is
        -- everything without reservations (strict priority) or of one tier.
        SELECT c.id, c.kind, c.queue, c.payload::text, c.carry::text, c.run_count, c.failures,
               c.claim_token, c.lease_s, c.backoff_base_s, c.backoff_cap_s,
               extract(epoch FROM now() - c.run_at)::float8,
               -- A first run has no history unless a merge journaled one (merges need a
               -- dedup key), so most claims skip the journal entirely.
               CASE WHEN c.run_count > 1 OR c.dedup_key IS NOT NULL THEN
               (SELECT jsonb_agg(jsonb_build_object(
                           'run', h.run, 'outcome', h.outcome, 'at', h.at, 'note', h.note,
                           'attachment', h.attachment, 'duration_s', h.duration_s,
                           'worker', h.worker) ORDER BY h.id)
                FROM {prefix}_journal AS h WHERE h.job_id = c.id)::text END,
               c.max_attempts, c.timeout_s, c.batch_id
        FROM claimed AS c JOIN picked AS p ON p.id = c.id,
             LATERAL (SELECT p.reserved AND c.priority < (SELECT max(priority) FROM claimed)
                      AS lower) AS r
        WHERE (SELECT count(*) FROM announced) >= 0  -- always true: makes the CTE run
        WINDOW spread AS (PARTITION BY r.lower ORDER BY c.priority DESC, c.run_at, c.id)
        ORDER BY (row_number() OVER spread - 0.5) / count(*) OVER (PARTITION BY r.lower),
                 r.lower, c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
    END LOOP;
END
$$;
