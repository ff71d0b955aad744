-- Scale-in fences, in {prefix}_fences (migration 0018): pods about to be removed claim
-- nothing. A fence takes each pod's fence lock exclusively; every claim of a pod takes it
-- shared (claim_v6 and v7), so a fence commits only after the claims of its pods in flight
-- did, and a claim that starts after it sees it.

-- fences_set --
-- Fence :pods until :ttl_s seconds from now (a pod fenced already: until the later of the
-- two). The locks are taken in the order of their keys, so two callers with overlapping pods
-- cannot deadlock (two pods whose names hash alike share a lock, taken once).
WITH locked AS (
    SELECT pg_advisory_xact_lock(hashtext('{prefix}_fences'), k.key)
    FROM (SELECT DISTINCT hashtext(pod) AS key FROM unnest(:pods::text[]) AS u(pod)
          ORDER BY key) AS k
)
INSERT INTO {prefix}_fences AS f (pod, until)
SELECT DISTINCT pod, now() + make_interval(secs => :ttl_s) FROM unnest(:pods::text[]) AS u(pod)
WHERE (SELECT count(*) FROM locked) >= 0  -- always true: takes the locks first
ON CONFLICT (pod) DO UPDATE SET fenced_at = now(), until = greatest(f.until, excluded.until);

-- fences_clear --
-- Lift the fences of :pods, and forget every fence past its until.
DELETE FROM {prefix}_fences WHERE pod = ANY (:pods::text[]) OR until <= now();

-- fences_list --
-- The pods fenced now (past their until, a fence holds nothing back).
SELECT pod FROM {prefix}_fences WHERE until > now() ORDER BY pod;
