-- Leader election by a lease row with terms (the table: migrations/*_workers_and_leadership
-- .sql; the elector: venturi/_maintenance/leader.py). Every statement is one short
-- transaction on any connection: no session state, so it works through PgBouncer in
-- transaction mode. Times are the database's.

-- leader_attempt --
-- Take the lease if it is free or expired, or renew it if :worker holds it. The term stays
-- when :worker renews the unexpired lease of its own term :term (NULL: it holds none), and
-- grows by one otherwise (a new leader, or a leader whose lease lapsed). `term` is NULL when
-- someone else leads; `expires_in_s` is then how long its lease has left (read before this
-- statement's own write, so it means nothing when the attempt won).
WITH attempt AS (
    INSERT INTO {prefix}_leader AS l (name, leader, term, elected_at, expires_at)
    VALUES (:name, :worker, 1, now(), now() + make_interval(secs => :ttl_s))
    ON CONFLICT (name) DO UPDATE SET
        term = CASE WHEN l.leader = excluded.leader AND l.term = :term::bigint
                         AND l.expires_at > now()
                    THEN l.term ELSE l.term + 1 END,
        elected_at = CASE WHEN l.leader = excluded.leader AND l.term = :term::bigint
                               AND l.expires_at > now()
                          THEN l.elected_at ELSE now() END,
        leader = excluded.leader,
        expires_at = excluded.expires_at
    WHERE l.expires_at <= now() OR l.leader = excluded.leader
    RETURNING l.term
)
SELECT (SELECT term FROM attempt) AS term,
       (SELECT extract(epoch FROM expires_at - now())::float8 FROM {prefix}_leader
        WHERE name = :name) AS expires_in_s;

-- leader_resign --
-- A leader's clean exit: its lease ends now (the row stays, so terms count on).
UPDATE {prefix}_leader SET expires_at = now()
WHERE name = :name AND leader = :worker AND term = :term AND expires_at > now();

-- leader_get --
-- Who holds the lease, of which term, and whether it is still valid.
SELECT leader, term, elected_at, expires_at, expires_at > now() AS valid
FROM {prefix}_leader WHERE name = :name;
