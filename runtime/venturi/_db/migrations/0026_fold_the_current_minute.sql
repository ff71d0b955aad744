-- The leader's fold of the per-minute counts folds the current minute too.
--
-- It left the current minute to its writers (folding it "would only churn its rows"), so
-- after a busy minute stats() read up to 16 slot rows per queue and kind for it: 1,700 rows
-- at 100 queue-kind pairs, more than a millisecond of the call, for as long as the minute
-- lasted. Folded every 10 s with the rest, it is one row per pair after each fold; a writer
-- of a folded slot inserts its row again (a row a writer holds is skipped, as before).

CREATE OR REPLACE FUNCTION {prefix}_fold_minute_counts(since timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held_minutes timestamptz[];
    held_queues text[];
    held_kinds text[];
    held_slots smallint[];
    folded bigint;
BEGIN
    WITH split AS (
        SELECT minute, queue, kind FROM {prefix}_minute_counts
        WHERE since IS NULL OR minute >= since
        GROUP BY minute, queue, kind HAVING count(*) > 1
    ), held AS (
        SELECT m.minute, m.queue, m.kind, m.slot
        FROM {prefix}_minute_counts AS m JOIN split USING (minute, queue, kind)
        FOR UPDATE OF m SKIP LOCKED
    )
    SELECT array_agg(minute), array_agg(queue), array_agg(kind), array_agg(slot)
    INTO held_minutes, held_queues, held_kinds, held_slots
    FROM held;
    IF held_minutes IS NULL THEN
        RETURN 0;
    END IF;
    WITH held AS (
        SELECT m.minute, m.queue, m.kind, m.slot, m.done, m.failed
        FROM {prefix}_minute_counts AS m
        JOIN unnest(held_minutes, held_queues, held_kinds, held_slots)
             AS h (minute, queue, kind, slot) USING (minute, queue, kind, slot)
    ), ranked AS (
        SELECT minute, queue, kind, slot, count(*) OVER g AS rows, min(slot) OVER g AS keep,
               sum(done) OVER g AS done, sum(failed) OVER g AS failed
        FROM held WINDOW g AS (PARTITION BY minute, queue, kind)
    ), kept AS (
        UPDATE {prefix}_minute_counts AS m SET done = r.done, failed = r.failed
        FROM ranked AS r
        WHERE r.rows > 1 AND r.slot = r.keep
          AND m.minute = r.minute AND m.queue = r.queue AND m.kind = r.kind AND m.slot = r.slot
    ), dropped AS (
        DELETE FROM {prefix}_minute_counts AS m
        USING ranked AS r
        WHERE r.rows > 1 AND r.slot <> r.keep
          AND m.minute = r.minute AND m.queue = r.queue AND m.kind = r.kind AND m.slot = r.slot
        RETURNING 1
    )
    SELECT count(*) INTO folded FROM dropped;
    RETURN folded;
END
$$;
