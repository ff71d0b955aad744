"""Plain records the store speaks: bytes and ids, no task types.

The typed world (dataclasses, Context) lives above the store; these are what crosses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar

from ulid import ULID

from venturi.jobs import JobStatus, JournalEntry


@dataclass(slots=True)  # not frozen: built once per enqueued job, frozen init costs
class NewJob:
    """One job to insert (`NewJobs.of` makes a batch of them). Exactly one of run_at /
    delay_s may be set (else: now)."""

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
    unique_key: str | None = None
    """The task's unique id (jobs of one KIND holding it exclude each other)."""
    unique_for_s: float | None = None
    trace_context: str | None = None
    """The W3C traceparent of the enqueue's span (a tracing producer), else None."""
    max_attempts: int | None = None
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class NewBatch:
    """A batch's own row, inserted with its jobs (`PostgresStore.insert_batch`)."""

    id: uuid.UUID
    name: str
    allow_failures: bool


@dataclass(slots=True)
class NewJobs:
    """Jobs to insert into one named queue, by column: entry i of every column is job i.

    The one shape every insert takes (a single enqueue is a batch of one). An optional column
    left None is NULL for every job, which is what most batches are (no per-job policy), and
    costs nothing to send.
    """

    queue: str
    ids: Sequence[uuid.UUID | ULID]
    kinds: Sequence[str]
    priorities: Sequence[int]
    payloads: Sequence[str]
    run_at: Sequence[datetime | None] | None = None
    delay_s: Sequence[float | None] | None = None
    lease_s: Sequence[float | None] | None = None
    backoff_base_s: Sequence[float | None] | None = None
    backoff_cap_s: Sequence[float | None] | None = None
    dedup_keys: Sequence[str | None] | None = None
    trace_contexts: Sequence[str | None] | None = None
    queues: Sequence[str] | None = None
    """Each job's named queue, when a batch spans several; None: every job is in `queue`."""
    max_attempts: Sequence[int | None] | None = None
    timeout_s: Sequence[float | None] | None = None
    batch_id: uuid.UUID | None = None
    """The `Queue.batch` every job of these belongs to (None: no batch)."""

    def __post_init__(self) -> None:
        # A short column would be padded with NULLs by unnest(): refuse it here instead.
        n = len(self.ids)
        for column in (
            self.kinds,
            self.priorities,
            self.payloads,
            self.run_at,
            self.delay_s,
            self.lease_s,
            self.backoff_base_s,
            self.backoff_cap_s,
            self.dedup_keys,
            self.trace_contexts,
            self.queues,
            self.max_attempts,
            self.timeout_s,
        ):
            if column is not None and len(column) != n:
                raise ValueError(f"NewJobs: every column must hold {n} values, one per job")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, jobs: Sequence[NewJob]) -> NewJobs:
        """The batch of `jobs` (of one named queue, or several: then by job)."""
        if len(jobs) == 1:  # a single enqueue, the most frequent: no column scans
            j = jobs[0]
            return cls(
                queue=j.queue,
                ids=[j.id],
                kinds=[j.kind],
                priorities=[j.priority],
                payloads=[j.payload],
                run_at=None if j.run_at is None else [j.run_at],
                delay_s=None if j.delay_s is None else [j.delay_s],
                lease_s=None if j.lease_s is None else [j.lease_s],
                backoff_base_s=None if j.backoff_base_s is None else [j.backoff_base_s],
                backoff_cap_s=None if j.backoff_cap_s is None else [j.backoff_cap_s],
                dedup_keys=None if j.dedup_key is None else [j.dedup_key],
                trace_contexts=None if j.trace_context is None else [j.trace_context],
                max_attempts=None if j.max_attempts is None else [j.max_attempts],
                timeout_s=None if j.timeout_s is None else [j.timeout_s],
            )
        queue = jobs[0].queue if jobs else ""
        mixed = any(j.queue != queue for j in jobs)
        return cls(
            queue=queue,
            ids=[j.id for j in jobs],
            kinds=[j.kind for j in jobs],
            priorities=[j.priority for j in jobs],
            payloads=[j.payload for j in jobs],
            run_at=_optional([j.run_at for j in jobs]),
            delay_s=_optional([j.delay_s for j in jobs]),
            lease_s=_optional([j.lease_s for j in jobs]),
            backoff_base_s=_optional([j.backoff_base_s for j in jobs]),
            backoff_cap_s=_optional([j.backoff_cap_s for j in jobs]),
            dedup_keys=_optional([j.dedup_key for j in jobs]),
            trace_contexts=_optional([j.trace_context for j in jobs]),
            queues=[j.queue for j in jobs] if mixed else None,
            max_attempts=_optional([j.max_attempts for j in jobs]),
            timeout_s=_optional([j.timeout_s for j in jobs]),
        )


_T = TypeVar("_T")


def _optional(values: list[_T | None]) -> list[_T | None] | None:
    """None for a column with no value at all (see `NewJobs`)."""
    return None if all(v is None for v in values) else values


@dataclass(slots=True)  # not frozen: one per job, and a frozen init costs ~10x
class ClaimedJob:
    """A job this worker now holds, as the claim returned it: its fields in the order of
    the claim's columns (`postgres.CLAIM_COLUMNS`), as the claim builds it by position."""

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
    max_attempts: int | None = None
    """The task's limit on failed executions (None: the worker's backstop alone)."""
    timeout_s: float | None = None
    """How long one run may take (None: no limit)."""
    batch_id: uuid.UUID | None = None
    """The batch the job is a member or a callback of (`Queue.batch`), else None."""
    priority: int = 1
    """Its tier (`Priority`)."""
    reserved: bool = False
    """A tier reservation of the claim picked it (see `venturi._claims.spread_order`)."""
    trace_context: str | None = None
    """The traceparent stored at enqueue, read only for a worker that traces."""


SettledAs = Literal["completed", "paused", "failed", "dead", "released", "returned"]
"""What a settlement writes (see `job_settle_many`)."""


@dataclass(slots=True)  # not frozen: one per job, and a frozen init costs ~10x
class Settlement:
    """One run's result, to be written (guarded by the claim token) with its journal row."""

    id: uuid.UUID
    claim_token: uuid.UUID
    kind: str
    queue: str
    run: int
    outcome: SettledAs
    """The journal's outcome (completed, paused, failed, dead, released), or "returned" for
    a prefetched job handed back unrun (nothing journaled)."""
    delay_s: float = 0.0
    carry: str | None = None
    set_carry: bool = False
    note: str | None = None
    attachment: str | None = None
    duration_s: float | None = None
    result: str | None = None
    """A completed run's result, as JSON."""
    progress: str | None = None
    """The run's latest progress, as JSON (None: keep what is stored)."""
    unrecordable: Callable[[str], Settlement] | None = None
    """What to write instead if the database refuses this settlement's data: a failed
    execution with the given reason (built by the executor, which knows the job's policy)."""
    hook_token: uuid.UUID | None = None
    """For a dead outcome: the token of its failure step (the task's `failed` hook and the
    reporters), recorded with the outcome and run once (see `_undertaker`)."""
    error: BaseException | None = None
    """For a dead outcome: the exception that ended the job, if one was raised."""
    batch_id: uuid.UUID | None = None
    """The job's batch, if it is a member or a callback (see `PostgresStore.settle`)."""

    @classmethod
    def of(cls, job: ClaimedJob, outcome: SettledAs, **fields: Any) -> Settlement:
        """The settlement of `job`'s current claim."""
        return cls(
            job.id,
            job.claim_token,
            job.kind,
            job.queue,
            job.run_count,
            outcome,
            batch_id=job.batch_id,
            **fields,
        )

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
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True)
class Recovery:
    """The decision for one stale job: re-pend after delay_s, or dead."""

    id: uuid.UUID
    dead: bool
    delay_s: float
    note: str
    hook_token: uuid.UUID | None = None
    """For a dead job: the token of its failure step (see `Settlement.hook_token`)."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """What became of one recovered job: pending again (after backoff), or dead."""

    id: ULID
    kind: str
    queue: str
    run: int
    status: JobStatus
    note: str | None
    hook_token: uuid.UUID | None = None
    """For a job made dead: its failure step, leased to the worker that recovered it."""


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
    """How to apply a merge: a new payload (None keeps it), maybe a carry, maybe a tier.
    `action` is the `Merge` decision, journaled as the `merged` entry's note."""

    action: Literal["keep", "independent", "replace", "with"]
    payload: str | None = None
    set_carry: bool = False
    carry: str | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class DueHook:
    """The failure step of a dead job, taken (leased) by this worker under `token`."""

    id: uuid.UUID
    token: uuid.UUID
    kind: str
    queue: str
    payload: str
    carry: str | None
    run_count: int
    failures: int
    last_error: str | None
    failed_at: datetime
    history: tuple[JournalEntry, ...]
    batch_id: uuid.UUID | None = None


class NextDue(NamedTuple):
    """What the claim loop reads after a claim that came back short (paused queues left
    out)."""

    in_s: float | None
    """Seconds until the next scheduled job becomes eligible (None: none is scheduled)."""
    held: bool
    """A job is due already: one the claim passed over, its row held by another transaction
    (or one enqueued since, whose notification is on its way)."""
