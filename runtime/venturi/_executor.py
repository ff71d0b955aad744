"""The executor: runs one claimed job through its handler and turns what happened into a
`Settlement` (the outcome the completer writes). Pure mapping plus the handler call
(through the worker's middleware, composed once per registration): decoding, the four
outcomes, backoff and backstop, the panic policy, and release on abort.

Only a cancellation venturi asked for (shutdown, a lost lease) releases a job; anything
else a handler raises, `CancelledError`, `KeyboardInterrupt` and `SystemExit` included, is
that run's failure, so a handler can neither loop forever through releases nor take the
worker, and every other job it runs, down with it.

Called by the runner for each claimed job.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from ulid import ULID

from venturi import logs
from venturi._records import ClaimedJob, Settlement
from venturi.backoff import Backoff, retry_delay
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.context import Cancellation, Context, ProgressCell
from venturi.errors import PayloadError
from venturi.outcome import Outcome, PanicPolicy, TaskError, failure_note
from venturi.task import is_encrypted_kind

logger = logging.getLogger(__name__)

Handler = Callable[[Any, Context[Any], Any], Awaitable[Outcome | None]]


@dataclass(frozen=True, slots=True)
class Registration:
    task_type: type[Any]
    kind: str
    handler: Handler
    """The handler wrapped in the worker's middleware (the handler itself without any)."""
    carry_type: type[Any] | None
    cap: int | None


@dataclass(frozen=True, slots=True)
class Policy:
    """The worker settings that decide how failures settle."""

    backoff: Backoff
    jitter_fraction: float
    backstop: int | None
    panic_policy: PanicPolicy
    codec: Codec = DEFAULT_CODEC
    """How payloads and carries decode and encode (the queue's producers use the same)."""


async def execute(
    job: ClaimedJob,
    reg: Registration,
    app: Any,
    policy: Policy,
    cancellation: Cancellation,
    progress: ProgressCell | None = None,
) -> Settlement:
    """Run `job` and return its settlement. A forced abort by venturi becomes a release.
    `progress` is where the run's `ctx.progress` goes (the runner's, for lease renewals)."""
    log_extra = logs.job_fields(job.id, job.kind, job.queue, job.run_count)
    try:
        task = policy.codec.decode(reg.task_type, job.payload, kind=job.kind, job_id=job.id)
        carry = _decode_carry(policy.codec, reg.carry_type, job)
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, ValueError) as exc:
        note = f"undecodable payload for kind {job.kind!r}: {exc}"
        logger.error("job %s (%s) dead: %s", job.id, job.kind, note, extra=log_extra)
        return Settlement.of(job, "dead", note=note, duration_s=0.0)

    ctx: Context[Any] = Context(
        job_id=ULID.from_bytes(job.id.bytes),
        kind=job.kind,
        queue=job.queue,
        run_count=job.run_count,
        history=job.history,
        carry=carry,
        cancellation=cancellation,
        progress=progress,
    )
    started = time.monotonic()
    try:
        with logs.bound(log_extra):  # the handler's own records name its job too
            result = await reg.handler(task, ctx, app)
    except asyncio.CancelledError:
        reason = cancellation.note if cancellation.forced else None
        if reason is None:
            current = asyncio.current_task()
            if current is None or not current.cancelling():
                # Raised by the handler itself: a failure, not a release (which would
                # re-run it at once, forever, without the backstop ever applying).
                stray = RuntimeError("the handler raised CancelledError; venturi did not cancel it")
                return _failure(job, ctx, policy, stray, started, permanent=False)
            reason = "cancelled from outside venturi (the event loop is shutting down?)"
        logger.warning("job %s (%s) released: %s", job.id, job.kind, reason, extra=log_extra)
        return Settlement.of(
            job,
            "released",
            note=reason,
            duration_s=time.monotonic() - started,
        )
    except TaskError as exc:
        return _failure(job, ctx, policy, exc, started, permanent=exc.is_permanent)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        # KeyboardInterrupt and SystemExit from a handler are the handler's own (asyncio.run
        # turns a real Ctrl-C into a cancellation of the main task, not an exception here):
        # they fail this run, and the worker keeps running the others.
        logger.warning("job %s (%s) raised", job.id, job.kind, exc_info=True, extra=log_extra)
        permanent = policy.panic_policy is PanicPolicy.DEAD
        return _failure(job, ctx, policy, exc, started, permanent=permanent)

    duration = time.monotonic() - started
    attachment = ctx.attachment.decode() if ctx.attachment is not None else None
    if result is None:
        result = Outcome.completed()
    if not isinstance(result, Outcome):
        exc = TypeError(f"handler returned {result!r}; expected an Outcome or None")
        permanent = policy.panic_policy is PanicPolicy.DEAD
        return _failure(job, ctx, policy, exc, started, permanent=permanent)
    unrecordable = functools.partial(_unrecordable, job, policy, duration)
    if result.result_json is not None and is_encrypted_kind(job.kind):
        # Results are stored as plain JSON: an encrypted task's must not reach the table.
        refused = TypeError(f"{job.kind} is an encrypted task: its results are not stored")
        permanent = policy.panic_policy is PanicPolicy.DEAD
        return _failure(job, ctx, policy, refused, started, permanent=permanent)
    if result.status == "completed":
        return Settlement.of(
            job,
            "completed",
            note=result.note,
            attachment=attachment,
            duration_s=duration,
            result=result.result_json,
            progress=ctx.progress_json,
            unrecordable=unrecordable,
        )
    carry_json, carry_error = _encode_carry(policy.codec, ctx)
    if carry_error is not None:
        return _failure(job, ctx, policy, carry_error, started, permanent=False)
    return Settlement.of(
        job,
        "paused",
        delay_s=result.delay,
        carry=carry_json,
        set_carry=carry_json is not None,
        note=result.note,
        attachment=attachment,
        duration_s=duration,
        progress=ctx.progress_json,
        unrecordable=unrecordable,
    )


def _decode_carry(codec: Codec, carry_type: type[Any] | None, job: ClaimedJob) -> Any:
    if carry_type is None:
        return None
    if job.carry is None:
        return carry_type()
    return codec.decode(carry_type, job.carry, kind=job.kind, job_id=job.id)


def _encode_carry(codec: Codec, ctx: Context[Any]) -> tuple[str | None, Exception | None]:
    if ctx.carry is None:
        return None, None
    try:
        return codec.encode(ctx.carry, role="carry", kind=ctx.kind, job_id=ctx.job_id), None
    except PayloadError as exc:
        return None, exc


def _failure(
    job: ClaimedJob,
    ctx: Context[Any],
    policy: Policy,
    exc: BaseException,
    started: float,
    *,
    permanent: bool,
) -> Settlement:
    """The run failed with `exc`; its carry and attachment are kept."""
    message = failure_note(exc)
    carry_json, _ = _encode_carry(policy.codec, ctx)
    attachment = ctx.attachment.decode() if ctx.attachment is not None else None
    duration = time.monotonic() - started
    return _failed(
        job,
        policy,
        message,
        permanent=permanent,
        carry=carry_json,
        set_carry=carry_json is not None,
        attachment=attachment,
        duration_s=duration,
        progress=ctx.progress_json,
        unrecordable=functools.partial(_unrecordable, job, policy, duration),
    )


def _unrecordable(job: ClaimedJob, policy: Policy, duration_s: float, reason: str) -> Settlement:
    """A failed execution standing in for an outcome the database refused to store."""
    message = f"the run's outcome could not be recorded: {reason}".replace("\x00", "\\0")
    return _failed(job, policy, message, permanent=False, duration_s=duration_s)


def _failed(
    job: ClaimedJob, policy: Policy, message: str, *, permanent: bool, **common: Any
) -> Settlement:
    """A failed execution: dead when permanent or at the backstop, else retried with backoff."""
    failures = job.failures + 1
    log_extra = logs.job_fields(job.id, job.kind, job.queue, job.run_count)
    if permanent or (policy.backstop is not None and failures >= policy.backstop):
        if not permanent:
            message = f"backstop reached after {failures} failed executions; last: {message}"
        logger.warning("job %s (%s) dead: %s", job.id, job.kind, message, extra=log_extra)
        return Settlement.of(job, "dead", note=message, **common)
    delay = retry_delay(job_backoff(job, policy), failures, job.id.bytes, policy.jitter_fraction)
    logger.info(
        "job %s (%s) failed (%d), retry in %.3fs: %s",
        job.id,
        job.kind,
        failures,
        delay,
        message,
        extra=log_extra,
    )
    return Settlement.of(job, "failed", delay_s=delay, note=message, **common)


def job_backoff(
    job: ClaimedJob | Any,
    policy: Policy,
) -> Backoff:
    """The job's own curve when its task set one at enqueue, else the worker's."""
    if job.backoff_base_s is None and job.backoff_cap_s is None:
        return policy.backoff
    return Backoff(
        job.backoff_base_s if job.backoff_base_s is not None else policy.backoff.base,
        job.backoff_cap_s if job.backoff_cap_s is not None else policy.backoff.cap,
    )
