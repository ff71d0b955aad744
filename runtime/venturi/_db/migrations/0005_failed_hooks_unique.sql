-- Failed jobs (status 'dead'): a hand-made retry is journaled as `retried`, and the failed
-- jobs are listed newest first from an index of their own (a range scan however many jobs
-- completed).
ALTER TABLE {prefix}_journal DROP CONSTRAINT {prefix}_journal_outcome_check;
ALTER TABLE {prefix}_journal ADD CONSTRAINT {prefix}_journal_outcome_check CHECK (outcome IN (
    'completed', 'paused', 'failed', 'dead', 'released', 'stale_recovered', 'merged', 'retried'));

CREATE INDEX {prefix}_jobs_failed_idx ON {prefix}_jobs (id) WHERE status = 'dead';

-- The failure step's outbox (the task's `failed` hook and the worker's reporters): the
-- statement that makes a job dead sets `hook_token` and leases the step to its worker until
-- `hook_lease_until`; the step clears both once it ran. A step whose lease ended (its worker
-- died first) is taken by another worker under a new token, so it never runs twice at once.
ALTER TABLE {prefix}_jobs
    ADD COLUMN hook_token uuid,
    ADD COLUMN hook_lease_until timestamptz;

CREATE INDEX {prefix}_jobs_hook_idx ON {prefix}_jobs (hook_lease_until)
    WHERE hook_token IS NOT NULL;

-- Unique jobs: a job of a task with `unique_for` holds its `unique_key` (the task's unique_id,
-- within its KIND) while `unique_until` is set: from its enqueue until it finishes (the
-- settlement clears it) or `unique_until` passes (the next enqueue of the key detaches it).
-- The index makes the hold exclusive; `unique_for_s` re-holds the key when a failed job is
-- retried.
ALTER TABLE {prefix}_jobs
    ADD COLUMN unique_key text,
    ADD COLUMN unique_for_s double precision,
    ADD COLUMN unique_until timestamptz;

CREATE UNIQUE INDEX {prefix}_jobs_unique_idx ON {prefix}_jobs (kind, unique_key)
    WHERE unique_until IS NOT NULL;
