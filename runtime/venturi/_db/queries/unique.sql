-- Unique jobs: an enqueue of a task with `unique_for` stores a job only if no job of its KIND
-- holds the same unique id; else it returns the holder's id and stores nothing.

-- job_insert_unique --
-- Enqueue one job holding :unique_key (within :kind) for :unique_for_s from now, unless a job
-- holds it: then nothing is stored and no row comes back (read the holder with
-- job_unique_holder). A holder whose time is up is detached first, in the same statement: the
-- insert's source reads the detach's result, so the detach runs to its end before the insert
-- checks the index (which then no longer sees the detached holder). ON CONFLICT, not an
-- error: a collision never aborts the caller's transaction. The same columns and defaults as
-- job_insert_one otherwise (tests/runtime/test_unique.py checks that both store the same row).
WITH expired AS (
    UPDATE {prefix}_jobs SET unique_until = NULL
    WHERE kind = :kind AND unique_key = :unique_key AND unique_until <= now()
    RETURNING id
), inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s,
                               unique_key, unique_for_s, unique_until, trace_context,
                               max_attempts, timeout_s)
    SELECT :id::uuid, :kind::text, :queue::text, :priority::smallint,
           coalesce(:run_at::timestamptz,
                    now() + make_interval(secs => coalesce(:delay_s::float8, 0))),
           :payload::text::jsonb, :lease_s::float8, :backoff_base_s::float8,
           :backoff_cap_s::float8, :unique_key::text, :unique_for_s::float8,
           now() + make_interval(secs => :unique_for_s::float8), :trace_context::text,
           :max_attempts::integer, :timeout_s::float8
    WHERE (SELECT count(*) FROM expired) >= 0  -- always true: makes the detach run first
    ON CONFLICT (kind, unique_key) WHERE unique_until IS NOT NULL DO NOTHING
    RETURNING kind
)
SELECT pg_notify(:channel, kind) AS woken FROM inserted;

-- job_unique_holder --
-- The job holding :unique_key within :kind (none: it finished meanwhile).
SELECT id FROM {prefix}_jobs
WHERE kind = :kind AND unique_key = :unique_key AND unique_until IS NOT NULL;

-- job_unique_detach_expired_of --
-- Detach the holder of the unique id of job :id if its time is up (before retrying :id).
UPDATE {prefix}_jobs AS h SET unique_until = NULL
FROM {prefix}_jobs AS d
WHERE d.id = :id AND h.kind = d.kind AND h.unique_key = d.unique_key
  AND h.unique_until <= now();

-- job_unique_holder_of --
-- The job holding the unique id of job :id, and that id (no row: the key is free).
SELECT h.id, h.unique_key FROM {prefix}_jobs AS h
JOIN {prefix}_jobs AS d ON h.kind = d.kind AND h.unique_key = d.unique_key
WHERE d.id = :id AND h.unique_until IS NOT NULL;

-- failed_unique_ids --
-- retry_all: failed jobs that hold a unique id when pending (retried one by one, each checked
-- against the index), of an optional queue and kind, after :after_id, oldest first.
SELECT id FROM {prefix}_jobs
WHERE status = 'dead' AND unique_key IS NOT NULL
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:kind::text IS NULL OR kind = :kind)
  AND (:after_id::uuid IS NULL OR id > :after_id)
ORDER BY id
LIMIT :limit;
