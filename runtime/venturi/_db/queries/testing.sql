-- The test helpers' statements (venturi.testing): never on a worker's path.

-- testing_pending --
-- Pending jobs, oldest first, of one kind and one queue when given (NULL: any), with their
-- stored payload (for the worker's codec to decode).
SELECT id, kind, payload::text AS payload FROM {prefix}_jobs
WHERE status = 'pending'
  AND (:kind::text IS NULL OR kind = :kind::text)
  AND (:queue::text IS NULL OR queue = :queue::text)
ORDER BY run_at, id;

-- testing_due --
-- The jobs of these queues and kinds due now that have run most (none: nothing is due), so
-- that a job that keeps putting itself back is seen after a few rounds.
SELECT id, kind, run_count FROM {prefix}_jobs
WHERE status = 'pending' AND run_at <= now()
  AND queue = ANY (:queues::text[]) AND kind = ANY (:kinds::text[])
ORDER BY run_count DESC
LIMIT 20;

-- testing_make_due --
-- Bring delayed jobs and waiting retries of these queues and kinds forward to now.
UPDATE {prefix}_jobs SET run_at = now()
WHERE status = 'pending' AND run_at > now()
  AND queue = ANY (:queues::text[]) AND kind = ANY (:kinds::text[]);

-- testing_drop_prefix --
-- DROP statements for the tables and functions of one prefix, and nothing else; tables
-- before functions (a trigger's function goes with CASCADE).
SELECT format('DROP TABLE IF EXISTS %I.%I CASCADE', n.nspname, c.relname) AS ddl
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema()
  AND starts_with(c.relname, :prefix || '_')
UNION ALL
SELECT format('DROP FUNCTION IF EXISTS %s CASCADE', p.oid::regprocedure)
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND starts_with(p.proname, :prefix || '_');
