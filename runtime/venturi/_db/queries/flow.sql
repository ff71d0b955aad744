-- Flow control (venturi/flow.py): keys held by one run at a time, and rate-limit windows.
-- Only the middleware of venturi.flow runs these; a worker without it never does.

-- lock_take --
-- Take :key for the run (:job_id, :token). Returns NULL when taken (or already this run's),
-- else the job id of the live run holding it. See the function in the flow migration.
SELECT {prefix}_lock_take_v1(:key, :job_id, :token) AS holder;

-- lock_release --
-- Release :key if the run (:job_id, :token) still holds it (a no-op otherwise).
DELETE FROM {prefix}_locks
WHERE key = :key AND job_id = :job_id AND claim_token = :token;

-- rate_take --
-- Take one start of :key's current window of :per_s seconds (windows aligned on the Unix
-- epoch, in database time) if fewer than :max were taken. `taken` is the start's number in
-- the window, NULL when the window is full; `reopens_in_s` is how long until the next window.
-- One atomic statement: the conflicting row is locked and its count re-read before the WHERE.
WITH w AS (
    SELECT to_timestamp(floor(extract(epoch FROM now()) / :per_s::float8) * :per_s::float8)
           AS start
), taken AS (
    INSERT INTO {prefix}_rate_windows AS r (key, window_start, taken)
    SELECT :key, w.start, 1 FROM w
    ON CONFLICT (key, window_start) DO UPDATE SET taken = r.taken + 1
    WHERE r.taken < :max
    RETURNING r.taken
), pruned AS (
    DELETE FROM {prefix}_rate_windows AS r
    WHERE r.key = :key AND r.window_start < (SELECT start FROM w)
)
SELECT (SELECT taken FROM taken) AS taken,
       greatest(extract(epoch FROM w.start + make_interval(secs => :per_s::float8) - now()),
                0)::float8 AS reopens_in_s
FROM w;
