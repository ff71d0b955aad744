-- The failure step of a job that failed for good (the task's `failed` hook, the worker's
-- reporters), run once: recorded by the statement that made the job dead (job_settle_many,
-- job_recover_many: `hook_token` and a lease on it), taken and finished under its token.

-- hook_take --
-- Extend the lease of failure steps this worker holds (:ids under :tokens) and read what they
-- need. A step missing from the result was taken by another worker (its lease had ended) or
-- already ran: this worker must not run it.
UPDATE {prefix}_jobs AS j
SET hook_lease_until = now() + make_interval(secs => :lease_s)
FROM unnest(:ids::uuid[], :tokens::uuid[]) AS h(id, token)
WHERE j.id = h.id AND j.hook_token = h.token
RETURNING j.id, j.hook_token, j.kind, j.queue, j.payload::text AS payload, j.carry::text AS carry,
          j.run_count, j.failures, j.last_error, j.finished_at, j.batch_id,
          (SELECT jsonb_agg(jsonb_build_object(
                      'run', x.run, 'outcome', x.outcome, 'at', x.at, 'note', x.note,
                      'attachment', x.attachment, 'duration_s', x.duration_s,
                      'worker', x.worker) ORDER BY x.id)
           FROM {prefix}_journal AS x WHERE x.job_id = j.id)::text AS history;

-- hook_take_expired --
-- Take, under new tokens and a lease of :lease_s, failure steps of :queues and :kinds whose
-- lease ended: their worker died (or stopped) before running them.
WITH due AS (
    SELECT id FROM {prefix}_jobs
    WHERE hook_token IS NOT NULL AND hook_lease_until < now()
      AND queue = ANY(:queues::text[]) AND kind = ANY(:kinds::text[])
    ORDER BY hook_lease_until
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {prefix}_jobs AS j
SET hook_token = gen_random_uuid(),
    hook_lease_until = now() + make_interval(secs => :lease_s)
WHERE j.id IN (SELECT id FROM due)
RETURNING j.id, j.hook_token, j.kind, j.queue, j.payload::text AS payload, j.carry::text AS carry,
          j.run_count, j.failures, j.last_error, j.finished_at, j.batch_id,
          (SELECT jsonb_agg(jsonb_build_object(
                      'run', x.run, 'outcome', x.outcome, 'at', x.at, 'note', x.note,
                      'attachment', x.attachment, 'duration_s', x.duration_s,
                      'worker', x.worker) ORDER BY x.id)
           FROM {prefix}_journal AS x WHERE x.job_id = j.id)::text AS history;

-- hook_finish --
-- The failure steps :ids ran (under :tokens): clear them, so no one runs them again.
UPDATE {prefix}_jobs AS j SET hook_token = NULL, hook_lease_until = NULL
FROM unnest(:ids::uuid[], :tokens::uuid[]) AS h(id, token)
WHERE j.id = h.id AND j.hook_token = h.token;

-- hook_next_expiry --
-- Seconds until the earliest lease of a failure step of :queues and :kinds ends (NULL: none
-- is pending).
SELECT extract(epoch FROM min(hook_lease_until) - now())::float8 AS expires_in_s
FROM {prefix}_jobs
WHERE hook_token IS NOT NULL AND queue = ANY(:queues::text[]) AND kind = ANY(:kinds::text[]);

-- hook_release --
-- End this worker's leases of failure steps it will not run (their kind is not registered
-- here, or it is shutting down), so the next worker that looks takes them.
UPDATE {prefix}_jobs AS j SET hook_lease_until = now()
FROM unnest(:ids::uuid[], :tokens::uuid[]) AS h(id, token)
WHERE j.id = h.id AND j.hook_token = h.token;
