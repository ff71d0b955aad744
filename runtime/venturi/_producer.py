"""The producer: the claim loop of a worker's queues.

It claims for free slots, plus (only while handlers are shorter than a claim's round trip)
one batch ahead, from the worker's queues in their order, in one statement per group of
kinds (capped kinds are claimed on their own, never beyond their cap). Between claims it
waits for a notification, the next due job (a timer, so delayed jobs start on time), or a
freed slot when capacity is what holds work back; `poll_max` only bounds a missed
notification. A paused queue is skipped by the claim itself; the producer only keeps a timer
to the first pause of its queues that ends by itself (re-read when a pause or resume is
announced, and after LISTEN reconnects), so an idle worker claims again when it ends.

A claim that fails in flight may have committed with its reply lost: before claiming again
the producer reconciles what the database says the worker holds with what the runner holds,
and releases the difference.

Started by the worker; calls `PostgresStore.claim`, `next_due`, `next_resume` and
`release_unheld`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from venturi import logs
from venturi._claims import (
    at_cap,
    claim_groups,
    claim_room,
    plan_slots,
    prefetch_depth,
    spread_order,
)
from venturi._db.failures import describe, is_database_failure
from venturi._db.run import reaped
from venturi._executor import Registration
from venturi._outage import Outage, next_delay
from venturi._records import ClaimedJob, NextDue
from venturi._runner import Runner, _ewma
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

CLAIM_STOP_WAIT = 2.0
"""Seconds a stopping worker lets the claim in flight finish before it cancels it."""
PASSED_OVER_FIRST = 0.25
PASSED_OVER_MAX = 5.0
"""Seconds after a claim that passed over a due job (its row held by another transaction) at
which the producer claims again: doubling from the first to the most while the row stays
held (`poll_max`, if shorter, bounds it too)."""

ANNOUNCED_MARGIN = 1.0
"""Seconds before an announced lease end after which a claim announces its own again: the
rescuers' look at that end must come after the claim has committed, to see its lease."""


@dataclass(frozen=True, slots=True)
class RunLimits:
    """When the producer stops claiming on its own (the worker then finishes what it holds
    and returns): never, by default."""

    once: bool = False
    """After the jobs due now: stop at the first claim that finds fewer than it asked for."""
    stop_when_empty: bool = False
    """When nothing of the worker's is pending any more, due now or later, and nothing runs."""
    max_jobs: int | None = None
    """After claiming this many jobs."""

    @property
    def any(self) -> bool:
        return self.once or self.stop_when_empty or self.max_jobs is not None


class Producer:
    def __init__(
        self,
        store: PostgresStore,
        runner: Runner,
        registry: Mapping[str, Registration],
        *,
        queues: list[str],
        worker: str,
        pod: str | None,
        lease: float,
        poll_max: float,
        priority_ratio: int | None,
        prefetch: bool,
        outage: Outage,
        limits: RunLimits = RunLimits(),
        traced: bool = False,
        every_kind: bool = False,
    ) -> None:
        self._store = store
        self._runner = runner
        self._registry = registry
        self._caps = {kind: reg.cap for kind, reg in registry.items()}
        self._every_kind = every_kind
        """Claim every kind of the queues, and fail those without a task (unknown_kinds)."""
        self._capped = [kind for kind, cap in self._caps.items() if cap is not None]
        self.queues = queues
        self._worker = worker
        self._pod = pod
        self._lease = lease
        self._poll_max = poll_max
        self._ratio = priority_ratio
        self._prefetch = prefetch
        self._outage = outage
        self._limits = limits
        self._traced = traced
        """Claims also read each job's trace context (the worker's middleware traces)."""
        self._claim_ewma: float | None = None
        self._announced: dict[str, float] = {}
        """Per queue, the loop time by which a lease this worker's claims announced ends: every
        rescuer of that queue looks then, and reads every lease claimed until then."""
        self._slot_counter = 0
        self._passed_over = 0.0
        """The wait before claiming again for a due job the last claims passed over (0: none)."""
        self._unsure = False
        """A claim failed in flight: it may have committed. Reconcile before claiming again."""
        self.claimed = 0
        self.wake = asyncio.Event()
        self.stopping = False
        self._claiming = False
        """The loop is claiming (or reconciling before a claim): cut off, it may commit."""
        self._pauses_stale = True
        """The pauses of our queues may have changed: re-read when the next one ends."""
        self._resume_at: float | None = None
        """Loop time when the first pause of our queues that has an until ends (None: none)."""

    def notified(self, kind: str) -> None:
        """A job of `kind` became claimable (an empty kind: maybe any)."""
        if not kind:
            self._pauses_stale = True  # LISTEN reconnected: a pause change may be missed
        if not kind or kind in self._registry or self._every_kind:
            self.wake.set()

    def pauses_changed(self) -> None:
        """One of our queues was paused or resumed: claim again, re-read the pauses."""
        self._pauses_stale = True
        self.wake.set()

    async def run(self) -> None:
        runner = self._runner
        kinds_all = list(self._registry)
        retry_delay = 0.0
        while not self.stopping:
            # Cleared before looking at capacity, so a slot freed during the awaits below
            # is never missed.
            runner.slot_freed.clear()
            want = claim_room(
                free=runner.free,
                depth=self._prefetch_depth(),
                buffered=len(runner.buffer),
                concurrency=runner.concurrency,
            )
            if self._limits.max_jobs is not None:
                want = min(want, self._limits.max_jobs - self.claimed)
                if self.claimed >= self._limits.max_jobs:
                    return  # the worker finishes what it holds, then returns
            kinds = [k for k in kinds_all if not at_cap(k, self._caps, runner.running_by_kind)]
            timeout = self._poll_max
            # Drained: the claim found fewer jobs than each of its groups had room for, and no
            # kind was left out at its cap; a slot freed meanwhile would find nothing more (a
            # job written since notifies).
            drained = False
            # Capacity holds work back when there is no room to claim (every slot is taken, the
            # prefetch buffer covers the next ones, or every kind is at its cap): then a
            # notification says nothing the claim after the next freed slot will not see, and
            # must not end the wait below (the loop would spin until a slot frees). Whatever
            # makes room (a run's end, and with it a buffered job's start) sets `slot_freed`.
            claimable = want > 0 and bool(kinds or self._every_kind)
            self.wake.clear()
            if claimable:
                epoch = self._outage.epoch
                self._claiming = True
                try:
                    if self._unsure:
                        await self._reconcile()
                    claimed, exhausted = await self._claim(kinds, want)
                except Exception as exc:
                    self._claiming = False
                    if not is_database_failure(exc):
                        raise
                    # The claim may have committed with its reply lost: reconcile first.
                    self._unsure = True
                    self._outage.failed("claiming", exc)
                    retry_delay = next_delay(retry_delay)
                    await self._outage.wait(retry_delay)
                    continue
                self._claiming = False
                self._outage.ok(epoch)
                retry_delay = 0.0
                if claimed:
                    self._passed_over = 0.0  # the next held row backs off from the start
                if len(claimed) >= want:
                    continue  # maybe more: claim again once there is room
                some_capped = len(kinds) < len(kinds_all)
                drained = exhausted and not some_capped
                if self._limits.once and not some_capped:
                    return  # nothing more is due now
                due = None
                if self._limits.stop_when_empty and not some_capped and runner.idle.is_set():
                    # Nothing runs; once its outcomes are written (a failure may have become
                    # a retry), nothing due now or later (held rows count) means nothing is
                    # left to do.
                    if any(runner.held_ids()):
                        await runner.flushed()
                        continue
                    due = await self._next_due(kinds)
                    if due.in_s is None and not due.held:
                        return
                if due is None:
                    due = await self._next_due(kinds)
                if due.in_s is not None:
                    timeout = min(timeout, max(due.in_s, 0.0))
                if due.held and drained:
                    # A due job this claim passed over (it looked at every kind and came
                    # back short): another transaction holds its row. Its commit notifies if
                    # it wrote the job, but a rollback, or a lock without a write, notifies
                    # nobody: look again soon, backing off while the row stays held.
                    self._passed_over = min(
                        self._passed_over * 2 or PASSED_OVER_FIRST, PASSED_OVER_MAX
                    )
                    timeout = min(timeout, self._passed_over)
                else:
                    self._passed_over = 0.0
                resume = await self._next_resume()
                if resume is not None:
                    timeout = min(timeout, resume)
            if runner.slot_freed.is_set() and runner.free > 0 and not drained:
                continue  # a job finished during this round: its slot may unblock work
            # Wait for a notification (only when this round could claim: otherwise only a
            # freed slot makes room, see above), the next due job, or (when capacity is what
            # holds work back: no room, the worker full, a kind at its cap) a freed slot.
            # With a run limit, a finished job may be what ends the run: look again then,
            # also when it finished during this round's reads (the runner is idle now, and
            # `slot_freed`, cleared at the round's start, is set: the wait ends at once).
            waiters = [asyncio.ensure_future(self.wake.wait())] if claimable else []
            full = runner.free <= 0
            capped = any(at_cap(k, self._caps, runner.running_by_kind) for k in kinds_all)
            if not claimable or full or capped or self._limits.any:
                waiters.append(asyncio.ensure_future(runner.slot_freed.wait()))
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _prefetch_depth(self) -> int:
        runner = self._runner
        if not self._prefetch or runner.handler_samples < runner.concurrency:
            return 0  # warm up first: a few runs say little
        return prefetch_depth(runner.concurrency, runner.handler_ewma, self._claim_ewma)

    async def _claim(self, kinds: list[str], limit: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to `limit` jobs, group by group (see `claim_groups`); each group's slots
        are split by tier for anti-starvation. Also says whether the claim exhausted what it
        may take: every kind not at its cap was looked at, and every group came back with
        fewer jobs than it had room for (a capped kind's room is what its cap leaves)."""
        runner = self._runner
        groups = claim_groups(
            kinds=kinds,
            caps=self._caps,
            running=runner.running_by_kind,
            free=runner.free,
            limit=limit,
            every_kind=self._every_kind,
        )
        claimed_all: list[ClaimedJob] = []
        # A capped kind left without a request (no free slot for it) was not looked at.
        exhausted = all(
            any(k in (ks or ()) for ks, _ in groups) for k in kinds if self._caps.get(k) is not None
        )
        loop = asyncio.get_running_loop()
        for group_kinds, group_limit in groups:
            room = min(group_limit, limit - len(claimed_all))
            if group_kinds is not None and self._caps.get(group_kinds[0]) is not None:
                # A capped kind is never claimed ahead: its room is the slots still free
                # now, after the jobs of this round's earlier requests took theirs.
                room = min(room, runner.free - len(runner.buffer))
            if room <= 0:
                exhausted = False  # not looked at
                continue
            low, normal = plan_slots(self._slot_counter, room, self._ratio)
            began = loop.time()
            claimed = await self._store.claim(
                queues=self.queues,
                kinds=group_kinds,
                skip_kinds=self._capped if group_kinds is None else (),
                limit=room,
                worker=self._worker,
                pod=self._pod,
                default_lease_s=self._lease,
                reserved_low=low,
                reserved_normal=normal,
                held_lease_s=(known := self._known_lease_end(began)),
                traced=self._traced,
            )
            replied = loop.time()
            self._claim_ewma = _ewma(self._claim_ewma, replied - began)
            self._note_announced(claimed, known, began)
            exhausted = exhausted and len(claimed) < room
            if len(claimed) > 1:  # in the order to start them (the reserved ones spread)
                order = spread_order([(j.queue, j.priority, j.reserved) for j in claimed])
                claimed = [claimed[i] for i in order]
            self._slot_counter += len(claimed)
            self.claimed += len(claimed)
            if claimed and logger.isEnabledFor(logging.DEBUG):  # one look per claim
                _log_claimed(claimed)
            starts = runner.starts
            for job in claimed:
                reg = self._registry.get(job.kind)
                if reg is None:  # a worker that fails unknown kinds took it
                    runner.refuse(job, f"no task registered for kind {job.kind!r}")
                else:
                    runner.accept(job, reg, began, replied)
            claimed_all.extend(claimed)
            if runner.starts != starts:
                # Jobs this reply started go first: the loop's next database call (the
                # next-due read after a short claim, a prefetch claim, the next group's)
                # would spend its setup and send before they ran (~0.2-0.3 ms of an idle
                # worker's pickup). Not in a steady drain, whose replies fill the buffer.
                await asyncio.sleep(0)
        return claimed_all, exhausted

    def _known_lease_end(self, now: float) -> float | None:
        """Seconds until the earliest lease end the rescuers of every one of our queues
        already know of: the shortest lease this worker holds, or a lease end it announced
        that is still more than `ANNOUNCED_MARGIN` ahead (None: none). A claim whose leases
        end sooner announces them (see `Rescuer`); one whose leases end later needs not, as
        the rescuers' look at the known end reads them. So an idle worker that takes one job
        at a time announces about once per lease, not once per job."""
        ends = [h.renewed_at + h.job.lease_s for h in self._runner.held()]
        for queue, end in list(self._announced.items()):
            if end - now <= ANNOUNCED_MARGIN:
                del self._announced[queue]
        if self._announced and all(q in self._announced for q in self.queues):
            ends.append(min(self._announced.values()))
        return min(ends) - now if ends else None

    def _note_announced(self, claimed: list[ClaimedJob], known: float | None, at: float) -> None:
        """Remember the lease ends this claim announced: per queue, the claim function
        announces its shortest lease when it ends sooner than `known` (or `known` is None)."""
        shortest: dict[str, float] = {}
        for job in claimed:
            shortest[job.queue] = min(job.lease_s, shortest.get(job.queue, job.lease_s))
        for queue, lease_s in shortest.items():
            if known is None or lease_s < known:
                end = at + lease_s
                self._announced[queue] = min(end, self._announced.get(queue, end))

    async def _next_due(self, kinds: list[str]) -> NextDue:
        try:
            if self._every_kind:
                return await self._store.next_due_in_queues(self.queues)
            return await self._store.next_due(kinds, queues=self.queues)
        except Exception as exc:
            if not is_database_failure(exc):
                raise
            self._outage.failed("reading the next due time", exc)
            return NextDue(min(1.0, self._poll_max), False)  # look again soon

    async def _next_resume(self) -> float | None:
        """Seconds until the first pause of our queues that has an until ends (None: none
        does), read again only after a pause change or once that pause has ended."""
        loop = asyncio.get_running_loop()
        if self._resume_at is not None and loop.time() >= self._resume_at:
            self._pauses_stale = True  # it has ended (the claim above saw so): read the next
        if self._pauses_stale:
            try:
                seconds = await self._store.next_resume(self.queues)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("reading the queues' pauses", exc)
                return min(1.0, self._poll_max)  # look again soon
            self._pauses_stale = False
            self._resume_at = None if seconds is None else loop.time() + max(seconds, 0.0)
        if self._resume_at is None:
            return None
        return max(self._resume_at - loop.time(), 0.0)

    async def stop(self, loop_task: asyncio.Task[None]) -> None:
        """End the claim loop `loop_task` at shutdown without losing a claim in flight: it
        ends after that claim (whose jobs, committed, the runner then holds and hands back
        unrun), within `CLAIM_STOP_WAIT`; cancelled past that (a claim stuck on a lock or a
        lost server), or after a claim whose reply was lost, what the database says this
        worker holds and it does not is handed back (best effort: the database may be away)."""
        self.stopping = True
        # Whichever the loop waits for: a notification, or (no room to claim) a freed slot,
        # which a notification must not end.
        self.wake.set()
        self._runner.slot_freed.set()
        if not loop_task.done():
            await asyncio.wait({loop_task}, timeout=CLAIM_STOP_WAIT)
        if not loop_task.done():
            loop_task.cancel()
            if self._claiming:
                self._unsure = True  # the claim cut off may have committed
        await asyncio.gather(loop_task, return_exceptions=True)
        if not self._unsure:
            return
        # The claim given up on, cancelled on the server first: it has then committed or not,
        # and what the check reads is what it did.
        await reaped()
        try:
            # Bounded too: behind a table lock it would wait as long as the lock is held.
            async with asyncio.timeout(CLAIM_STOP_WAIT):
                await self._reconcile("claimed as the worker stopped; handed back unrun")
        except Exception as exc:
            if not is_database_failure(exc):
                raise
            logger.warning(
                "shutdown: could not check for a claim in flight (%s); if it committed, its "
                "jobs come back after their leases",
                describe(exc) if not isinstance(exc, TimeoutError) else "no answer in time",
            )

    async def _reconcile(
        self, note: str = "claimed while the connection failed; the claim's reply was lost"
    ) -> None:
        """Release what the database says this worker holds and it does not: claims that
        committed while their reply was lost."""
        released = await self._store.release_unheld(
            worker=self._worker, held=self._runner.held_ids(), note=note
        )
        self._unsure = False
        for job_id, kind in released:
            logger.warning(
                "job %s (%s): released a claim whose reply was lost",
                logs.ShownId(job_id),
                kind,
                extra={"job_id": logs.id_text(job_id), "kind": kind},
            )


def _log_claimed(claimed: list[ClaimedJob]) -> None:
    for job in claimed:
        logger.debug(
            "claimed job %s (%s), run %d, due %.3fs ago",
            logs.ShownId(job.id),
            job.kind,
            job.run_count,
            job.waited_s,
            extra=logs.job_fields(job.id, job.kind, job.queue, job.run_count),
        )
