"""What a handler decides: `Outcome` for success and pauses, `TaskError` for failures.

return Outcome.completed()                  # done
return Outcome.completed(note="sent")       # done, with a journal note
return Outcome.pause_in(30)                 # re-pend with the carry; not a failure
raise TaskError.retryable("upstream 503")   # retry with backoff (any exception does)
raise TaskError.permanent("account gone")   # dead at once, no retry
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from venturi.backoff import Seconds, to_seconds


@dataclass(frozen=True, slots=True)
class Outcome:
    """A successful run's decision: the job is done, or it pauses and resumes later."""

    kind: Literal["completed", "paused"]
    note: str | None = None
    delay: float = 0.0
    """Seconds until a paused job is eligible again (0 for completed jobs)."""

    @classmethod
    def completed(cls, note: str | None = None) -> Outcome:
        """The job is done; `note` goes to this run's journal entry."""
        return cls("completed", note)

    @classmethod
    def pause_in(cls, delay: Seconds, note: str | None = None) -> Outcome:
        """Re-pend the job with its carry, eligible again after `delay`.

        A pause is not a failure: it never counts toward the backstop and uses no
        backoff. `pause_in(0)` yields at once (the job goes back to the end of its tier).
        """
        return cls("paused", note, to_seconds(delay, name="pause_in(delay)"))


class TaskError(Exception):
    """Raise from a handler to fail the run on purpose.

    `TaskError.retryable(msg)` retries with backoff, exactly like any other exception;
    `TaskError.permanent(msg)` sends the job straight to dead (retrying cannot help).
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
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
