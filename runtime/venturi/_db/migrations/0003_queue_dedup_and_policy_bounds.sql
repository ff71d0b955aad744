-- Deduplication candidacy includes the queue: a key enqueued to queue `b` never merges into a
-- pending job of queue `a` (which no worker of `b` would run). The candidacy index gains it.
DROP INDEX {prefix}_jobs_dedup_idx;
CREATE INDEX {prefix}_jobs_dedup_idx ON {prefix}_jobs (queue, kind, dedup_key)
    WHERE status = 'pending' AND dedup_key IS NOT NULL;

-- Stored policies stay within the bounds every release from this one refuses to go beyond at
-- enqueue (a lease of 0.5 s to 30 days; a retry curve with 0 <= base <= cap <= 10 years, both
-- set or neither): an infinite or NaN lease or backoff would make every claim or recovery
-- statement of the queue fail. Rows from earlier releases are brought within them first: a
-- lease is clamped (NaN: the worker's), an out-of-range curve falls back to the worker's.
UPDATE {prefix}_jobs
SET lease_s = CASE WHEN lease_s = 'NaN' THEN NULL WHEN lease_s < 0.5 THEN 0.5 ELSE 2592000 END
WHERE NOT lease_s BETWEEN 0.5 AND 2592000;

UPDATE {prefix}_jobs SET backoff_base_s = NULL, backoff_cap_s = NULL
WHERE (backoff_base_s IS NULL) <> (backoff_cap_s IS NULL)
   OR NOT (backoff_base_s BETWEEN 0 AND backoff_cap_s AND backoff_cap_s <= 315576000);

ALTER TABLE {prefix}_jobs
    ADD CONSTRAINT {prefix}_jobs_lease_s_check CHECK (lease_s BETWEEN 0.5 AND 2592000),
    ADD CONSTRAINT {prefix}_jobs_backoff_check CHECK (
        (backoff_base_s IS NULL) = (backoff_cap_s IS NULL)
        AND backoff_base_s BETWEEN 0 AND backoff_cap_s
        AND backoff_cap_s <= 315576000
    );
