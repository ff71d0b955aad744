"""The registry's statements (`queries/workers.sql`), run on a store's runner: what the
worker's heartbeat, the leader's sweep and the read API call, through
`PostgresStore.registry`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from venturi._db.leadership import MAINTENANCE
from venturi._db.run import Runner
from venturi._db.sql import Statement
from venturi.registry import SILENT_AFTER, UnknownKinds, WorkerInfo


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """What a worker writes about itself on every heartbeat."""

    id: str
    host: str
    pid: int
    pod: str | None
    queues: Sequence[str]
    kinds: Sequence[str]
    unknown_kinds: UnknownKinds
    concurrency: int
    heartbeat_s: float


class Registry:
    def __init__(self, run: Runner, queries: Mapping[str, Statement]) -> None:
        self._run = run
        self._q = queries

    async def heartbeat(self, me: WorkerRow, started_at: datetime | None) -> datetime:
        """Register `me`, or refresh its row; returns its `started_at` (pass it back)."""
        value: datetime = await self._run.fetchval(
            self._q["worker_upsert"],
            id=me.id,
            host=me.host,
            pid=me.pid,
            pod=me.pod,
            queues=list(me.queues),
            kinds=list(me.kinds),
            unknown_kinds=me.unknown_kinds,
            concurrency=me.concurrency,
            heartbeat_s=me.heartbeat_s,
            started_at=started_at,
        )
        return value

    async def remove(self, worker_id: str) -> None:
        await self._run.execute(self._q["worker_delete"], id=worker_id)

    async def workers(self) -> list[WorkerInfo]:
        rows = await self._run.fetch(
            self._q["worker_list"], silent_after=SILENT_AFTER, lease=MAINTENANCE
        )
        return [
            WorkerInfo(
                id=r["id"],
                host=r["host"],
                pid=r["pid"],
                pod=r["pod"],
                queues=tuple(r["queues"]),
                kinds=tuple(r["kinds"]),
                unknown_kinds=r["unknown_kinds"],
                concurrency=r["concurrency"],
                heartbeat=r["heartbeat_s"],
                started_at=r["started_at"],
                last_seen=r["last_seen"],
                live=r["live"],
                leader=r["leader"],
            )
            for r in rows
        ]

    async def sweep(self) -> list[str]:
        """Remove the rows of workers gone silent; returns their ids."""
        rows = await self._run.fetch(self._q["worker_sweep"], silent_after=SILENT_AFTER)
        return [r["id"] for r in rows]

    async def unserved_kinds(self) -> dict[str, list[str]]:
        """Queue -> pending KINDs that no live worker serving the queue registers."""
        found: dict[str, list[str]] = {}
        for r in await self._run.fetch(self._q["worker_unserved_kinds"], silent_after=SILENT_AFTER):
            found.setdefault(r["queue"], []).append(r["kind"])
        return found
