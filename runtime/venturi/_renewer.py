"""The renewer: keeps the leases of the jobs a worker holds alive, and stops jobs whose
lease was lost or is about to end unrenewed.

Each job is renewed a third of its lease after its last renewal (or its claim); a newly
taken job wakes this loop, so a short lease is never overlooked. While the database is
unreachable, renewal is retried; a job whose lease would end before a renewal succeeds is
aborted first (`Held.abort_at`), and a renewal is never waited for past that point, so no
other worker can recover a job that still runs here.

Started by the worker; calls `PostgresStore.renew_leases`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from venturi._db.failures import is_database_failure
from venturi._outage import Outage, next_delay
from venturi._runner import Runner
from venturi._timeouts import wait_for
from venturi.postgres import PostgresStore

RENEW_FRACTION = 1 / 3
"""Leases are renewed after this fraction of their length: two renewals can fail in a row."""


class Renewer:
    def __init__(self, store: PostgresStore, runner: Runner, *, outage: Outage) -> None:
        self._store = store
        self._runner = runner
        self._outage = outage

    async def run(self) -> None:
        runner = self._runner
        loop = asyncio.get_running_loop()
        failed_at: float | None = None
        delay = 0.0
        while True:
            runner.changed.clear()
            now = loop.time()
            held = []
            deadline = math.inf
            # Once per held job per wake-up (one per claim, of a whole batch of jobs).
            for h in list(runner.held()):  # `lose` below must not change what we walk
                abort_at = h.abort_at
                if now >= abort_at:
                    runner.lose(
                        h,
                        "its lease could not be renewed in time (the database did not answer, "
                        "or this worker's event loop was blocked)",
                    )
                else:
                    held.append(h)
                    deadline = min(deadline, abort_at)
            if not held:
                await runner.changed.wait()
                continue
            if failed_at is not None:
                due = failed_at + delay
            else:
                due = min(h.renewed_at + h.job.lease_s * RENEW_FRACTION for h in held)
            if min(due, deadline) > now:
                with contextlib.suppress(TimeoutError):
                    await wait_for(runner.changed.wait(), min(due, deadline) - now)
                continue
            progress = [h.progress.unwritten() for h in held]  # ctx.progress, sent along
            try:
                owned = await wait_for(
                    self._store.renew_leases(
                        [h.job.id for h in held],
                        [h.job.claim_token for h in held],
                        [h.job.lease_s for h in held],
                        progress,
                    ),
                    max(deadline - now, 0.05),
                )
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("renewing leases", exc)
                failed_at = loop.time()
                delay = min(next_delay(delay), min(h.job.lease_s for h in held) * 0.1)
                continue
            self._outage.ok()
            failed_at = None
            delay = 0.0
            for h, sent in zip(held, progress, strict=True):
                if h.job.id in owned:
                    h.renewed_at = now
                    if sent is not None:
                        h.progress.written = sent
                else:
                    runner.lose(h, "its lease was lost (recovered by another worker)")
