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
-- Take one start of :key's current window of :per_s seconds if fewer than :max were taken:
-- `taken`, and `reopens_in_s` until the window ends. See the function in the flow migration.
SELECT taken, reopens_in_s FROM {prefix}_rate_take_v1(:key, :max, :per_s);
