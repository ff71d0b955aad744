"""The completer: buffers settlements for a few milliseconds and writes them together.

One `UPDATE ... FROM unnest(...)` plus its journal rows per flush instead of one round
trip per job is the largest throughput lever a Postgres queue has. Each row is guarded
by its claim token, so a settlement for a job recovered elsewhere is dropped (and logged),
never written over another worker's claim.

Called by the worker's executor; calls `PostgresStore.settle`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from venturi._records import Settlement
from venturi.postgres import PostgresStore

logger = logging.getLogger(__name__)

FLUSH_DELAY = 0.002
"""Seconds each flush waits for more settlements to join it (none once shutting down)."""
MAX_BATCH = 1000
"""Most settlements written by one statement."""
MAX_BUFFERED = 2 * MAX_BATCH
"""Past this many waiting settlements, `settle()` waits (and with it the freed slot): claims
never run far ahead of what the database has recorded, and memory stays bounded."""
RETRY_DELAY_MAX = 5.0
"""Seconds; cap on the wait between attempts when the database is unreachable."""
CLOSING_ATTEMPTS = 5
"""Attempts per batch once shutting down, before leaving the jobs to lease recovery."""


class Completer:
    def __init__(
        self,
        store: PostgresStore,
        *,
        worker: str,
        on_settled: Callable[[Settlement, bool], None] | None = None,
        flush_delay: float = FLUSH_DELAY,
    ) -> None:
        self._store = store
        self._worker = worker
        self._on_settled = on_settled
        self._flush_delay = flush_delay
        self._buffer: list[Settlement] = []
        self._has_items = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False

    async def settle(self, settlement: Settlement) -> None:
        """Queue a settlement for the next flush."""
        while len(self._buffer) >= MAX_BUFFERED:
            self._room.clear()
            await self._room.wait()
        self._buffer.append(settlement)
        self._drained.clear()
        self._has_items.set()

    async def run(self) -> None:
        """Flush until `close()` has been called and the buffer is empty."""
        while True:
            await self._has_items.wait()
            while self._buffer:
                if not self._closing and len(self._buffer) < MAX_BATCH:
                    # Gather for a moment before every flush, not only the first of a burst:
                    # under load each statement then carries more jobs, and a statement's
                    # fixed cost (round trip, commit, triggers) is most of its cost.
                    await asyncio.sleep(self._flush_delay)
                batch = self._buffer[:MAX_BATCH]
                del self._buffer[:MAX_BATCH]
                self._room.set()
                await self._write(batch)
            self._has_items.clear()
            self._drained.set()
            if self._closing:
                return

    async def close(self) -> None:
        """Flush what is buffered and stop `run()`."""
        self._closing = True
        self._has_items.set()
        await self._drained.wait()

    async def _write(self, batch: list[Settlement]) -> None:
        delay = 0.05
        attempts_while_closing = 0
        while True:
            try:
                owned = await self._store.settle(batch, worker=self._worker)
                break
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The database is unreachable (or cancelled the statement): keep the outcomes
                # and retry. If the outage
                # outlasts the leases, other workers recover the jobs and the guarded
                # write then drops them: nothing is lost, nothing settled twice.
                if self._closing:
                    attempts_while_closing += 1
                    if attempts_while_closing > CLOSING_ATTEMPTS:
                        # Shutting down with no database: leave the jobs to lease recovery.
                        logger.error(
                            "shutdown: could not settle %d jobs (%s); their leases will "
                            "expire and another worker will recover them",
                            len(batch),
                            exc,
                        )
                        return
                logger.warning(
                    "settling %d jobs failed, retrying in %.2fs: %s", len(batch), delay, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_DELAY_MAX)
        for s in batch:
            kept = s.id in owned
            if not kept:
                logger.warning(
                    "job %s (%s): claim lost before settling (%s); another worker recovered it",
                    s.id,
                    s.kind,
                    s.outcome,
                    extra={"job_id": str(s.id), "kind": s.kind},
                )
            if self._on_settled is not None:
                self._on_settled(s, kept)
