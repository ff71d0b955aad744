-- Stored results (venturi.queue.Queue.result): waiting for a job's end without polling.

-- job_await --
-- Mark :id as awaited, if it has not finished, so that its settle or recovery notifies the
-- results channel with its id. Returns its status when marked (NULL: finished, or no such
-- job). A chain's link or a batch's callback that waits is awaited too. Run after LISTEN
-- on the channel: a job that finishes once marked always notifies.
UPDATE {prefix}_jobs SET awaited = true
WHERE id = :id AND status IN ('pending', 'claimed', 'waiting')
RETURNING status;

-- job_unfinished --
-- Whether :id has yet to finish (NULL: finished, or no such job): where LISTEN cannot hold (a
-- transaction pooler without listen_dsn), `Queue.result` looks with this, reading only, so
-- it never holds the row a claim or a settle wants.
SELECT status FROM {prefix}_jobs
WHERE id = :id AND status IN ('pending', 'claimed', 'waiting');
