"""The retention cleaner: deletes finished jobs (and their journal) older than the
`Retention` says, per status, in bounded batches (`PostgresStore.cleanup`, each batch its own
short transaction). Only what `Retention` names is deleted; by default nothing is, and dead
jobs stay unless `dead=` is given; finished batches' rows with `batches=`. A maintenance
service: the leader runs it."""

from __future__ import annotations

import logging
from datetime import timedelta

from venturi.backoff import to_seconds
from venturi.jobs import CleanupCriteria, JobStatus
from venturi.maintenance import Retention
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")


class RetentionCleaner:
    name = "retention"

    def __init__(self, retention: Retention) -> None:
        self._ages = retention.ages()
        self._batch_age = retention.batch_age()
        self._batch = retention.batch_size
        self.interval = to_seconds(retention.interval, name="Retention.interval", low=0.01)

    async def run_once(self, store: PostgresStore) -> None:
        now = await store.database_now()  # not this host's clock, which may be off
        for status, age in self._ages.items():
            deleted = await store.cleanup(
                CleanupCriteria(finished_before=now - age, status=JobStatus(status)),
                batch_size=self._batch,
            )
            if deleted:
                logger.info(
                    "retention: deleted %d %s jobs finished more than %s ago",
                    deleted,
                    status,
                    _span(age),
                )
        if self._batch_age is not None:
            pruned = await store.batches.prune(now - self._batch_age, self._batch)
            if pruned:
                logger.info(
                    "retention: deleted %d batches finished more than %s ago",
                    pruned,
                    _span(self._batch_age),
                )


def _span(age: timedelta) -> str:
    """A retention age as it is configured ('7 days', '5 minutes', '90 seconds'), not as a
    timedelta prints ('0:05:00' reads as a time of day)."""
    seconds = age.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} second{'s' if seconds != 1 else ''}"
