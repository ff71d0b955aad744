-- The worker registry (its table: migrations/*_workers_and_leadership.sql): who runs,
-- serving what. Written by each worker's heartbeat (venturi/_registry.py), swept by the
-- leader, read by `Queue.workers()`, the CLI and `Queue.unserved_kinds()`. A worker is live
-- while its last heartbeat is younger than :silent_after of its own heartbeat intervals.
-- Times come from the database clock.

-- worker_upsert --
-- Register a worker, or refresh its row: every heartbeat writes the whole row, so a row the
-- sweep removed during a long outage comes back with the next heartbeat. :started_at is NULL
-- on the first registration (now()), then the time that one returned, so it stays put.
INSERT INTO {prefix}_workers AS w
    (id, host, pid, pod, queues, kinds, unknown_kinds, concurrency, heartbeat_s, started_at)
VALUES (:id, :host, :pid, :pod, :queues::text[], :kinds::text[], :unknown_kinds,
        :concurrency, :heartbeat_s, coalesce(:started_at::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET
    queues = excluded.queues,
    kinds = excluded.kinds,
    unknown_kinds = excluded.unknown_kinds,
    concurrency = excluded.concurrency,
    heartbeat_s = excluded.heartbeat_s,
    started_at = least(w.started_at, excluded.started_at),
    last_seen = now()
RETURNING started_at;

-- worker_delete --
-- A worker's clean exit.
DELETE FROM {prefix}_workers WHERE id = :id;

-- worker_list --
-- Every registered worker, oldest first, with whether it is live and whether it holds the
-- lease :lease (the leader of the maintenance services).
SELECT w.id, w.host, w.pid, w.pod, w.queues, w.kinds, w.unknown_kinds, w.concurrency,
       w.heartbeat_s, w.started_at, w.last_seen,
       w.last_seen > now() - make_interval(secs => w.heartbeat_s * :silent_after) AS live,
       coalesce(l.leader = w.id AND l.expires_at > now(), false) AS leader
FROM {prefix}_workers AS w
LEFT JOIN {prefix}_leader AS l ON l.name = :lease
ORDER BY w.started_at, w.id;

-- worker_sweep --
-- Remove the rows of workers gone silent (killed, or cut off from the database for longer
-- than :silent_after heartbeats; such a worker registers again with its next heartbeat).
DELETE FROM {prefix}_workers
WHERE last_seen < now() - make_interval(secs => heartbeat_s * :silent_after)
RETURNING id;

-- worker_unserved_kinds --
-- Pending KINDs, per queue, that no live worker serving that queue registers (a worker that
-- fails unknown kinds serves every kind of its queues). The pending kinds come from the
-- trigger-kept counts; the queues holding pending jobs from a skip scan of the claim index
-- (one probe per queue); each (queue, kind) left unserved is then confirmed by one probe.
WITH RECURSIVE live AS (
    SELECT queues, kinds, unknown_kinds FROM {prefix}_workers
    WHERE last_seen > now() - make_interval(secs => heartbeat_s * :silent_after)
), pending_kinds AS (
    SELECT kind FROM {prefix}_counts WHERE status = 'pending'
    GROUP BY kind HAVING sum(n) > 0
), queues AS (
    (SELECT queue FROM {prefix}_jobs WHERE status = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {prefix}_jobs AS j
            WHERE j.status = 'pending' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues AS q WHERE q.queue IS NOT NULL
), candidates AS (
    SELECT q.queue, k.kind FROM queues AS q CROSS JOIN pending_kinds AS k
    WHERE q.queue IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM live AS w
        WHERE q.queue = ANY(w.queues) AND (w.unknown_kinds = 'fail' OR k.kind = ANY(w.kinds))
    )
)
SELECT c.queue, c.kind FROM candidates AS c
WHERE EXISTS (
    SELECT 1 FROM {prefix}_jobs AS j
    WHERE j.status = 'pending' AND j.queue = c.queue AND j.kind = c.kind
)
ORDER BY c.queue, c.kind;
