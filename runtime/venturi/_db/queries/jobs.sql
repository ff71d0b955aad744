-- The hot path: enqueue, claim, settle, renew, and the claim loop's helpers. `{prefix}` is
-- replaced by the validated table prefix; `:name` are parameters (see _db/sql.py). Names are
-- noun_verb so related statements sort together. Times always come from the database clock
-- (now()), never from a worker's.

-- job_insert --
-- Enqueue a batch of jobs in one statement (arrays + unnest) and wake listeners
-- once per kind (delivered at commit). Every enqueue comes here, or, for a single job, to
-- job_insert_one. An optional column sent as NULL is NULL for every job (unnest pads a NULL
-- array with NULLs), so the usual batch, with no per-job policy, sends those as one NULL each.
-- :wake_kinds are the batch's distinct kinds: the insert runs once, whole or not at all,
-- whether or not it is read, so they are what it inserted (a DISTINCT over its RETURNING
-- costs about 25 us a statement).
-- Every job goes to :queue, unless :queues (a batch spanning several queues) names each one's;
-- likewise every job is of :kind and :priority unless :kinds and :priorities name each one's
-- (a batch is usually of one kind and one priority: one value each to send, not a thousand).
-- :batch_id: the Queue.batch they belong to (NULL for nearly every insert).
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key,
                               max_attempts, timeout_s, trace_context, batch_id)
    SELECT r.id, coalesce(r.kind, :kind::text), coalesce(r.queue, :queue),
           coalesce(r.priority, :priority::smallint),
           coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay_s, 0))),
           r.payload::jsonb, r.lease_s, r.backoff_base_s, r.backoff_cap_s, r.dedup_key,
           r.max_attempts, r.timeout_s, r.trace_context, :batch_id::uuid
    FROM unnest(:ids::uuid[], :kinds::text[], :priorities::smallint[], :run_at::timestamptz[],
                :delay_s::float8[], :payloads::text[], :lease_s::float8[],
                :backoff_base_s::float8[], :backoff_cap_s::float8[], :dedup_keys::text[],
                :queues::text[], :max_attempts::integer[], :timeout_s::float8[],
                :trace_contexts::text[])
         AS r(id, kind, priority, run_at, delay_s, payload, lease_s, backoff_base_s,
              backoff_cap_s, dedup_key, queue, max_attempts, timeout_s, trace_context)
)
SELECT pg_notify(:channel, w.kind) FROM unnest(:wake_kinds::text[]) AS w(kind);

-- job_insert_one --
-- job_insert for a batch of one (a single enqueue, the most frequent call), from plain
-- values: unnest's function scans and the one-element arrays cost a single enqueue about a
-- tenth more. The same columns and defaults as job_insert (tests/runtime/test_store.py
-- checks that both store the same row).
WITH inserted AS (
    INSERT INTO {prefix}_jobs (id, kind, queue, priority, run_at, payload,
                               lease_s, backoff_base_s, backoff_cap_s, dedup_key,
                               max_attempts, timeout_s, trace_context, batch_id)
    -- The delay's cast: coalesce(:delay_s, 0) alone would type it integer (1.2 s -> 1 s).
    VALUES (:id, :kind, :queue, :priority,
            coalesce(:run_at, now() + make_interval(secs => coalesce(:delay_s::float8, 0))),
            :payload::text::jsonb, :lease_s, :backoff_base_s, :backoff_cap_s, :dedup_key,
            :max_attempts::integer, :timeout_s::float8, :trace_context,
            :batch_id::uuid)
    RETURNING kind
)
SELECT pg_notify(:channel, kind) FROM inserted;

-- job_claim --
-- (A worker of one queue outside a pod claims with job_claim_queue, below: the same claim.)
-- Claim up to :n eligible jobs of the queues :queues, in their order, skipping paused ones,
-- of the kinds :kinds (NULL: every kind but :skip_kinds; see the claim function's definitions
-- in migrations 0004 and after for the claim order, the tier reservations
-- :reserved_low/:reserved_normal and the lease announcement :held_lease_s on :channel). Rows
-- come back queue by queue, each in priority, then FIFO order, with each row's priority and
-- whether a reservation picked it (the worker spreads those: `_claims.spread_order`). With
-- :traced (a worker that traces its runs), each job's stored trace context too: one
-- primary-key probe per job, never made otherwise. The probe reads
-- with the statement's snapshot, which can predate a job the function claims (its queries
-- take their own): such a job's context reads NULL and its span is simply not linked (the
-- context never changes after the insert). :traced is read through a subquery so that the
-- planner cannot fold the CASE away: a custom plan would then always look cheaper than the
-- generic one, and the statement would be planned anew at every claim (~30-40 us).
SELECT c.id, c.kind, c.queue, c.payload, c.carry, c.run_count, c.failures, c.claim_token,
       c.lease_s, c.backoff_base_s, c.backoff_cap_s, c.waited_s, c.history, c.max_attempts,
       c.timeout_s, c.batch_id, c.priority, c.reserved,
       CASE WHEN (SELECT :traced::bool) THEN
           (SELECT j.trace_context FROM {prefix}_jobs AS j WHERE j.id = c.id) END
           AS trace_context
FROM {prefix}_claim_v7(:queues, :kinds, :skip_kinds, :n, :reserved_low, :reserved_normal,
                       :worker, :pod, :default_lease_s, :held_lease_s, :channel) AS c;

-- job_claim_queue --
-- job_claim for the usual worker: one queue, outside a Kubernetes pod (no scale-in fence to
-- look at). The claim function's per-queue statement as a plain one: the function's call
-- (PL/pgSQL, its result set written and read back) cost every claim 100-180 us of server
-- time (one job: 0.36 ms through the function, 0.24 ms plain). A fence needs the function (its
-- lock is taken before the fence is read, with a snapshot of its own), as does a claim over
-- several queues in order. The same clauses as claim_v7's loop body (migration 0019), with
-- the pause test as a gate read once: tests/runtime/test_claim_statements.py runs both on
-- the same backlogs and compares what they claim and write.
WITH gate AS (
    -- A paused queue is skipped (its jobs stay pending), unless its pause has run out.
    SELECT NOT EXISTS (
        SELECT 1 FROM {prefix}_queues AS p
        WHERE p.name = :queue::text AND p.paused_at IS NOT NULL
          AND (p.paused_until IS NULL OR p.paused_until > now())
    ) AS open
), p0 AS (
    SELECT j.id FROM {prefix}_jobs AS j
    WHERE (SELECT open FROM gate)
      AND j.status = 'pending' AND j.queue = :queue AND (:kinds::text[] IS NULL OR j.kind = ANY(:kinds)) AND (cardinality(:skip_kinds::text[]) = 0 OR j.kind <> ALL(:skip_kinds))
      AND j.priority <= 0 AND j.run_at <= now()
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :reserved_low::integer
    FOR UPDATE SKIP LOCKED
), p1 AS (
    SELECT j.id FROM {prefix}_jobs AS j
    WHERE (SELECT open FROM gate)
      AND j.status = 'pending' AND j.queue = :queue AND (:kinds IS NULL OR j.kind = ANY(:kinds)) AND (cardinality(:skip_kinds) = 0 OR j.kind <> ALL(:skip_kinds))
      AND j.priority <= 1 AND j.run_at <= now() AND j.id NOT IN (SELECT id FROM p0)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :reserved_low + :reserved_normal::integer - (SELECT count(*) FROM p0)
    FOR UPDATE SKIP LOCKED
), p2 AS (
    SELECT j.id FROM {prefix}_jobs AS j
    WHERE (SELECT open FROM gate)
      AND j.status = 'pending' AND j.queue = :queue AND (:kinds IS NULL OR j.kind = ANY(:kinds)) AND (cardinality(:skip_kinds) = 0 OR j.kind <> ALL(:skip_kinds))
      AND j.run_at <= now()
      AND j.id NOT IN (SELECT id FROM p0 UNION ALL SELECT id FROM p1)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :n::integer - (SELECT count(*) FROM p0) - (SELECT count(*) FROM p1)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id, true AS reserved FROM p0 UNION ALL SELECT id, true FROM p1
    UNION ALL SELECT id, false FROM p2
), claimed AS (
    UPDATE {prefix}_jobs AS j SET
        status = 'claimed',
        run_count = j.run_count + 1,
        -- One token for the whole claim (an InitPlan, drawn once): it says "still claimed
        -- by this claim" with the id, and a draw per row cost ~1.5 us a job.
        claim_token = (SELECT gen_random_uuid()),
        claimed_at = now(),
        claimed_by = :worker::text,
        claimed_pod = :pod::text,  -- NULL: the store sends no pod's claim here
        lease_until = now() + make_interval(secs => least(2592000, greatest(
            coalesce(j.lease_s, :default_lease_s::float8), j.timeout_s + 60)))
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.kind, j.queue, j.payload, j.carry, j.run_count, j.failures,
              j.claim_token,
              least(2592000, greatest(coalesce(j.lease_s, :default_lease_s),
                                      j.timeout_s + 60)) AS lease_s,
              j.backoff_base_s, j.backoff_cap_s, j.priority, j.run_at, j.dedup_key,
              j.max_attempts, j.timeout_s, j.batch_id
), announced AS (
    SELECT pg_notify(:channel::text, '!lease ' || min(c.lease_s)::text || ' ' || :queue)
    FROM claimed AS c
    HAVING count(*) > 0
       AND ((SELECT :held_lease_s::float8) IS NULL OR min(c.lease_s) < :held_lease_s)
)
SELECT c.id, c.kind, c.queue, c.payload::text AS payload, c.carry::text AS carry,
       c.run_count, c.failures, c.claim_token, c.lease_s, c.backoff_base_s, c.backoff_cap_s,
       -- date_part gives float8 directly; extract() computes in numeric (~0.3 us a row).
       date_part('epoch', now() - c.run_at) AS waited_s,
       CASE WHEN c.run_count > 1 OR c.dedup_key IS NOT NULL THEN
       (SELECT jsonb_agg(jsonb_build_object(
                   'run', h.run, 'outcome', h.outcome, 'at', h.at, 'note', h.note,
                   'attachment', h.attachment, 'duration_s', h.duration_s,
                   'worker', h.worker) ORDER BY h.id)
        FROM {prefix}_journal AS h WHERE h.job_id = c.id)::text END AS history,
       c.max_attempts, c.timeout_s, c.batch_id, c.priority,
       -- A hash of the reserved ids (a hashed subplan), not = ANY(ARRAY(...)): that compared
       -- each row with every reserved id (see migration 0022).
       c.id IN (SELECT p.id FROM picked AS p WHERE p.reserved) AS reserved,
       CASE WHEN (SELECT :traced::bool) THEN
           (SELECT t.trace_context FROM {prefix}_jobs AS t WHERE t.id = c.id) END
           AS trace_context
FROM claimed AS c
WHERE (SELECT count(*) FROM announced) >= 0  -- always true: makes the CTE run
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
-- A dead outcome records its failure step (:hook_tokens, leased to this worker for
-- :hook_lease_s) in the same row write: see failure_hooks.sql.
-- The jobs done and failed for good are counted per minute in the same statement (in this
-- backend's slot: no row every worker writes), and with :prune (about once a minute per
-- store) one bounded batch of minutes older than two hours is deleted, skipping rows another
-- settle holds.
-- The arrays and :prune are read through subqueries, so that a custom plan cannot count the
-- batch or fold the prune away: at a trickle (one job per settle) every custom plan would
-- then look cheaper than the cached generic one, and the statement would be planned anew at
-- every settle (see job_claim).
-- A batch of one outcome (the usual: all completed) sends it once as :outcome and
-- :outcomes as NULL; a batch with no delay sends :delay_s as NULL (0). The reply is one
-- row: the ids of the settlements that still held their claim, only when some did not
-- (NULL: all did; the usual batch sends and decodes no id twice).
WITH s AS (
    SELECT u.id, u.token, coalesce(u.outcome, (SELECT :outcome::text)) AS outcome,
           coalesce(u.delay_s, 0) AS delay_s, u.carry, u.set_carry, u.note, u.attachment,
           u.duration_s, u.hook_token, u.result, u.progress
    FROM unnest((SELECT :ids::uuid[]), (SELECT :tokens::uuid[]),
                (SELECT :outcomes::text[]), (SELECT :delay_s::float8[]),
                (SELECT :carries::text[]), (SELECT :set_carry::bool[]),
                (SELECT :notes::text[]), (SELECT :attachments::text[]),
                (SELECT :durations_s::float8[]), (SELECT :hook_tokens::uuid[]),
                (SELECT :results::text[]), (SELECT :progress::text[]))
        AS u(id, token, outcome, delay_s, carry, set_carry, note, attachment, duration_s,
             hook_token, result, progress)
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
        -- Sent as NULL arrays by batches without results or progress (most of them).
        result = coalesce(s.result::jsonb, j.result),
        progress = coalesce(s.progress::jsonb, j.progress),
        claim_token = NULL,
        lease_until = NULL,
        -- A unique job that finished lets go of its unique id.
        unique_until = CASE WHEN s.outcome IN ('completed', 'dead') THEN NULL
                            ELSE j.unique_until END,
        hook_token = coalesce(s.hook_token, j.hook_token),
        hook_lease_until = CASE WHEN s.hook_token IS NOT NULL
                                THEN now() + make_interval(secs => :hook_lease_s)
                                ELSE j.hook_lease_until END
    FROM s
    WHERE j.id = s.id AND j.claim_token = s.token
    RETURNING j.id, j.kind, j.queue, j.run_count, j.status, j.awaited,
              s.outcome, s.note, s.attachment, s.duration_s
), journal AS (
    INSERT INTO {prefix}_journal (job_id, run, outcome, note, attachment, duration_s, worker)
    SELECT id, run_count, outcome, note, attachment::jsonb, duration_s, :worker
    FROM settled
    WHERE outcome <> 'returned'
), counted AS (
    INSERT INTO {prefix}_minute_counts AS m (minute, queue, kind, slot, done, failed)
    SELECT date_trunc('minute', now()), queue, kind, pg_backend_pid() % 16,
           count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'dead')
    FROM settled
    WHERE status IN ('completed', 'dead')
    GROUP BY queue, kind ORDER BY queue, kind
    ON CONFLICT (minute, queue, kind, slot)
    DO UPDATE SET done = m.done + excluded.done, failed = m.failed + excluded.failed
), pruned AS (
    DELETE FROM {prefix}_minute_counts
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {prefix}_minute_counts
        WHERE (SELECT :prune::bool) AND minute < date_trunc('minute', now()) - interval '2 hours'
        LIMIT 5000
        FOR UPDATE SKIP LOCKED
    ))
), woken AS (
    SELECT pg_notify(:channel, kind) FROM (SELECT DISTINCT kind FROM settled
                                           WHERE status = 'pending') AS kinds
), finished AS (  -- only jobs a `Queue.result` waits for (see job_await)
    SELECT pg_notify(:results_channel, id::text) FROM settled
    WHERE awaited AND status IN ('completed', 'dead')
)
SELECT CASE WHEN count(*) < cardinality((SELECT :ids::uuid[]))
            THEN coalesce(array_agg(settled.id), '{}') END AS owned_ids,
       (SELECT count(*) FROM woken) + (SELECT count(*) FROM finished) AS woken
FROM settled;

-- job_renew_leases --
-- Extend the leases of jobs whose handlers are alive. Returns the jobs still owned; a job
-- missing from the result was recovered elsewhere and must not be settled by this worker.
-- :progress carries each run's latest `ctx.progress` (NULL: unchanged; the whole array is
-- NULL when no run reported any).
UPDATE {prefix}_jobs AS j
SET lease_until = now() + make_interval(secs => r.lease_s),
    progress = coalesce(r.progress::jsonb, j.progress)
FROM unnest(:ids::uuid[], :tokens::uuid[], :lease_s::float8[], :progress::text[])
    AS r(id, token, lease_s, progress)
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
-- After a claim that came back short: seconds until the next scheduled job of these kinds in
-- :queues becomes eligible (NULL when none is), and whether one is due already (held). A
-- due job there is one the claim passed over because another transaction holds its row
-- (SKIP LOCKED), or one enqueued since (its notification is on its way): the worker claims
-- again after a short backoff, as a transaction that rolls back, or locks the row without
-- writing it, notifies nobody. Paused queues are left out (the claim skips them). Two probes
-- of the (queue, kind, run_at) index per queue and kind: the first entry after now(), and
-- the first at or before it (past the entries of jobs claimed since the last vacuum, as the
-- claim's own scan of the claim index). The arrays are read through subqueries, so that a
-- custom plan cannot count their elements: it would then always look cheaper than the
-- cached generic plan of the same shape, and the statement, run after most claims, would be
-- planned anew each time (~150-200 us, ten times its run).
SELECT extract(epoch FROM min(t.run_at) - now())::float8 AS due_in_s,
       coalesce(bool_or(h.due), false) AS held
FROM unnest((SELECT :queues::text[])) AS q(queue)
CROSS JOIN unnest((SELECT :kinds::text[])) AS k(kind)
LEFT JOIN LATERAL (
    SELECT run_at FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = q.queue AND kind = k.kind AND run_at > now()
    ORDER BY run_at LIMIT 1
) AS t ON true
LEFT JOIN LATERAL (
    SELECT true AS due FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = q.queue AND kind = k.kind AND run_at <= now()
    LIMIT 1
) AS h ON true
WHERE NOT EXISTS (
    SELECT 1 FROM {prefix}_queues AS p
    WHERE p.name = q.queue AND p.paused_at IS NOT NULL
      AND (p.paused_until IS NULL OR p.paused_until > now())
);

-- job_next_due_in_queues --
-- job_next_due for a worker that takes every kind of its queues (paused ones left out): the
-- next scheduled job of :queues and whether one is due already. Two probes of the claim
-- index per queue and priority tier (the array read through a subquery, as above).
SELECT extract(epoch FROM min(t.run_at) - now())::float8 AS due_in_s,
       coalesce(bool_or(h.due), false) AS held
FROM unnest((SELECT :queues::text[])) AS q(queue)
CROSS JOIN (VALUES (0::smallint), (1::smallint), (2::smallint)) AS p(priority)
LEFT JOIN LATERAL (
    SELECT run_at FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = q.queue AND priority = p.priority AND run_at > now()
    ORDER BY run_at LIMIT 1
) AS t ON true
LEFT JOIN LATERAL (
    SELECT true AS due FROM {prefix}_jobs
    WHERE status = 'pending' AND queue = q.queue AND priority = p.priority AND run_at <= now()
    LIMIT 1
) AS h ON true
WHERE NOT EXISTS (
    SELECT 1 FROM {prefix}_queues AS u
    WHERE u.name = q.queue AND u.paused_at IS NOT NULL
      AND (u.paused_until IS NULL OR u.paused_until > now())
);

-- chain_link --
-- Link a chain's jobs, just inserted in the same transaction: each points at the next, and
-- every link but the first waits for the one before it (see migration 0012's trigger).
UPDATE {prefix}_jobs AS j SET
    chain_next = l.next,
    status = CASE WHEN l.waits THEN 'waiting' ELSE j.status END
FROM unnest(:ids::uuid[], :nexts::uuid[], :waits::bool[]) AS l(id, next, waits)
WHERE j.id = l.id;
