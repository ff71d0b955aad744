-- Chains as the dashboard reads them (chains page, a job's chain position). A chain is its
-- links joined by chain_next; every link but the last has one, so these partial indexes hold
-- the chained jobs only (none of the rest: an unchained job costs nothing here).
-- By the next link: "which job points at this one" (a link's previous link; a head is a link
-- nothing points at).
CREATE INDEX {prefix}_jobs_chain_next_idx ON {prefix}_jobs (chain_next)
    WHERE chain_next IS NOT NULL;
-- By id: chained jobs newest first, for the heads of recent chains (keyset paging by id).
CREATE INDEX {prefix}_jobs_chain_idx ON {prefix}_jobs (id)
    WHERE chain_next IS NOT NULL;
