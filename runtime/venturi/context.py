"""`Context[Carry]`: what a handler knows about the run it is in, and what it may record.

The worker builds one per run. The handler reads `run_count` and `history`, mutates
`carry` (persisted when the job pauses or is retried), attaches evidence to this run's
journal entry, and watches for the cooperative cancel, whose `cancel_reason` says why it came.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Generic, TypeVar

import msgspec
from ulid import ULID

from venturi._storable import encode_json, json_problem
from venturi.errors import AttachmentTooLarge, ResultTooLarge
from venturi.jobs import JournalEntry
from venturi.task import is_encrypted_kind

C = TypeVar("C")

ATTACHMENT_MAX_BYTES = 64 * 1024
"""Cap on one run's attachment, as encoded JSON: the journal is history, not storage."""

PROGRESS_MAX_BYTES = 64 * 1024
"""Cap on a run's progress value, as encoded JSON: it is rewritten with every lease renewal."""

_encoder = msgspec.json.Encoder()


class ProgressCell:
    """The latest progress of one run: set by its `Context`, written by the worker with the
    next lease renewal and at settle (never a write of its own)."""

    __slots__ = ("encoded", "written")

    def __init__(self) -> None:
        self.encoded: str | None = None
        """The latest value, as JSON (None: none reported)."""
        self.written: str | None = None
        """The value the database last received (the renewer compares by identity)."""

    def unwritten(self) -> str | None:
        """The value to send with the next renewal, or None when the database has it."""
        return None if self.encoded is self.written else self.encoded


class CancelReason(enum.StrEnum):
    """Why the worker asked a run to stop."""

    SHUTDOWN = "shutdown"
    """The worker is shutting down: checkpoint (pause with the carry) or finish quickly."""
    LEASE_LOST = "lease_lost"
    """The job's lease was lost (recovered elsewhere) or could not be renewed in time: stop;
    whatever the run does now no longer counts."""
    TIMEOUT = "timeout"
    """The run took longer than its task's timeout."""


class Cancellation:
    """The cancel signal of one run, shared by the worker (which raises it) and the run's
    `Context` (which reads it). `forced` is set when the worker also cancels the handler's
    task: the executor then releases the job with `note`, instead of failing the run."""

    __slots__ = ("_event", "forced", "note", "reason", "timed_out")

    def __init__(self) -> None:
        # Made when a run first waits for it: most runs never do, and an Event per job was
        # a few percent of a worker's CPU in a drain of short jobs.
        self._event: asyncio.Event | None = None
        self.reason: CancelReason | None = None
        """Why the run was asked to wind down (None: it was not)."""
        self.forced = False
        self.note: str | None = None
        self.timed_out = False
        """Whether the run's timeout passed (also after another reason came first)."""

    @property
    def event(self) -> asyncio.Event:
        """Set once the run is asked to wind down."""
        if self._event is None:
            self._event = asyncio.Event()
            if self.reason is not None:
                self._event.set()
        return self._event

    def request(self, reason: CancelReason) -> None:
        """Ask the run to wind down (the first reason given is kept)."""
        if self.reason is None:
            self.reason = reason
        if self._event is not None:
            self._event.set()

    def force(self, reason: CancelReason, note: str) -> None:
        """Record a forced abort; the caller cancels the task."""
        self.request(reason)
        if not self.forced:
            self.forced = True
            self.note = note


class Context(Generic[C]):
    """The execution context of one run of one job."""

    __slots__ = (
        "_attachment",
        "_cancellation",
        "_progress",
        "attempt",
        "batch_id",
        "carry",
        "history",
        "job_id",
        "kind",
        "max_attempts",
        "queue",
        "run_count",
        "trace_context",
    )

    def __init__(
        self,
        *,
        job_id: ULID,
        kind: str,
        queue: str,
        run_count: int,
        history: tuple[JournalEntry, ...],
        carry: C,
        cancellation: Cancellation,
        trace_context: str | None = None,
        attempt: int = 1,
        max_attempts: int | None = None,
        progress: ProgressCell | None = None,
        batch_id: ULID | None = None,
    ) -> None:
        self.job_id = job_id
        self.kind = kind
        self.queue = queue
        """The named queue the job was claimed from."""
        self.run_count = run_count
        """This run's number: 1 on the first run, counting every claim (pauses too)."""
        self.attempt = attempt
        """This attempt's number: 1 until a run fails, then one more per failed execution
        (errors, timeouts, expired leases; pauses and releases never count)."""
        self.max_attempts = max_attempts
        """The attempt whose failure ends the job (the task's `max_attempts()` or the
        worker's backstop, the lower); None: no limit. `attempt == max_attempts` is the
        last one."""
        self.history = history
        """The job's earlier journal entries, oldest first."""
        self.carry = carry
        """The typed carry; mutate it freely, it is saved when the job pauses or retries."""
        self.batch_id = batch_id
        """The batch this job is a member or a callback of (`Queue.batch`), else None."""
        self.trace_context = trace_context
        """The W3C traceparent the job was enqueued under, for tracing middleware
        (`venturi.otel`); None unless the producer traced and this worker's middleware
        reads it."""
        self._cancellation = cancellation
        self._attachment: bytes | None = None
        self._progress = progress if progress is not None else ProgressCell()

    def progress(self, value: Any) -> None:
        """Record this run's progress (any JSON value, e.g. `{"done": 42, "of": 100}`),
        readable from `Queue.job(id).progress`. Cheap: kept in memory and written with the
        job's next lease renewal (every third of its lease) and when the run settles; the
        latest value wins. Raises like `attach` (`ResultTooLarge` past the cap), and a
        TypeError in an encrypted task (progress is stored as plain JSON).
        """
        if is_encrypted_kind(self.kind):
            raise TypeError(
                f"ctx.progress: {self.kind} is an encrypted task; progress is not stored"
            )
        self._progress.encoded = encode_json(
            value, what="ctx.progress", cap=PROGRESS_MAX_BYTES, too_large=ResultTooLarge
        ).decode()

    @property
    def progress_json(self) -> str | None:
        """The latest progress, as JSON (for the worker)."""
        return self._progress.encoded

    def attach(self, value: Any) -> None:
        """Store a JSON value on this run's journal entry (replacing an earlier one).

        Raises `AttachmentTooLarge` when the encoded JSON exceeds the cap, a `TypeError`
        when the value is not JSON-serializable, and a `ValueError` when JSON would not store
        it faithfully (NaN or infinity, a NUL character in a string, nesting too deep); the
        run itself goes on, and the earlier attachment (if any) is kept.
        """
        try:
            encoded = _encoder.encode(value)
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(f"ctx.attach: value is not JSON-serializable: {exc}") from None
        except RecursionError:
            raise ValueError("ctx.attach: value is nested too deeply to encode") from None
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"ctx.attach: value cannot be encoded: {exc}") from None
        problem = json_problem(encoded, value)
        if problem is not None:
            raise ValueError(f"ctx.attach: {problem}")
        if len(encoded) > ATTACHMENT_MAX_BYTES:
            raise AttachmentTooLarge(
                f"ctx.attach: attachment is {len(encoded)} bytes of JSON, "
                f"over the {ATTACHMENT_MAX_BYTES}-byte cap"
            )
        self._attachment = encoded

    @property
    def attachment(self) -> bytes | None:
        """The encoded attachment, if any (for the worker)."""
        return self._attachment

    @property
    def is_cancelled(self) -> bool:
        """True once the worker asked this run to wind down (see `cancel_reason`)."""
        return self._cancellation.reason is not None

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the run was asked to stop: shutdown, a lost lease, or a timeout (None: not)."""
        return self._cancellation.reason

    async def cancelled(self) -> None:
        """Wait until the worker asks this run to wind down."""
        await self._cancellation.event.wait()
