-- The rescuer's statements: jobs whose lease expired (their worker died or hung).

-- job_select_stale --
-- Lock claimed jobs of :queues whose lease expired, oldest first, at most :limit. Each
-- queue's own workers recover its jobs, by its own policy.
SELECT id, kind, run_count, failures, backoff_base_s, backoff_cap_s, claimed_by, claim_token,
       max_attempts
FROM {prefix}_jobs
WHERE status = 'claimed' AND lease_until < now() AND queue = ANY(:queues::text[])
ORDER BY lease_until
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- job_recover_many --
-- Re-pend (with backoff) or kill (attempts used up) jobs locked by job_select_stale. A job
-- made dead records its failure step (:hook_tokens, leased to this worker for :hook_lease_s)
-- in the same row write: see failure_hooks.sql.
WITH r AS (
    SELECT * FROM unnest(:ids::uuid[], :tokens::uuid[], :dead::bool[], :delay_s::float8[],
                         :notes::text[], :hook_tokens::uuid[])
        AS r(id, token, dead, delay_s, note, hook_token)
), recovered AS (
    UPDATE {prefix}_jobs AS j SET
        status = CASE WHEN r.dead THEN 'dead' ELSE 'pending' END,
        run_at = CASE WHEN r.dead THEN j.run_at
                      ELSE now() + make_interval(secs => least(greatest(r.delay_s, 0), 315576000))
                 END,
        finished_at = CASE WHEN r.dead THEN now() END,
        failures = j.failures + 1,
        last_error = r.note,
        claim_token = NULL,
        lease_until = NULL,
        unique_until = CASE WHEN r.dead THEN NULL ELSE j.unique_until END,
        hook_token = coalesce(r.hook_token, j.hook_token),
        hook_lease_until = CASE WHEN r.hook_token IS NOT NULL
                                THEN now() + make_interval(secs => :hook_lease_s)
                                ELSE j.hook_lease_until END
    FROM r
    WHERE j.id = r.id AND j.claim_token = r.token  -- still the claim that expired (see settle)
    RETURNING j.id, j.kind, j.queue, j.run_count, j.status, j.awaited, r.note, r.hook_token
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, worker)
    SELECT id, run_count, 'stale_recovered', note, :worker FROM recovered
), counted AS (
    -- Jobs the backstop killed count as failed this minute (see job_settle_many).
    INSERT INTO {prefix}_minute_counts AS m (minute, queue, kind, slot, done, failed)
    SELECT date_trunc('minute', now()), queue, kind, pg_backend_pid() % 16, 0, count(*)
    FROM recovered
    WHERE status = 'dead'
    GROUP BY queue, kind ORDER BY queue, kind
    ON CONFLICT (minute, queue, kind, slot) DO UPDATE SET failed = m.failed + excluded.failed
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM recovered
                                           WHERE status = 'pending') AS kinds
), finished AS (  -- a dead job a `Queue.result` waits for (see job_await)
    SELECT pg_notify(:results_channel, id::text) FROM recovered
    WHERE awaited AND status = 'dead'
)
SELECT recovered.id, recovered.kind, recovered.queue, recovered.run_count, recovered.status,
       recovered.note, recovered.hook_token,
       (SELECT count(*) FROM woken) + (SELECT count(*) FROM finished) AS woken
FROM recovered;

-- lease_next_expiry --
-- Seconds until the earliest lease among claimed jobs of :queues expires (NULL when none is
-- claimed).
SELECT extract(epoch FROM min(lease_until) - now())::float8 AS expires_in_s
FROM {prefix}_jobs
WHERE status = 'claimed' AND queue = ANY(:queues::text[]);
