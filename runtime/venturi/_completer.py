"""The completer: buffers settlements for a few milliseconds and writes them together.

One `UPDATE ... FROM unnest(...)` plus its journal rows per flush instead of one round
trip per job is the largest throughput lever a Postgres queue has. Each row is guarded
by its claim token, so a settlement for a job recovered elsewhere is dropped (and logged),
never written over another worker's claim.

Two kinds of failure are told apart. When the database is unreachable, the batch is kept
and retried until it is back (nothing is lost: if the outage outlasts the leases, other
workers recover the jobs and the guarded write then drops them). When the server refuses
the batch for what it carries, one bad settlement must not fail the others: the batch is
split until the offender stands alone, and that one is recorded as a failed execution with
the server's reason instead.

Called by the worker's executor; calls `PostgresStore.settle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

from venturi import logs
from venturi._db.failures import (
    describe,
    is_database_failure,
    is_encoding_refusal,
    is_refused_data,
)
from venturi._outage import Outage, next_delay
from venturi._records import Settlement
from venturi._storable import ascii_text
from venturi.postgres import DEFAULT_HOOK_LEASE_S, PostgresStore

logger = logging.getLogger(__name__)

FLUSH_DELAY = 0.002
"""Seconds each flush waits for more settlements to join it (none once shutting down)."""
MAX_BATCH = 1000
"""Most settlements written by one statement."""
MAX_BUFFERED = 2 * MAX_BATCH
"""Past this many waiting settlements, `settle()` waits (and with it the freed slot): claims
never run far ahead of what the database has recorded, and memory stays bounded."""
CLOSING_AT_LEAST = 5.0
"""Seconds the last settlements get at shutdown however long the handlers took to stop: the
database may be away for a moment, or a lock held."""


class _Refused(Exception):
    """The server refused a batch for its data (see `is_refused_data`)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.cause = cause


class Completer:
    def __init__(
        self,
        store: PostgresStore,
        *,
        worker: str,
        outage: Outage | None = None,
        on_settled: Callable[[Settlement, bool], None] | None = None,
        flush_delay: float = FLUSH_DELAY,
        hook_lease_s: float = DEFAULT_HOOK_LEASE_S,
    ) -> None:
        self._store = store
        self._hook_lease_s = hook_lease_s
        self._worker = worker
        self._outage = outage or Outage(worker)
        self._on_settled = on_settled
        self._flush_delay = flush_delay
        self._buffer: list[Settlement] = []
        self._writing: list[Settlement] = []
        self._has_items = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._give_up_at: float | None = None
        # The bound of the statement being sent (none until `close()`): `close()` sets it on a
        # statement already waiting, for a lock or a lost server, as on the ones after it.
        self._bound: asyncio.Timeout | None = None
        self._closed = False

    @property
    def store(self) -> PostgresStore:
        return self._store

    async def settle(self, settlement: Settlement) -> None:
        """Queue a settlement for the next flush (waits while the buffer is full)."""
        while len(self._buffer) >= MAX_BUFFERED and not self._closed:
            self._room.clear()
            await self._room.wait()
        self.settle_nowait(settlement)

    def settle_nowait(self, settlement: Settlement) -> None:
        """Queue a settlement for the next flush, past the buffer's bound."""
        if self._closed:
            # Only a handler abandoned at shutdown finishes this late; its job was released.
            logger.warning(
                "job %s (%s): finished after shutdown; not recorded",
                logs.ShownId(settlement.id),
                settlement.kind,
                extra=logs.job_fields(
                    settlement.id, settlement.kind, settlement.queue, settlement.run
                ),
            )
            return
        self._buffer.append(settlement)
        self._drained.clear()
        self._has_items.set()

    async def flushed(self) -> None:
        """Wait until every settlement given so far is written (or given up on)."""
        await self._drained.wait()

    def unwritten(self) -> Iterator[uuid.UUID]:
        """Ids of jobs whose settlement is waiting or being written: still claimed in the
        database, and still this worker's."""
        for s in self._buffer:
            yield s.id
        for s in self._writing:
            yield s.id

    async def run(self) -> None:
        """Flush until `close()` has been called and the buffer is empty."""
        try:
            while True:
                await self._has_items.wait()
                while self._buffer:
                    if not self._closing and len(self._buffer) < MAX_BATCH:
                        # Gather for a moment before every flush, not only the first of a
                        # burst: under load each statement then carries more jobs, and a
                        # statement's fixed cost (round trip, commit, triggers) is most of it.
                        await asyncio.sleep(self._flush_delay)
                    batch = self._buffer[:MAX_BATCH]
                    del self._buffer[:MAX_BATCH]
                    self._room.set()
                    self._writing = batch
                    try:
                        await self._write(batch)
                    finally:
                        self._writing = []
                self._has_items.clear()
                self._drained.set()
                if self._closing:
                    return
        finally:
            self._closed = True
            self._room.set()

    async def close(self, *, until: float | None = None) -> None:
        """Flush what is buffered and stop `run()`. What the database has not taken by
        `until` (the event loop's clock; at least `CLOSING_AT_LEAST` from now), through an
        outage or behind a lock, is given up on: those jobs are left to lease recovery."""
        loop = asyncio.get_running_loop()
        self._give_up_at = max(until or 0.0, loop.time() + CLOSING_AT_LEAST)
        self._closing = True
        if self._bound is not None:
            self._bound.reschedule(self._give_up_at)
        self._has_items.set()
        await self._drained.wait()

    @contextlib.asynccontextmanager
    async def _bounded(self) -> AsyncIterator[None]:
        """A statement's time: unbounded until `close()`, then until `_give_up_at` -- also
        for a statement sent before and still waiting then. Whether such a statement commits
        or not, its jobs are safe (written, or recovered at the end of their leases)."""
        async with asyncio.timeout_at(self._give_up_at if self._closing else None) as bound:
            self._bound = bound
            try:
                yield
            finally:
                self._bound = None

    async def _write(self, batch: list[Settlement]) -> None:
        """Write `batch`; when its data is refused, split it to write every good row."""
        try:
            owned = await self._settle(batch)
        except _Refused as refused:
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write(batch[:half])
                await self._write(batch[half:])
                return
            await self._write_instead(batch[0], refused)
            return
        if owned is None:
            return
        self._report(batch, owned)

    async def _write_instead(self, bad: Settlement, refused: _Refused) -> None:
        if is_encoding_refusal(refused.cause) and bad.note is not None and not bad.note.isascii():
            # A database of another encoding than UTF8 (LATIN1, say) cannot hold a character
            # of the note: the outcome stands, its note is written in ASCII escapes. (JSON data,
            # a result, carry or attachment, is stored exactly or refused, as below.)
            escaped = dataclasses.replace(bad, note=ascii_text(bad.note))
            try:
                owned = await self._settle([escaped])
            except _Refused as again:
                refused = again
            else:
                if owned is not None:
                    logger.warning(
                        "job %s (%s): the database's encoding cannot hold a character of its "
                        "note; written with backslash escapes",
                        logs.ShownId(bad.id),
                        bad.kind,
                        extra=logs.job_fields(bad.id, bad.kind, bad.queue, bad.run),
                    )
                    self._report([escaped], owned)
                return
        reason = str(refused)
        logger.error(
            "job %s (%s): the database refused its %s outcome (%s); recording a failed "
            "execution instead",
            logs.ShownId(bad.id),
            bad.kind,
            bad.outcome,
            reason,
            extra=logs.job_fields(bad.id, bad.kind, bad.queue, bad.run),
        )
        if bad.unrecordable is None:
            return  # nothing safer to write: the lease will bring the job back
        replacement = bad.unrecordable(reason)
        try:
            owned = await self._settle([replacement])
        except _Refused as again:
            logger.error(
                "job %s (%s): its failure could not be recorded either (%s); the lease "
                "will bring it back",
                logs.ShownId(bad.id),
                bad.kind,
                again,
                extra=logs.job_fields(bad.id, bad.kind, bad.queue, bad.run),
            )
            return
        if owned is not None:
            self._report([replacement], owned)

    async def _settle(self, batch: list[Settlement]) -> set[uuid.UUID] | None:
        """The ids still owned, after retrying through outages; None if shutting down
        without a database. Raises `_Refused` for data the server will never take."""
        delay = 0.0
        loop = asyncio.get_running_loop()
        unsure = False  # an attempt failed after sending: it may have committed
        while True:
            epoch = self._outage.epoch
            try:
                async with self._bounded():
                    owned = await self._store.settle(
                        batch, worker=self._worker, hook_lease_s=self._hook_lease_s
                    )
            except Exception as exc:
                if is_refused_data(exc):
                    raise _Refused(exc) from exc
                if not is_database_failure(exc):
                    raise  # a bug in venturi: end the worker loudly
                self._outage.failed(f"settling {len(batch)} jobs", exc)
                unsure = True
                delay = next_delay(delay)
                give_up_at = self._give_up_at if self._closing else None
                if give_up_at is not None and loop.time() + delay / 2 >= give_up_at:
                    logger.error(
                        "shutdown: could not settle %d jobs (%s) by the end of the shutdown "
                        "timeout; their leases will expire and another worker will recover "
                        "them",
                        len(batch),
                        describe(exc),
                    )
                    return None
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            if unsure and len(owned) < len(batch):
                owned |= await self._written_earlier([s for s in batch if s.id not in owned])
            return owned

    async def _written_earlier(self, batch: list[Settlement]) -> set[uuid.UUID]:
        """The settlements of `batch` an earlier, failed attempt wrote after all (its reply
        was lost): theirs, not lost to another worker. Asked once; an answer the database
        cannot give leaves them reported lost (the outcome is in the journal either way)."""
        try:
            async with self._bounded():
                return await self._store.written_by(batch, worker=self._worker)
        except Exception as exc:
            if not is_database_failure(exc):
                raise
            return set()

    def _report(self, batch: list[Settlement], owned: set[uuid.UUID]) -> None:
        for s in batch:
            kept = s.id in owned
            if not kept:
                logger.warning(
                    "job %s (%s): claim lost before settling (%s); another worker recovered it",
                    logs.ShownId(s.id),
                    s.kind,
                    s.outcome,
                    extra=logs.job_fields(s.id, s.kind, s.queue, s.run),
                )
            if self._on_settled is not None:
                self._on_settled(s, kept)
