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

-- One row per key and fixed window (aligned on the Unix epoch): the starts taken in it.
-- Each take deletes its key's earlier windows, so a key keeps one or two rows.
CREATE TABLE {prefix}_rate_windows (
    key          text        NOT NULL,
    window_start timestamptz NOT NULL,
    taken        integer     NOT NULL,
    PRIMARY KEY (key, window_start)
);
