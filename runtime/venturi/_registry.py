"""The worker's side of the registry: its row, written when it starts, refreshed every
`HEARTBEAT` seconds, removed when it exits cleanly.

The heartbeat rides out database outages like every other loop of the worker (retry with
capped backoff through the shared `Outage`); a worker cut off for longer than
`registry.SILENT_AFTER` heartbeats counts as gone and may be swept by the leader, and its
next heartbeat writes the row again (with its first `started_at`).

Started by the worker; calls `PostgresStore.registry`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from venturi._db.failures import describe, is_database_failure
from venturi._db.registry import WorkerRow
from venturi._outage import Outage, next_delay
from venturi._timeouts import wait_for
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

HEARTBEAT = 3.0
"""Seconds between a worker's heartbeats."""
REMOVE_TIMEOUT = 2.0
"""Seconds a clean exit waits to remove the worker's row (the sweep removes it otherwise)."""


class Heartbeat:
    def __init__(
        self, store: PostgresStore, me: WorkerRow, *, outage: Outage, interval: float = HEARTBEAT
    ) -> None:
        self._store = store
        self._me = me
        self._outage = outage
        self._interval = interval
        self._started_at: datetime | None = None
        self.registered = asyncio.Event()
        """Set once the row is written (the worker reports ready after it)."""

    async def run(self) -> None:
        delay = 0.0
        while True:
            epoch = self._outage.epoch
            try:
                self._started_at = await self._store.registry.heartbeat(self._me, self._started_at)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("heartbeat", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            self.registered.set()
            delay = 0.0
            await asyncio.sleep(self._interval)

    async def remove(self) -> None:
        """Remove the row (a clean exit); on failure leave it to the leader's sweep."""
        try:
            await wait_for(self._store.registry.remove(self._me.id), REMOVE_TIMEOUT)
        except Exception as exc:
            if not is_database_failure(exc) and not isinstance(exc, TimeoutError):
                raise
            logger.warning(
                "worker %s: could not remove its registry row (%s); the leader's sweep will",
                self._me.id,
                describe(exc),
            )
