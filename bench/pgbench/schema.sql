-- The ceiling's job table: what any PostgreSQL queue must store and index, and nothing more.
-- One row per job, a primary key, and a partial index that matches the claim's filter and
-- order exactly (so the claim is an index scan at any depth).
DROP TABLE IF EXISTS ceiling_jobs;
CREATE TABLE ceiling_jobs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text        NOT NULL,
    status      text        NOT NULL DEFAULT 'pending',
    priority    smallint    NOT NULL DEFAULT 1,
    run_at      timestamptz NOT NULL DEFAULT now(),
    created_at  timestamptz NOT NULL DEFAULT now(),
    payload     jsonb       NOT NULL,
    run_count   integer     NOT NULL DEFAULT 0,
    claimed_at  timestamptz,
    lease_until timestamptz,
    finished_at timestamptz
);
CREATE INDEX ceiling_jobs_claim_idx ON ceiling_jobs (priority DESC, run_at, id)
    WHERE status = 'pending';
