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
"""

from __future__ import annotations

__all__ = ["BURST_WAKE_SECONDS", "wake_at"]

#: The least time between ticks that NOTIFYs at a running pool cause.
BURST_WAKE_SECONDS = 5.0


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
