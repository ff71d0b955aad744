-- Live counts of jobs by kind and status, kept by statement-level triggers, so stats() reads a
-- few small rows instead of counting a million-row backlog. Counts are sharded by backend, so
-- concurrent workers rarely wait on each other's counter rows; readers sum the shards.

CREATE TABLE {prefix}_counts (
    kind    text     NOT NULL,
    status  text     NOT NULL,
    shard   smallint NOT NULL,
    n       bigint   NOT NULL,
    PRIMARY KEY (kind, status, shard)
);

CREATE FUNCTION {prefix}_count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Deltas per (kind, status) from the statement's transition tables, applied in key
    -- order so two transactions never lock counter rows in opposite orders.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {prefix}_counts AS c (kind, status, shard, n)
        SELECT kind, status, pg_backend_pid() % 16, count(*) FROM new_rows
        GROUP BY kind, status ORDER BY kind, status
        ON CONFLICT (kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {prefix}_counts AS c (kind, status, shard, n)
        SELECT kind, status, pg_backend_pid() % 16, sum(n) FROM (
            SELECT kind, status, count(*) AS n FROM new_rows GROUP BY kind, status
            UNION ALL
            SELECT kind, status, -count(*) FROM old_rows GROUP BY kind, status
        ) AS delta
        GROUP BY kind, status HAVING sum(n) <> 0 ORDER BY kind, status
        ON CONFLICT (kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSE
        INSERT INTO {prefix}_counts AS c (kind, status, shard, n)
        SELECT kind, status, pg_backend_pid() % 16, -count(*) FROM old_rows
        GROUP BY kind, status ORDER BY kind, status
        ON CONFLICT (kind, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER {prefix}_count_inserts AFTER INSERT ON {prefix}_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {prefix}_count_jobs();
CREATE TRIGGER {prefix}_count_updates AFTER UPDATE ON {prefix}_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {prefix}_count_jobs();
CREATE TRIGGER {prefix}_count_deletes AFTER DELETE ON {prefix}_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {prefix}_count_jobs();

-- Backfill from the jobs already there, with writers held off until this commits.
LOCK TABLE {prefix}_jobs IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO {prefix}_counts (kind, status, shard, n)
SELECT kind, status, 0, count(*) FROM {prefix}_jobs GROUP BY kind, status;
