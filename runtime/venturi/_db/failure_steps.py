"""The failure steps (`queries/failure_hooks.sql`), run on a store's runner: a job that failed
for good keeps a lease of its own (`hook_token`, `hook_lease_until`) until its `failed` hook
has run once, so that the step survives its worker (another takes it once the lease ends).
What the worker's undertaker calls, through `PostgresStore.failure_steps`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import asyncpg

from venturi._db.rows import history
from venturi._db.run import Runner
from venturi._db.sql import Statement
from venturi._records import DueHook


class FailureSteps:
    def __init__(self, run: Runner, queries: Mapping[str, Statement]) -> None:
        self._run = run
        self._q = queries

    async def take(
        self, ids: Sequence[uuid.UUID], tokens: Sequence[uuid.UUID], *, lease_s: float
    ) -> list[DueHook]:
        """Extend the leases of failure steps this worker holds and read them; a step
        missing from the result is no longer this worker's to run."""
        rows = await self._run.fetch(
            self._q["hook_take"], ids=list(ids), tokens=list(tokens), lease_s=lease_s
        )
        return [_due_hook(r) for r in rows]

    async def take_expired(
        self, *, queues: Sequence[str], kinds: Sequence[str], lease_s: float, limit: int = 100
    ) -> list[DueHook]:
        """Take failure steps whose lease ended (their worker died first), under new tokens."""
        rows = await self._run.fetch(
            self._q["hook_take_expired"],
            queues=list(queues),
            kinds=list(kinds),
            lease_s=lease_s,
            limit=limit,
        )
        return [_due_hook(r) for r in rows]

    async def finish(self, ids: Sequence[uuid.UUID], tokens: Sequence[uuid.UUID]) -> None:
        """Mark failure steps done (guarded by their tokens)."""
        await self._run.execute(self._q["hook_finish"], ids=list(ids), tokens=list(tokens))

    async def release(self, ids: Sequence[uuid.UUID], tokens: Sequence[uuid.UUID]) -> None:
        """End this worker's leases of failure steps it will not run (guarded by tokens)."""
        await self._run.execute(self._q["hook_release"], ids=list(ids), tokens=list(tokens))

    async def next_expiry(self, queues: Sequence[str], kinds: Sequence[str]) -> float | None:
        """Seconds until the earliest failure step's lease of `queues` and `kinds` ends
        (negative: already; None: none is pending)."""
        value: float | None = await self._run.fetchval(
            self._q["hook_next_expiry"], queues=list(queues), kinds=list(kinds)
        )
        return value


def _due_hook(r: asyncpg.Record) -> DueHook:
    return DueHook(
        id=r["id"],
        token=r["hook_token"],
        kind=r["kind"],
        queue=r["queue"],
        payload=r["payload"],
        carry=r["carry"],
        run_count=r["run_count"],
        failures=r["failures"],
        last_error=r["last_error"],
        failed_at=r["finished_at"],
        history=history(r["history"]),
        batch_id=r["batch_id"],
    )
