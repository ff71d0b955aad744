-- A job's journal: one row per run's outcome, recovery, release and merge.

-- journal_list_for_job --
-- A job's journal, oldest first.
SELECT job_id, run, outcome, at, note, attachment::text AS attachment, duration_s, worker
FROM {prefix}_journal WHERE job_id = :id ORDER BY id;
