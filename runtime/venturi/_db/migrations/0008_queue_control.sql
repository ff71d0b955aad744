-- Queue control: pausing a named queue, and a job's attempts and timeout.
--
-- {prefix}_queues holds what an operator decided about a queue: a paused queue's jobs stay
-- pending and no claim takes them until it is resumed or its `paused_until` passes (a pause
-- past its until is simply not a pause: nothing has to run at that moment to end it). One row
-- per queue ever paused, written by `pause`/`resume` only; the claim reads it by primary key,
-- once per queue it serves, so the hot path never joins it.
CREATE TABLE {prefix}_queues (
    name          text        PRIMARY KEY,
    paused_at     timestamptz,                -- NULL: not paused
    paused_until  timestamptz,                -- NULL: paused until resumed
    reason        text,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (paused_at IS NOT NULL OR (paused_until IS NULL AND reason IS NULL))
);

-- A job's attempts and timeout, set at enqueue by its task (NULL: the worker's backstop alone;
-- no timeout). A timeout is at most 29 days, so the lease that must outlast it by a minute
-- stays within the 30 days a lease may last.
ALTER TABLE {prefix}_jobs
    ADD COLUMN max_attempts integer CHECK (max_attempts >= 1),
    ADD COLUMN timeout_s double precision CHECK (timeout_s > 0 AND timeout_s <= 2505600);

-- The claim, version 3: version 2 (migration 0007: NULL kinds for every kind but skip_kinds;
-- versions 1 and 2 are kept, so workers of the previous releases keep claiming during a
-- rolling deploy; they see neither pauses nor timeouts) plus the pause check, a
-- lease that outlasts the job's timeout by a minute (so a run reaches its timeout without a
-- single renewal: a worker cut off from the database neither aborts the run nor has its job
-- recovered elsewhere before the run's own timeout has ended it), and the job's max_attempts
-- and timeout_s returned. Its statements run on generic
-- plans: with custom ones PL/pgSQL re-plans the claim's statement for every queue of every
-- call (the parameters differ each time), and planning, not running, was most of a claim's
-- cost, most of all for the empty queues a strict-order claim passes over (measured: a claim
-- of 8 jobs from the third of three queues, two of them empty, about 0.7 ms instead of 1.9;
-- from one queue, 0.5 instead of 1.0). The generic plans are range scans of the claim index
-- (tests/runtime/test_plans.py checks them).
CREATE FUNCTION {prefix}_claim_v3(
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
    timeout_s double precision
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
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
              AND j.priority <= 0 AND j.run_at <= now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low
            FOR UPDATE SKIP LOCKED
        ), p1 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
              AND j.priority <= 1 AND j.run_at <= now() AND j.id NOT IN (SELECT id FROM p0)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low + normal - (SELECT count(*) FROM p0)
            FOR UPDATE SKIP LOCKED
        ), p2 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
              AND j.run_at <= now()
              AND j.id NOT IN (SELECT id FROM p0 UNION ALL SELECT id FROM p1)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT n - taken - (SELECT count(*) FROM p0) - (SELECT count(*) FROM p1)
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT id FROM p0 UNION ALL SELECT id FROM p1 UNION ALL SELECT id FROM p2
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
                      j.max_attempts, j.timeout_s
        ), announced AS (
            SELECT pg_notify(channel, '!lease ' || min(c.lease_s)::text || ' ' || q)
            FROM claimed AS c
            HAVING count(*) > 0 AND (held_lease_s IS NULL OR min(c.lease_s) < held_lease_s)
        )
        -- In claim order: a worker that holds some jobs back (prefetch) starts them in order.
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
               c.max_attempts, c.timeout_s
        FROM claimed AS c
        WHERE (SELECT count(*) FROM announced) >= 0  -- always true: makes the CTE run
        ORDER BY c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
    END LOOP;
END
$$;

-- KEDA's backlog (migration 0006) leaves paused queues out: their due jobs need no worker
-- until the queue is resumed (jobs already running still count).
CREATE OR REPLACE FUNCTION {prefix}_backlog(
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
        cap)
$$;
