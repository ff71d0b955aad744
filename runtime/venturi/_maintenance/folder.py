"""The counters' fold: every few seconds the leader adds the sharded counter rows (the live
counts by queue, kind and status, and the per-minute counts of finished jobs) into one row
per group, so that `stats()`, the dashboard and the operator read one row per group instead
of one per backend that wrote it; then it sums the last hour's ended minutes per queue and
kind, so that stats() reads those sums instead of the hour's rows (`PostgresStore.fold_counts`,
queries/counts.sql, migration 0016). A maintenance service: the leader runs it, always (it
changes no figure anyone reads, only how many rows hold it)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

FOLD_EVERY = 10.0
"""Seconds between folds."""

REFOLD = timedelta(minutes=3)
"""How far back each fold looks again at minutes an earlier fold covered: a settle that
began in a minute may still write to it a little after the minute ended, and the worker's
clock may be off the database's. A row left out is only a row more to read, never a count
wrong."""


class CountFold:
    name = "count-fold"

    def __init__(self, interval: float = FOLD_EVERY) -> None:
        self.interval = interval
        # The first fold covers every minute kept; later ones the last few only.
        self._since: datetime | None = None

    async def run_once(self, store: PostgresStore) -> None:
        started = await store.database_now()  # the minutes' clock, not this host's
        folded = await store.fold_counts(self._since)
        self._since = started - REFOLD
        if folded:
            logger.debug("count-fold: folded %d counter rows", folded)
