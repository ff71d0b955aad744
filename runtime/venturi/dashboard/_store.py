"""The dashboard's database access: bounded reads, and the actions on dead jobs.

Every page reads in one read-only, repeatable-read transaction (one snapshot, so the figures
of a page agree with each other) whose statements are bounded by a statement timeout set
first (`dashboard_session`). Reads go through the public `Queue` on that connection
(`store.using(conn)`), plus the few statements of `_db/queries/dashboard.sql`.

Pause, resume, retry, forget and cancelling a batch go through the public `Queue` too (one
semantics, whoever clicks), on a write transaction of the same bounds; retry all runs
`Queue.retry_all`, whose batches are short transactions of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from ulid import ULID

from venturi._db import sql
from venturi._db.run import discard_if_broken, release
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.errors import JobStateError
from venturi.jobs import (
    BatchStatus,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    MinuteCounts,
    Stats,
)
from venturi.pauses import QueueState
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.registry import WorkerInfo
from venturi.schedules import ScheduleInfo

BULK_LIMIT = 10_000
"""Jobs "retry all" changes per click at most: a click never holds a request for minutes."""


CHAIN_LINKS = 100
"""Links of one chain a page reads at most (a longer chain says that more follow)."""


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One link of a chain, as the chains page and a job's page show it."""

    id: ULID
    position: int
    """1 for the first link read (the head, unless cleanup deleted earlier finished links)."""
    kind: str
    queue: str
    status: JobStatus
    run_at: datetime
    created_at: datetime
    finished_at: datetime | None
    failures: int
    last_error: str | None
    has_next: bool
    """It points at a next link (which the walk may not have read: the cap)."""


def _link(r: asyncpg.Record) -> ChainLink:
    return ChainLink(
        id=ULID.from_bytes(r["id"].bytes),
        position=r["position"],
        kind=r["kind"],
        queue=r["queue"],
        status=JobStatus(r["status"]),
        run_at=r["run_at"],
        created_at=r["created_at"],
        finished_at=r["finished_at"],
        failures=r["failures"],
        last_error=r["last_error"],
        has_next=r["chain_next"] is not None,
    )


@dataclass(frozen=True, slots=True)
class BatchCallback:
    """One callback job of a batch."""

    name: str
    """then, catch or finally."""
    id: ULID
    kind: str
    status: JobStatus


class Reader:
    """The reads of one page, on one connection, inside its bounded transaction."""

    def __init__(self, conn: Any, queries: Mapping[str, sql.Statement], queue: Queue) -> None:
        self._conn = conn
        self._q = queries
        self.queue = queue

    async def _fetch(self, name: str, **values: Any) -> list[asyncpg.Record]:
        stmt = self._q[name]
        rows: list[asyncpg.Record] = await self._conn.fetch(stmt.text, *stmt.args(values))
        return rows

    async def stats(self) -> Stats:
        return await self.queue.stats()

    async def counts(self) -> dict[str, dict[JobStatus, int]]:
        """Jobs by kind and status, from the kept counters (all four statuses)."""
        found: dict[str, dict[JobStatus, int]] = {}
        for r in await self._fetch("dashboard_counts"):
            found.setdefault(r["kind"], {})[JobStatus(r["status"])] = r["n"]
        return found

    async def now(self) -> datetime:
        """The database's clock, as of this page's snapshot."""
        rows = await self._fetch("dashboard_now")
        at: datetime = rows[0]["now"]
        return at

    async def jobs(self, f: JobFilter) -> list[Job]:
        return await self.queue.jobs(f)

    async def job(self, job_id: ULID) -> Job | None:
        return await self.queue.job(job_id)

    async def journal(self, job_id: ULID) -> list[JournalEntry]:
        return await self.queue.job_journal(job_id)

    async def chains(
        self, *, before: ULID | None, limit: int
    ) -> list[tuple[ULID, list[ChainLink]]]:
        """The newest `limit` chains whose head is older than `before`, newest first, each
        its links in order (at most `CHAIN_LINKS`)."""
        rows = await self._fetch(
            "dashboard_chains",
            before_id=before.to_uuid() if before is not None else None,
            limit=limit,
            max_links=CHAIN_LINKS,
        )
        chains: dict[Any, list[ChainLink]] = {}
        for r in rows:
            chains.setdefault(r["head"], []).append(_link(r))
        return [(ULID.from_bytes(head.bytes), links) for head, links in chains.items()]

    async def job_chain(self, job_id: ULID) -> tuple[list[ChainLink], bool]:
        """The links of the chain `job_id` is in (only itself when it is in none), and
        whether the chain starts before the first link returned (the walk back's cap)."""
        rows = await self._fetch("dashboard_job_chain", id=job_id.to_uuid(), max_links=CHAIN_LINKS)
        return [_link(r) for r in rows], bool(rows and rows[0]["before"])

    async def queue_states(self) -> list[QueueState]:
        return await self.queue.queues()

    async def workers(self) -> list[WorkerInfo]:
        return await self.queue.workers()

    async def unserved_kinds(self) -> dict[str, list[str]]:
        return await self.queue.unserved_kinds()

    async def schedules(self) -> list[ScheduleInfo]:
        return await self.queue.schedules()

    async def per_minute(self) -> list[MinuteCounts]:
        return await self.queue.finished_per_minute()

    async def batches(self, limit: int, before: ULID | None) -> list[BatchStatus]:
        return await self.queue.recent_batches(limit, before=before)

    async def batch(self, batch_id: ULID) -> BatchStatus | None:
        return await self.queue.batch_status(batch_id)

    async def batch_callbacks(self, batch_id: ULID) -> list[BatchCallback]:
        """The batch's callbacks, in the order they are decided: catch, then, finally."""
        rows = await self._fetch("dashboard_batch_callbacks", id=batch_id.to_uuid())
        found = {
            r["batch_callback"]: BatchCallback(
                r["batch_callback"],
                ULID.from_bytes(r["id"].bytes),
                r["kind"],
                JobStatus(r["status"]),
            )
            for r in rows
        }
        return [found[name] for name in ("catch", "then", "finally") if name in found]


class DashboardStore:
    """The dashboard's view of one store (one table prefix)."""

    def __init__(
        self,
        store: PostgresStore,
        *,
        statement_timeout: float,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        self.store = store
        self._q = sql.queries(store.prefix)
        self._timeout_ms = str(max(1, round(statement_timeout * 1000)))
        self._codec = codec

    @asynccontextmanager
    async def _connection(self, *, readonly: bool) -> AsyncIterator[Any]:
        # The store's own pool (the store keeps it private; this is the one place that
        # reaches for it). A connection that broke mid-statement (a cancelled request) is
        # terminated rather than returned, as the store does for its own statements.
        pool: asyncpg.Pool = self.store._pool_or_raise()
        conn = await pool.acquire()
        reaped = False
        try:
            async with conn.transaction(
                readonly=readonly, isolation="repeatable_read" if readonly else None
            ):
                stmt = self._q["dashboard_session"]
                await conn.execute(stmt.text, *stmt.args({"timeout_ms": self._timeout_ms}))
                yield conn
        except BaseException as exc:
            reaped = discard_if_broken(pool, conn, exc)
            raise
        finally:
            if not reaped:
                await release(pool, conn)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Reader]:
        """One page's reads: a read-only snapshot, every statement bounded."""
        async with self._connection(readonly=True) as conn:
            queue = Queue(self.store.using(conn), codec=self._codec)
            yield Reader(conn, self._q, queue)

    async def pause(self, name: str, *, reason: str | None, until: datetime | None) -> QueueState:
        """Pause the named queue (`Queue.pause`: checked, stored, announced at commit)."""
        async with self._connection(readonly=False) as conn:
            queue = Queue(self.store.using(conn), codec=self._codec)
            return await queue.pause(name, reason=reason, until=until)

    async def cancel_batch(self, batch_id: ULID) -> int | None:
        """Cancel the batch (`Queue.cancel_batch`); how many jobs were skipped, or None if
        it had finished already (a page loaded before it did). LookupError if there is none."""
        async with self._connection(readonly=False) as conn:
            queue = Queue(self.store.using(conn), codec=self._codec)
            status = await queue.batch_status(batch_id)
            if status is not None and status.finished_at is not None:
                return None
            return await queue.cancel_batch(batch_id)

    async def resume(self, name: str) -> bool:
        """Resume the named queue; whether it was paused (`Queue.resume`)."""
        async with self._connection(readonly=False) as conn:
            return await Queue(self.store.using(conn), codec=self._codec).resume(name)

    async def retry(self, job_id: ULID, *, actor: str) -> bool:
        """`Queue.retry` with the actor in the journal's note; False when the job is no
        longer dead (another click got there first, or it is gone). A unique job whose id
        another job holds now stays dead: `JobStateError` says which job holds it."""
        async with self._connection(readonly=False) as conn:
            queue = Queue(self.store.using(conn), codec=self._codec)
            try:
                await queue.retry(job_id, note=retry_note(actor))
            except JobStateError as exc:
                if exc.status == JobStatus.DEAD.value:
                    raise
                return False
        return True

    async def forget(self, job_id: ULID) -> bool:
        """`Queue.forget`: delete the dead job and its journal; False when it is no longer
        dead (or gone)."""
        async with self._connection(readonly=False) as conn:
            try:
                await Queue(self.store.using(conn), codec=self._codec).forget(job_id)
            except JobStateError:
                return False
        return True

    async def retry_all(self, *, kind: str | None, actor: str, limit: int = BULK_LIMIT) -> int:
        """`Queue.retry_all` of `kind` (None: every kind), at most `limit` a click; returns
        how many. Its batches are short statements of their own on the store's pool (a
        transaction around them all would hold every lock to the end)."""
        return await Queue(self.store, codec=self._codec).retry_all(
            kind=kind, note=retry_note(actor), limit=limit
        )

    async def dead_count(self, kind: str | None) -> int:
        """Dead jobs (of `kind`, or all) from the kept counters."""
        async with self.reading() as reader:
            counts = await reader.counts()
        return sum(
            by_status.get(JobStatus.DEAD, 0)
            for k, by_status in counts.items()
            if kind is None or k == kind
        )


def retry_note(actor: str) -> str:
    """The note of a retry's journal entry: who clicked (a long name cut: the note's bound)."""
    name = actor if len(actor) <= 200 else actor[:199] + "…"
    return f"retried from the dashboard by {name}"
