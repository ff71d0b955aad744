"""Pausing a named queue: the state `Queue.queues()` lists, and the checks of a pause's
arguments (pure functions: a bad value is a `ValueError` naming it, before any SQL runs).

A paused queue's jobs stay pending and no claim takes them (the claim function checks the
pause), until `Queue.resume` or the pause's `until` passes. The pause is stored, so it
survives every restart, and announced to every worker at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from venturi._shown import shown
from venturi.backoff import MAX_DELAY

MAX_REASON = 1000
"""Characters in a pause's reason: a note for operators, not a document."""


@dataclass(frozen=True, slots=True)
class QueueState:
    """A named queue as `Queue.queues()` lists it: a queue with pending jobs, or one that was
    ever paused. `since`, `until` and `reason` are set while it is paused."""

    name: str
    paused: bool
    reason: str | None = None
    since: datetime | None = None
    """When it was paused (a second pause of a paused queue keeps this)."""
    until: datetime | None = None
    """When it resumes by itself (None: when resumed)."""


def check_reason(reason: object) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise TypeError(f"pause(reason=): expected a str or None, got {shown(reason)}")
    if len(reason) > MAX_REASON:
        raise ValueError(
            f"pause(reason=): expected at most {MAX_REASON} characters, got {len(reason):,}"
        )
    if "\x00" in reason:
        raise ValueError(f"pause(reason=): a NUL character cannot be stored: {shown(reason)}")
    return reason


def check_until(until: object, *, now: datetime | None = None) -> datetime | None:
    """A timezone-aware datetime in the future (by this process's clock), within 10 years."""
    if until is None:
        return None
    if not isinstance(until, datetime):
        raise TypeError(f"pause(until=): expected a timezone-aware datetime, got {shown(until)}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise ValueError(f"pause(until=): expected a timezone-aware datetime, got {until!r}")
    now = now or datetime.now(UTC)
    if until <= now:
        raise ValueError(
            f"pause(until=): {until.isoformat()} has passed (resume the queue instead, or "
            f"pause it without `until`)"
        )
    if (until - now).total_seconds() > MAX_DELAY:
        raise ValueError(f"pause(until=): expected within 10 years of now, got {until.isoformat()}")
    return until
