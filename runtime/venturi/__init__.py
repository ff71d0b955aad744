"""venturi: typed background jobs on PostgreSQL.

Everything public is exported here; submodules prefixed with `_` are private.
"""

from venturi.backoff import Backoff
from venturi.codec import Codec, JsonCodec
from venturi.context import CancelReason, Context
from venturi.encryption import KeyRing, SealedCodec
from venturi.errors import (
    AttachmentTooLarge,
    DuplicateKindError,
    PayloadError,
    SchemaError,
    StoreClosedError,
    VenturiError,
)
from venturi.hooks import Hooks
from venturi.identity import WorkerIdentity
from venturi.jobs import (
    CleanupCriteria,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    JournalOutcome,
    Stats,
)
from venturi.merge import DedupKey, Merge, Pending
from venturi.middleware import CallNext, Middleware
from venturi.outcome import Outcome, PanicPolicy, TaskError
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.schedules import Missed, Overlap, Schedule, ScheduleInfo
from venturi.task import Priority, Task
from venturi.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AttachmentTooLarge",
    "Backoff",
    "CallNext",
    "CancelReason",
    "CleanupCriteria",
    "Codec",
    "Context",
    "DedupKey",
    "DuplicateKindError",
    "Hooks",
    "Job",
    "JobFilter",
    "JobStatus",
    "JournalEntry",
    "JournalOutcome",
    "JsonCodec",
    "KeyRing",
    "Merge",
    "Middleware",
    "Missed",
    "Outcome",
    "Overlap",
    "PanicPolicy",
    "PayloadError",
    "Pending",
    "PostgresStore",
    "Priority",
    "Queue",
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
]
