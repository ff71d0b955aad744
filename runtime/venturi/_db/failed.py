"""Failed (dead) jobs (`queries/failed.sql`), run on a store's runner: listing them, putting
them back in their queues, deleting them: what `Queue.failed`, `retry`, `retry_all`,
`forget` and `flush` call, through `PostgresStore.list_failed` and the like."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import asyncpg
from ulid import ULID

from venturi._db.run import Runner
from venturi._db.sql import Statement
from venturi.errors import JobStateError
from venturi.jobs import FailedJob, JobStatus


class FailedJobs:
    def __init__(self, run: Runner, queries: Mapping[str, Statement], channel: str) -> None:
        self._run = run
        self._q = queries
        self._channel = channel
        """The NOTIFY channel a job put back in its queue wakes workers on."""

    async def page(
        self,
        *,
        queue: str | None,
        kind: str | None,
        before_id: ULID | None,
        limit: int,
        decode: Callable[[Any], Any],
    ) -> list[FailedJob]:
        """Failed (dead) jobs, newest first, their payloads decoded by `decode` (the
        codec's)."""
        rows = await self._run.fetch(
            self._q["failed_list"],
            queue=queue,
            kind=kind,
            before_id=None if before_id is None else before_id.to_uuid(),
            limit=limit,
        )
        return [
            FailedJob(
                id=ULID.from_bytes(r["id"].bytes),
                queue=r["queue"],
                kind=r["kind"],
                payload=decode(r["payload"]),
                error=r["last_error"],
                failed_at=r["finished_at"],
                run_count=r["run_count"],
                failures=r["failures"],
            )
            for r in rows
        ]

    async def retry(self, job: uuid.UUID, *, note: str) -> JobStatus | None:
        """Put a dead job back in its queue (see `failed_retry`); returns its status before
        (None: no such job). Only a dead job is changed. A unique job takes its unique id
        again: while another job holds it, `JobStateError` names the holder."""
        q = self._q
        for attempt in range(3):
            try:
                # Under a savepoint on the caller's connection: a collision is not theirs.
                async with self._run.transaction() as tx:
                    if attempt:  # a holder whose time is up lets go first
                        await tx.execute(q["job_unique_detach_expired_of"], id=job)
                    row = await tx.fetchrow(
                        q["failed_retry"], id=job, note=note, channel=self._channel
                    )
                return None if row is None else JobStatus(row["status"])
            except asyncpg.UniqueViolationError:
                holder = await self._run.fetchrow(q["job_unique_holder_of"], id=job)
                if holder is not None and attempt:
                    raise JobStateError(
                        f"job {ULID.from_bytes(job.bytes)} cannot be retried now: its unique id "
                        f"{holder['unique_key']!r} is held by job "
                        f"{ULID.from_bytes(holder['id'].bytes)}",
                        JobStatus.DEAD.value,
                    ) from None
        raise JobStateError(
            f"job {ULID.from_bytes(job.bytes)} cannot be retried now: its unique id is in use",
            JobStatus.DEAD.value,
        )

    async def retry_all(
        self,
        *,
        queue: str | None,
        kind: str | None,
        note: str,
        batch_size: int = 500,
        limit: int | None = None,
    ) -> int:
        """Retry every dead job of `queue` and `kind` (None: any), in bounded batches; at
        most `limit` (None: all)."""
        total = 0

        def room() -> int:
            return batch_size if limit is None else min(batch_size, limit - total)

        after: uuid.UUID | None = None
        while room() > 0:
            row = await self._run.fetchrow(
                self._q["failed_retry_batch"],
                queue=queue,
                kind=kind,
                after_id=after,
                limit=room(),
                note=note,
                channel=self._channel,
            )
            assert row is not None
            total += int(row["retried"])
            if row["last_id"] is None:
                break
            after = row["last_id"]
        after = None
        while room() > 0:  # unique jobs, one by one: each takes its unique id again, if free
            rows = await self._run.fetch(
                self._q["failed_unique_ids"],
                queue=queue,
                kind=kind,
                after_id=after,
                limit=room(),
            )
            for r in rows:
                try:
                    if await self.retry(r["id"], note=note) is JobStatus.DEAD:
                        total += 1
                except JobStateError:
                    pass  # its unique id is held by another job: it stays failed
            if len(rows) < batch_size:
                return total
            after = rows[-1]["id"]
        return total

    async def forget(self, job: uuid.UUID) -> JobStatus | None:
        """Delete a dead job and its journal; returns its status (None: no such job). A job
        that is not dead is left alone."""
        row = await self._run.fetchrow(self._q["failed_forget"], id=job)
        return None if row is None else JobStatus(row["status"])

    async def flush(
        self,
        *,
        queue: str | None,
        kind: str | None,
        before: datetime | None,
        batch_size: int = 1000,
    ) -> int:
        """Delete dead jobs (and their journal) in bounded batches; returns how many."""
        total = 0
        while True:
            n: int = await self._run.fetchval(
                self._q["failed_flush_batch"],
                queue=queue,
                kind=kind,
                before=before,
                limit=batch_size,
            )
            total += n
            if n < batch_size:
                return total
