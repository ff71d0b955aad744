-- Scale-in fences: the pods the operator is about to remove (it lowers the Deployment's
-- replicas next, and the ReplicaSet deletes them), recorded so that they claim nothing more.
-- Without a fence, a pod the operator saw idle could claim a job between that read and its
-- SIGTERM, and then drain it (finish it within the grace period, or hand it back to be run
-- again elsewhere). `until` bounds a fence whose scale-in never happened (an operator that
-- died half-way): the claim ignores it from then on, and the operator deletes it.
--
-- claim_v6: claim_v5 that claims nothing for a fenced pod. Workers outside Kubernetes (no
-- pod) skip the check. claim_v5 stays for workers of the previous release (which a fence
-- does not stop: their pods drain as before).

CREATE TABLE {prefix}_fences (
    pod text PRIMARY KEY,
    fenced_at timestamptz NOT NULL DEFAULT now(),
    until timestamptz NOT NULL,
    CHECK (length(pod) BETWEEN 1 AND 253)
);

CREATE FUNCTION {prefix}_claim_v6(
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
    IF pod IS NOT NULL THEN
        -- A pod the operator is about to remove claims nothing (see the table above). The
        -- shared lock orders this claim against a fence of the same pod: a fence waits for
        -- the claims of its pod in flight to commit (so the operator's read of the pod's
        -- claims after the fence sees them), and a claim that comes after it sees the fence.
        PERFORM pg_advisory_xact_lock_shared(hashtext('{prefix}_fences'), hashtext(pod));
        IF EXISTS (
            SELECT 1 FROM {prefix}_fences AS f
            WHERE f.pod = {prefix}_claim_v6.pod AND f.until > now()
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
