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
