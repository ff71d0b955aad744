-- Chains (Queue.chain): a link waits (status 'waiting') until the link before it completes.
-- The release is a row trigger on that completion, so it happens in the transaction that
-- completes the previous link, whatever statement completed it; its WHEN clause keeps it off
-- every other update (a claim, a settle of an unchained job costs one comparison per row).
ALTER TABLE {prefix}_jobs ADD COLUMN chain_next uuid;

ALTER TABLE {prefix}_jobs DROP CONSTRAINT {prefix}_jobs_status_check;
ALTER TABLE {prefix}_jobs ADD CONSTRAINT {prefix}_jobs_status_check
    CHECK (status IN ('pending', 'claimed', 'completed', 'dead', 'waiting'));

CREATE FUNCTION {prefix}_release_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_kind text;
BEGIN
    UPDATE {prefix}_jobs SET status = 'pending', run_at = now()
    WHERE id = NEW.chain_next AND status = 'waiting'
    RETURNING kind INTO next_kind;
    IF next_kind IS NOT NULL THEN  -- NULL: the next link was forgotten, or released already
        PERFORM pg_notify('{prefix}_jobs', next_kind);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER {prefix}_chain_release AFTER UPDATE OF status ON {prefix}_jobs
    FOR EACH ROW WHEN (NEW.status = 'completed' AND NEW.chain_next IS NOT NULL)
    EXECUTE FUNCTION {prefix}_release_chain();
