"""`Queue`: the producer's handle. It needs task classes only, never handlers.

queue = Queue(store)
job_id = await queue.enqueue(SendEmail(to="a@example.com", subject="hi"))
await queue.enqueue_in(Reminder(user=7), timedelta(hours=1))
ids = await queue.enqueue_many(SendEmail(to=a, subject="x") for a in addresses)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ulid import ULID

from venturi import codec
from venturi._records import NewJob
from venturi.backoff import Seconds, to_seconds
from venturi.jobs import Job, JournalEntry, Stats
from venturi.postgres import PostgresStore
from venturi.task import Priority, Task, kind_of

logger = logging.getLogger(__name__)

DEFAULT_QUEUE = "default"


class Queue:
    """Enqueue jobs and read their state. Cheap to create; share one per store."""

    def __init__(self, store: PostgresStore, *, queue: str = DEFAULT_QUEUE) -> None:
        self.store = store
        self.queue = queue

    async def enqueue(self, task: Task[Any], *, priority: Priority | None = None) -> ULID:
        """Store a job that is eligible now; returns its id."""
        job = self._new_job(task, priority=priority)
        await self.store.insert(job)
        self._log(job)
        return ULID.from_bytes(job.id.bytes)

    async def enqueue_at(
        self, task: Task[Any], when: datetime, *, priority: Priority | None = None
    ) -> ULID:
        """Store a job that becomes eligible at `when` (a timezone-aware datetime)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"enqueue_at: `when` must be a timezone-aware datetime, got {when!r}")
        job = self._new_job(task, priority=priority, run_at=when)
        await self.store.insert(job)
        self._log(job)
        return ULID.from_bytes(job.id.bytes)

    async def enqueue_in(
        self, task: Task[Any], delay: Seconds, *, priority: Priority | None = None
    ) -> ULID:
        """Store a job that becomes eligible `delay` from now (by the database clock)."""
        delay_s = to_seconds(delay, name="enqueue_in(delay)")
        job = self._new_job(task, priority=priority, delay_s=delay_s)
        await self.store.insert(job)
        self._log(job)
        return ULID.from_bytes(job.id.bytes)

    async def enqueue_many(
        self, tasks: Iterable[Task[Any]], *, priority: Priority | None = None
    ) -> list[ULID]:
        """Store many jobs in one round trip; returns their ids in order.

        Every payload is encoded before anything is sent, so one bad task fails the call
        and nothing is stored.
        """
        jobs = [self._new_job(task, priority=priority) for task in tasks]
        await self.store.insert_many(jobs)
        logger.debug("enqueued %d jobs", len(jobs))
        return [ULID.from_bytes(job.id.bytes) for job in jobs]

    async def job(self, job_id: ULID) -> Job | None:
        """The stored job, or None if there is no such job (or it was cleaned up)."""
        return await self.store.get_job(job_id)

    async def job_journal(self, job_id: ULID) -> list[JournalEntry]:
        """Every journal entry of one job, oldest first."""
        return await self.store.journal(job_id)

    async def stats(self) -> Stats:
        """Live counts by kind: pending (eligible), scheduled, claimed, dead, oldest age."""
        return await self.store.stats()

    def _new_job(
        self,
        task: Task[Any],
        *,
        priority: Priority | None,
        run_at: datetime | None = None,
        delay_s: float | None = None,
    ) -> NewJob:
        kind = kind_of(type(task))
        payload = codec.encode(task, what=f"payload of {type(task).__qualname__} ({kind})")
        tier = Priority(priority if priority is not None else task.priority())
        lease = task.lease()
        backoff = task.backoff()
        return NewJob(
            id=ULID().to_uuid(),
            kind=kind,
            queue=self.queue,
            priority=int(tier),
            payload=payload,
            run_at=run_at,
            delay_s=delay_s,
            lease_s=to_seconds(lease, name=f"{kind}.lease()") if lease is not None else None,
            backoff_base_s=backoff.base if backoff is not None else None,
            backoff_cap_s=backoff.cap if backoff is not None else None,
        )

    @staticmethod
    def _log(job: NewJob) -> None:
        logger.debug(
            "enqueued job %s (%s)",
            job.id,
            job.kind,
            extra={"job_id": str(job.id), "kind": job.kind},
        )
