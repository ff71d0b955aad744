-- Statements about a connection rather than a table.

-- connection_probe --
-- Liveness probe of a long-lived connection (the LISTEN one).
SELECT 1;

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

-- commit --
COMMIT;

-- rollback --
ROLLBACK;
