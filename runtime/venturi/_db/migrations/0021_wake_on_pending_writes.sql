-- A write that keeps a job pending wakes its workers at commit. A claim skips the rows other
-- transactions hold (SKIP LOCKED), and a worker whose claim came back short sleeps until a
-- notification (poll_max only bounds a missed one). Every statement that makes a job
-- claimable notifies; the ones that only write a pending job did not, so a claim that ran
-- while one of them held the row skipped the job and its worker slept for up to poll_max
-- with the job due: a dedup merge in the caller's (long) transaction, `Queue.result` marking
-- the job awaited, the failure step's bookkeeping on a job retried before its step ended, a
-- unique id's detach, a rekey. This trigger covers them all, and any such write to come,
-- when it commits: a transaction that holds the row and rolls back, or locks it without a
-- write, sends nothing, and a claim that skipped the job meanwhile still waits for the next
-- notification of its kind or poll_max.
--
-- Its WHEN clause keeps it off the hot path's updates (a claim takes a job out of pending, a
-- settle or a recovery that makes one pending again notifies on its own): one comparison of
-- two values per row. A job touched while scheduled for later wakes a worker that then reads
-- the next due time again, which is what a changed run_at needs anyway.
CREATE FUNCTION {prefix}_pending_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{prefix}_jobs', NEW.kind);
    RETURN NULL;
END
$$;

CREATE TRIGGER {prefix}_pending_written AFTER UPDATE ON {prefix}_jobs
    FOR EACH ROW WHEN (OLD.status = 'pending' AND NEW.status = 'pending')
    EXECUTE FUNCTION {prefix}_pending_written();
