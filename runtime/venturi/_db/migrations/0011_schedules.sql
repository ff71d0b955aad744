-- Periodic tasks (venturi.schedules): one row per schedule declared in code. `last_tick` is
-- the latest tick dealt with; a tick's job is enqueued in the transaction that moves it, with
-- the row locked, so each tick is enqueued once however many workers run the schedule.
CREATE TABLE {prefix}_schedules (
    name text PRIMARY KEY,
    spec text NOT NULL,
    kind text NOT NULL,
    last_tick timestamptz NOT NULL,
    next_tick timestamptz NOT NULL,
    last_job uuid,
    enqueued bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    seen_at timestamptz NOT NULL DEFAULT now(),
    seen_by text
);
