"""The registry's sweep: removes the rows of workers gone silent (no heartbeat for
`registry.SILENT_AFTER` heartbeats: killed, or cut off from the database; one that comes
back registers again with its next heartbeat). A maintenance service: the leader runs it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

SWEEP_EVERY = 3.0
"""Seconds between sweeps (a heartbeat's interval)."""


@dataclass(frozen=True, slots=True)
class WorkerSweep:
    name: str = "worker-sweep"
    interval: float = SWEEP_EVERY

    async def run_once(self, store: PostgresStore) -> None:
        for worker_id in await store.registry.sweep():
            logger.info("worker %s went silent: removed from the registry", worker_id)
