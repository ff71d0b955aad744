"""The runner: the jobs a worker holds, and their runs.

A claimed job starts at once in a free slot, or waits in the prefetch buffer (its lease
renewed all the same) until one frees. Each run goes through the executor (middleware,
handler, outcome) and its settlement to the completer. The renewer and the producer read
what the runner holds; the worker drains it at shutdown.

A prefetched member of a batch that is cancelled before it starts is not run: the worker
hands it to the database, which cancels it if its batch is cancelled (`batch_cancelled`).

Called by the producer (`accept`), the renewer (`held`, `lose`), the notifier
(`batch_cancelled`, `recheck_batches`) and the worker (`drain`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

from ulid import ULID

from venturi import _current, logs
from venturi._completer import Completer
from venturi._db.failures import describe, is_database_failure
from venturi._executor import Policy, Registration, abandoned_after_timeout, crashed, execute
from venturi._hooks import HookSet
from venturi._records import ClaimedJob, Settlement
from venturi.context import Cancellation, CancelReason, ProgressCell
from venturi.hooks import Claimed, Finished, Started

logger = logging.getLogger("venturi.worker")

LEASE_MARGIN_MAX = 5.0
"""Seconds; a job whose lease could not be renewed is aborted this long (or a tenth of its
lease, if less) before the lease ends, so it has stopped before any other worker can take it."""
RENEW_FRACTION = 1 / 3
"""Leases are renewed after this fraction of their length: two renewals can fail in a row."""
CANCELLED_BATCH_MEMORY = 600.0
"""Seconds a cancelled batch is remembered, for its members whose claim's reply arrives
after the cancellation's notice (a claim that committed before the cancellation)."""
ABANDON_AFTER = 1.0
"""Seconds a handler gets to stop once its task is cancelled at shutdown; one that ignores
the cancellation is then abandoned so that shutdown ends (see `Runner.release_abandoned`)."""
SKIP_WAIT = 2.0
"""Seconds a shutdown waits for the skips of a cancelled batch's members in flight (one
statement each) before it cuts them off and hands their members back."""


def _ewma(previous: float | None, sample: float, alpha: float = 0.2) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)


class Held:
    """One job this worker holds: running, or prefetched and waiting for a slot. (A plain
    class with slots: one is made per job, on the hot path.)"""

    __slots__ = ("cancellation", "job", "lost", "progress", "reg", "renewed_at", "task")

    def __init__(self, job: ClaimedJob, reg: Registration, renewed_at: float) -> None:
        self.job = job
        self.reg = reg
        self.renewed_at = renewed_at
        """Loop time just before the claim or the last renewal was sent (so the lease surely
        lasts until `renewed_at + lease_s` by the database's clock too)."""
        self.cancellation = Cancellation()
        self.progress = ProgressCell()
        """The run's `ctx.progress`, sent with lease renewals."""
        self.task: asyncio.Task[None] | None = None
        self.lost = False

    @property
    def renewal_due(self) -> float:
        """Loop time at which the job's lease is next due for renewal."""
        return self.renewed_at + self.job.lease_s * RENEW_FRACTION

    @property
    def abort_at(self) -> float:
        """Loop time by which the job must have stopped unless its lease is renewed."""
        lease = self.job.lease_s
        return self.renewed_at + lease - min(lease * 0.1, LEASE_MARGIN_MAX)

    def stop(self, reason: CancelReason, note: str) -> None:
        """Abort the handler now (the executor turns this into a release with `note`)."""
        self.cancellation.force(reason, note)
        if self.task is not None:
            self.task.cancel()


class Runner:
    def __init__(
        self,
        *,
        app: Any,
        concurrency: int,
        policy: Policy,
        completer: Completer,
        hooks: HookSet,
    ) -> None:
        self._app = app
        self.concurrency = concurrency
        self._policy = policy
        self._completer = completer
        self._hooks = hooks
        self.running: dict[uuid.UUID, Held] = {}
        self.running_by_kind: Counter[str] = Counter()
        self.buffer: deque[Held] = deque()
        """Prefetched jobs: claimed (their leases renewed), not started yet."""
        self.successors: dict[uuid.UUID, Held] = {}
        """Jobs claimed again while an earlier run of theirs still runs here (a run aborted
        when its lease was lost, whose handler has not stopped yet): each starts when that
        run ends, never beside it. Their leases are renewed meanwhile, like prefetched ones."""
        self.handler_ewma: float | None = None
        self.handler_samples = 0
        self.starts = 0
        """Runs started so far (the claim loop yields to the ones a claim just started)."""
        self.slot_freed = asyncio.Event()
        self.changed = asyncio.Event()
        """Set when a job is taken on whose renewal is due before the renewer's next look
        (it recomputes its next renewal)."""
        self.renewer_looks_at = -math.inf
        """Loop time at which the renewer next looks at the held jobs: set by it before it
        waits (inf: it waits for a job), -inf while it is not waiting (it looks before it
        waits). A job taken on wakes it only if the job's renewal is due sooner, so the
        usual claim, whose leases are due after those held already, wakes nothing."""
        self.skipping: list[Held] = []
        """Prefetched members of a cancelled batch, held back while the database cancels
        them (`batch_skip_held`); the ones whose batch still runs go back to the buffer."""
        self._cancelled_batches: dict[uuid.UUID, float] = {}
        """Batches cancelled lately, with the loop time at which to forget them."""
        self._skips: set[asyncio.Task[None]] = set()
        self.idle = asyncio.Event()
        """Set while the runner holds no job (nothing running, nothing prefetched)."""
        self.idle.set()
        self.stopping = False
        self._abandoned: list[asyncio.Task[None]] = []
        self.release_abandoned = False
        """Whether the jobs of handlers given up on at shutdown are settled (released, or
        failed past their timeout): only when the process ends with `run()` (`venturi
        worker`), which ends those handlers too. Otherwise they may run on in this process,
        and their jobs stay claimed until their leases end: never run elsewhere beside them."""

    @property
    def free(self) -> int:
        return self.concurrency - len(self.running)

    @property
    def abandoned(self) -> int:
        return sum(1 for t in self._abandoned if not t.done())

    def held(self) -> Iterator[Held]:
        """Every job held and not lost: running, then prefetched (waiting ones too)."""
        for h in self.running.values():
            if not h.lost:
                yield h
        for h in self.buffer:
            if not h.lost:
                yield h
        for h in self.successors.values():
            if not h.lost:
                yield h
        for h in self.skipping:
            if not h.lost:
                yield h

    async def flushed(self) -> None:
        """Wait until the outcomes of the jobs run so far are written."""
        await self._completer.flushed()

    def owned_ids(self) -> list[uuid.UUID]:
        """Ids of the jobs this worker holds and has not lost (running, prefetched, waiting),
        and of those whose outcome it has still to write: its rescuer leaves them alone. A
        lost one (its lease not renewed in time) is left to recovery, as any other."""
        return [*(h.job.id for h in self.held()), *self._completer.unwritten()]

    def held_ids(self) -> list[uuid.UUID]:
        """Ids of every job the database should show as claimed by this worker."""
        return [
            *self.running,
            *(h.job.id for h in self.buffer),
            *self.successors,
            *(h.job.id for h in self.skipping),
            *self._completer.unwritten(),
        ]

    def accept(
        self, job: ClaimedJob, reg: Registration, claimed_at: float, replied_at: float
    ) -> None:
        """Start a claimed job now, or hold it in the prefetch buffer. `claimed_at` and
        `replied_at` are the loop's time when its claim was sent and when the reply came."""
        held = Held(job, reg, claimed_at)
        self.idle.clear()
        if self._hooks.active:
            self._hooks.claimed(
                Claimed(
                    ULID.from_bytes(job.id.bytes), job.kind, job.queue, job.run_count, job.waited_s
                )
            )
        if replied_at >= held.abort_at:
            # The claim's reply came too late (a connection that stalled): the lease may be
            # over and the job recovered elsewhere. Never start it; hand it back unrun.
            logger.warning(
                "job %s (%s): its claim's reply arrived as its lease was ending; handed back",
                logs.ShownId(job.id),
                job.kind,
                extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
            )
            self._completer.settle_nowait(Settlement.of(job, "returned"))
            self._note_if_idle()
            return
        if job.id in self.running:
            # The earlier run lost its lease and was recovered, but its handler has not
            # stopped: this claim waits for it (two runs of one job never overlap here).
            self.successors[job.id] = held
        elif job.batch_id is not None and self._batch_cancelled_lately(job.batch_id):
            self._skip([held])  # its claim committed before the cancellation did
        elif len(self.running) < self.concurrency and not self.buffer and not self.stopping:
            self._start(held)
        else:
            self.buffer.append(held)  # (stopping: drain() hands it back unrun)
        if held.renewal_due < self.renewer_looks_at:
            self.changed.set()  # a lease to renew sooner (a buffered job's start changes none)

    def refuse(self, job: ClaimedJob, note: str) -> None:
        """Fail a claimed job for good without running it (its kind has no task here)."""
        if self._hooks.active:
            self._hooks.claimed(
                Claimed(
                    ULID.from_bytes(job.id.bytes), job.kind, job.queue, job.run_count, job.waited_s
                )
            )
        logger.warning(
            "job %s (%s): %s; failed for good",
            logs.ShownId(job.id),
            job.kind,
            note,
            extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
        )
        self._completer.settle_nowait(Settlement.of(job, "dead", note=note))

    def _start(self, held: Held) -> None:
        job = held.job
        self.running[job.id] = held
        self.running_by_kind[job.kind] += 1
        self.starts += 1
        if self._hooks.active:
            self._hooks.started(
                Started(ULID.from_bytes(job.id.bytes), job.kind, job.queue, job.run_count)
            )
        # The id in hex: str() of a UUID costs three times as much (~0.6 us a job).
        held.task = asyncio.create_task(self._execute(held), name=f"venturi-job-{job.id.hex}")

    async def _execute(self, held: Held) -> None:
        job = held.job
        loop = asyncio.get_running_loop()
        began = loop.time()
        _current.run.set(_current.Run(self._completer.store, job))  # this run's task only
        try:
            try:
                settlement = await execute(
                    job, held.reg, self._app, self._policy, held.cancellation, held.progress
                )
            except Exception as exc:  # a bug: the job must not stay claimed until its lease
                logger.exception(
                    "job %s (%s): venturi failed running it; recorded as a failed run",
                    logs.ShownId(job.id),
                    job.kind,
                    extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
                )
                settlement = crashed(job, self._policy, exc, loop.time() - began)
            self.handler_ewma = _ewma(self.handler_ewma, loop.time() - began)
            self.handler_samples += 1
            if self._hooks.active:
                self._hooks.finished(
                    Finished(
                        ULID.from_bytes(job.id.bytes),
                        job.kind,
                        job.queue,
                        job.run_count,
                        settlement.outcome,
                        settlement.duration_s,
                    )
                )
            if self.running.get(job.id) is held:  # else abandoned at shutdown: released
                await self._completer.settle(settlement)
        finally:
            self._forget(held)
            successor = self.successors.pop(job.id, None)
            if successor is not None and not successor.lost:
                if self.stopping:  # drain() has handed back the rest already
                    self._completer.settle_nowait(Settlement.of(successor.job, "returned"))
                else:
                    self.buffer.appendleft(successor)  # it has waited: first in line
            self._start_buffered()
            self._note_if_idle()
            self.slot_freed.set()

    def _start_buffered(self) -> None:
        while self.buffer and not self.stopping and len(self.running) < self.concurrency:
            nxt = self.buffer.popleft()
            if not nxt.lost:
                self._start(nxt)

    def _note_if_idle(self) -> None:
        if not self.running and not self.skipping and all(h.lost for h in self.buffer):
            self.idle.set()

    # -- members of cancelled batches --------------------------------------------------

    def batch_cancelled(self, batch_id: uuid.UUID) -> None:
        """A batch was cancelled (its notice): skip its members held here, not started."""
        now = asyncio.get_running_loop().time()
        for known, forget_at in list(self._cancelled_batches.items()):
            if forget_at <= now:
                del self._cancelled_batches[known]
        self._cancelled_batches[batch_id] = now + CANCELLED_BATCH_MEMORY
        self._skip_members(batch_id)

    def recheck_batches(self) -> None:
        """The notices may have been missed (LISTEN reconnected): ask about every batch
        member held here, not started; the database cancels those whose batch is."""
        self._skip_members(None)

    def _batch_cancelled_lately(self, batch_id: uuid.UUID) -> bool:
        forget_at = self._cancelled_batches.get(batch_id)
        return forget_at is not None and forget_at > asyncio.get_running_loop().time()

    def _skip_members(self, batch_id: uuid.UUID | None) -> None:
        """Skip the buffered members of `batch_id` (None: of any batch)."""
        members = [
            h
            for h in self.buffer
            if h.job.batch_id is not None and batch_id in (None, h.job.batch_id)
        ]
        if members:
            for h in members:
                self.buffer.remove(h)
            self._skip(members)

    def _skip(self, members: list[Held]) -> None:
        if self.stopping:  # drain() hands back what is not started
            for h in members:
                if not h.lost:
                    self._completer.settle_nowait(Settlement.of(h.job, "returned"))
            return
        self.idle.clear()
        self.skipping.extend(members)
        task = asyncio.create_task(self._skip_held(members), name="venturi-batch-skip")
        self._skips.add(task)
        task.add_done_callback(self._skips.discard)

    async def _skip_held(self, members: list[Held]) -> None:
        live = [h for h in members if not h.lost]
        skipped: set[uuid.UUID] = set()
        failed = False
        try:
            if live:
                skipped = await self._completer.store.batches.skip_held(
                    [h.job.id for h in live],
                    [h.job.claim_token for h in live],
                    [h.job.batch_id for h in live if h.job.batch_id is not None],
                )
        except (Exception, asyncio.CancelledError) as exc:
            # It may have committed with its reply lost: hand them back unrun (a hand-back
            # of a member it cancelled is dropped by its claim token); a claim takes the
            # others again, and asks again. Cancelled: cut off by `drain` at shutdown.
            failed = True
            if isinstance(exc, asyncio.CancelledError):
                logger.warning("shutdown: skipping members of a cancelled batch took too long")
            elif is_database_failure(exc):
                logger.warning("could not skip members of a cancelled batch: %s", describe(exc))
            else:
                logger.exception("could not skip members of a cancelled batch")
        for h in members:
            self.skipping.remove(h)
        for h in reversed(members):
            if failed or (self.stopping and h.job.id not in skipped):
                if not h.lost:
                    self._completer.settle_nowait(Settlement.of(h.job, "returned"))
            elif h.job.id in skipped:
                logger.info(
                    "job %s (%s): not started: its batch %s was cancelled",
                    logs.ShownId(h.job.id),
                    h.job.kind,
                    logs.ShownId(h.job.batch_id) if h.job.batch_id else "",
                    extra=logs.job_fields(h.job.id, h.job.kind, h.job.queue, h.job.run_count),
                )
            elif not h.lost:
                self.buffer.appendleft(h)  # they have waited: first in line
        self._start_buffered()
        self._note_if_idle()
        self.slot_freed.set()

    def _forget(self, held: Held) -> None:
        """Stop counting a running job (once, whichever of its exit or abandonment is first)."""
        if self.running.get(held.job.id) is held:
            del self.running[held.job.id]
            self.running_by_kind[held.job.kind] -= 1

    def lose(self, held: Held, why: str) -> None:
        """This worker no longer (or soon no longer) owns the job: stop it."""
        held.lost = True
        if self.running.get(held.job.id) is not held:
            return  # prefetched, never started: dropped when dequeued; recovery takes it
        logger.warning(
            "job %s (%s): aborted: %s",
            logs.ShownId(held.job.id),
            held.job.kind,
            why,
            extra=logs.job_fields(held.job.id, held.job.kind, held.job.queue, held.job.run_count),
        )
        held.stop(CancelReason.LEASE_LOST, f"aborted: {why}")

    async def drain(
        self, *, graceful: bool, shutdown_timeout: float, hurry: asyncio.Event | None = None
    ) -> None:
        """Hand back prefetched jobs, ask running ones to wind down, wait up to the grace
        period (or until `hurry` is set), abort and release stragglers, and give up on
        handlers that ignore even that."""
        self.stopping = True
        if self._skips:  # (no new one starts now: `_skip` hands members back)
            # One statement each, normally quick; through an outage or behind a lock, cut
            # off: its members are handed back unrun (a member it did skip keeps its outcome:
            # the hand-back's claim token no longer matches).
            _, late = await asyncio.wait(self._skips, timeout=SKIP_WAIT)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        waiting = [*self.successors.values()]
        self.successors.clear()
        while self.buffer:
            waiting.append(self.buffer.popleft())
        for h in waiting:
            if not h.lost:
                # Past the buffer's bound if need be: nothing else grows it now, and waiting
                # for room through an outage would hold the shutdown until it ends.
                self._completer.settle_nowait(Settlement.of(h.job, "returned"))
        if not self.running:
            return
        logger.info("shutdown: %d jobs running, asking them to wind down", len(self.running))
        for held in self.running.values():
            held.cancellation.request(CancelReason.SHUTDOWN)
        tasks = [h.task for h in self.running.values() if h.task is not None]
        if graceful and shutdown_timeout > 0:
            ended = asyncio.ensure_future(asyncio.wait(tasks, timeout=shutdown_timeout))
            hurried = asyncio.ensure_future((hurry or asyncio.Event()).wait())
            try:
                await asyncio.wait({ended, hurried}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                hurried.cancel()
            if hurry is not None and hurry.is_set():
                logger.warning("shutdown: told to stop now; aborting the running jobs")
            pending = {t for t in tasks if not t.done()}
        else:
            pending = {t for t in tasks if not t.done()}
        stragglers = [h for h in self.running.values() if h.task in pending]
        for h in stragglers:
            h.stop(CancelReason.SHUTDOWN, "aborted at shutdown after the grace period")
        if pending:
            logger.warning("shutdown: aborting %d jobs after the grace period", len(pending))
            # Executors turn the abort into a release settlement; a handler that swallows
            # the cancellation is given up on, so shutdown always ends.
            _, stubborn = await asyncio.wait(pending, timeout=ABANDON_AFTER)
            for h in stragglers:
                if h.task in stubborn:
                    self._abandon(h)

    def _abandon(self, held: Held) -> None:
        """Stop waiting for a handler that ignores cancellation; settle its job only if the
        process ends with `run()` (see `release_abandoned`)."""
        job = held.job
        self._forget(held)
        if held.task is not None:
            self._abandoned.append(held.task)
        logger.error(
            "shutdown: job %s (%s): the handler ignored cancellation for %.0fs; %s",
            logs.ShownId(job.id),
            job.kind,
            ABANDON_AFTER,
            "released without it (the process ends with the worker, and the handler with it)"
            if self.release_abandoned
            else "given up on, its job left claimed: the handler may still be running in this "
            "process, so the job is recovered when its lease ends, not run elsewhere beside it",
            extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
        )
        if not self.release_abandoned:
            return
        # Buffered synchronously: the completer's close() flushes it. A run past its timeout
        # (before the shutdown or during its grace period) is a failed execution, as it would
        # have been had it exited: a release would never count it as an attempt (redeployed
        # often, never dead).
        if held.cancellation.timed_out:
            settlement = abandoned_after_timeout(job, self._policy)
        else:
            settlement = Settlement.of(
                job, "released", note="the handler ignored cancellation at shutdown; abandoned"
            )
        self._completer.settle_nowait(settlement)
