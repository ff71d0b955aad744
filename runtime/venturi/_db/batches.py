"""The batches' statements (`queries/batches.sql`), run on a store's runner: what
`Queue.batch_status`, `recent_batches`, `cancel_batch` and `prune_batches` call (and a
worker skipping the members it holds of a cancelled batch), through
`PostgresStore.batches`. Inserting a batch is `PostgresStore.insert_batch` (it needs the
store's insert); counting and the callbacks are the member trigger's (migration 0013)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime

import asyncpg
from ulid import ULID

from venturi._db.run import Runner
from venturi._db.sql import Statement
from venturi.jobs import BatchStatus


class Batches:
    def __init__(self, run: Runner, queries: Mapping[str, Statement]) -> None:
        self._run = run
        self._q = queries

    async def get(self, batch_id: uuid.UUID) -> BatchStatus | None:
        row = await self._run.fetchrow(self._q["batch_get"], id=batch_id)
        return None if row is None else _status(row)

    async def recent(self, limit: int, before: uuid.UUID | None) -> list[BatchStatus]:
        rows = await self._run.fetch(self._q["batch_recent"], limit=limit, before_id=before)
        return [_status(r) for r in rows]

    async def cancel(self, batch_id: uuid.UUID) -> int | None:
        """Cancel the batch: its members not started yet are skipped; returns how many (0 for
        a finished batch), None if there is no such batch. One transaction: the members are
        skipped with the mark, or neither happens."""
        async with self._run.transaction() as tx:
            row = await tx.fetchrow(self._q["batch_mark_cancelled"], id=batch_id)
            if row is None:
                return None
            if not row["open"]:
                return 0
            skipped: int = await tx.fetchval(self._q["batch_cancel_members"], id=batch_id)
            return skipped

    async def skip_held(
        self,
        ids: Sequence[uuid.UUID],
        tokens: Sequence[uuid.UUID],
        batch_ids: Sequence[uuid.UUID],
    ) -> set[uuid.UUID]:
        """Cancel the held, unstarted members `ids` (claimed with `tokens`, of the batches
        `batch_ids`) whose batch was cancelled after their claim; returns the ids cancelled
        (the others stay claimed: start them)."""
        async with self.in_batch_order(batch_ids) as run:
            rows = await run.fetch(self._q["batch_skip_held"], ids=ids, tokens=tokens)
        return {r["id"] for r in rows}

    @asynccontextmanager
    async def in_batch_order(self, batch_ids: Sequence[uuid.UUID]) -> AsyncIterator[Runner]:
        """Where to run a statement that moves members of the batches `batch_ids`: the
        member trigger updates each batch's row in whatever order the plan writes the jobs,
        so a statement spanning two batches or more first locks their rows, in id order, in
        the same transaction; two such statements over the same batches never deadlock (one
        batch alone needs no lock: its row is taken after every other lock of the statement
        but the counts')."""
        batches = sorted(set(batch_ids))
        if len(batches) < 2:
            yield self._run
            return
        async with self._run.transaction() as tx:
            await tx.execute(self._q["batch_lock"], ids=batches)
            yield tx

    async def prune(self, finished_before: datetime, batch_size: int) -> int:
        """Delete the batches finished before `finished_before`, `batch_size` per statement
        (each its own short transaction); returns how many."""
        deleted = 0
        while True:
            n: int = await self._run.fetchval(
                self._q["batch_prune"], finished_before=finished_before, limit=batch_size
            )
            deleted += n
            if n < batch_size:
                return deleted


def _status(r: asyncpg.Record) -> BatchStatus:
    return BatchStatus(
        id=ULID.from_bytes(r["id"].bytes),
        name=r["name"],
        created_at=r["created_at"],
        allow_failures=r["allow_failures"],
        total=r["total"],
        pending=r["pending"],
        done=r["done"],
        failed=r["failed"],
        cancelled=r["cancelled"],
        failed_at=r["failed_at"],
        cancelled_at=r["cancelled_at"],
        finished_at=r["finished_at"],
    )
