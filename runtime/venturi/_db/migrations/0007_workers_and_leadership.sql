-- The worker registry: one row per running Worker, written when it starts, refreshed by its
-- heartbeat, removed when it exits cleanly (and by the leader's sweep once it has gone
-- silent: a killed worker cannot remove its own). Small (one row per worker) and written
-- once per heartbeat per worker: no index beyond the key.
CREATE TABLE {prefix}_workers (
    id             text             PRIMARY KEY,   -- the identity: [pod/]host:pid#tag
    host           text             NOT NULL,
    pid            integer          NOT NULL,
    pod            text,
    queues         text[]           NOT NULL,      -- served in this order
    kinds          text[]           NOT NULL,      -- registered KINDs
    unknown_kinds  text             NOT NULL DEFAULT 'wait'
                   CHECK (unknown_kinds IN ('wait', 'fail')),
    concurrency    integer          NOT NULL,
    heartbeat_s    double precision NOT NULL,      -- how often it refreshes last_seen
    started_at     timestamptz      NOT NULL DEFAULT now(),
    last_seen      timestamptz      NOT NULL DEFAULT now()
);

-- Leadership: one row per thing led ('maintenance': the leader-only services). Whoever holds
-- an unexpired lease leads; it renews the lease well before it ends, and anyone may take an
-- expired one. `term` grows by one at every change of hands (or lapse), and is never reused:
-- a resigning leader expires its lease rather than deleting the row, so the next term counts
-- on from it. See venturi/_maintenance/leader.py for why a table and not an advisory lock.
CREATE TABLE {prefix}_leader (
    name        text        PRIMARY KEY,
    leader      text        NOT NULL,   -- the worker's identity
    term        bigint      NOT NULL,
    elected_at  timestamptz NOT NULL,   -- when this term began
    expires_at  timestamptz NOT NULL
);

-- The claim, version 2: as {prefix}_claim_v1 (migration 0004: the claim order, the tier
-- reservations, the lease announcement), but `kinds` may be NULL: every kind of the queues,
-- except `skip_kinds` (the kinds claimed on their own, under a cap). A worker that fails
-- unknown kinds claims with NULL (it takes, and fails, what it has no task for); any other
-- passes its kinds and an empty `skip_kinds`. v1 stays for workers of the release before,
-- during a rolling upgrade.
CREATE FUNCTION {prefix}_claim_v2(
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
    history text
) LANGUAGE plpgsql AS $$
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
        low := reserved_low * (n - taken) / n;
        normal := reserved_normal * (n - taken) / n;
        RETURN QUERY
        WITH p0 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q
              AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
              AND j.priority <= 0 AND j.run_at <= now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low
            FOR UPDATE SKIP LOCKED
        ), p1 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q
              AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
              AND j.priority <= 1 AND j.run_at <= now() AND j.id NOT IN (SELECT id FROM p0)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT low + normal - (SELECT count(*) FROM p0)
            FOR UPDATE SKIP LOCKED
        ), p2 AS (
            SELECT j.id FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue = q
              AND (kinds IS NULL OR j.kind = ANY(kinds)) AND j.kind <> ALL(skip_kinds)
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
                lease_until = now() + make_interval(secs => coalesce(j.lease_s, default_lease_s))
            -- = ANY(ARRAY(...)) rather than a join: the planner cannot estimate the CTEs' row
            -- counts (their LIMITs are expressions) and would hash-join a scan of the table.
            WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
            RETURNING j.id, j.kind, j.queue, j.payload, j.carry, j.run_count, j.failures,
                      j.claim_token, coalesce(j.lease_s, default_lease_s) AS lease_s,
                      j.backoff_base_s, j.backoff_cap_s, j.priority, j.run_at, j.dedup_key
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
                FROM {prefix}_journal AS h WHERE h.job_id = c.id)::text END
        FROM claimed AS c
        WHERE (SELECT count(*) FROM announced) >= 0  -- always true: makes the CTE run
        ORDER BY c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
    END LOOP;
END
$$;
