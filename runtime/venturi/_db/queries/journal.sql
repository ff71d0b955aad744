-- A job's journal: one row per run's outcome, recovery, release and merge.

-- journal_list_for_job --
-- A job's journal, oldest first.
SELECT job_id, run, outcome, at, note, attachment::text AS attachment, duration_s, worker
FROM {prefix}_journal WHERE job_id = :id ORDER BY id;

-- journal_written_by --
-- Of the jobs :ids, each at its run :runs, those whose outcome of that run :worker wrote: a
-- settlement retried after its reply was lost finds its claim cleared by its own first
-- attempt, which committed, not by a recovery elsewhere (which clears it without a row of
-- this worker's for this run). Only after such a retry, for the settlements it did not own.
SELECT u.id
FROM unnest(:ids::uuid[], :runs::int[]) AS u (id, run)
WHERE EXISTS (
    SELECT 1 FROM {prefix}_journal AS j
    WHERE j.job_id = u.id AND j.run = u.run AND j.worker = :worker
      AND j.outcome NOT IN ('stale_recovered', 'released'));
