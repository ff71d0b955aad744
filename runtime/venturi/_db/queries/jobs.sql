-- The hot path: enqueue, claim, settle, renew, and the claim loop's helpers. `{prefix}` is
-- replaced by the validated table prefix; `:name` are parameters (see _db/sql.py). Names are
-- noun_verb so related statements sort together. Times always come from the database clock
-- (now()), never from a worker's.

-- job_insert --
-- Enqueue a batch of jobs of one queue in one statement (arrays + unnest) and wake listeners
-- once per kind (delivered at commit). Every enqueue comes here, or, for a single job, to
-- job_insert_one. An optional column sent as NULL is NULL for every job (unnest pads a NULL
-- array with NULLs), so the usual batch, with no per-job policy, sends those as one NULL each.
-- :wake_kinds are the batch's distinct kinds: the insert runs once, whole or not at all,
-- whether or not it is read, so they are what it inserted (a DISTINCT over its RETURNING
-- costs about 25 us a statement).
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key)
    SELECT r.id, r.kind, :queue, r.priority,
           coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay_s, 0))),
           r.payload::jsonb, r.lease_s, r.backoff_base_s, r.backoff_cap_s, r.dedup_key
    FROM unnest(:ids::uuid[], :kinds::text[], :priorities::smallint[], :run_at::timestamptz[],
                :delay_s::float8[], :payloads::text[], :lease_s::float8[],
                :backoff_base_s::float8[], :backoff_cap_s::float8[], :dedup_keys::text[])
         AS r(id, kind, priority, run_at, delay_s, payload,
              lease_s, backoff_base_s, backoff_cap_s, dedup_key)
)
SELECT pg_notify(:channel, w.kind) FROM unnest(:wake_kinds::text[]) AS w(kind);

-- job_insert_one --
-- job_insert for a batch of one (a single enqueue, the most frequent call), from plain
-- values: unnest's function scans and the one-element arrays cost a single enqueue about a
-- tenth more. The same columns and defaults as job_insert (tests/runtime/test_store.py
-- checks that both store the same row).
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key)
    -- The delay's cast: coalesce(:delay_s, 0) alone would type it integer (1.2 s -> 1 s).
    VALUES (:id, :kind, :queue, :priority,
            coalesce(:run_at, now() + make_interval(secs => coalesce(:delay_s::float8, 0))),
            :payload::text::jsonb, :lease_s, :backoff_base_s, :backoff_cap_s, :dedup_key)
    RETURNING kind
)
SELECT pg_notify(:channel, kind) FROM inserted;

-- job_claim --
-- Claim eligible jobs of :queue in claim order (priority tier, then age), skipping rows
-- other workers hold: up to :low_slots LOW-only slots, then :normal_slots for NORMAL or LOW,
-- then :any_slots for any tier (weighted-slot anti-starvation; a reserved slot left empty
-- passes to the next group). One statement, each part a range scan of
-- {prefix}_jobs_claim_idx at any backlog. Each claim gets a fresh token that guards every
-- later write to the job (stored leases are bounded by a CHECK constraint, so no row's lease
-- can fail the statement).
-- :held_lease_s is the shortest lease the claiming worker already holds (NULL: none): a
-- claim whose leases end sooner announces them on :channel, so idle rescuers know when to
-- look.
WITH p0 AS (
    SELECT id FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = :queue AND kind = ANY(:kinds::text[])
      AND priority <= 0 AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT :low_slots
    FOR UPDATE SKIP LOCKED
), p1 AS (
    SELECT id FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = :queue AND kind = ANY(:kinds::text[])
      AND priority <= 1 AND run_at <= now() AND id NOT IN (SELECT id FROM p0)
    ORDER BY priority DESC, run_at, id
    LIMIT :low_slots + :normal_slots - (SELECT count(*) FROM p0)
    FOR UPDATE SKIP LOCKED
), p2 AS (
    SELECT id FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = :queue AND kind = ANY(:kinds::text[])
      AND run_at <= now()
      AND id NOT IN (SELECT id FROM p0 UNION ALL SELECT id FROM p1)
    ORDER BY priority DESC, run_at, id
    LIMIT :low_slots + :normal_slots + :any_slots
          - (SELECT count(*) FROM p0) - (SELECT count(*) FROM p1)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM p0 UNION ALL SELECT id FROM p1 UNION ALL SELECT id FROM p2
), claimed AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'claimed',
        run_count = j.run_count + 1,
        claim_token = gen_random_uuid(),
        claimed_at = now(),
        claimed_by = :worker,
        claimed_pod = :pod,
        lease_until = now() + make_interval(secs => coalesce(j.lease_s, :default_lease_s))
    -- = ANY(ARRAY(...)) rather than a join: the planner cannot estimate the CTEs' row
    -- counts (their LIMITs are expressions) and would hash-join a scan of the whole table.
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.kind, j.payload, j.carry, j.run_count, j.failures, j.claim_token,
              coalesce(j.lease_s, :default_lease_s) AS lease_s, j.backoff_base_s,
              j.backoff_cap_s, j.priority, j.run_at, j.dedup_key
), announced AS (
    SELECT pg_notify(:channel, '!lease ' || min(lease_s)::text || ' ' || :queue)
    FROM claimed
    HAVING count(*) > 0 AND (:held_lease_s::float8 IS NULL OR min(lease_s) < :held_lease_s)
)
-- In claim order: a worker that holds some jobs back (prefetch) starts them in this order.
SELECT c.id, c.kind, c.payload::text AS payload, c.carry::text AS carry, c.run_count,
       c.failures, c.claim_token, c.lease_s, c.backoff_base_s, c.backoff_cap_s,
       extract(epoch FROM now() - c.run_at)::float8 AS waited_s,
       -- A first run has no history unless a merge journaled one (merges need a dedup
       -- key), so most claims skip the journal entirely.
       CASE WHEN c.run_count > 1 OR c.dedup_key IS NOT NULL THEN
       (SELECT jsonb_agg(jsonb_build_object(
                   'run', h.run, 'outcome', h.outcome, 'at', h.at, 'note', h.note,
                   'attachment', h.attachment, 'duration_s', h.duration_s,
                   'worker', h.worker) ORDER BY h.id)
        FROM {prefix}_journal AS h WHERE h.job_id = c.id)::text END AS history,
       (SELECT count(*) FROM announced) AS announced
FROM claimed AS c
ORDER BY c.priority DESC, c.run_at, c.id;

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
    SELECT * FROM unnest(:ids::uuid[], :tokens::uuid[], :outcomes::text[], :delay_s::float8[],
                         :carries::text[], :set_carry::bool[], :notes::text[],
                         :attachments::text[], :durations_s::float8[])
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
    SELECT id, run_count, outcome, note, attachment::jsonb, duration_s, :worker
    FROM settled
    WHERE outcome <> 'returned'
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM settled
                                           WHERE status = 'pending') AS kinds
)
SELECT settled.id, (SELECT count(*) FROM woken) AS woken FROM settled;

-- job_renew_leases --
-- Extend the leases of jobs whose handlers are alive. Returns the jobs still owned; a job
-- missing from the result was recovered elsewhere and must not be settled by this worker.
UPDATE {prefix}_jobs AS j
SET lease_until = now() + make_interval(secs => r.lease_s)
FROM unnest(:ids::uuid[], :tokens::uuid[], :lease_s::float8[]) AS r(id, token, lease_s)
WHERE j.id = r.id AND j.claim_token = r.token  -- id and token only: see job_settle_many
RETURNING j.id;

-- job_release_unheld --
-- Hand back the jobs the database says :worker holds that it does not hold (:held): claims
-- whose reply was lost with the connection (committed, never received). Journaled as
-- 'released' with :note (not a failure), eligible at once, and announced on :channel.
WITH released AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'pending',
        run_at = now(),
        claim_token = NULL,
        lease_until = NULL
    WHERE j.status = 'claimed' AND j.claimed_by = :worker AND j.id <> ALL(:held::uuid[])
    RETURNING j.id, j.kind, j.run_count
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, worker)
    SELECT id, run_count, 'released', :note, :worker FROM released
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM released) AS kinds
)
SELECT released.id, released.kind, (SELECT count(*) FROM woken) AS woken FROM released;

-- job_next_due --
-- Seconds until the next pending job of these kinds becomes eligible (NULL when none is
-- scheduled). One index probe per kind.
SELECT extract(epoch FROM min(t.run_at) - now())::float8 AS due_in_s
FROM unnest(:kinds::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT run_at FROM {prefix}_jobs
    WHERE status = 'pending' AND kind = k.kind AND run_at > now()
    ORDER BY run_at LIMIT 1
) AS t;
