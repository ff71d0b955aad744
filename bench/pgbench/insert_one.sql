-- The single-row ceiling: one job row per transaction, each its own commit (autocommit, so
-- each waits for its WAL flush), from one client: what a producer that awaits every enqueue
-- can at best get from this PostgreSQL, with no queue library in the way. Same table, same
-- indexes and the same payload as queue_cycle.sql's insert. Run with -M prepared, -c 1.
INSERT INTO ceiling_jobs (kind, payload)
VALUES ('noop', jsonb_build_object('enqueued_at', extract(epoch FROM clock_timestamp())));
