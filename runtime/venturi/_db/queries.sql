-- Every statement venturi runs, by name. `{prefix}` is replaced by the validated table
-- prefix; `$n` are asyncpg parameters. Names are noun_verb so related queries sort together.
-- Times always come from the database clock (now()), never from a worker's.

-- job_insert --
-- Enqueue one job and wake listeners (delivered at commit).
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key)
    -- $6 cast: coalesce($6, 0) alone would type it integer and truncate 1.2 s to 1 s.
    VALUES ($1, $2, $3, $4, coalesce($5, now() + make_interval(secs => coalesce($6::float8, 0))),
            $7::text::jsonb, $8, $9, $10, $11)
    RETURNING kind
)
SELECT pg_notify($12, kind) FROM inserted;

-- job_insert_many --
-- Enqueue many jobs of one queue ($3) in one statement (arrays + unnest), one notification
-- per kind.
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key)
    SELECT r.id, r.kind, $3, r.priority,
           coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay_s, 0))),
           r.payload::jsonb, r.lease_s, r.backoff_base_s, r.backoff_cap_s, r.dedup_key
    FROM unnest($1::uuid[], $2::text[], $4::smallint[], $5::timestamptz[],
                $6::float8[], $7::text[], $8::float8[], $9::float8[], $10::float8[], $11::text[])
         AS r(id, kind, priority, run_at, delay_s, payload,
              lease_s, backoff_base_s, backoff_cap_s, dedup_key)
    RETURNING kind
)
SELECT pg_notify($12, kind) FROM (SELECT DISTINCT kind FROM inserted) AS kinds;

-- job_claim --
-- Claim up to $3 eligible jobs of the queues $1, in their order, of the kinds $2 (see the
-- function's definition in migration 0004 for the claim order, the tier reservations $4/$5
-- and the lease announcement $9 on channel $10). Rows come back in claim order.
SELECT id, kind, queue, payload, carry, run_count, failures, claim_token, lease_s,
       backoff_base_s, backoff_cap_s, waited_s, history
FROM {prefix}_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- job_settle_many --
-- Settle a batch of outcomes and write their journal rows in one statement. Each row is
-- guarded by its claim token (set by each claim, cleared by every settle and recovery, so a
-- matching token means "still claimed by this claim"): a job recovered and reclaimed
-- elsewhere is left untouched. 'returned' hands back a prefetched job that never started:
-- pending again, its claim not counted as a run, and nothing journaled.
-- Plan-proof on purpose: jobs are matched to outcomes on id and token only (a status filter
-- would let a cached generic plan, guessing the batch holds 10 rows and "claimed" none, loop
-- over the lease index once per outcome), and the journal reads the update's RETURNING
-- instead of joining. tests/runtime/test_plans.py keeps these statements linear.
WITH s AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[],
                         $6::bool[], $7::text[], $8::text[], $9::float8[])
        AS s(id, token, outcome, delay_s, carry, set_carry, note, attachment, duration_s)
), settled AS (
    UPDATE {prefix}_jobs AS j SET
        status = CASE WHEN s.outcome IN ('completed', 'dead') THEN s.outcome ELSE 'pending' END,
        -- Delays clamped to [0, 10 years]: one absurd value must not fail the whole batch.
        run_at = CASE WHEN s.outcome IN ('completed', 'dead') THEN j.run_at
                      ELSE now() + make_interval(secs => least(greatest(s.delay_s, 0), 315576000))
                 END,
        finished_at = CASE WHEN s.outcome IN ('completed', 'dead') THEN now() END,
        carry = CASE WHEN s.set_carry THEN s.carry::jsonb ELSE j.carry END,
        failures = j.failures + CASE WHEN s.outcome IN ('failed', 'dead') THEN 1 ELSE 0 END,
        run_count = j.run_count - CASE WHEN s.outcome = 'returned' THEN 1 ELSE 0 END,
        last_error = CASE WHEN s.outcome IN ('failed', 'dead') THEN s.note ELSE j.last_error END,
        claim_token = NULL,
        lease_until = NULL
    FROM s
    WHERE j.id = s.id AND j.claim_token = s.token
    RETURNING j.id, j.kind, j.run_count, j.status,
              s.outcome, s.note, s.attachment, s.duration_s
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, attachment, duration_s, worker)
    SELECT id, run_count, outcome, note, attachment::jsonb, duration_s, $10
    FROM settled
    WHERE outcome <> 'returned'
), woken AS (
    SELECT pg_notify($11, kind) FROM (SELECT DISTINCT kind FROM settled
                                      WHERE status = 'pending') AS kinds
)
SELECT settled.id, (SELECT count(*) FROM woken) AS woken FROM settled;

-- job_renew_leases --
-- Extend the leases of jobs whose handlers are alive. Returns the jobs still owned; a job
-- missing from the result was recovered elsewhere and must not be settled by this worker.
UPDATE {prefix}_jobs AS j
SET lease_until = now() + make_interval(secs => r.lease_s)
FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) AS r(id, token, lease_s)
WHERE j.id = r.id AND j.claim_token = r.token  -- id and token only: see job_settle_many
RETURNING j.id;

-- job_select_stale --
-- Lock claimed jobs of these queues ($2) whose lease expired (their worker died or hung),
-- oldest first. Each queue's own workers recover its jobs, by its own policy.
SELECT id, kind, run_count, failures, backoff_base_s, backoff_cap_s, claimed_by, claim_token
FROM {prefix}_jobs
WHERE status = 'claimed' AND lease_until < now() AND queue = ANY($2::text[])
ORDER BY lease_until
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- job_recover_many --
-- Re-pend (with backoff) or kill (backstop reached) jobs locked by job_select_stale.
WITH r AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bool[], $4::float8[], $5::text[])
        AS r(id, token, dead, delay_s, note)
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
        lease_until = NULL
    FROM r
    WHERE j.id = r.id AND j.claim_token = r.token  -- still the claim that expired (see settle)
    RETURNING j.id, j.kind, j.queue, j.run_count, j.status, r.note
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, worker)
    SELECT id, run_count, 'stale_recovered', note, $6 FROM recovered
), woken AS (
    SELECT pg_notify($7, kind) FROM (SELECT DISTINCT kind FROM recovered
                                     WHERE status = 'pending') AS kinds
)
SELECT recovered.id, recovered.kind, recovered.queue, recovered.run_count, recovered.status,
       recovered.note, (SELECT count(*) FROM woken) AS woken
FROM recovered;

-- lease_next_expiry --
-- Seconds until the earliest lease among claimed jobs of these queues expires (NULL when none
-- is claimed).
SELECT extract(epoch FROM min(lease_until) - now())::float8 FROM {prefix}_jobs
WHERE status = 'claimed' AND queue = ANY($1::text[]);

-- job_release_unheld --
-- Hand back the jobs the database says worker $1 holds that it does not hold ($2): claims
-- whose reply was lost with the connection (committed, never received). Journaled as
-- 'released' with note $3 (not a failure), eligible at once, and announced on channel $4.
WITH released AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'pending',
        run_at = now(),
        claim_token = NULL,
        lease_until = NULL
    WHERE j.status = 'claimed' AND j.claimed_by = $1 AND j.id <> ALL($2::uuid[])
    RETURNING j.id, j.kind, j.run_count
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, worker)
    SELECT id, run_count, 'released', $3, $1 FROM released
), woken AS (
    SELECT pg_notify($4, kind) FROM (SELECT DISTINCT kind FROM released) AS kinds
)
SELECT released.id, released.kind, (SELECT count(*) FROM woken) AS woken FROM released;

-- job_next_due --
-- Seconds until the next pending job of these kinds becomes eligible (NULL when none is
-- scheduled). One index probe per kind.
SELECT extract(epoch FROM min(t.run_at) - now())::float8
FROM unnest($1::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT run_at FROM {prefix}_jobs
    WHERE status = 'pending' AND kind = k.kind AND run_at > now()
    ORDER BY run_at LIMIT 1
) AS t;

-- job_get --
-- One job by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text, carry::text,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error
FROM {prefix}_jobs WHERE id = $1;

-- journal_list_for_job --
-- A job's journal, oldest first.
SELECT job_id, run, outcome, at, note, attachment::text, duration_s, worker
FROM {prefix}_journal WHERE job_id = $1 ORDER BY id;

-- stats --
-- The live state counters cannot reconstruct, in one statement that stays cheap at any
-- backlog: totals by kind and status from the trigger-kept counts; per kind with pending
-- jobs, one index probe for the oldest eligible job and a range count of the scheduled ones
-- (jobs waiting for a future run_at, usually few).
WITH totals AS (
    SELECT kind, status, sum(n)::bigint AS n FROM {prefix}_counts
    WHERE status IN ('pending', 'claimed', 'dead', 'completed')
    GROUP BY kind, status HAVING sum(n) > 0
)
SELECT t.status, t.kind, t.n,
       CASE WHEN t.status = 'pending' THEN (
           SELECT count(*) FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.kind = t.kind AND j.run_at > now()
       ) ELSE 0 END AS scheduled,
       CASE WHEN t.status = 'pending' THEN (
           SELECT extract(epoch FROM now() - j.run_at)::float8 FROM {prefix}_jobs AS j
           WHERE j.status = 'pending' AND j.kind = t.kind AND j.run_at <= now()
           ORDER BY j.run_at LIMIT 1
       ) END AS oldest_s
FROM totals AS t;

-- claimed_by_pod --
-- Claimed jobs per pod (claimed_pod; jobs of workers outside Kubernetes have none), for the
-- operator's pod-deletion-cost: a range over the partial lease index, one row per busy pod.
SELECT claimed_pod, count(*)::bigint FROM {prefix}_jobs
WHERE status = 'claimed' AND claimed_pod IS NOT NULL
GROUP BY claimed_pod;

-- migration_table_create --
-- The record of applied migrations (created under the migration lock).
CREATE TABLE IF NOT EXISTS {prefix}_migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- migration_list --
-- Versions already applied.
SELECT version FROM {prefix}_migrations ORDER BY version;

-- migration_record --
-- Mark one migration applied.
INSERT INTO {prefix}_migrations (version, name) VALUES ($1, $2);

-- lock_migrations --
-- Serialize migrate() across processes for this prefix, until the transaction ends.
SELECT pg_advisory_xact_lock($1);

-- connection_probe --
-- Liveness probe of a long-lived connection (the LISTEN one).
SELECT 1;

-- dedup_lock --
-- Serialize enqueues of one (queue, kind, dedup key) across producers until the transaction
-- ends.
SELECT pg_advisory_xact_lock($1);

-- job_find_pending_duplicate --
-- The oldest pending job of this kind and key in this queue ($3), locked for the merge
-- decision: a job of another queue is never a candidate (no worker of this queue would run
-- it). A job being claimed right now stops matching once the claim commits (it is no longer
-- pending).
SELECT id, payload::text, carry::text, run_count
FROM {prefix}_jobs
WHERE status = 'pending' AND kind = $1 AND dedup_key = $2 AND queue = $3
ORDER BY id
LIMIT 1
FOR UPDATE;

-- job_merge --
-- Apply a merge decision to the existing pending job and journal it (payload NULL: keep).
WITH merged AS (
    UPDATE {prefix}_jobs SET
        payload = coalesce($2::text::jsonb, payload),
        carry = CASE WHEN $3 THEN $4::text::jsonb ELSE carry END,
        priority = coalesce($5, priority)
    WHERE id = $1 AND status = 'pending'
    RETURNING id, run_count
)
INSERT INTO {prefix}_journal (job_id, run, outcome, note)
SELECT id, run_count, 'merged', $6 FROM merged;

-- job_list --
-- Jobs matching optional filters (NULL = any), newest first, keyset-paginated by id.
SELECT id, kind, queue, status, priority, run_at, created_at, finished_at,
       payload::text, carry::text,
       run_count, failures, claimed_at, lease_until, claimed_by, claimed_pod, last_error
FROM {prefix}_jobs
WHERE ($1::text IS NULL OR status = $1)
  AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR queue = $3)
  AND ($4::uuid IS NULL OR id < $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6)
ORDER BY id DESC
LIMIT $7;

-- job_cleanup_batch --
-- Delete one bounded batch of finished jobs and their journal (short locks, short WAL bursts).
WITH doomed AS (
    SELECT id FROM {prefix}_jobs
    WHERE status IN ('completed', 'dead') AND finished_at < $1
      AND ($2::text IS NULL OR kind = $2)
      AND ($3::text IS NULL OR status = $3)
    ORDER BY finished_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), journal AS (
    DELETE FROM {prefix}_journal WHERE job_id IN (SELECT id FROM doomed)
), deleted AS (
    DELETE FROM {prefix}_jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*) FROM deleted;
