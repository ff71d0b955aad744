"""The exceptions venturi raises, so callers catch precise types, never parse messages.

    VenturiError
    ├── PayloadError          (also a ValueError) a task's payload cannot be encoded
    ├── AttachmentTooLarge    (also a ValueError) ctx.attach() got more than the cap
    ├── ResultTooLarge        (also a ValueError) a result or progress value over its cap
    ├── JobFailed             the job failed for good: Queue.result(), failure hooks
    ├── DuplicateKindError    (also a ValueError) two task types registered under one KIND
    ├── JobStateError         (also a ValueError) the job is not in a state the call acts on
    ├── SchemaError           the tables are missing, or their schema is not this release's
    └── StoreClosedError      the store was closed; create a new one

`TaskError` (in `venturi.outcome`) is not here: handlers raise it to choose an outcome,
it is not an error of venturi's.
"""

from __future__ import annotations


class VenturiError(Exception):
    """Base class of every error venturi raises."""


class PayloadError(VenturiError, ValueError):
    """A task's payload (or carry) cannot be encoded; the message names the field."""


class AttachmentTooLarge(VenturiError, ValueError):
    """`Context.attach` was given a value whose JSON exceeds the attachment cap."""


class ResultTooLarge(VenturiError, ValueError):
    """`Outcome.completed(result=...)` or `Context.progress` was given a value whose JSON
    exceeds its cap."""


class JobFailed(VenturiError):
    """A job failed for good (it is dead). `Queue.result` raises it (no result will come),
    and a task's `failed` hook and the worker's reporters receive it when the exception that
    ended the job is not at hand: its worker died during the last attempt, or died before
    running the hook (another worker runs it), or the payload did not decode. The message is
    the job's recorded error."""

    def __init__(self, message: str, *, job_id: str, error: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        """The job's id (a ULID string)."""
        self.error = error
        """The job's last error, as its journal recorded it."""


class DuplicateKindError(VenturiError, ValueError):
    """Two different task types were registered under the same KIND."""


class JobStateError(VenturiError, ValueError):
    """The job is missing, or not in a state the call acts on (retrying a job that has not
    failed, say); `status` is the job's status, a `JobStatus` (None: there is no such job)."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class SchemaError(VenturiError):
    """The prefix's tables are missing (run `venturi migrate`), or their schema was made by
    another release of venturi (older: migrate; newer: upgrade venturi)."""


class StoreClosedError(VenturiError):
    """An operation was attempted on a closed store."""


class MetricsPortError(VenturiError, OSError):
    """The worker could not serve /metrics on its `metrics_port` (in use, or not allowed):
    said as such, not taken for a database error."""
