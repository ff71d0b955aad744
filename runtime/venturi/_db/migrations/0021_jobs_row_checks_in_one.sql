-- The jobs table's seven CHECK constraints (status and priority, and the policy bounds of
-- migrations 0003, 0008 and 0013) become one with the same conditions. PostgreSQL builds a
-- table's check expressions anew for every statement that writes it (each one read back
-- from its stored text and simplified on its own), so a single-job claim, settle or enqueue
-- paid for seven: about a tenth of a trickle worker's server time per job (insert, claim and
-- settle of one job: 0.80 against 0.68-0.79 ms with one constraint, 0.65-0.72 with none, in
-- one interleaved pgbench run of three rounds each; fsync off).
--
-- A conjunction passes and fails exactly where the seven did: a CHECK fails only on false,
-- and `a AND b` is false if and only if one of them is. Every stored row passed the seven,
-- so the constraint is added NOT VALID: no scan of the table under this migration's lock,
-- and new writes are checked all the same. Workers of the previous release write the same
-- rows; only the constraint named in an error changes.
-- The seven are found by kind, not by name: those PostgreSQL named itself (the column checks)
-- are shortened differently from `{prefix}_jobs_<column>_check` under a long prefix.
DO $$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = '{prefix}_jobs'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE {prefix}_jobs DROP CONSTRAINT %I', c);
    END LOOP;
END
$$;

ALTER TABLE {prefix}_jobs
    ADD CONSTRAINT {prefix}_jobs_row_check CHECK (
        status IN ('pending', 'claimed', 'completed', 'dead', 'waiting', 'cancelled')
        AND priority BETWEEN 0 AND 2
        AND lease_s BETWEEN 0.5 AND 2592000
        AND (backoff_base_s IS NULL) = (backoff_cap_s IS NULL)
        AND backoff_base_s BETWEEN 0 AND backoff_cap_s
        AND backoff_cap_s <= 315576000
        AND max_attempts >= 1
        AND timeout_s > 0 AND timeout_s <= 2505600
        AND batch_callback IN ('then', 'catch', 'finally')
    ) NOT VALID;
