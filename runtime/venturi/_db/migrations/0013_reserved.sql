-- A placeholder that keeps the numbers without gaps on the dashboard2 branch: number 13 is the
-- batches migration's (the lead's branch). Delete this file when merging, keeping 0013_batches.
SELECT 1;
