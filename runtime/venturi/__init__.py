"""venturi: typed background jobs on PostgreSQL.

Everything public is exported here; submodules prefixed with `_` are private.
"""

from ulid import ULID

from venturi.backoff import Backoff
from venturi.batches import Batch
from venturi.codec import Codec, JsonCodec
from venturi.context import CancelReason, Context
from venturi.encryption import KeyRing, SealedCodec
from venturi.errors import (
    AttachmentTooLarge,
    DuplicateKindError,
    JobFailed,
    JobStateError,
    PayloadError,
    ResultTooLarge,
    SchemaError,
    StoreClosedError,
    VenturiError,
)
from venturi.hooks import Hooks
from venturi.identity import WorkerIdentity
from venturi.jobs import (
    BatchStatus,
    CleanupCriteria,
    FailedJob,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    JournalOutcome,
    MinuteCounts,
    QueueStats,
    Stats,
)
from venturi.maintenance import MaintenanceService, Retention
from venturi.merge import DedupKey, Merge, Pending
from venturi.middleware import CallNext, Middleware
from venturi.outcome import Outcome, PanicPolicy, TaskError
from venturi.pauses import QueueState
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.registry import WorkerInfo
from venturi.schedules import Missed, Overlap, Schedule, ScheduleInfo
from venturi.task import Priority, Task
from venturi.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "ULID",
    "AttachmentTooLarge",
    "Backoff",
    "Batch",
    "BatchStatus",
    "CallNext",
    "CancelReason",
    "CleanupCriteria",
    "Codec",
    "Context",
    "DedupKey",
    "DuplicateKindError",
    "FailedJob",
    "Hooks",
    "Job",
    "JobFailed",
    "JobFilter",
    "JobStateError",
    "JobStatus",
    "JournalEntry",
    "JournalOutcome",
    "JsonCodec",
    "KeyRing",
    "MaintenanceService",
    "Merge",
    "Middleware",
    "MinuteCounts",
    "Missed",
    "Outcome",
    "Overlap",
    "PanicPolicy",
    "PayloadError",
    "Pending",
    "PostgresStore",
    "Priority",
    "Queue",
    "QueueState",
    "QueueStats",
    "ResultTooLarge",
    "Retention",
    "Schedule",
    "ScheduleInfo",
    "SchemaError",
    "SealedCodec",
    "Stats",
    "StoreClosedError",
    "Task",
    "TaskError",
    "VenturiError",
    "Worker",
    "WorkerIdentity",
    "WorkerInfo",
]
