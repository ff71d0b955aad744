"""The undertaker: runs the failure step of every job that failed for good, once.

The failure step is the task's `failed(error, ctx, app)` hook, then each of the worker's
reporters. The statement that makes a job dead (a settlement, or a recovery after its worker
died during the last attempt) records the step in the job's row (`hook_token`) and leases it
to the worker that wrote it; after the commit, that worker runs the step and clears it. A
worker that dies first leaves the step pending: when its lease ends, a worker of the job's
queue that registers its kind takes it under a new token (so two workers never run one step
at once: the old holder's token no longer matches) and runs it.

A step that ran is cleared and never runs again, also when the hook or a reporter raised
(that is logged: the step is a notification, not a job with retries). One cut short by a
crash runs again in another worker: the job id is the idempotency key. Each step runs under a
timeout a little shorter than its lease, so it has stopped before anyone else may take it.

Started by the worker, told of deaths by the worker (settlements) and the rescuer
(recoveries); calls the store's `failure_steps` (`_db/failure_steps.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from venturi import logs
from venturi._db.failures import is_database_failure
from venturi._executor import Registration
from venturi._outage import Outage, next_delay
from venturi._records import DueHook
from venturi._timeouts import wait_for
from venturi.codec import Codec
from venturi.context import Cancellation, CancelReason, Context
from venturi.errors import JobFailed
from venturi.jobs import FailedJob
from venturi.middleware import check_call
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

REPORTERS_SHARE = 0.2
REPORTERS_SHARE_MAX = 10.0
"""Of a failure step's time, the part kept for the reporters: a fifth, at most 10 s."""

Reporter = Callable[[BaseException, FailedJob], Awaitable[None] | None]
"""`reporter(error, job)`: told of every job that fails for good (sync or async)."""

LOOK_SLACK = 0.05
"""Seconds past the earliest lease's end before looking, so the lease is surely over."""
TAKE_LIMIT = 100
"""Most orphaned steps taken by one look."""


@dataclass(frozen=True, slots=True)
class _Death:
    id: uuid.UUID
    token: uuid.UUID
    error: BaseException | None


def has_hook(task_type: type[Any]) -> bool:
    """Whether the task class defines a `failed` hook."""
    return callable(getattr(task_type, "failed", None))


def check_hook(task_type: type[Any], where: str) -> None:
    """Refuse, when the task is registered, a `failed` hook that could not be called as it
    will be (`task.failed(error, ctx, app)`), rather than lose it when a job dies."""
    if not has_hook(task_type):
        return
    # Called on the task, so a plain function of the class also takes `self`.
    hook = inspect.getattr_static(task_type, "failed")
    plain = inspect.isfunction(hook)  # not a staticmethod or classmethod
    parameters = "failed(self, error, ctx, app)" if plain else "failed(error, ctx, app)"
    check_call(task_type.failed, where, parameters, count=4 if plain else 3)


class Undertaker:
    def __init__(
        self,
        store: PostgresStore,
        registry: Mapping[str, Registration],
        *,
        app: Any,
        codec: Codec,
        reporters: Sequence[Reporter],
        queues: list[str],
        worker: str,
        lease_s: float,
        poll_max: float,
        concurrency: int,
        outage: Outage | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._app = app
        self._codec = codec
        self._reporters = tuple(reporters)
        self._queues = queues
        self._kinds = list(registry)
        self._lease_s = lease_s
        self._poll_max = poll_max
        self._outage = outage or Outage(worker)
        self._slots = asyncio.Semaphore(concurrency)
        self._buried: list[_Death] = []
        self._wake = asyncio.Event()
        self._running: dict[asyncio.Task[None], DueHook] = {}
        self._closing = False
        self._stopped = asyncio.Event()
        self.ran = 0
        """Failure steps run to their end by this worker (for tests and logs)."""

    @property
    def _timeout(self) -> float:
        """Seconds a step may take: it must end before its lease does."""
        return self._lease_s - min(self._lease_s * 0.1, 5.0)

    @property
    def _reporters_share(self) -> float:
        """Seconds of the step kept for the reporters: a hook that runs out of time is cut
        short without taking the reporters' turn (the error tracker still hears of it)."""
        return min(self._timeout * REPORTERS_SHARE, REPORTERS_SHARE_MAX) if self._reporters else 0.0

    def bury(self, job_id: uuid.UUID, token: uuid.UUID, error: BaseException | None) -> None:
        """This worker made a job dead and the write committed: run its failure step."""
        self._buried.append(_Death(job_id, token, error))
        self._wake.set()

    async def run(self) -> None:
        """Run failure steps until `close()`: this worker's own as they come, and orphaned ones
        (their worker died first) when their leases end."""
        try:
            await self._run()
        finally:
            self._stopped.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        look_at = loop.time()  # look for orphaned steps at once
        delay = 0.0
        while True:
            epoch = self._outage.epoch
            try:
                if self._buried:
                    await self._take_buried()
                    continue
                if self._closing:
                    return
                if loop.time() >= look_at:
                    look_at = loop.time() + await self._look()
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("running failure hooks", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            delay = 0.0
            if not self._buried and not self._closing:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._wake.wait(), max(look_at - loop.time(), 0))

    async def close(self, grace: float) -> None:
        """Let the steps of this worker's last deaths start, wait up to `grace` seconds for
        running steps, then cancel the rest and hand them back (another worker runs them)."""
        self._closing = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            await wait_for(self._stopped.wait(), grace)
        if self._running:
            await asyncio.wait(list(self._running), timeout=grace)
        cut = list(self._running.items())
        for task, _ in cut:
            task.cancel()
        if cut:
            await asyncio.wait([t for t, _ in cut])
            with contextlib.suppress(Exception):
                await self._store.failure_steps.release(
                    [h.id for _, h in cut], [h.token for _, h in cut]
                )

    async def _take_buried(self) -> None:
        batch, self._buried = self._buried, []
        try:
            due = await self._store.failure_steps.take(
                [d.id for d in batch], [d.token for d in batch], lease_s=self._lease_s
            )
        except BaseException:
            self._buried[:0] = batch  # nothing taken: try again after the outage
            raise
        errors = {d.id: d.error for d in batch}
        elsewhere = [h for h in due if h.kind not in self._registry]
        if elsewhere:
            # Recovered here, but of a kind this worker does not run: leave the step to a
            # worker that knows the kind (the next to look takes it).
            await self._store.failure_steps.release(
                [h.id for h in elsewhere], [h.token for h in elsewhere]
            )
        for h in due:
            if h.kind in self._registry:
                self._start(h, errors.get(h.id))

    async def _look(self) -> float:
        """Take orphaned steps whose lease ended; returns seconds until the next look."""
        if not self._kinds:
            return self._poll_max
        due = await self._store.failure_steps.take_expired(
            queues=self._queues, kinds=self._kinds, lease_s=self._lease_s, limit=TAKE_LIMIT
        )
        for h in due:
            logger.warning(
                "job %s (%s): running the failure hook its worker did not run",
                logs.ShownId(h.id),
                h.kind,
                extra=logs.job_fields(h.id, h.kind, h.queue, h.run_count),
            )
            self._start(h, None)
        if len(due) == TAKE_LIMIT:
            return 0.0
        until = await self._store.failure_steps.next_expiry(self._queues, self._kinds)
        if until is None:
            return self._poll_max
        # Negative: expired but locked by another worker right now (or taken just above).
        return min(max(until, 0.0) + LOOK_SLACK, self._poll_max)

    def _start(self, hook: DueHook, error: BaseException | None) -> None:
        task = asyncio.create_task(self._attend(hook, error), name=f"venturi-failed-{hook.id}")
        self._running[task] = hook
        task.add_done_callback(self._running.pop)

    async def _attend(self, hook: DueHook, error: BaseException | None) -> None:
        job_id = ULID.from_bytes(hook.id.bytes)
        fields = logs.job_fields(hook.id, hook.kind, hook.queue, hook.run_count)
        if error is None:
            error = JobFailed(
                hook.last_error or "failed for good", job_id=str(job_id), error=hook.last_error
            )
        cancellation = Cancellation()
        async with self._slots:
            end = asyncio.get_running_loop().time() + self._timeout
            hook_time = self._timeout - self._reporters_share
            with logs.bound(fields):
                try:
                    async with asyncio.timeout_at(end - self._reporters_share):
                        await self._hook(hook, job_id, error, cancellation)
                except TimeoutError:
                    cancellation.request(CancelReason.TIMEOUT)
                    logger.error(
                        "job %s (%s): its failure hook took longer than %.1fs; cut short%s",
                        logs.ShownId(hook.id),
                        hook.kind,
                        hook_time,
                        ", the reporters run" if self._reporters else "",
                        extra=fields,
                    )
                try:
                    async with asyncio.timeout_at(end):
                        await self._report(hook, job_id, error)
                except TimeoutError:
                    logger.error(
                        "job %s (%s): its failure hook and reporters took longer than %.1fs "
                        "(the lease of the step); the reporters were cut short",
                        logs.ShownId(hook.id),
                        hook.kind,
                        self._timeout,
                        extra=fields,
                    )
            await self._finish(hook)
        self.ran += 1

    async def _hook(
        self, hook: DueHook, job_id: ULID, error: BaseException, cancellation: Cancellation
    ) -> None:
        reg = self._registry[hook.kind]
        if not has_hook(reg.task_type):
            return
        try:
            # With the job's id and kind: a sealed value opens only with them.
            task = self._codec.decode(reg.task_type, hook.payload, kind=hook.kind, job_id=hook.id)
            carry = None
            if reg.carry_type is not None:
                carry = (
                    reg.carry_type()
                    if hook.carry is None
                    else self._codec.decode(
                        reg.carry_type, hook.carry, kind=hook.kind, job_id=hook.id
                    )
                )
        except Exception as exc:
            logger.error(
                "job %s (%s): no failure hook: the payload does not decode (%s)",
                logs.ShownId(hook.id),
                hook.kind,
                exc,
            )
            return
        ctx: Context[Any] = Context(
            job_id=job_id,
            kind=hook.kind,
            queue=hook.queue,
            run_count=hook.run_count,
            history=hook.history,
            carry=carry,
            cancellation=cancellation,
            batch_id=None if hook.batch_id is None else ULID.from_bytes(hook.batch_id.bytes),
        )
        try:
            result = task.failed(error, ctx, self._app)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception(
                "job %s (%s): its failure hook raised", logs.ShownId(hook.id), hook.kind
            )

    async def _report(self, hook: DueHook, job_id: ULID, error: BaseException) -> None:
        if not self._reporters:
            return
        try:
            payload = self._codec.decode_any(hook.payload)
        except Exception:
            payload = hook.payload
        failed = FailedJob(
            id=job_id,
            queue=hook.queue,
            kind=hook.kind,
            payload=payload,
            error=hook.last_error,
            failed_at=hook.failed_at,
            run_count=hook.run_count,
            failures=hook.failures,
        )
        for reporter in self._reporters:
            try:
                result = reporter(error, failed)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception(
                    "job %s (%s): reporter %r raised", logs.ShownId(hook.id), hook.kind, reporter
                )

    async def _finish(self, hook: DueHook) -> None:
        """Clear the step, retrying through outages (until cancelled at shutdown)."""
        delay = 0.0
        while True:
            epoch = self._outage.epoch
            try:
                await self._store.failure_steps.finish([hook.id], [hook.token])
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("finishing a failure hook", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
                continue
            self._outage.ok(epoch)
            return
