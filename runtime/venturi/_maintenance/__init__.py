"""The maintainer: takes part in the leader election, and while this worker leads, runs the
maintenance services (`venturi.maintenance.MaintenanceService`), each in a loop of its own
every `interval` seconds, first right after the election.

Leadership lost (the lease could not be renewed in time, or another worker took it) cancels
every service's run at once; a new term starts them afresh. A service that raises is
logged with its traceback and run again at its next interval (a bug in a service must not
stop the worker, nor the other services); a database failure is recorded in the worker's
`Outage` and retried at the next interval.

Services, one per module: `sweeper` (the registry's silent workers), `cleaner` (retention).
The cron scheduler and batch pruning join them as further services.

Started by the worker; calls `Elector` and the services.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from venturi._db.failures import is_database_failure
from venturi._maintenance.leader import Elector
from venturi._outage import Outage
from venturi.maintenance import MaintenanceService
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

PAST_DEADLINE_CHECK = 0.05
"""Seconds between two looks at the leader's deadline by a service that found it passed."""
STOP_WAIT = 5.0
"""Seconds a stopping worker waits for its cancelled maintenance services to end."""


class Maintainer:
    def __init__(
        self,
        store: PostgresStore,
        services: Sequence[MaintenanceService],
        *,
        worker: str,
        outage: Outage,
    ) -> None:
        self._store = store
        self._services = list(services)
        self._worker = worker
        self._outage = outage
        self._running: list[asyncio.Task[None]] = []
        self._cancelled: set[asyncio.Task[None]] = set()
        """Services of a term that ended, cancelled but perhaps not yet unwound (a statement
        being cancelled on the server still holds its pool connection)."""
        self.elector = Elector(
            store,
            worker=worker,
            outage=outage,
            on_elected=self._elected,
            on_deposed=self._deposed,
        )

    @property
    def leads(self) -> bool:
        return self.elector.term is not None

    async def run(self) -> None:
        try:
            await self.elector.run()
        finally:
            await self._stop_services()

    async def close(self) -> None:
        """At a clean exit: stop the services and resign the lease."""
        await self.elector.resign()
        await self._stop_services()

    def _elected(self, term: int) -> None:
        self._running = [
            asyncio.create_task(self._serve(s, term), name=f"venturi-maintenance-{s.name}")
            for s in self._services
        ]

    def _deposed(self, term: int, why: str) -> None:
        self._cancel_running()

    def _cancel_running(self) -> None:
        for task in self._running:
            task.cancel()
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)
        self._running = []

    async def _stop_services(self) -> None:
        """Cancel the running services and wait until every service task has ended, also
        those of earlier terms, so that none holds a connection once the worker closes its
        store; but no longer than `STOP_WAIT` (a service that ignores cancellation must not
        keep the worker from stopping: the store's close terminates what it holds)."""
        self._cancel_running()
        if not self._cancelled:
            return
        _, stuck = await asyncio.wait(set(self._cancelled), timeout=STOP_WAIT)
        for task in stuck:
            logger.warning(
                "worker %s: maintenance task %s did not stop within %.0fs of its cancellation",
                self._worker,
                task.get_name(),
                STOP_WAIT,
            )

    async def _serve(self, service: MaintenanceService, term: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if loop.time() >= self.elector.deadline:
                # Past the time this leader may act on its own clock (the process was
                # frozen, say): a run starts only once the elector has renewed the lease;
                # if it cannot, it deposes this term, and this task is cancelled.
                await asyncio.sleep(PAST_DEADLINE_CHECK)
                continue
            try:
                await service.run_once(self._store)
            except Exception as exc:
                if is_database_failure(exc):
                    self._outage.failed(f"maintenance ({service.name})", exc)
                else:
                    logger.exception(
                        "worker %s: maintenance service %r failed (term %d); it runs again "
                        "in %.1fs",
                        self._worker,
                        service.name,
                        term,
                        service.interval,
                    )
            # (A service's success says nothing of the database: it may not touch it. The
            # loops that do end the outage.)
            await asyncio.sleep(service.interval)
