"""The renewer: keeps the leases of the jobs a worker holds alive, and stops jobs whose
lease was lost or is about to end unrenewed.

Each job is renewed a third of its lease after its last renewal (or its claim). A job
taken on whose renewal is due before this loop's next look wakes it, so a short lease is
never overlooked; the usual claim, whose leases are due after those held, wakes nothing.
While the database is unreachable, renewal is retried; a job whose lease would end before
a renewal succeeds is aborted first (`Held.abort_at`), and a renewal is never waited for
past that point, so no other worker can recover a job that still runs here.

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
            runner.renewer_looks_at = -math.inf  # it looks below, before it waits
            now = loop.time()
            held = []
            deadline = math.inf
            # Once per held job per wake-up (a renewal, or a job taken on that is due sooner).
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
                runner.renewer_looks_at = math.inf
                await runner.changed.wait()
                continue
            due = failed_at + delay if failed_at is not None else min(h.renewal_due for h in held)
            if min(due, deadline) > now:
                runner.renewer_looks_at = min(due, deadline)
                with contextlib.suppress(TimeoutError):
                    await wait_for(runner.changed.wait(), min(due, deadline) - now)
                continue
            progress = [h.progress.unwritten() for h in held]  # ctx.progress, sent along
            epoch = self._outage.epoch
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
            self._outage.ok(epoch)
            failed_at = None
            delay = 0.0
            for h, sent in zip(held, progress, strict=True):
                if h.job.id in owned:
                    h.renewed_at = now
                    if sent is not None:
                        h.progress.written = sent
                else:
                    runner.lose(h, "its lease was lost (recovered by another worker)")
