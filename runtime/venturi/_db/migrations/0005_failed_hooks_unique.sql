-- Failed jobs (status 'dead'): a hand-made retry is journaled as `retried`, and the failed
-- jobs are listed newest first from an index of their own (a range scan however many jobs
-- completed).
ALTER TABLE {prefix}_journal DROP CONSTRAINT {prefix}_journal_outcome_check;
ALTER TABLE {prefix}_journal ADD CONSTRAINT {prefix}_journal_outcome_check CHECK (outcome IN (
    'completed', 'paused', 'failed', 'dead', 'released', 'stale_recovered', 'merged', 'retried'));

CREATE INDEX {prefix}_jobs_failed_idx ON {prefix}_jobs (id) WHERE status = 'dead';
