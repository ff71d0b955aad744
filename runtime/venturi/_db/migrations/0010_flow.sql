-- Flow control: keys that at most one run holds at a time (without_overlapping), and
-- fixed-window counters of run starts (rate_limited). See venturi/flow.py.

-- One row per held key: the run holding it, by job and claim token. A row whose token is no
-- longer its job's current claim (the run settled, or its lease was recovered: both clear
-- the token) holds nothing, so a holder that died frees its key with no cleanup of its own.
CREATE TABLE {prefix}_locks (
    key         text        PRIMARY KEY,
    job_id      uuid        NOT NULL,
    claim_token uuid        NOT NULL,
    taken_at    timestamptz NOT NULL DEFAULT now()
);

-- Take `lock_key` for the run (job_id, claim_token): NULL when taken (or already held by
-- this run), else the holder's job id. A function because the check must read the holder's
-- claim with a snapshot taken after the key's row is locked: in one statement, a snapshot
-- older than the holder's claim would see it unclaimed and take the key from a live run.
-- Each statement of a volatile PL/pgSQL function takes a fresh snapshot (READ COMMITTED).
CREATE FUNCTION {prefix}_lock_take_v1(lock_key text, job uuid, token uuid) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    holder uuid;
    holder_token uuid;
BEGIN
    LOOP
        INSERT INTO {prefix}_locks AS l (key, job_id, claim_token)
        VALUES (lock_key, job, token)
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        SELECT l.job_id, l.claim_token INTO holder, holder_token
        FROM {prefix}_locks AS l WHERE l.key = lock_key FOR UPDATE;
        IF FOUND THEN
            EXIT;
        END IF;
        -- Released between the two statements: try to insert again.
    END LOOP;
    IF (holder = job AND holder_token = token) OR NOT EXISTS (
        SELECT 1 FROM {prefix}_jobs AS j WHERE j.id = holder AND j.claim_token = holder_token
    ) THEN
        UPDATE {prefix}_locks AS l SET job_id = job, claim_token = token, taken_at = now()
        WHERE l.key = lock_key;
        RETURN NULL;
    END IF;
    RETURN holder;
END
$$;

-- One row per rate-limit key: its current fixed window (aligned on the Unix epoch) and the
-- starts taken in it.
CREATE TABLE {prefix}_rate_windows (
    key          text        PRIMARY KEY,
    window_start timestamptz NOT NULL,
    taken        integer     NOT NULL
);

-- Take one start of `rate_key`'s current window of `per_s` seconds if fewer than `max_starts`
-- were taken in it. Returns whether it was taken, and the seconds until the window ends. The
-- window is read from the clock after the key's row is locked, so takes are counted in the
-- order they happen and a take that waited on the lock across a window's end counts in the
-- new window, where its run starts.
CREATE FUNCTION {prefix}_rate_take_v1(rate_key text, max_starts integer, per_s double precision)
RETURNS TABLE (taken boolean, reopens_in_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz;
    current_start timestamptz;
    row_start timestamptz;
    row_taken integer;
BEGIN
    LOOP
        SELECT r.window_start, r.taken INTO row_start, row_taken
        FROM {prefix}_rate_windows AS r WHERE r.key = rate_key FOR UPDATE;
        now_at := clock_timestamp();
        current_start := to_timestamp(floor(extract(epoch FROM now_at) / per_s) * per_s);
        IF FOUND THEN
            EXIT;
        END IF;
        INSERT INTO {prefix}_rate_windows AS r (key, window_start, taken)
        VALUES (rate_key, current_start, 1)
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            RETURN QUERY SELECT true, extract(epoch FROM current_start - now_at)::float8 + per_s;
            RETURN;
        END IF;
        -- Another take inserted the row first: lock it, as above.
    END LOOP;
    IF row_start < current_start THEN
        UPDATE {prefix}_rate_windows AS r SET window_start = current_start, taken = 1
        WHERE r.key = rate_key;
    ELSIF row_taken < max_starts THEN
        UPDATE {prefix}_rate_windows AS r SET taken = r.taken + 1 WHERE r.key = rate_key;
        current_start := row_start;
    ELSE
        RETURN QUERY SELECT false, greatest(extract(epoch FROM row_start - now_at)::float8 + per_s, 0);
        RETURN;
    END IF;
    RETURN QUERY SELECT true, greatest(extract(epoch FROM current_start - now_at)::float8 + per_s, 0);
END
$$;

-- Stored results and progress: the value a completed run returned, the latest progress a
-- run reported (written with lease renewals and settles), and whether a caller waits for the
-- job's end (`Queue.result`): settles and recoveries notify the results channel for those
-- jobs only, so finishing a job nobody waits for sends nothing.
ALTER TABLE {prefix}_jobs
    ADD COLUMN result   jsonb,
    ADD COLUMN progress jsonb,
    ADD COLUMN awaited  boolean;
