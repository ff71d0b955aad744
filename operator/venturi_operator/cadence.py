"""When a JobQueue's reconcile loop ticks: the wake rule, shared by the kopf daemon
(``handlers.jobqueue``) and the autoscaling simulator (``bench/autoscale``).

The daemon ticks when the JobQueue appears or its spec changes, ``interval`` seconds after the
previous tick ends, and when a NOTIFY (a job enqueued or made claimable) wakes it:

- at once for a pool at zero replicas: nothing serves the job, waiting the interval would be
  waiting for nothing;
- for a running pool, :data:`BURST_WAKE_SECONDS` after the last tick at the earliest: a burst
  that arrives at a running pool is seen within that, not up to an interval later, while a
  steady stream of jobs costs at most one tick per :data:`BURST_WAKE_SECONDS` (each tick is one
  stats query of under a millisecond, and the API calls that read the Deployment).

After a tick whose scale-in was held back because every pod it would remove holds a job, the
next tick comes :data:`SPARED_RETRY_SECONDS` later instead of an interval (:func:`next_wait`);
after one whose status the API server did not take, :data:`RETRY_AFTER_API_FAILURE` later.
"""

from __future__ import annotations

__all__ = [
    "BURST_WAKE_SECONDS",
    "RETRY_AFTER_API_FAILURE",
    "SPARED_RETRY_SECONDS",
    "next_wait",
    "wake_at",
]

#: The least time between ticks that NOTIFYs at a running pool cause.
BURST_WAKE_SECONDS = 5.0
#: The wait after a tick whose scale-in busy pods held back: a pod that goes idle is taken
#: within this, not an interval later.
SPARED_RETRY_SECONDS = 2.0
#: The wait after a tick whose end the API server did not take (its status patch failed, the
#: server away): the tick is tried again this soon, not an interval later.
RETRY_AFTER_API_FAILURE = 5.0


def next_wait(interval: float, *, spared: bool) -> float:
    """Seconds from the end of a tick to the next one (unless a NOTIFY or a spec change wakes
    the loop sooner): ``interval``, or :data:`SPARED_RETRY_SECONDS` when the tick wanted fewer
    replicas than the pods that hold jobs (``policy.Reason.BUSY_PODS_SPARED``). Jobs spread
    over the pods, so a pool busy at 80 % rarely has a pod idle, and then not for long: a scale-in
    that waits for one must look often to catch it (each look is one stats query, one claims
    query and a pod list, and only while a scale-in waits)."""
    return min(interval, SPARED_RETRY_SECONDS) if spared else interval


def wake_at(*, decided: int | None, last_tick: float | None, now: float) -> float | None:
    """When a NOTIFY for a pool should tick the loop (None: leave it to the interval).

    ``decided`` is the replicas the last tick decided for the pool (None: no tick yet, and the
    first one is on its way); ``last_tick`` when that tick started, on the clock of ``now``.
    """
    if decided is None:
        return None
    if decided == 0 or last_tick is None:
        return now
    return max(now, last_tick + BURST_WAKE_SECONDS)
