-- Migrations' bookkeeping (the migrations themselves are _db/migrations/NNNN_name.sql).

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
INSERT INTO {prefix}_migrations (version, name) VALUES (:version, :name);

-- lock_migrations --
-- Serialize migrate() across processes for this prefix, until the transaction ends.
SELECT pg_advisory_xact_lock(:key);

-- privileges_missing --
-- The prefix's tables (and the journal's id sequence) on which the session's role lacks a
-- privilege a worker uses, with what it lacks. A worker checks before it starts, so that a
-- role granted before a migration added a table fails there, naming it, rather than on the
-- statement that first reads it.
SELECT t.name, array_agg(p.privilege ORDER BY p.n) AS missing
FROM unnest(:tables::text[]) AS t (name)
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) WITH ORDINALITY AS p (privilege, n)
WHERE to_regclass(t.name) IS NOT NULL AND NOT has_table_privilege(t.name, p.privilege)
  AND (t.name <> '{prefix}_migrations' OR p.privilege = 'SELECT')  -- only migrate writes it
GROUP BY t.name
UNION ALL
SELECT s.name, ARRAY['USAGE']
FROM (SELECT CASE WHEN to_regclass('{prefix}_journal') IS NOT NULL  -- unmigrated: none
             THEN pg_get_serial_sequence('{prefix}_journal', 'id') END AS name) AS s
WHERE s.name IS NOT NULL AND NOT has_sequence_privilege(s.name, 'USAGE')
ORDER BY 1;

-- session_role --
-- Who the session is, and where its tables are: for the GRANT a missing privilege needs.
SELECT quote_ident(current_user) AS role, quote_ident(current_schema()) AS schema;

-- prefix_elsewhere --
-- Schemas holding the prefix's record of migrations that this session does not see (off
-- its search_path), with the search_path: for the error that says where they are.
SELECT current_setting('search_path') AS search_path,
       array(SELECT quote_ident(n.nspname) FROM pg_class AS c
             JOIN pg_namespace AS n ON n.oid = c.relnamespace
             WHERE c.relname = '{prefix}_migrations' AND c.relkind = 'r'
               AND n.nspname <> ALL(current_schemas(false))
             ORDER BY 1) AS schemas;

-- migration_table_exists --
-- Whether the record of applied migrations exists (migrate() only reads when up to date).
SELECT to_regclass('{prefix}_migrations') IS NOT NULL;

-- migration_lock_timeout --
-- How long, in this transaction, a migration's statement waits for a table lock.
SELECT set_config('lock_timeout', :ms, true);

-- lock_holders --
-- The other sessions holding a lock on one of the prefix's tables (:tables): whom a migration
-- that could not get its lock waited for.
SELECT a.pid, a.application_name, a.state,
       coalesce(date_part('epoch', now() - a.xact_start), 0)::float8 AS xact_s
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid() AND a.pid IN (
    SELECT l.pid FROM pg_locks AS l
    WHERE l.granted AND l.relation = ANY (
        SELECT to_regclass(t) FROM unnest(:tables::text[]) AS t WHERE to_regclass(t) IS NOT NULL))
ORDER BY a.xact_start NULLS LAST
LIMIT 5;

-- server_encoding --
-- The database's encoding: anything but UTF8 (or SQL_ASCII, which stores bytes as given)
-- refuses text with characters it has none for, which migrate() says once.
SELECT current_setting('server_encoding') AS encoding;
