"""The data model as callers see it: job status, journal entries, stored jobs, stats.

These are plain frozen records built from database rows; they carry no behaviour.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ulid import ULID

from venturi._shown import shown


class JobStatus(enum.StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"
    """Waiting to be claimed (now, or from its run_at on)."""
    CLAIMED = "claimed"
    """Held by a worker under a lease."""
    COMPLETED = "completed"
    """Done (terminal)."""
    DEAD = "dead"
    """Failed for good (terminal): a permanent error, the backstop, or a bad payload."""
    WAITING = "waiting"
    """A chain's link, waiting for the link before it to complete (`Queue.chain`), or a
    batch's callback, waiting for the batch to decide it (`Queue.batch`)."""
    CANCELLED = "cancelled"
    """Skipped (terminal): a batch member that had not started when its batch was cancelled
    (`Queue.cancel_batch`, or its first failure without `allow_failures`), or a batch's
    callback whose condition did not hold."""


class JournalOutcome(enum.StrEnum):
    """What one journal entry records."""

    COMPLETED = "completed"
    PAUSED = "paused"
    FAILED = "failed"
    """A failed execution that will be retried."""
    DEAD = "dead"
    """A failed execution that ended the job."""
    RELEASED = "released"
    """Aborted at shutdown and handed back, eligible at once; not a failure."""
    STALE_RECOVERED = "stale_recovered"
    """The lease expired (the worker died or hung); counted as a failed execution."""
    MERGED = "merged"
    RETRIED = "retried"
    """A failed (dead) job put back in its queue by hand (`Queue.retry`, `retry_all`)."""
    CANCELLED = "cancelled"
    """A batch member skipped before it ran: its batch was cancelled."""


_FAILURES = frozenset({JournalOutcome.FAILED, JournalOutcome.DEAD, JournalOutcome.STALE_RECOVERED})


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One row of a job's append-only journal."""

    run: int
    """The run this entry belongs to (1 for the first claim)."""
    outcome: JournalOutcome
    at: datetime
    note: str | None = None
    attachment: Any = None
    """The JSON value the handler attached with `ctx.attach`, if any."""
    duration: float | None = None
    """Seconds the handler ran, for executions."""
    worker: str | None = None
    """Identity of the worker that wrote the entry (host:pid, and pod when in Kubernetes)."""

    @property
    def is_failure(self) -> bool:
        """True for failed executions (retried, dead, or recovered after a lost lease)."""
        return self.outcome in _FAILURES


@dataclass(frozen=True, slots=True)
class Job:
    """A stored job, as `Queue.job()` returns it."""

    id: ULID
    kind: str
    queue: str
    status: JobStatus
    priority: int
    run_at: datetime
    created_at: datetime
    finished_at: datetime | None
    payload: Any
    """The decoded JSON payload (a dict of the task's fields)."""
    carry: Any
    run_count: int
    failures: int
    claimed_at: datetime | None
    lease_until: datetime | None
    claimed_by: str | None
    claimed_pod: str | None
    last_error: str | None
    """The note of the job's latest failed run, kept when a later run succeeds (a completed
    job that failed before shows why it did; its journal has every run's note)."""
    result: Any = None
    """The JSON value a completed run returned (`Outcome.completed(result=...)`), decoded."""
    progress: Any = None
    """The latest `ctx.progress` value the database received (see `Context.progress`)."""
    batch_id: ULID | None = None
    """The batch the job is a member or a callback of (`Queue.batch`), else None."""


@dataclass(frozen=True, slots=True)
class FailedJob:
    """A job that failed for good (status dead), as `Queue.failed()` lists it."""

    id: ULID
    queue: str
    kind: str
    payload: Any
    """The decoded JSON payload, as it was enqueued."""
    error: str | None
    """Why it failed: the last failed execution's note."""
    failed_at: datetime
    run_count: int
    failures: int


@dataclass(frozen=True, slots=True)
class _KindCounts:
    """Live counts by kind, and their totals (what `Stats` and `QueueStats` share)."""

    pending_by_kind: Mapping[str, int] = field(default_factory=dict)
    scheduled_by_kind: Mapping[str, int] = field(default_factory=dict)
    claimed_by_kind: Mapping[str, int] = field(default_factory=dict)
    dead_by_kind: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_age_by_kind: Mapping[str, float] = field(default_factory=dict)
    completed_by_kind: Mapping[str, int] = field(default_factory=dict)
    done_last_hour_by_kind: Mapping[str, int] = field(default_factory=dict)
    """Jobs completed in the minutes that began in the last hour (cleanup does not lower it)."""
    failed_last_hour_by_kind: Mapping[str, int] = field(default_factory=dict)
    """Jobs that failed for good (became dead) in the minutes that began in the last hour."""

    @property
    def pending(self) -> int:
        return sum(self.pending_by_kind.values())

    @property
    def scheduled(self) -> int:
        return sum(self.scheduled_by_kind.values())

    @property
    def claimed(self) -> int:
        return sum(self.claimed_by_kind.values())

    @property
    def dead(self) -> int:
        return sum(self.dead_by_kind.values())

    @property
    def completed(self) -> int:
        return sum(self.completed_by_kind.values())

    @property
    def done_last_hour(self) -> int:
        return sum(self.done_last_hour_by_kind.values())

    @property
    def failed_last_hour(self) -> int:
        return sum(self.failed_last_hour_by_kind.values())

    @property
    def oldest_pending_age(self) -> float | None:
        """Seconds the oldest eligible job has waited, over all kinds (None when none)."""
        return max(self.oldest_pending_age_by_kind.values(), default=None)


@dataclass(frozen=True, slots=True)
class QueueStats(_KindCounts):
    """One queue's live state, by kind: `Stats.queues[name]`. The fields mean what the same
    fields of `Stats` mean, for this queue's jobs only."""

    paused: bool = False
    """Whether the queue is paused now (its pending jobs wait until it resumes)."""


@dataclass(frozen=True, slots=True)
class Stats(_KindCounts):
    """A snapshot of live queue state, from one grouped query over partial indexes.

    Ages are seconds, measured by the database clock. "Pending" counts jobs eligible now;
    jobs waiting for a future run_at are counted in `scheduled_by_kind`. `completed_by_kind`
    and `dead_by_kind` are totals of the jobs kept (cleanup lowers them): two snapshots'
    difference is the jobs that finished in between, unless a cleanup ran meanwhile.

    The `*_by_kind` fields are totals over all queues (an age: the oldest over all queues);
    `queues` holds the same figures per queue (`stats.queues["high"].pending_by_kind`), for
    every queue that holds a job or finished one in the last hour.
    """

    queues: Mapping[str, QueueStats] = field(default_factory=dict)
    paused_queues: frozenset[str] = frozenset()
    """Named queues paused now (with jobs or not): their jobs are counted as pending above,
    and wait."""

    @property
    def paused_by_kind(self) -> Mapping[str, int]:
        """Pending jobs (eligible or scheduled) of the paused queues, by kind: the part of
        the pending and scheduled counts that waits for a resume."""
        paused: dict[str, int] = {}
        for name in self.paused_queues:
            q = self.queues.get(name)
            if q is None:
                continue
            for counts in (q.pending_by_kind, q.scheduled_by_kind):
                for kind, n in counts.items():
                    paused[kind] = paused.get(kind, 0) + n
        return paused

    @property
    def paused(self) -> int:
        """Pending jobs of the paused queues (see `paused_by_kind`)."""
        return sum(self.paused_by_kind.values())


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """Jobs of one queue and kind that finished in one minute (`Queue.finished_per_minute`)."""

    minute: datetime
    """The minute's start (database clock)."""
    queue: str
    kind: str
    done: int
    """Jobs completed."""
    failed: int
    """Jobs that failed for good (became dead)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """Which jobs `Queue.jobs` lists; every criterion is optional. Newest first."""

    status: JobStatus | None = None
    kind: str | None = None
    queue: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    before_id: ULID | None = None
    """Keyset pagination: pass the last id of the previous page."""
    limit: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status(self.status, "JobFilter.status"))


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupCriteria:
    """Which finished jobs `Queue.cleanup` deletes (with their journal)."""

    finished_before: datetime
    kind: str | None = None
    status: JobStatus | None = None
    """COMPLETED or DEAD; None deletes both. Pending and claimed jobs are never deleted."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status(self.status, "CleanupCriteria.status"))


def _status(value: object, what: str) -> JobStatus | None:
    """A status given as a JobStatus or its value ("dead"); anything else is refused."""
    if value is None or isinstance(value, JobStatus):
        return value
    if isinstance(value, str):
        try:
            return JobStatus(value)
        except ValueError:
            pass
    names = ", ".join(s.value for s in JobStatus)
    raise ValueError(f"{what}: expected a JobStatus or one of {names}, got {shown(value)}")


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A batch's progress (`Queue.batch_status`, `recent_batches`), read from its row: the
    counters move in the transaction that settles each member."""

    id: ULID
    name: str
    created_at: datetime
    allow_failures: bool
    total: int
    """Members (callbacks not included)."""
    pending: int
    """Members not finished yet: waiting, due, running or waiting for a retry."""
    done: int
    """Members completed."""
    failed: int
    """Members that failed for good (dead)."""
    cancelled: int
    """Members skipped because the batch was cancelled before they ran."""
    failed_at: datetime | None
    """When the first member failed for good (the `catch` callback was released then)."""
    cancelled_at: datetime | None
    """When the batch was cancelled (`Queue.cancel_batch`, or its first failure without
    `allow_failures`)."""
    finished_at: datetime | None
    """When its last member finished (`then` and `finally` were decided then)."""

    @property
    def percent(self) -> int:
        """Finished members (done, failed or cancelled) as a whole percentage of all of
        them; 100 for a batch without members."""
        if self.total == 0:
            return 100
        return (self.total - self.pending) * 100 // self.total

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def state(self) -> str:
        """In a word, from the members as they stand: running (members not finished),
        cancelling (cancelled, members still running), succeeded (every member completed),
        failed (finished with a member failed for good: a batch without allow_failures stops
        at the first, which cancels the members not started) or cancelled (members skipped,
        or `cancel_batch` called). A failed member retried (`queue.retry`) counts as not
        finished again: the batch reads running until it ends, then what it ended as."""
        # Stopped: members skipped, or cancelled by hand. A first failure that found nothing
        # left to skip stopped nothing: its member, retried and completed, leaves a success.
        stopped = self.cancelled > 0 or (self.cancelled_at is not None and self.failed_at is None)
        if self.pending:
            return "cancelling" if stopped else "running"
        if self.failed:
            return "failed"
        return "cancelled" if stopped else "succeeded"
