"""Plain records the store speaks: bytes and ids, no task types.

The typed world (dataclasses, Context) lives above the store; these are what crosses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ulid import ULID

from venturi.jobs import JobStatus, JournalEntry


@dataclass(slots=True)  # not frozen: built once per enqueued job, frozen init costs
class NewJob:
    """A job to insert. Exactly one of run_at / delay_s may be set (else: now)."""

    id: ULID
    kind: str
    queue: str
    priority: int
    payload: str
    run_at: datetime | None = None
    delay_s: float | None = None
    lease_s: float | None = None
    backoff_base_s: float | None = None
    backoff_cap_s: float | None = None
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker now holds, as the claim returned it."""

    id: uuid.UUID
    kind: str
    queue: str
    payload: str
    carry: str | None
    run_count: int
    failures: int
    claim_token: uuid.UUID
    lease_s: float
    backoff_base_s: float | None
    backoff_cap_s: float | None
    waited_s: float
    history: tuple[JournalEntry, ...]


@dataclass(frozen=True, slots=True)
class Settlement:
    """One run's result, to be written (guarded by the claim token) with its journal row."""

    id: uuid.UUID
    claim_token: uuid.UUID
    kind: str
    queue: str
    run: int
    outcome: str
    """A JournalOutcome value (completed, paused, failed, dead or released), or "returned"
    for a prefetched job handed back unrun."""
    delay_s: float = 0.0
    carry: str | None = None
    set_carry: bool = False
    note: str | None = None
    attachment: str | None = None
    duration_s: float | None = None
    unrecordable: Callable[[str], Settlement] | None = None
    """What to write instead if the database refuses this settlement's data: a failed
    execution with the given reason (built by the executor, which knows the job's policy)."""

    @classmethod
    def of(cls, job: ClaimedJob, outcome: str, **fields: Any) -> Settlement:
        """The settlement of `job`'s current claim."""
        return cls(job.id, job.claim_token, job.kind, job.queue, job.run_count, outcome, **fields)

    @property
    def ulid(self) -> ULID:
        return ULID.from_bytes(self.id.bytes)


@dataclass(frozen=True, slots=True)
class StaleJob:
    """A claimed job whose lease expired, locked for recovery."""

    id: uuid.UUID
    kind: str
    run_count: int
    failures: int
    backoff_base_s: float | None
    backoff_cap_s: float | None
    claimed_by: str | None


@dataclass(frozen=True, slots=True)
class Recovery:
    """The decision for one stale job: re-pend after delay_s, or dead."""

    id: uuid.UUID
    dead: bool
    delay_s: float
    note: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """What became of one recovered job: pending again (after backoff), or dead."""

    id: ULID
    kind: str
    queue: str
    run: int
    status: JobStatus
    note: str | None


@dataclass(frozen=True, slots=True)
class ExistingJob:
    """A pending job an enqueue collided with (same kind and dedup key), locked."""

    id: uuid.UUID
    payload: str
    carry: str | None
    run_count: int
    journal: tuple[JournalEntry, ...]


@dataclass(frozen=True, slots=True)
class MergePlan:
    """How to apply a merge: a new payload (None keeps it), maybe a carry, maybe a tier."""

    action: str
    payload: str | None = None
    set_carry: bool = False
    carry: str | None = None
    priority: int | None = None
