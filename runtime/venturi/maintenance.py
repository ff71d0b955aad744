"""Maintenance: periodic work that runs once for the whole queue, in the elected leader.

    class PruneAudit:
        name = "prune-audit"
        interval = 300.0                            # seconds between runs

        async def run_once(self, store: PostgresStore) -> None:
            ...                                      # idempotent: see below

    worker = Worker(app, store, maintenance=[PruneAudit()],
                    retention=Retention(completed=timedelta(days=7)))

Every worker of a prefix takes part in one election (a lease row, see
`venturi._maintenance.leader`); only the leader runs the services, each every `interval`
seconds, the first run right after it is elected. A run is cancelled when leadership is
lost (at the latest when the lease could have ended unrenewed), so runs of two leaders do
not overlap; a service should still be idempotent (a run cut short is simply run again by
the next leader). A service that raises is logged and run again at its next interval; a
database outage is waited out like everywhere else in the worker.

Built in: the registry's sweep of workers gone silent (always), and the retention cleaner
(only with `retention=`: by default venturi keeps every finished job).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

from venturi.backoff import MAX_DELAY, Seconds, to_seconds
from venturi.postgres import PostgresStore

DEFAULT_RETENTION_INTERVAL = 60.0
"""Seconds between the retention cleaner's runs."""
DEFAULT_RETENTION_BATCH = 1000
"""Jobs deleted per statement (each its own short transaction)."""
_MAX_AGE = MAX_DELAY


@runtime_checkable
class MaintenanceService(Protocol):
    """Periodic work for the leader: a `name` (in logs), an `interval` (seconds between
    runs) and `run_once(store)`."""

    @property
    def name(self) -> str: ...

    @property
    def interval(self) -> float: ...

    async def run_once(self, store: PostgresStore) -> None: ...


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs are kept, per status (None: kept for good, the default).

    `Retention(completed=timedelta(days=7))` deletes completed jobs (and their journal)
    seven days after they finished and keeps dead ones; add `dead=timedelta(days=30)` to
    prune those too, `cancelled=` for batch members skipped by a cancellation, and
    `batches=timedelta(hours=24)` for the rows of finished batches (`Queue.batch`; their
    jobs follow the ages above). The leader deletes in bounded batches of `batch_size`
    (short locks, short WAL bursts), every `interval` seconds."""

    completed: Seconds | None = None
    dead: Seconds | None = None
    cancelled: Seconds | None = None
    batches: Seconds | None = None
    interval: Seconds = DEFAULT_RETENTION_INTERVAL
    batch_size: int = DEFAULT_RETENTION_BATCH

    def __post_init__(self) -> None:
        for name in ("completed", "dead", "cancelled", "batches"):
            value = getattr(self, name)
            if value is not None:
                to_seconds(value, name=f"Retention.{name}", low=1.0, high=_MAX_AGE)
        to_seconds(self.interval, name="Retention.interval", low=0.01)
        if (
            not isinstance(self.batch_size, int)
            or isinstance(self.batch_size, bool)
            or self.batch_size < 1
        ):
            raise ValueError(f"Retention.batch_size: expected an int >= 1, got {self.batch_size!r}")

    def ages(self) -> dict[str, timedelta]:
        """Status -> how long jobs of it are kept (only the statuses that are pruned)."""
        found = {}
        for name in ("completed", "dead", "cancelled"):
            value = getattr(self, name)
            if value is not None:
                found[name] = timedelta(seconds=to_seconds(value, name=name, high=_MAX_AGE))
        return found

    def batch_age(self) -> timedelta | None:
        """How long finished batches are kept (None: for good)."""
        if self.batches is None:
            return None
        return timedelta(seconds=to_seconds(self.batches, name="batches", high=_MAX_AGE))

    @property
    def prunes(self) -> bool:
        """Whether anything is pruned at all (else the cleaner does not run)."""
        return bool(self.ages()) or self.batches is not None
