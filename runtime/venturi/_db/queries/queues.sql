-- Named queues' operator state (pause and resume), in {prefix}_queues. A queue counts as
-- paused while paused_at is set and paused_until (if any) has not passed, by the database
-- clock; every change is announced on :channel ("!queue pause|resume <name>"), delivered at
-- commit, so every worker learns of it at once.

-- queue_pause --
-- Pause :name (a queue that has no jobs yet is fine) until :until (NULL: until resumed), with
-- :reason. Pausing a paused queue updates its reason and until and keeps when it was paused.
WITH paused AS (
    INSERT INTO {prefix}_queues AS q (name, paused_at, paused_until, reason)
    VALUES (:name, now(), :until, :reason)
    ON CONFLICT (name) DO UPDATE SET
        paused_at = CASE WHEN q.paused_at IS NOT NULL
                          AND (q.paused_until IS NULL OR q.paused_until > now())
                         THEN q.paused_at ELSE now() END,
        paused_until = excluded.paused_until,
        reason = excluded.reason,
        updated_at = now()
    RETURNING q.name, q.paused_at, q.paused_until, q.reason
), announced AS (
    SELECT pg_notify(:channel, '!queue pause ' || name) FROM paused
)
SELECT name, paused_at, paused_until, reason FROM paused
WHERE (SELECT count(*) FROM announced) >= 0;  -- always true: makes the CTE run

-- queue_resume --
-- Resume :name; returns whether it was paused (a pause past its until was not).
WITH old AS (
    SELECT name, paused_at IS NOT NULL AND (paused_until IS NULL OR paused_until > now())
               AS was_paused
    FROM {prefix}_queues WHERE name = :name AND paused_at IS NOT NULL
    FOR UPDATE
), resumed AS (
    UPDATE {prefix}_queues AS q SET
        paused_at = NULL, paused_until = NULL, reason = NULL, updated_at = now()
    FROM old WHERE q.name = old.name
    RETURNING q.name, old.was_paused
), announced AS (
    SELECT pg_notify(:channel, '!queue resume ' || name) FROM resumed
)
SELECT coalesce(bool_or(was_paused), false) AS was_paused FROM resumed
WHERE (SELECT count(*) FROM announced) >= 0;

-- queue_list --
-- Every queue that has pending jobs or was ever paused, by name, with its pause if it is
-- paused now. The queues with pending jobs come from a skip scan of the claim index (one
-- probe per queue, whatever the backlog).
WITH RECURSIVE pending AS (
    (SELECT queue FROM {prefix}_jobs WHERE status = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
    FROM pending AS p WHERE p.queue IS NOT NULL
), states AS (
    SELECT coalesce(q.name, p.queue) AS name,
           q.paused_at IS NOT NULL AND (q.paused_until IS NULL OR q.paused_until > now())
               AS paused,
           q.paused_at, q.paused_until, q.reason
    FROM (SELECT queue FROM pending WHERE queue IS NOT NULL) AS p
    FULL JOIN {prefix}_queues AS q ON q.name = p.queue
)
SELECT name, coalesce(paused, false) AS paused,
       CASE WHEN paused THEN paused_at END AS paused_at,
       CASE WHEN paused THEN paused_until END AS paused_until,
       CASE WHEN paused THEN reason END AS reason
FROM states ORDER BY name;

-- queue_next_resume --
-- Seconds until the first of :queues whose pause has an until resumes (NULL: none will).
SELECT extract(epoch FROM min(paused_until) - now())::float8 AS resumes_in_s
FROM {prefix}_queues
WHERE name = ANY(:queues::text[]) AND paused_at IS NOT NULL AND paused_until > now();

-- queue_known --
-- Whether anything names the queue :queue: a job kept in it (the trigger-kept counts, one
-- index range), a stored pause, or a live worker's registry row serving it.
SELECT EXISTS (SELECT 1 FROM {prefix}_counts WHERE queue = :queue AND n <> 0)
    OR EXISTS (SELECT 1 FROM {prefix}_queues WHERE name = :queue)
    OR EXISTS (SELECT 1 FROM {prefix}_workers WHERE :queue = ANY (queues)) AS known;
