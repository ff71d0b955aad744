-- Batches (Queue.batch): jobs that run side by side, counted in a row of their own, with
-- callback jobs (then / catch / finally) released exactly once by the transaction that
-- settles the member that decides them.
--
-- The bookkeeping is a row trigger on the members: when a member starts or stops being
-- finished (completed, dead, cancelled), it moves the batch row's counters in the same
-- transaction. The batch row's lock serializes members finishing at once, so exactly one
-- transaction sees `pending` reach 0 (and one the first failure); the flags it sets
-- (`finished_at`, `failed_at`) and the callbacks' own status (waiting -> pending, once) make
-- every release happen once. Its WHEN clause keeps it off every other update: claims,
-- renewals and the jobs of no batch cost one comparison per row.
--
-- Callbacks are ordinary jobs stored with the batch, status 'waiting', `batch_callback` naming
-- which one they are; one whose condition did not hold ends 'cancelled'. Members skipped by a
-- cancellation (cancel_batch, or the first failure without allow_failures) end 'cancelled'
-- too, with a journal entry saying why.

-- `batch_id` has been in the jobs table since the first migration, unused until now.
ALTER TABLE {prefix}_jobs
    ADD COLUMN batch_callback text CHECK (batch_callback IN ('then', 'catch', 'finally'));

ALTER TABLE {prefix}_jobs DROP CONSTRAINT {prefix}_jobs_status_check;
ALTER TABLE {prefix}_jobs ADD CONSTRAINT {prefix}_jobs_status_check
    CHECK (status IN ('pending', 'claimed', 'completed', 'dead', 'waiting', 'cancelled'));

ALTER TABLE {prefix}_journal DROP CONSTRAINT {prefix}_journal_outcome_check;
ALTER TABLE {prefix}_journal ADD CONSTRAINT {prefix}_journal_outcome_check CHECK (outcome IN (
    'completed', 'paused', 'failed', 'dead', 'released', 'stale_recovered', 'merged', 'retried',
    'cancelled'));

-- A batch's members and callbacks: a callback by its name in one probe (its release), the
-- members by the batch (cancellation); partial, so the jobs of no batch are not in it.
CREATE INDEX {prefix}_jobs_batch_idx ON {prefix}_jobs (batch_id, batch_callback)
    WHERE batch_id IS NOT NULL;

-- Cleanup and history take cancelled jobs too (a superset of the old index's predicate, so
-- the statements of the release before still use it).
CREATE INDEX {prefix}_jobs_finished_v2_idx ON {prefix}_jobs (finished_at)
    WHERE status IN ('completed', 'dead', 'cancelled');
DROP INDEX {prefix}_jobs_finished_idx;

CREATE TABLE {prefix}_batches (
    id             uuid        PRIMARY KEY,
    name           text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    allow_failures boolean     NOT NULL,
    total          integer     NOT NULL CHECK (total >= 0),
    pending        integer     NOT NULL,            -- members not finished yet
    done           integer     NOT NULL DEFAULT 0,
    failed         integer     NOT NULL DEFAULT 0,  -- dead
    cancelled      integer     NOT NULL DEFAULT 0,
    failed_at      timestamptz,  -- the first failure (catch released then)
    cancelled_at   timestamptz,  -- cancel_batch, or the first failure without allow_failures
    finished_at    timestamptz   -- every member finished (then / finally decided then)
);

CREATE INDEX {prefix}_batches_finished_idx ON {prefix}_batches (finished_at)
    WHERE finished_at IS NOT NULL;

-- Release (waiting -> pending, due now) or drop (waiting -> cancelled) one callback of a
-- batch; a callback that is not waiting any more (released, dropped, forgotten) is left alone.
CREATE FUNCTION {prefix}_batch_callback(batch uuid, which text, release boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    released_kind text;
    dropped uuid;
    was_awaited boolean;
BEGIN
    IF release THEN
        UPDATE {prefix}_jobs SET status = 'pending', run_at = now()
        WHERE batch_id = batch AND batch_callback = which AND status = 'waiting'
        RETURNING kind INTO released_kind;
        IF released_kind IS NOT NULL THEN
            PERFORM pg_notify('{prefix}_jobs', released_kind);
        END IF;
    ELSE
        UPDATE {prefix}_jobs SET status = 'cancelled', finished_at = now()
        WHERE batch_id = batch AND batch_callback = which AND status = 'waiting'
        RETURNING id, awaited INTO dropped, was_awaited;
        IF was_awaited THEN  -- a Queue.result waiting for it is told it ended
            PERFORM pg_notify('{prefix}_results', dropped::text);
        END IF;
    END IF;
END
$$;

-- Skip the members of a batch that have not started (pending, a retry waiting for its
-- backoff included); each one's trigger counts it. Returns how many.
CREATE FUNCTION {prefix}_batch_cancel_members(batch uuid) RETURNS integer
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
    RETURN skipped;
END
$$;

-- Finish the batch if every member is finished and it was not finished before: `then` runs
-- if every member completed, `finally` either way; a callback that did not run is dropped.
CREATE FUNCTION {prefix}_batch_finish(batch uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    all_done boolean;
BEGIN
    UPDATE {prefix}_batches SET finished_at = now()
    WHERE id = batch AND pending = 0 AND finished_at IS NULL
    RETURNING done = total INTO all_done;
    IF FOUND THEN
        PERFORM {prefix}_batch_callback(batch, 'then', all_done);
        PERFORM {prefix}_batch_callback(batch, 'catch', false);  -- unless a failure released it
        PERFORM {prefix}_batch_callback(batch, 'finally', true);
    END IF;
END
$$;

CREATE FUNCTION {prefix}_batch_member_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    was_finished boolean := OLD.status IN ('completed', 'dead', 'cancelled');
    is_finished boolean := NEW.status IN ('completed', 'dead', 'cancelled');
    stop_batch boolean;
    left_pending integer;
BEGIN
    UPDATE {prefix}_batches SET
        pending = pending - (is_finished::int - was_finished::int),
        done = done + (NEW.status = 'completed')::int - (OLD.status = 'completed')::int,
        failed = failed + (NEW.status = 'dead')::int - (OLD.status = 'dead')::int,
        cancelled = cancelled + (NEW.status = 'cancelled')::int - (OLD.status = 'cancelled')::int
    WHERE id = NEW.batch_id
    RETURNING pending INTO left_pending;
    IF NOT FOUND THEN
        RETURN NULL;  -- the batch was pruned: nothing to count
    END IF;
    IF NEW.status = 'cancelled' THEN
        INSERT INTO {prefix}_journal (job_id, run, outcome, note)
        VALUES (NEW.id, NEW.run_count, 'cancelled', 'batch ' || NEW.batch_id || ' cancelled');
    ELSIF NEW.status = 'dead' THEN
        -- The first failure: catch runs, and without allow_failures the batch stops.
        UPDATE {prefix}_batches SET failed_at = now()
        WHERE id = NEW.batch_id AND failed_at IS NULL
        RETURNING NOT allow_failures AND cancelled_at IS NULL INTO stop_batch;
        IF FOUND THEN
            PERFORM {prefix}_batch_callback(NEW.batch_id, 'catch', true);
            IF stop_batch THEN
                UPDATE {prefix}_batches SET cancelled_at = now() WHERE id = NEW.batch_id;
                PERFORM {prefix}_batch_cancel_members(NEW.batch_id);
            END IF;
        END IF;
    END IF;
    -- The last member (a cancellation above counts its own members, and finishes there).
    IF left_pending = 0 THEN
        PERFORM {prefix}_batch_finish(NEW.batch_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER {prefix}_batch_member AFTER UPDATE OF status ON {prefix}_jobs
    FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL AND NEW.batch_callback IS NULL
                       AND NEW.status IS DISTINCT FROM OLD.status
                       AND (NEW.status IN ('completed', 'dead', 'cancelled')
                            OR OLD.status IN ('completed', 'dead', 'cancelled')))
    EXECUTE FUNCTION {prefix}_batch_member_moved();

-- The claim of migration 0008 (claim_v3), returning each job's batch too (Context.batch_id).
-- claim_v3 stays for the workers of the release before, during a rolling deploy.
CREATE FUNCTION {prefix}_claim_v4(
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
