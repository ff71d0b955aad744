-- Statements about a connection rather than a table.

-- connection_probe --
-- Liveness probe of a long-lived connection (the LISTEN one).
SELECT 1;

-- idle_session_timeout --
-- The server's idle_session_timeout for this session, in seconds (0: none; no row before
-- PostgreSQL 14): the LISTEN connection, idle between notifications, is probed within it.
SELECT setting::float8 / 1000 AS seconds FROM pg_settings WHERE name = 'idle_session_timeout';

-- savepoint --
-- Inside the caller's transaction, a statement group that may fail (a deduplicated enqueue)
-- runs under a savepoint, so its failure rolls back only what it did.
SAVEPOINT venturi;

-- savepoint_release --
RELEASE SAVEPOINT venturi;

-- savepoint_rollback --
ROLLBACK TO SAVEPOINT venturi;

-- begin_with_timeout --
-- Through a transaction pooler a session setting would stay on whichever server connection
-- ran it, so a statement timeout is set per transaction: BEGIN and SET LOCAL in one round
-- trip (the simple protocol, so no parameters: the store writes in the integer).
BEGIN; SET LOCAL statement_timeout = {statement_timeout_ms};

-- begin --
-- A transaction of the store's own (see `_db.run.Pooled`).
BEGIN;

-- commit --
COMMIT;

-- rollback --
ROLLBACK;
