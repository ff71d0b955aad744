-- Periodic tasks (venturi.schedules, run by the worker's scheduler).

-- schedule_declare --
-- Record the schedules a worker runs. A new one starts at the database's now (its past ticks
-- are not owed); a changed spec keeps its last tick (the new spec's next tick follows it).
-- A function's KIND is known once it has ticked (kind ''): another worker declaring the
-- schedule keeps the one learnt, unless the spec changed.
INSERT INTO {prefix}_schedules AS s (name, spec, kind, last_tick, next_tick, seen_by)
SELECT d.name, d.spec, d.kind, now(), now(), :worker
FROM unnest(:names::text[], :specs::text[], :kinds::text[]) AS d(name, spec, kind)
ON CONFLICT (name) DO UPDATE
    SET spec = excluded.spec,
        kind = CASE WHEN excluded.kind = '' AND s.spec = excluded.spec THEN s.kind
                    ELSE excluded.kind END,
        next_tick = CASE WHEN s.spec = excluded.spec THEN s.next_tick ELSE now() END,
        seen_at = now(),
        seen_by = excluded.seen_by;

-- schedule_lock_due --
-- The schedules among :names whose next tick has come, locked for this pass (another
-- worker's pass skips them), with the database's now and whether each one's last job is
-- still waiting or running (the overlap policy).
SELECT s.name, s.last_tick, now() AS now,
       coalesce(j.status IN ('pending', 'claimed'), false) AS previous_running
FROM {prefix}_schedules AS s
LEFT JOIN {prefix}_jobs AS j ON j.id = s.last_job
WHERE s.name = ANY (:names::text[]) AND s.next_tick <= now()
FOR UPDATE OF s SKIP LOCKED;

-- schedule_advance --
-- After a pass decided (in the same transaction as the tick's enqueue, if any).
UPDATE {prefix}_schedules SET
    kind = coalesce(:kind::text, kind),
    last_tick = :last_tick,
    next_tick = :next_tick,
    last_job = coalesce(:job::uuid, last_job),
    enqueued = enqueued + (:job::uuid IS NOT NULL)::int,
    skipped = skipped + :skipped,
    seen_at = now(),
    seen_by = :worker
WHERE name = :name;

-- schedule_next_due --
-- Seconds until the earliest next tick among :names (NULL: none of them is recorded).
SELECT extract(epoch FROM min(next_tick) - now())::float8 FROM {prefix}_schedules
WHERE name = ANY (:names::text[]);

-- schedule_list --
-- Every recorded schedule, for `venturi schedules`.
SELECT name, spec, kind, last_tick, next_tick, last_job, enqueued, skipped, seen_at, seen_by
FROM {prefix}_schedules ORDER BY name;
