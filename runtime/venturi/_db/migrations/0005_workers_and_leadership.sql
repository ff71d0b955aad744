-- The worker registry: one row per running Worker, written when it starts, refreshed by its
-- heartbeat, removed when it exits cleanly (and by the leader's sweep once it has gone
-- silent: a killed worker cannot remove its own). Small (one row per worker) and written
-- once per heartbeat per worker: no index beyond the key.
CREATE TABLE {prefix}_workers (
    id             text             PRIMARY KEY,   -- the identity: [pod/]host:pid#tag
    host           text             NOT NULL,
    pid            integer          NOT NULL,
    pod            text,
    queues         text[]           NOT NULL,      -- served in this order
    kinds          text[]           NOT NULL,      -- registered KINDs
    unknown_kinds  text             NOT NULL DEFAULT 'wait'
                   CHECK (unknown_kinds IN ('wait', 'fail')),
    concurrency    integer          NOT NULL,
    heartbeat_s    double precision NOT NULL,      -- how often it refreshes last_seen
    started_at     timestamptz      NOT NULL DEFAULT now(),
    last_seen      timestamptz      NOT NULL DEFAULT now()
);

-- Leadership: one row per thing led ('maintenance': the leader-only services). Whoever holds
-- an unexpired lease leads; it renews the lease well before it ends, and anyone may take an
-- expired one. `term` grows by one at every change of hands (or lapse), and is never reused:
-- a resigning leader expires its lease rather than deleting the row, so the next term counts
-- on from it. See venturi/_maintenance/leader.py for why a table and not an advisory lock.
CREATE TABLE {prefix}_leader (
    name        text        PRIMARY KEY,
    leader      text        NOT NULL,   -- the worker's identity
    term        bigint      NOT NULL,
    elected_at  timestamptz NOT NULL,   -- when this term began
    expires_at  timestamptz NOT NULL
);
