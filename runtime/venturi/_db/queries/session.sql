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
