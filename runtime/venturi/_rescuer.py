"""The rescuer: recovers jobs whose lease expired because their worker died or hung.

Recovery is timeout-only (a lease is renewed while its handler is alive, so only dead or
wedged workers lose jobs): the job re-pends with backoff and a `stale_recovered` journal
entry, counted as a failed execution (the backstop applies). Every worker runs one for the
queues it serves (so a job's recovery follows its own queue's policy); they contend safely
through SKIP LOCKED.

It sleeps until the earliest lease of its queues expires, so a crashed worker's jobs come
back right after their lease, not a poll later. When it saw nothing claimed it would sleep
`poll_max`, and miss the lease of a job another worker claims meanwhile; so a claim whose
leases end sooner than any its worker already holds or has announced announces them (about
one notification per lease, not per claim), and `lease_announced` moves the wake-up
earlier. Each look reads the next expiry of every lease claimed until then, which is what
lets a later lease go unannounced. No query runs while nothing is claimed, beyond one per
`poll_max`.

It never recovers a job its own worker still holds (running, prefetched, or finished with its
outcome not yet written): after an outage longer than a lease, the worker writes what it
holds as soon as the database is back, and its own rescuer must not get there first and
count a finished job as failed. (Another worker's rescuer may: an expired lease is the
signal it acts on.)

Started by the worker; calls `PostgresStore.next_lease_expiry` and `recover_stale`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import Counter
from collections.abc import Callable, Collection

from venturi import logs
from venturi._db.failures import is_database_failure
from venturi._executor import Policy, job_backoff, limit_note
from venturi._hooks import HookSet
from venturi._outage import Outage, next_delay
from venturi._records import Recovered, Recovery, StaleJob
from venturi._timeouts import wait_for
from venturi.backoff import retry_delay
from venturi.hooks import Dead
from venturi.hooks import Recovered as RecoveredEvent
from venturi.jobs import JobStatus
from venturi.postgres import DEFAULT_HOOK_LEASE_S, PostgresStore

logger = logging.getLogger(__name__)

OWN_HELD_WAIT = 0.5
"""Seconds before looking again when every expired lease is one this worker holds (its
outcomes are being written, or its renewals are about to extend them)."""
LAST_ATTEMPT = "the worker stopped during the last attempt"
"""How a job whose worker died during its last attempt fails for good."""
EXPIRY_SLACK = 0.05
"""Seconds past the earliest expiry before looking, so the lease is surely over."""
WARN_EACH = 10
"""Recovered jobs logged one WARNING each per sweep; the rest of a sweep's (a killed worker
held a thousand prefetched jobs) at INFO each, under one WARNING that counts them by kind."""


def decide_recoveries(stale: list[StaleJob], policy: Policy) -> list[Recovery]:
    """Pure: for each stale job, re-pend with backoff, or dead when out of attempts."""
    decisions = []
    for job in stale:
        failures = job.failures + 1
        held = f"lease expired while held by {job.claimed_by or 'an unknown worker'}"
        used_up = limit_note(job, policy, failures)
        if used_up is not None:
            note = f"{LAST_ATTEMPT} ({held}; {used_up})"
            decisions.append(Recovery(job.id, True, 0.0, note, hook_token=uuid.uuid4()))
        else:
            delay = retry_delay(
                job_backoff(job, policy), failures, job.id.bytes, policy.jitter_fraction
            )
            decisions.append(Recovery(job.id, False, delay, held))
    return decisions


class Rescuer:
    def __init__(
        self,
        store: PostgresStore,
        policy: Policy,
        *,
        queues: list[str],
        worker: str,
        poll_max: float,
        hooks: HookSet,
        outage: Outage | None = None,
        hook_lease_s: float = DEFAULT_HOOK_LEASE_S,
        held: Callable[[], Collection[uuid.UUID]] = frozenset,
        on_dead: Callable[[Recovered], None] | None = None,
    ):
        self._held = held
        """The ids of the jobs this rescuer's worker holds, never recovered here."""
        self._hooks = hooks
        self._hook_lease_s = hook_lease_s
        self._on_dead = on_dead
        """Called for each job this rescuer made dead, once that is committed (its failure
        step is leased to this worker)."""
        self._store = store
        self._policy = policy
        self._queues = queues
        self._worker = worker
        self._poll_max = poll_max
        self._outage = outage or Outage(worker)
        self._loop = asyncio.get_running_loop()
        self._announced = math.inf
        """Loop time by which an announced lease ends (inf: none since the last look)."""
        self._rescheduled = asyncio.Event()

    def lease_announced(self, queue: str, seconds: float) -> None:
        """A worker claimed jobs of `queue` whose leases end in `seconds`: look by then."""
        if queue not in self._queues:
            return
        at = self._loop.time() + seconds + EXPIRY_SLACK
        if at < self._announced:
            self._announced = at
            self._rescheduled.set()

    async def run(self) -> None:
        delay = 0.0
        while True:
            epoch = self._outage.epoch
            try:
                wait = await self._sweep()
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("recovering expired leases", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            delay = 0.0
            await self._sleep(wait)

    async def _sleep(self, wait: float) -> None:
        """Sleep `wait` seconds, or until an announced lease ends sooner. Announcements
        that arrived during the last look are kept: the look may have read before their
        claim committed."""
        deadline = self._loop.time() + wait
        while (left := min(deadline, self._announced) - self._loop.time()) > 0:
            self._rescheduled.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._rescheduled.wait(), left)
        self._announced = math.inf  # the next look reads every lease claimed until now

    async def _sweep(self) -> float:
        """Recover what has expired; return seconds until the next look."""
        while True:
            until = await self._store.next_lease_expiry(self._queues)
            if until is None:
                return self._poll_max
            if until > 0:
                return min(until + EXPIRY_SLACK, self._poll_max)
            own_held = 0

            def decide(stale: list[StaleJob]) -> list[Recovery]:
                nonlocal own_held
                held = set(self._held())
                others = [job for job in stale if job.id not in held]
                own_held = len(stale) - len(others)
                return decide_recoveries(others, self._policy)

            recovered = await self._store.recover_stale(
                decide,
                queues=self._queues,
                worker=self._worker,
                hook_lease_s=self._hook_lease_s,
            )
            if len(recovered) > WARN_EACH:
                kinds = Counter(r.kind for r in recovered)
                logger.warning(
                    "%d jobs recovered after their leases expired (%s); each is logged, the "
                    "first %d as warnings, the others at info",
                    len(recovered),
                    ", ".join(f"{kind}: {n}" for kind, n in kinds.most_common()),
                    WARN_EACH,
                )
            for i, r in enumerate(recovered):
                if r.status is JobStatus.DEAD and self._on_dead is not None:
                    self._on_dead(r)
                logger.log(
                    logging.WARNING if i < WARN_EACH else logging.INFO,
                    "job %s (%s) recovered after its lease expired: now %s",
                    r.id,
                    r.kind,
                    r.status,
                    extra=logs.job_fields(r.id, r.kind, r.queue, r.run),
                )
                if self._hooks.active:
                    self._hooks.recovered(RecoveredEvent(r.id, r.kind, r.queue, r.status.value))
                    if r.status is JobStatus.DEAD:
                        self._hooks.dead(Dead(r.id, r.kind, r.queue, r.run, r.note))
            if not recovered:
                if own_held:  # ours: the worker writes or renews them
                    return min(OWN_HELD_WAIT, self._poll_max)
                # Expired but locked by another rescuer right now: look again shortly.
                return min(EXPIRY_SLACK * 2, self._poll_max)
