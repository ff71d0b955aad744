-- A member skipped by its batch's cancellation has the journal note "batch <id> cancelled";
-- the id was the uuid column's text, where everything else (Queue.batch(...).enqueue(),
-- ctx.batch_id, the CLI, logs) shows the batch id as a ULID. The same 128 bits, written as a
-- ULID: Crockford base32, 26 characters, the first carrying the top 3 bits.
CREATE FUNCTION {prefix}_ulid_text(id uuid) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT string_agg(
        substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ',
               substring(bits FROM i * 5 + 1 FOR 5)::int + 1, 1), '' ORDER BY i)
    FROM (SELECT B'00' || ('x' || replace(id::text, '-', ''))::bit(128) AS bits) AS b,
         generate_series(0, 25) AS i
$$;

CREATE OR REPLACE FUNCTION {prefix}_batch_member_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    was_finished boolean := OLD.status IN ('completed', 'dead', 'cancelled');
    is_finished boolean := NEW.status IN ('completed', 'dead', 'cancelled');
    stop_batch boolean;
    left_pending integer;
BEGIN
    UPDATE {prefix}_batches SET
        pending = pending - (is_finished::int - was_finished::int),
        done = done + (NEW.status = 'completed')::int - (OLD.status = 'completed')::int,
        failed = failed + (NEW.status = 'dead')::int - (OLD.status = 'dead')::int,
        cancelled = cancelled + (NEW.status = 'cancelled')::int - (OLD.status = 'cancelled')::int
    WHERE id = NEW.batch_id
    RETURNING pending INTO left_pending;
    IF NOT FOUND THEN
        RETURN NULL;  -- the batch was pruned: nothing to count
    END IF;
    IF NEW.status = 'cancelled' THEN
        INSERT INTO {prefix}_journal (job_id, run, outcome, note)
        VALUES (NEW.id, NEW.run_count, 'cancelled',
                'batch ' || {prefix}_ulid_text(NEW.batch_id) || ' cancelled');
    ELSIF NEW.status = 'dead' THEN
        -- The first failure: catch runs, and without allow_failures the batch stops.
        UPDATE {prefix}_batches SET failed_at = now()
        WHERE id = NEW.batch_id AND failed_at IS NULL
        RETURNING NOT allow_failures AND cancelled_at IS NULL INTO stop_batch;
        IF FOUND THEN
            PERFORM {prefix}_batch_callback(NEW.batch_id, 'catch', true);
            IF stop_batch THEN
                UPDATE {prefix}_batches SET cancelled_at = now() WHERE id = NEW.batch_id;
                PERFORM {prefix}_batch_cancel_members(NEW.batch_id);
            END IF;
        END IF;
    END IF;
    -- The last member (a cancellation above counts its own members, and finishes there).
    IF left_pending = 0 THEN
        PERFORM {prefix}_batch_finish(NEW.batch_id);
    END IF;
    RETURN NULL;
END
$$;
