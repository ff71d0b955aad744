"""Hooks: observers of the job lifecycle.

A hook is called at a point of a job's life and returns; it cannot change what happens to
the job (a middleware can: see `venturi.middleware`). Subclass `Hooks`, override the points
you need, and pass instances to `Worker(..., hooks=[...])` and `Queue(..., hooks=[...])`:

    class Audit(Hooks):
        def dead(self, event: Dead) -> None:
            log.error("job %s (%s) failed for good: %s", event.id, event.kind, event.reason)

    worker = Worker(app, store, hooks=[Audit()])

The points, in order: `enqueued` (after the insert or merge committed), `claimed`,
`started` (the handler is called), `finished` (it returned or raised; the outcome is not
recorded yet), `settled` (the outcome is written, or `kept=False` if the claim was lost
first), `dead` (after a `settled` or `recovered` that failed the job for good) and
`recovered` (a lease expired and the job was taken back). Hooks run synchronously on the
worker's event loop, so they must be quick; an exception in one is logged and ignored, never
the job's or the worker's problem. Hooks observe at most once: a worker killed between a
write and its hook call skips the call (the journal is the record that never skips).
Prometheus metrics (`metrics=True`) are one hook among others.

One producer-side point can add to what is stored: an `EnqueueTracer` (`Queue(tracer=...)`,
`venturi.otel.Tracing` is one) wraps each enqueue and gives each job the trace context to
store with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ulid import ULID

__all__ = [
    "Claimed",
    "Dead",
    "EnqueueTracer",
    "Enqueued",
    "Finished",
    "Hooks",
    "Recovered",
    "Settled",
    "Started",
]


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: ULID
    """The job that holds the work (for a merge, the existing job)."""
    kind: str
    queue: str
    merged: str | None = None
    """For a dedup collision, the merge decision ("keep", "replace", "with"); "unique" for an
    enqueue that found its unique id held (`id` is the holder's); else None."""


@dataclass(frozen=True, slots=True)
class Claimed:
    id: ULID
    kind: str
    queue: str
    run: int
    waited_s: float
    """Seconds from the job becoming eligible to its claim (database clock)."""


@dataclass(frozen=True, slots=True)
class Started:
    id: ULID
    kind: str
    queue: str
    run: int


@dataclass(frozen=True, slots=True)
class Finished:
    id: ULID
    kind: str
    queue: str
    run: int
    outcome: str
    """What the run came to: completed, paused, failed, dead or released."""
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class Settled:
    id: ULID
    kind: str
    queue: str
    run: int
    outcome: str
    """completed, paused, failed, dead, released, or returned (a prefetched job handed back
    unrun)."""
    note: str | None
    kept: bool
    """False if the claim was lost before the write (another worker recovered the job)."""


@dataclass(frozen=True, slots=True)
class Dead:
    id: ULID
    kind: str
    queue: str
    run: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class Recovered:
    id: ULID
    kind: str
    queue: str
    status: str
    """pending (re-run after backoff) or dead (the backstop was reached)."""


class EnqueueTracer(Protocol):
    """Traces enqueues: `Queue(store, tracer=...)` (see `venturi.otel`)."""

    def enqueue(
        self, queue: str, jobs: Sequence[tuple[ULID, str]]
    ) -> AbstractContextManager[Sequence[str | None]]:
        """Around one enqueue call of `jobs` (id, kind) into `queue`: yields the trace
        context (a W3C traceparent, or None) to store with each job, in order; the block
        exits with the insert's exception, if it raised."""
        ...


class Hooks:
    """Base class of lifecycle observers: every point does nothing until overridden."""

    def enqueued(self, event: Enqueued) -> None:
        """A job was stored, or an enqueue merged into a pending job."""

    def claimed(self, event: Claimed) -> None:
        """This worker claimed a job (it may wait in the prefetch buffer before it starts)."""

    def started(self, event: Started) -> None:
        """The job's handler is being called."""

    def finished(self, event: Finished) -> None:
        """The handler returned or raised; its outcome is about to be written."""

    def settled(self, event: Settled) -> None:
        """The run's outcome was written (or dropped: the claim was lost)."""

    def dead(self, event: Dead) -> None:
        """The job failed for good (it will not run again unless retried by hand)."""

    def recovered(self, event: Recovered) -> None:
        """A job whose lease expired was taken back by this worker."""
