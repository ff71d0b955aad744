"""The rescuer: recovers jobs whose lease expired because their worker died or hung.

Recovery is timeout-only (a lease is renewed while its handler is alive, so only dead or
wedged workers lose jobs): the job re-pends with backoff and a `stale_recovered` journal
entry, counted as a failed execution (the backstop applies). Every worker runs one; they
contend safely through SKIP LOCKED. It sleeps until the earliest lease expires (bounded by
`poll_max`), so a crashed worker's jobs come back right after their lease, not a poll later.

Started by the worker; calls `PostgresStore.recover_stale`.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from venturi._executor import Policy, job_backoff
from venturi._hooks import Hooks
from venturi._records import Recovery, StaleJob
from venturi.backoff import retry_delay
from venturi.postgres import PostgresStore

logger = logging.getLogger(__name__)

EXPIRY_SLACK = 0.05
"""Seconds past the earliest expiry before looking, so the lease is surely over."""


def decide_recoveries(stale: list[StaleJob], policy: Policy) -> list[Recovery]:
    """Pure: for each stale job, re-pend with backoff, or dead at the backstop."""
    decisions = []
    for job in stale:
        failures = job.failures + 1
        held = f"lease expired while held by {job.claimed_by or 'an unknown worker'}"
        if policy.backstop is not None and failures >= policy.backstop:
            decisions.append(
                Recovery(job.id, True, 0.0, f"{held}; backstop reached after {failures} failures")
            )
        else:
            delay = retry_delay(
                job_backoff(job, policy), failures, job.id.bytes, policy.jitter_fraction
            )
            decisions.append(Recovery(job.id, False, delay, held))
    return decisions


class Rescuer:
    def __init__(
        self, store: PostgresStore, policy: Policy, *, worker: str, poll_max: float, hooks: Hooks
    ):
        self._hooks = hooks
        self._store = store
        self._policy = policy
        self._worker = worker
        self._poll_max = poll_max

    async def run(self) -> None:
        while True:
            try:
                wait = await self._sweep()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("stale-job recovery failed: %s", exc)
                wait = min(self._poll_max, 1.0)
            await asyncio.sleep(wait)

    async def _sweep(self) -> float:
        """Recover what has expired; return seconds until the next look."""
        while True:
            until = await self._store.next_lease_expiry()
            if until is None:
                return self._poll_max
            if until > 0:
                return min(until + EXPIRY_SLACK, self._poll_max)
            recovered = await self._store.recover_stale(
                lambda stale: decide_recoveries(stale, self._policy), worker=self._worker
            )
            for job_id, kind, status in recovered:
                self._hooks.recovered(kind)
                logger.warning(
                    "job %s (%s) recovered after its lease expired: now %s",
                    job_id,
                    kind,
                    status,
                    extra={"job_id": str(job_id), "kind": kind},
                )
            if not recovered:
                # Expired but locked by another rescuer right now: look again shortly.
                return min(EXPIRY_SLACK * 2, self._poll_max)
