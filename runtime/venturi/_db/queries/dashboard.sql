-- The dashboard's own statements (venturi.dashboard). Reads run in a read-only transaction
-- that dashboard_session bounds first; every read is cheap at any table size (the kept
-- counters, index range scans). The actions are the queue's own (Queue.retry,
-- retry_all, forget, pause, resume: failed.sql, queues.sql).

-- dashboard_session --
-- Bound every statement of this transaction (SET LOCAL, with a parameter): no dashboard query
-- can run long, whatever the table holds. Custom plans always: the dashboard's filters are
-- optional (NULL = any), which a cached generic plan cannot prune.
SELECT set_config('statement_timeout', :timeout_ms, true),
       set_config('plan_cache_mode', 'force_custom_plan', true);

-- dashboard_counts --
-- Jobs by kind and status from the trigger-kept counters (completed included, which stats()
-- leaves out): a few small rows, whatever the backlog.
SELECT kind, status, sum(n)::bigint AS n FROM {prefix}_counts
GROUP BY kind, status HAVING sum(n) > 0
ORDER BY kind, status;

-- dashboard_now --
-- The database's clock (the transaction's start: the moment the page's snapshot shows).
SELECT now() AS now;

-- dashboard_chains --
-- The newest :limit chains whose head (a link no job's chain_next points at) is older than
-- :before_id (NULL: from the newest), each walked from its head along chain_next, at most
-- :max_links links. Cheap at any table size: the heads come newest first off the chained
-- jobs' id index (only jobs with a next link are in it), the "nothing points at it" test is one
-- probe of the chain_next index, each step a primary-key lookup (the chain_links migration
-- adds both indexes); the scan passes each chain's other linked jobs once. A chain's
-- last link has no chain_next, so it is reached by the walk only. A head is the first link
-- left: when cleanup deleted finished links, the chain shows from the first one kept.
WITH RECURSIVE heads AS (
    SELECT h.id FROM {prefix}_jobs AS h
    WHERE h.chain_next IS NOT NULL
      AND (:before_id::uuid IS NULL OR h.id < :before_id)
      AND NOT EXISTS (SELECT 1 FROM {prefix}_jobs AS p WHERE p.chain_next = h.id)
    ORDER BY h.id DESC
    LIMIT :limit
), links AS (
    SELECT h.id AS head, 1 AS position, j.id, j.chain_next, j.kind, j.queue, j.status,
           j.run_at, j.created_at, j.finished_at, j.failures, left(j.last_error, 500) AS last_error
    FROM heads AS h JOIN {prefix}_jobs AS j ON j.id = h.id
    UNION ALL
    SELECT l.head, l.position + 1, j.id, j.chain_next, j.kind, j.queue, j.status,
           j.run_at, j.created_at, j.finished_at, j.failures, left(j.last_error, 500)
    FROM links AS l JOIN {prefix}_jobs AS j ON j.id = l.chain_next
    WHERE l.position < :max_links
)
SELECT head, position, id, chain_next, kind, queue, status, run_at, created_at, finished_at,
       failures, last_error
FROM links
ORDER BY head DESC, position;

-- dashboard_job_chain --
-- The chain job :id is a link of (no row but its own when it is not one): back to its head along
-- the chain_next index (at most :max_links steps), then forward from there along chain_next
-- (at most :max_links links). `position` counts from the first link found (1); `before` is
-- true when the walk back stopped at its cap (the chain starts earlier than shown).
WITH RECURSIVE back AS (
    SELECT :id::uuid AS id, 0 AS step
    UNION ALL
    SELECT p.id, b.step + 1
    FROM back AS b JOIN {prefix}_jobs AS p ON p.chain_next = b.id
    WHERE b.step < :max_links
), head AS (
    SELECT id, step FROM back ORDER BY step DESC LIMIT 1
), links AS (
    SELECT 1 AS position, j.id, j.chain_next, j.kind, j.queue, j.status, j.run_at, j.created_at,
           j.finished_at, j.failures, left(j.last_error, 500) AS last_error,
           h.step >= :max_links AS before
    FROM head AS h JOIN {prefix}_jobs AS j ON j.id = h.id
    UNION ALL
    SELECT l.position + 1, j.id, j.chain_next, j.kind, j.queue, j.status, j.run_at, j.created_at,
           j.finished_at, j.failures, left(j.last_error, 500), l.before
    FROM links AS l JOIN {prefix}_jobs AS j ON j.id = l.chain_next
    WHERE l.position < :max_links * 2
)
SELECT position, id, chain_next, kind, queue, status, run_at, created_at, finished_at, failures,
       last_error, before
FROM links
ORDER BY position;

-- dashboard_batch_callbacks --
-- A batch's callback jobs, by name (one probe each of the batch index).
SELECT batch_callback, id, kind, status
FROM {prefix}_jobs
WHERE batch_id = :id AND batch_callback IN ('then', 'catch', 'finally');
