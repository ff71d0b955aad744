"""The executor: runs one claimed job through its handler and turns what happened into a
`Settlement` (the outcome the completer writes). Pure mapping plus the handler call
(through the worker's middleware, composed once per registration): decoding, the four
outcomes, backoff, the attempt limit (the task's max_attempts, the worker's backstop), the
panic policy, the per-run timeout, and release on abort.

A run that outlives its task's timeout is cancelled (its context says TIMEOUT) and settled
as a failed execution recorded as a timeout, but only once it has exited: a handler that
ignores the cancellation is reported (`STUCK_AFTER`) and keeps its slot, and its job's
lease, until it returns, so the job never runs twice at once.

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
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from ulid import ULID

from venturi import logs
from venturi._records import ClaimedJob, Settlement
from venturi.backoff import Backoff, retry_delay
from venturi.codec import DEFAULT_CODEC, Codec, looks_sealed, stored_text
from venturi.context import Cancellation, CancelReason, Context, ProgressCell
from venturi.errors import PayloadError
from venturi.outcome import Outcome, PanicPolicy, TaskError, failure_note
from venturi.task import is_encrypted_kind

logger = logging.getLogger(__name__)

Handler = Callable[[Any, Context[Any], Any], Awaitable[Outcome | None]]

STUCK_AFTER = 10.0
"""Seconds after a run's timeout cancelled it: a handler still running then is reported as
ignoring the cancellation (once; it keeps its slot until it returns)."""


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
    what = "payload"
    try:
        task = policy.codec.decode(reg.task_type, job.payload, kind=job.kind, job_id=job.id)
        what = "carry"
        carry = _decode_carry(policy.codec, reg.carry_type, job)
    except Exception as exc:  # anything: a task's own __post_init__ check, a codec's bug
        note = f"undecodable {what} for kind {job.kind!r}: {_decode_error(exc, job)}"
        logger.error("job %s (%s) dead: %s", logs.ShownId(job.id), job.kind, note, extra=log_extra)
        return Settlement.of(job, "dead", note=note, duration_s=0.0, hook_token=uuid.uuid4())

    ctx: Context[Any] = Context(
        job_id=ULID.from_bytes(job.id.bytes),
        kind=job.kind,
        queue=job.queue,
        run_count=job.run_count,
        history=job.history,
        carry=carry,
        cancellation=cancellation,
        trace_context=job.trace_context,
        attempt=job.failures + 1,
        max_attempts=attempt_limit(job, policy),
        progress=progress,
        batch_id=None if job.batch_id is None else ULID.from_bytes(job.batch_id.bytes),
    )
    started = time.monotonic()
    deadline = None if job.timeout_s is None else _Deadline(job, cancellation, log_extra)
    timed_out = False
    try:
        try:
            bound = logs.bind(log_extra)  # the handler's own records name its job too
            try:
                result = await reg.handler(task, ctx, app)
            finally:
                logs.unbind(bound)
        finally:
            timed_out = deadline is not None and deadline.close()
    except asyncio.CancelledError:
        if timed_out:
            # The timeout came first: a failed execution, also when a shutdown or a lost lease
            # then forced the abort (released, a run that ignores its timeout would never count
            # as an attempt under rolling deploys; a settle of a lost lease is refused anyway).
            return _timed_out(job, ctx, policy, started, deadline)
        reason = cancellation.note if cancellation.forced else None
        if reason is None:
            current = asyncio.current_task()
            if current is None or not current.cancelling():
                # Raised by the handler itself: a failure, not a release (which would
                # re-run it at once, forever, without the backstop ever applying).
                stray = RuntimeError("the handler raised CancelledError; venturi did not cancel it")
                return _failure(job, ctx, policy, stray, started, permanent=False)
            reason = "cancelled from outside venturi (the event loop is shutting down?)"
        logger.warning(
            "job %s (%s) released: %s", logs.ShownId(job.id), job.kind, reason, extra=log_extra
        )
        return Settlement.of(
            job,
            "released",
            note=reason,
            duration_s=time.monotonic() - started,
        )
    except TaskError as exc:
        if timed_out:
            return _timed_out(job, ctx, policy, started, deadline)
        return _failure(job, ctx, policy, exc, started, permanent=exc.is_permanent)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        if timed_out:  # raised on the way out of the cancellation: the timeout's doing
            return _timed_out(job, ctx, policy, started, deadline)
        # KeyboardInterrupt and SystemExit from a handler are the handler's own (asyncio.run
        # turns a real Ctrl-C into a cancellation of the main task, not an exception here):
        # they fail this run, and the worker keeps running the others.
        logger.warning(
            "job %s (%s) raised", logs.ShownId(job.id), job.kind, exc_info=True, extra=log_extra
        )
        permanent = policy.panic_policy is PanicPolicy.DEAD
        return _failure(job, ctx, policy, exc, started, permanent=permanent)

    if timed_out:  # it swallowed the cancellation and returned: the run was still too long
        return _timed_out(job, ctx, policy, started, deadline)
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
        # Results are stored as plain JSON: an encrypted task's must not reach the table. The
        # run's work is done, and every retry would return a result again: dead, not retried
        # (a retry would do the work again, and again).
        refused = TypeError(
            f"{job.kind} is an encrypted task: its results are not stored (the run is not "
            "retried: its work is done)"
        )
        return _failure(job, ctx, policy, refused, started, permanent=True)
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
        return _failure(job, ctx, policy, carry_error, started, permanent=False, carry_failed=True)
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


class _Deadline:
    """The timeout of one run: when it passes, ask the run to stop (TIMEOUT) and cancel its
    task; if the task is still running `STUCK_AFTER` later, report it."""

    def __init__(self, job: ClaimedJob, cancellation: Cancellation, log_extra: Any) -> None:
        assert job.timeout_s is not None
        self._job = job
        self._cancellation = cancellation
        self._log_extra = log_extra
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(job.timeout_s, self._fire)
        self.fired_at: float | None = None
        self.stuck = False

    def _fire(self) -> None:
        self.fired_at = self._loop.time()
        self._cancellation.timed_out = True
        self._cancellation.request(CancelReason.TIMEOUT)
        if self._task is not None:
            self._task.cancel()
        self._timer = self._loop.call_later(STUCK_AFTER, self._report)

    def _report(self) -> None:
        self.stuck = True
        self._timer = None
        job = self._job
        logger.error(
            "job %s (%s): the handler ignored its timeout's cancellation for %.0fs; its slot "
            "stays held, and the job claimed, until it returns",
            logs.ShownId(job.id),
            job.kind,
            STUCK_AFTER,
            extra=self._log_extra,
        )

    def close(self) -> bool:
        """The run has exited: stop the timers; True if the timeout fired."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.fired_at is None:
            return False
        if self._task is not None:
            self._task.uncancel()  # the cancellation was ours, and it is handled here
        if self.stuck:
            logger.warning(
                "job %s (%s): the handler that ignored its timeout returned %.0fs after it",
                logs.ShownId(self._job.id),
                self._job.kind,
                self._loop.time() - self.fired_at,
                extra=self._log_extra,
            )
        return True


def _timed_out(
    job: ClaimedJob, ctx: Context[Any], policy: Policy, started: float, deadline: _Deadline | None
) -> Settlement:
    """The run outlived its timeout: a failed execution, its note saying so."""
    stuck = " (the handler ignored the cancellation)" if deadline and deadline.stuck else ""
    error = TaskError.retryable(
        f"timeout: the run took longer than its timeout of {job.timeout_s:g}s{stuck}"
    )
    return _failure(job, ctx, policy, error, started, permanent=False)


_AT_PATH = re.compile(r" - at `([^`]*)`$")


def _decode_error(exc: Exception, job: ClaimedJob) -> str:
    """The decoder's message, but of an encrypted task's payload or carry only where it went
    wrong: msgspec quotes the value it rejected ("Invalid enum value 'visa-...'"), and the
    message becomes the job's last error, its journal note and a log line, which never hold
    an encrypted task's plaintext. Another exception (raised by the task class's own
    `__post_init__`, or a codec's) is named by its type, with its message unless encrypted."""
    encrypted = is_encrypted_kind(job.kind) or looks_sealed(job.payload)
    if not isinstance(exc, (msgspec.ValidationError, msgspec.DecodeError, TypeError, ValueError)):
        if encrypted:
            return (
                f"{type(exc).__name__} (its message is withheld: it may quote the decrypted value)"
            )
        return failure_note(exc)
    if not isinstance(exc, msgspec.ValidationError) or not encrypted:
        return str(exc)
    at = _AT_PATH.search(str(exc))
    where = f" at `{at.group(1)}`" if at else ""
    return (
        f"the decrypted value does not fit the task class{where} (the decoder's message is "
        "withheld: it may quote the encrypted value)"
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
        text = codec.encode(ctx.carry, role="carry", kind=ctx.kind, job_id=ctx.job_id)
        return stored_text(codec, text, role="carry", kind=ctx.kind), None
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
    carry_failed: bool = False,
) -> Settlement:
    """The run failed with `exc`; its carry and attachment are kept. A carry that cannot be
    stored is not: the note and a warning say so, and the next attempt starts from the carry
    stored before (`carry_failed`: `exc` is that carry's error, already the note)."""
    message = failure_note(exc)
    carry_json, carry_error = (None, None) if carry_failed else _encode_carry(policy.codec, ctx)
    if carry_error is not None:
        message = f"{message}; its carry was not saved: {carry_error}"
        logger.warning(
            "job %s (%s): the failed run's carry was not saved: %s",
            logs.ShownId(job.id),
            job.kind,
            carry_error,
            extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
        )
    attachment = ctx.attachment.decode() if ctx.attachment is not None else None
    duration = time.monotonic() - started
    return _failed(
        job,
        policy,
        message,
        error=exc,
        permanent=permanent,
        carry=carry_json,
        set_carry=carry_json is not None,
        attachment=attachment,
        duration_s=duration,
        progress=ctx.progress_json,
        unrecordable=functools.partial(_unrecordable, job, policy, duration),
    )


def crashed(job: ClaimedJob, policy: Policy, exc: Exception, duration_s: float) -> Settlement:
    """A failed execution standing in for a run that `execute` itself could not finish (a bug
    of venturi's, never the handler's: its exceptions are failures already)."""
    message = f"venturi failed running the job: {failure_note(exc)}"
    return _failed(job, policy, message, permanent=False, error=exc, duration_s=duration_s)


def abandoned_after_timeout(job: ClaimedJob, policy: Policy) -> Settlement:
    """A failed execution for a run that passed its timeout, ignored the cancellation, and
    was given up on at shutdown (its handler may still be running)."""
    message = (
        f"timeout: the run took longer than its timeout of {job.timeout_s:g}s (the handler "
        "ignored the cancellation; abandoned at shutdown)"
    )
    return _failed(job, policy, message, permanent=False)


def _unrecordable(job: ClaimedJob, policy: Policy, duration_s: float, reason: str) -> Settlement:
    """A failed execution standing in for an outcome the database refused to store."""
    message = f"the run's outcome could not be recorded: {reason}".replace("\x00", "\\0")
    return _failed(job, policy, message, permanent=False, duration_s=duration_s)


def attempt_limit(job: ClaimedJob | Any, policy: Policy) -> int | None:
    """Failed executions that end the job: the task's max_attempts or the worker's backstop,
    whichever is lower (None: neither is set)."""
    task, backstop = job.max_attempts, policy.backstop
    if task is None or backstop is None:
        return backstop if task is None else task
    return min(task, backstop)


def limit_note(job: ClaimedJob | Any, policy: Policy, failures: int) -> str | None:
    """Why `failures` failed executions end the job (None: they do not)."""
    limit = attempt_limit(job, policy)
    if limit is None or failures < limit:
        return None
    if job.max_attempts is not None and job.max_attempts == limit:
        return f"max_attempts ({limit}) reached"
    return f"backstop reached after {failures} failed executions"


def _failed(
    job: ClaimedJob,
    policy: Policy,
    message: str,
    *,
    permanent: bool,
    error: BaseException | None = None,
    **common: Any,
) -> Settlement:
    """A failed execution: dead when permanent or out of attempts, else retried with backoff.
    A dead one carries its failure step's token and the exception (see `_undertaker`)."""
    failures = job.failures + 1
    log_extra = logs.job_fields(job.id, job.kind, job.queue, job.run_count)
    used_up = limit_note(job, policy, failures)
    if permanent or used_up is not None:
        if not permanent:
            message = f"{used_up}; last: {message}"
        logger.warning(
            "job %s (%s) dead: %s", logs.ShownId(job.id), job.kind, message, extra=log_extra
        )
        return Settlement.of(
            job, "dead", note=message, hook_token=uuid.uuid4(), error=error, **common
        )
    delay = retry_delay(job_backoff(job, policy), failures, job.id.bytes, policy.jitter_fraction)
    logger.info(
        "job %s (%s) failed (%d), retry in %.3fs: %s",
        logs.ShownId(job.id),
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
