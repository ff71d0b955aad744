"""What a handler decides: `Outcome` for success and pauses, `TaskError` for failures.

return Outcome.completed()                  # done
return Outcome.completed(note="sent")       # done, with a journal note
return Outcome.completed(result={"n": 3})   # done, storing a JSON result with the job
return Outcome.pause_in(30)                 # re-pend with the carry; not a failure
raise TaskError.retryable("upstream 503")   # retry with backoff (any exception does)
raise TaskError.permanent("account gone")   # dead at once, no retry

Values are checked where they are made, so a settlement can never fail on them: a note or
message must be a string (a NUL in it is escaped as `\\x00`), a pause lasts a finite delay
of at most `MAX_DELAY` (about ten years).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from venturi._shown import shown
from venturi._storable import encode_json, safe_text
from venturi.backoff import Seconds, to_seconds
from venturi.errors import ResultTooLarge

RESULT_MAX_BYTES = 1024 * 1024
"""Cap on a completed job's stored result, as encoded JSON: results live in the jobs table."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A successful run's decision: the job is done, or it pauses and resumes later."""

    status: Literal["completed", "paused"]
    """What becomes of the job: done, or pending again after `delay`."""
    note: str | None = None
    delay: float = 0.0
    """Seconds until a paused job is eligible again (0 for completed jobs)."""
    result_json: str | None = None
    """A completed job's result, encoded as JSON (see `completed(result=...)`)."""

    def __post_init__(self) -> None:
        if self.status not in ("completed", "paused"):
            raise ValueError(
                f"Outcome.status: expected 'completed' or 'paused', got {self.status!r}"
            )
        if self.note is not None:
            object.__setattr__(self, "note", _text(self.note, "Outcome note"))
        if self.status == "paused":
            object.__setattr__(self, "delay", to_seconds(self.delay, name="pause_in(delay)"))
        elif self.delay != 0.0:
            raise ValueError(f"Outcome.completed has no delay, got {self.delay!r}")
        if self.result_json is not None and self.status != "completed":
            raise ValueError("Outcome: only a completed outcome has a result")

    @classmethod
    def completed(cls, note: str | None = None, *, result: Any = None) -> Outcome:
        """The job is done; `note` goes to this run's journal entry.

        `result` (any JSON value; None stores nothing) is stored with the job, read back by
        `Queue.job(id).result` and `await Queue.result(id)`. It is encoded here, so a value
        that cannot be stored raises at once (a TypeError, a ValueError, or
        `ResultTooLarge` past `RESULT_MAX_BYTES`) and fails the run, with that message.
        """
        if result is None:
            return _COMPLETED if note is None and cls is Outcome else cls("completed", note)
        encoded = encode_json(
            result,
            what="Outcome.completed(result=...)",
            cap=RESULT_MAX_BYTES,
            too_large=ResultTooLarge,
        )
        return cls("completed", note, 0.0, encoded.decode())

    @classmethod
    def pause_in(cls, delay: Seconds, note: str | None = None) -> Outcome:
        """Re-pend the job with its carry, eligible again after `delay`.

        A pause is not a failure: it never counts toward the backstop and uses no
        backoff. `pause_in(0)` yields at once (the job goes back to the end of its tier).
        """
        return cls("paused", note, to_seconds(delay, name="pause_in(delay)"))


_COMPLETED = Outcome("completed")
"""`Outcome.completed()`, made once: outcomes are immutable, and most runs return this one."""


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a str, got {type(value).__name__} {shown(value)}")
    return safe_text(value)


def failure_note(exc: BaseException) -> str:
    """The journal note (and `last_error`) for a failed run: a `TaskError`'s message, or
    "Type: message" for any other exception. Always storable text, even when the exception's
    message holds a NUL or its `__str__` itself raises."""
    message = getattr(exc, "message", None) if isinstance(exc, TaskError) else None
    if isinstance(message, str):
        return safe_text(_kept(message))
    try:
        text = str(exc)
    except Exception as inner:
        text = f"<unprintable: its __str__ raised {type(inner).__name__}>"
    return safe_text(f"{type(exc).__name__}: {_kept(text)}")


def _kept(text: str) -> str:
    """A message of megabytes (a response body, a dump) would be stored in the job and in its
    journal, and logged, whole: its start says what went wrong."""
    if len(text) <= FAILURE_NOTE_MAX_CHARS:
        return text
    cut = len(text) - FAILURE_NOTE_MAX_CHARS
    return f"{text[:FAILURE_NOTE_MAX_CHARS]}... ({cut:,} more character{'s' * (cut != 1)} not kept)"


FAILURE_NOTE_MAX_CHARS = 8000
"""The most of an exception's message a failed run's note (and `last_error`) keeps."""


class TaskError(Exception):
    """Raise from a handler to fail the run on purpose.

    `TaskError.retryable(msg)` retries with backoff, exactly like any other exception;
    `TaskError.permanent(msg)` sends the job straight to dead (retrying cannot help).
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        message = _text(message, "TaskError message")
        super().__init__(message)
        self.message = message
        self.is_permanent = permanent

    @classmethod
    def retryable(cls, message: str) -> TaskError:
        return cls(message, permanent=False)

    @classmethod
    def permanent(cls, message: str) -> TaskError:
        return cls(message, permanent=True)


class PanicPolicy(enum.Enum):
    """How an unexpected exception (anything but `TaskError`) settles a run."""

    RETRY = "retry"
    """A failed execution: backoff, bounded by the backstop (the default)."""
    DEAD = "dead"
    """Straight to dead: treat bugs as permanent."""
