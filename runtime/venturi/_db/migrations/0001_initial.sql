-- The jobs table, the append-only journal, and the indexes the hot path needs.
-- `{prefix}` is replaced by the validated table prefix before this runs.

CREATE TABLE {prefix}_jobs (
    id              uuid        PRIMARY KEY,          -- a ULID, stored as 16 bytes
    kind            text        NOT NULL,
    queue           text        NOT NULL DEFAULT 'default',
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'claimed', 'completed', 'dead')),
    priority        smallint    NOT NULL DEFAULT 1 CHECK (priority BETWEEN 0 AND 2),
    run_at          timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    payload         jsonb       NOT NULL,
    carry           jsonb,
    run_count       integer     NOT NULL DEFAULT 0,   -- claims so far (the current run's number)
    failures        integer     NOT NULL DEFAULT 0,   -- failed executions (pauses never count)
    -- enqueue-time policy; NULL means "the worker's default"
    lease_s         double precision,
    backoff_base_s  double precision,
    backoff_cap_s   double precision,
    -- the current claim: who holds the job, until when, under which token
    claim_token     uuid,
    claimed_at      timestamptz,
    lease_until     timestamptz,
    claimed_by      text,
    claimed_pod     text,
    last_error      text,
    -- room for what comes next (dedup and merge, batches, chains)
    dedup_key       text,
    batch_id        uuid,
    chain_id        uuid
);

-- The claim: pending jobs of a queue in claim order. The claim's WHERE and ORDER BY match it.
CREATE INDEX {prefix}_jobs_claim_idx ON {prefix}_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';

-- Stats and the next-due timer: pending jobs by kind, oldest first (index-only scans).
CREATE INDEX {prefix}_jobs_pending_kind_idx ON {prefix}_jobs (kind, run_at)
    WHERE status = 'pending';

-- Recovery of expired leases, and claimed-by-kind stats.
CREATE INDEX {prefix}_jobs_lease_idx ON {prefix}_jobs (lease_until, kind)
    WHERE status = 'claimed';

-- Dead jobs by kind, for stats (dead jobs are few and stay until cleanup).
CREATE INDEX {prefix}_jobs_dead_idx ON {prefix}_jobs (kind)
    WHERE status = 'dead';

-- Cleanup and history of finished jobs.
CREATE INDEX {prefix}_jobs_finished_idx ON {prefix}_jobs (finished_at)
    WHERE status IN ('completed', 'dead');

-- Deduplication candidates (used from the dedup feature on).
CREATE INDEX {prefix}_jobs_dedup_idx ON {prefix}_jobs (kind, dedup_key)
    WHERE status = 'pending' AND dedup_key IS NOT NULL;

-- Hot table: vacuum it early and often, so dead tuples from claims never pile up.
ALTER TABLE {prefix}_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);

-- One row per execution, release, recovery or merge. Rows are only ever inserted;
-- cleanup removes a job's rows together with the job. No foreign key: the settle path
-- writes jobs and journal in one statement, and an FK check per row would cost more
-- than it protects.
CREATE TABLE {prefix}_journal (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid        NOT NULL,
    run         integer     NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN (
                    'completed', 'paused', 'failed', 'dead', 'released', 'stale_recovered', 'merged')),
    at          timestamptz NOT NULL DEFAULT now(),
    note        text,
    attachment  jsonb,
    duration_s  double precision,
    worker      text
);

CREATE INDEX {prefix}_journal_job_idx ON {prefix}_journal (job_id, id);
