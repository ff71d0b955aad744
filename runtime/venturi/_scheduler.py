"""The scheduler: enqueues the ticks of the schedules a worker runs (see venturi.schedules).

Each pass locks the due schedule rows (FOR UPDATE SKIP LOCKED: a pass of another worker skips
them), decides with the pure `schedules.decide`, enqueues the tick's job on the same
connection, and moves the row past the tick, all in one transaction: a tick is enqueued
exactly once, or not at all if the transaction fails (the next pass retries it). What is due
is decided by the database's clock, never the worker's. Between passes it sleeps until the
earliest next tick (at most `poll_max`), and waits out database outages like every other
loop of the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from venturi._db.failures import breaks_connection, is_configuration_error, is_database_failure
from venturi._outage import Outage, next_delay
from venturi.codec import Codec
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.schedules import Schedule, decide
from venturi.task import Task, kind_of

logger = logging.getLogger(__name__)

SLACK = 0.01
"""Seconds past a tick before the pass that enqueues it, so the database sees it due."""


class Scheduler:
    def __init__(
        self,
        store: PostgresStore,
        schedules: Sequence[Schedule],
        *,
        queue: str,
        worker: str,
        codec: Codec,
        poll_max: float,
        outage: Outage,
        on_enqueued: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._on_enqueued = on_enqueued
        """Called after a pass that enqueued a tick (a worker without LISTEN wakes itself)."""
        self._schedules = {s.name: s for s in schedules}
        self._names = list(self._schedules)
        self._queue = queue
        self._worker = worker
        self._codec = codec
        self._poll_max = poll_max
        self._outage = outage
        self.enqueued = 0

    async def run(self) -> None:
        declared, delay = False, 0.0
        while True:
            epoch = self._outage.epoch
            try:
                if not declared:
                    await self._declare()
                    declared = True
                before = self.enqueued
                wait = await self._pass()
                if self.enqueued != before and self._on_enqueued is not None:
                    self._on_enqueued()
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("running schedules", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            delay = 0.0
            await asyncio.sleep(wait)

    async def _declare(self) -> None:
        store = self._store
        schedules = list(self._schedules.values())
        await store._run.execute(
            store._q["schedule_declare"],
            names=[s.name for s in schedules],
            specs=[s.spec for s in schedules],
            kinds=[_kind(s) for s in schedules],
            worker=self._worker,
        )

    async def _pass(self) -> float:
        """Enqueue what is due; return seconds until the next look."""
        async with self._store._in_transaction() as tx:
            rows = await tx._run.fetch(tx._q["schedule_lock_due"], names=self._names)
            for row in rows:
                schedule = self._schedules[row["name"]]
                decision = decide(
                    schedule,
                    last_tick=row["last_tick"],
                    now=row["now"],
                    previous_running=row["previous_running"],
                )
                job, kind, failed = None, None, 0
                if decision.enqueue is not None:
                    try:
                        # A savepoint: a task the database refuses leaves the pass going.
                        async with tx._run.transaction():
                            task = schedule.task_for(decision.enqueue)
                            kind = kind_of(type(task))
                            queue = Queue(
                                tx, queue=schedule.queue or self._queue, codec=self._codec
                            )
                            job = await queue.enqueue(task)
                    except Exception as exc:
                        if is_database_failure(exc) and (
                            breaks_connection(exc) or is_configuration_error(exc)
                        ):
                            raise  # an outage or a refusal: the pass is tried again
                        # The schedule's own function (or its task) failed: that tick is
                        # skipped, the schedule and the worker go on.
                        logger.exception(
                            "schedule %s: tick %s skipped: making or storing its task failed",
                            schedule.name,
                            decision.enqueue.isoformat(),
                        )
                        job, kind, failed = None, None, 1
                    else:
                        logger.info(
                            "schedule %s: tick %s enqueued as job %s",
                            schedule.name,
                            decision.enqueue.isoformat(),
                            job,
                        )
                elif decision.skipped:
                    logger.info(
                        "schedule %s: %d tick(s) up to %s skipped (%s)",
                        schedule.name,
                        decision.skipped,
                        decision.last_tick.isoformat(),
                        "missed" if not row["previous_running"] else "previous run not done",
                    )
                await tx._run.execute(
                    tx._q["schedule_advance"],
                    name=schedule.name,
                    kind=kind,
                    last_tick=decision.last_tick,
                    next_tick=decision.next_tick,
                    job=None if job is None else job.to_uuid(),
                    skipped=decision.skipped + failed,
                    worker=self._worker,
                )
                self.enqueued += job is not None
        until: float | None = await self._store._run.fetchval(
            self._store._q["schedule_next_due"], names=self._names
        )
        if until is None:
            return self._poll_max
        return min(max(until, 0.0) + SLACK, self._poll_max)


def _kind(schedule: Schedule) -> str:
    """The KIND a schedule enqueues ("" when a function makes its task, until it has)."""
    task = schedule.task
    return kind_of(type(task)) if isinstance(task, Task) else ""
