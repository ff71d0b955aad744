-- Done and failed "in the last hour" without summing the hour's per-minute rows on every
-- stats() call: the leader's fold (`venturi._maintenance.folder`, every 10 s) also sums, per
-- queue and kind, the minutes that ended at least two minutes ago, for the window that
-- starts now and for the one that starts next minute; stats() adds that sum to the rows of
-- the few minutes after it. A window is the minutes that began in the last hour, named by
-- its w_first minute; `{prefix}_hour_marks` says which windows were summed and through which
-- minute (a (queue, kind) without a row in a marked window finished nothing in it).
--
-- Where no mark names the current window (no leader yet, a leader of an older release, or
-- one more than a minute behind), stats() sums the minutes as before: the same figure, at
-- the old cost. A settle that began in a minute and committed more than a minute after it
-- ended, after the sum was taken, is counted from the next fold on (within 10 s).

CREATE TABLE {prefix}_hour_marks (
    window_start timestamptz PRIMARY KEY,
    through      timestamptz NOT NULL
);

CREATE TABLE {prefix}_hour_counts (
    window_start timestamptz NOT NULL,
    queue        text        NOT NULL,
    kind         text        NOT NULL,
    done         bigint      NOT NULL,
    failed       bigint      NOT NULL,
    PRIMARY KEY (window_start, queue, kind)
);

-- One call, one transaction: readers see the old sums or the new, never a mix. Both tables
-- are rewritten whole (a couple of hundred rows at 100 queue-kind pairs).
CREATE FUNCTION {prefix}_hour_counts_refresh() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    w_first   timestamptz := date_trunc('minute', now() - interval '1 hour') + interval '1 minute';
    w_through timestamptz := date_trunc('minute', now()) - interval '2 minutes';
    summed  bigint;
BEGIN
    DELETE FROM {prefix}_hour_counts;
    DELETE FROM {prefix}_hour_marks;
    INSERT INTO {prefix}_hour_marks (window_start, through)
    VALUES (w_first, w_through), (w_first + interval '1 minute', w_through);
    INSERT INTO {prefix}_hour_counts (window_start, queue, kind, done, failed)
    SELECT w.start, m.queue, m.kind, sum(m.done), sum(m.failed)
    FROM unnest(ARRAY[w_first, w_first + interval '1 minute']) AS w(start)
    JOIN {prefix}_minute_counts AS m ON m.minute >= w.start AND m.minute <= w_through
    GROUP BY w.start, m.queue, m.kind;
    GET DIAGNOSTICS summed = ROW_COUNT;
    RETURN summed;
END
$$;
