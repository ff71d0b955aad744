-- claim_v7, replaced in place (the same arguments and rows, but one claim token for all the
-- rows of a claim; workers of the previous release call it too), with three costs per
-- claimed row taken out:
-- - whether a tier reservation picked the row is read from a hash of the picked ids
--   (`IN (SELECT ...)`, a hashed subplan), not with `= ANY(ARRAY(...))`, which compared every
--   claimed row with every reserved id: at the default ratio (4) a quarter of a claim's slots
--   are reserved, so a claim of 1,000 jobs made ~250,000 comparisons, about 1.5 ms of ~13 ms;
-- - the wait is `date_part('epoch', ...)`, a float8, not `extract(...)::float8`, which
--   computes in numeric (about 0.3 us a row);
-- - the claim token is drawn once per claim, not per row (gen_random_uuid() costs about
--   1.5 us): a settle, renewal or recovery matches the job's id and its token, so a token
--   shared by the jobs of one claim still says "claimed by this claim, not recovered since".
-- The plain one-queue claim (job_claim_queue) changes the same way.

CREATE OR REPLACE FUNCTION {prefix}_claim_v7(
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
    batch_id uuid,
    priority smallint,
    reserved boolean
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    q text;
    taken integer := 0;
    got integer;
    low integer;
    normal integer;
BEGIN
    IF pod IS NOT NULL THEN
        -- A pod the operator is about to remove claims nothing (see the table above). The
        -- shared lock orders this claim against a fence of the same pod: a fence waits for
        -- the claims of its pod in flight to commit (so the operator's read of the pod's
        -- claims after the fence sees them), and a claim that comes after it sees the fence.
        PERFORM pg_advisory_xact_lock_shared(hashtext('{prefix}_fences'), hashtext(pod));
        IF EXISTS (
            SELECT 1 FROM {prefix}_fences AS f
            WHERE f.pod = {prefix}_claim_v7.pod AND f.until > now()
        ) THEN
            RETURN;
        END IF;
    END IF;
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
                -- One token for the whole claim (an InitPlan, drawn once): it says "still claimed
                -- by this claim" with the id, and a draw per row cost ~1.5 us a job.
                claim_token = (SELECT gen_random_uuid()),
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
        -- In priority, then FIFO order, each row saying whether a tier reservation picked it
        -- (the worker spreads those that are below the claim's top tier among the others:
        -- `venturi._claims.spread_order`).
        SELECT c.id, c.kind, c.queue, c.payload::text, c.carry::text, c.run_count, c.failures,
               c.claim_token, c.lease_s, c.backoff_base_s, c.backoff_cap_s,
               date_part('epoch', now() - c.run_at),
               -- A first run has no history unless a merge journaled one (merges need a
               -- dedup key), so most claims skip the journal entirely.
               CASE WHEN c.run_count > 1 OR c.dedup_key IS NOT NULL THEN
               (SELECT jsonb_agg(jsonb_build_object(
                           'run', h.run, 'outcome', h.outcome, 'at', h.at, 'note', h.note,
                           'attachment', h.attachment, 'duration_s', h.duration_s,
                           'worker', h.worker) ORDER BY h.id)
                FROM {prefix}_journal AS h WHERE h.job_id = c.id)::text END,
               c.max_attempts, c.timeout_s, c.batch_id, c.priority,
               c.id IN (SELECT p.id FROM picked AS p WHERE p.reserved)
        FROM claimed AS c
        WHERE (SELECT count(*) FROM announced) >= 0  -- always true: makes the CTE run
        ORDER BY c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
    END LOOP;
END
$$;
