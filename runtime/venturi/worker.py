"""`Worker`: claims jobs, runs them through their handlers, settles their outcomes.

    worker = Worker(app, store, concurrency=16)
    worker.register(SendEmail, send_email)          # or: worker.register(SendEmail)
    worker.register(Reindex, reindex, cap=2)        # at most 2 at once in this worker
    await worker.run(shutdown_event)                # until the event is set, then drains

One worker runs five loops: the claim loop and lease renewal (here), the completer
(batched settlements), the notifier (LISTEN wake-ups) and the rescuer (expired leases).
The claim loop claims for free slots, plus (only while handlers are shorter than a claim's
round trip) one batch ahead; capped kinds are never claimed beyond their cap, so their
work stays pending rather than claimed-and-idle.

No loop ends because the database went away: each retries (backoff capped at a second,
the outage logged once) and resumes as soon as any of them gets through. After a claim
failed mid-flight the worker reconciles what the database says it holds with what it runs,
and hands back the difference (a claim whose reply was lost). A job whose lease cannot be
renewed is aborted before the lease ends, so no other worker can run it meanwhile. Only a
bug in venturi ends `run()`, with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from venturi._completer import Completer
from venturi._db.failures import is_configuration_error, is_database_failure
from venturi._executor import Abort, Policy, Registration, execute
from venturi._hooks import metrics_hooks
from venturi._notifier import Notifier
from venturi._outage import Outage, next_delay
from venturi._records import ClaimedJob, Settlement
from venturi._rescuer import Rescuer
from venturi._settings import DEFAULT_QUEUE, worker_settings
from venturi._slots import plan_slots
from venturi.backoff import DEFAULT_BACKOFF, Backoff, Seconds
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.context import Context
from venturi.errors import DuplicateKindError
from venturi.identity import WorkerIdentity
from venturi.outcome import Outcome, PanicPolicy
from venturi.postgres import PostgresStore
from venturi.task import Task, carry_type_of, kind_of

logger = logging.getLogger(__name__)

AppT = TypeVar("AppT")
T = TypeVar("T", bound=Task[Any])

DEFAULT_POLL_MAX = 30.0
"""Seconds; the longest idle wait. Only a missed notification ever waits this long."""
DEFAULT_LEASE = 15 * 60.0
"""Seconds; a claim's lease. Renewed while the handler runs, so it bounds crash recovery."""
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
"""Seconds handlers get to wind down at shutdown before they are aborted and released."""
DEFAULT_JITTER_FRACTION = 0.5
DEFAULT_BACKSTOP = 25
"""Failed executions before a job goes dead if its task never decides to give up."""
DEFAULT_PRIORITY_RATIO = 4
PREFETCH_MAX_FACTOR = 8
"""Most jobs held ahead of free slots, as a multiple of concurrency (short jobs only)."""
RENEW_FRACTION = 1 / 3
"""Leases are renewed after this fraction of their length: two renewals can fail in a row."""
LEASE_MARGIN_MAX = 5.0
"""Seconds; a job whose lease could not be renewed is aborted this long (or a tenth of its
lease, if less) before the lease ends, so it has stopped before any other worker can take it."""
ABANDON_AFTER = 1.0
"""Seconds a handler gets to stop once its task is cancelled at shutdown; one that ignores
the cancellation is then abandoned (its job released) so that `run()` returns."""
MIN_POOL_SIZE = 2
"""Fewest pool connections a worker runs on (a `from_pool` store also LISTENs on one)."""


def _ewma(previous: float | None, sample: float, alpha: float = 0.2) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)


def default_concurrency() -> int:
    """`max(1, min(8, cores // 2))`: conservative; raise it for I/O-bound handlers."""
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def prefetch_depth(concurrency: int, handler_s: float | None, claim_s: float | None) -> int:
    """How many jobs to hold ahead of free slots: enough to keep every slot busy for one
    claim round trip (at least `concurrency`, at most `PREFETCH_MAX_FACTOR` times it), but
    only while handlers run shorter than that round trip (then the round trip, not the work,
    is the limit); none for long jobs, which other workers should get instead."""
    if handler_s is None or claim_s is None or handler_s >= claim_s:
        return 0
    per_round_trip = math.ceil(concurrency * claim_s / max(handler_s, 1e-6))
    return min(PREFETCH_MAX_FACTOR * concurrency, max(concurrency, per_round_trip))


@dataclass(eq=False)
class _Running:
    job: ClaimedJob
    reg: Registration
    cancelled: asyncio.Event
    renewed_at: float
    """Loop time just before the claim or the last renewal was sent (so the lease surely
    lasts until `renewed_at + lease_s` by the database's clock too)."""
    task: asyncio.Task[None] | None = None
    lost: bool = False
    abort: Abort = field(default_factory=Abort)

    @property
    def abort_at(self) -> float:
        """Loop time by which the job must have stopped unless its lease is renewed."""
        lease = self.job.lease_s
        return self.renewed_at + lease - min(lease * 0.1, LEASE_MARGIN_MAX)

    def stop(self, reason: str) -> None:
        """Abort the handler now (the executor turns this into a release)."""
        self.abort.reason = self.abort.reason or reason
        self.cancelled.set()
        if self.task is not None:
            self.task.cancel()


@dataclass
class _Counters:
    claimed: int = 0
    settled: Counter[str] = field(default_factory=Counter)


class Worker(Generic[AppT]):
    """A consumer of jobs: handlers registered by task type, run against shared `app` state.

    All settings are keyword-only, in seconds (or `timedelta`), validated here:

    - `concurrency`: most jobs running at once (default `max(1, min(8, cores // 2))`).
    - `poll_max`: the longest idle wait (30 s); a missed notification waits at most this.
    - `lease`: a claim's lease (15 min) unless the task sets `lease()`; renewed while alive.
    - `shutdown_timeout`: the grace period at shutdown (30 s) before stragglers are aborted.
    - `backoff`: the retry curve (500 ms base, 2 min cap) unless the task sets `backoff()`.
    - `jitter_fraction`: proportional spread of retry delays, clamped to [0, 1] (0.5).
    - `backstop`: failed executions before dead (25); `None` leaves it to the task.
    - `priority_ratio`: anti-starvation ratio between tiers (4); `None` is strict priority.
    - `panic_policy`: how unexpected exceptions settle: `PanicPolicy.RETRY` or `DEAD`.
    - `queue`: the named queue this worker serves ("default").
    - `identity`: who the worker is, on every claim and journal entry (`host:pid#tag`, and
      the pod name in Kubernetes); each Worker gets its own, and two must never share one.
    - `metrics`: record Prometheus metrics (needs `venturi[metrics]`); `metrics_port`
      also serves them on /metrics from this process, on `metrics_host` (all interfaces
      inside a Kubernetes pod, 127.0.0.1 elsewhere).
    - `prefetch`: while handlers run shorter than a claim's round trip, claim up to one
      batch ahead so slots never wait on the database (True); never for capped kinds.
    - `codec`: how payloads and carries decode (JSON); the queue's producers use the same.
    """

    def __init__(
        self,
        app: AppT,
        store: PostgresStore,
        *,
        concurrency: int | None = None,
        poll_max: Seconds = DEFAULT_POLL_MAX,
        lease: Seconds = DEFAULT_LEASE,
        shutdown_timeout: Seconds = DEFAULT_SHUTDOWN_TIMEOUT,
        backoff: Backoff = DEFAULT_BACKOFF,
        jitter_fraction: float = DEFAULT_JITTER_FRACTION,
        backstop: int | None = DEFAULT_BACKSTOP,
        priority_ratio: int | None = DEFAULT_PRIORITY_RATIO,
        panic_policy: PanicPolicy = PanicPolicy.RETRY,
        queue: str = DEFAULT_QUEUE,
        identity: WorkerIdentity | None = None,
        metrics: bool = False,
        metrics_port: int | None = None,
        metrics_host: str | None = None,  # all interfaces in a pod, else 127.0.0.1
        prefetch: bool = True,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        if concurrency is None:
            concurrency = default_concurrency()
        settings = worker_settings(
            concurrency=concurrency,
            poll_max=poll_max,
            lease=lease,
            shutdown_timeout=shutdown_timeout,
            backoff=backoff,
            jitter_fraction=jitter_fraction,
            backstop=backstop,
            priority_ratio=priority_ratio,
            panic_policy=panic_policy,
            queue=queue,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
        self.app = app
        self.store = store
        self.concurrency = settings.concurrency
        self.poll_max = settings.poll_max
        self.lease = settings.lease
        self.shutdown_timeout = settings.shutdown_timeout
        self.priority_ratio = settings.priority_ratio
        self.queue = settings.queue
        self.identity = identity or WorkerIdentity.current()
        self.policy = Policy(
            backoff=settings.backoff,
            jitter_fraction=settings.jitter_fraction,
            backstop=settings.backstop,
            panic_policy=settings.panic_policy,
            codec=codec,
        )
        self.prefetch = prefetch
        self.hooks = metrics_hooks(metrics or metrics_port is not None)
        self.metrics_port = settings.metrics_port
        self.metrics_host = settings.metrics_host
        self._registry: dict[str, Registration] = {}
        self._running: dict[uuid.UUID, _Running] = {}
        self._buffer: deque[_Running] = deque()
        """Prefetched jobs: claimed (their leases renewed), not started yet."""
        self._handler_ewma: float | None = None
        self._claim_ewma: float | None = None
        self._handler_samples = 0
        self._running_by_kind: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._running_changed = asyncio.Event()
        self._stopping = False
        self._started = False
        self._counters = _Counters()
        self._slot_counter = 0
        self._completer: Completer | None = None
        self._rescuer: Rescuer | None = None
        self._outage = Outage(str(self.identity))
        self._unsure = False
        """A claim failed in flight: it may have committed. Reconcile before claiming again."""
        self.notifier: Notifier | None = None
        self._abandoned: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()
        """Set once the worker listens and claims (tests and health checks await it)."""

    # -- registration ----------------------------------------------------------------

    def register(
        self,
        task_type: type[T],
        handler: Callable[[T, Context[Any], AppT], Awaitable[Outcome | None]] | None = None,
        *,
        cap: int | None = None,
    ) -> None:
        """Teach the worker a task type, and add its KIND to what this worker claims.

        `handler(task, ctx, app)` returns an `Outcome` (or None for completed) or raises;
        without one, the task class's own `handle(self, ctx, app)` method is used. `cap`
        bounds how many jobs of this kind run at once in this worker.
        """
        kind = kind_of(task_type)
        if handler is None:
            handler = getattr(task_type, "handle", None)
            if handler is None:
                raise TypeError(
                    f"register({task_type.__qualname__}): pass a handler, or define "
                    f"`async def handle(self, ctx, app)` on the task class"
                )
        if not callable(handler):
            raise TypeError(f"register({task_type.__qualname__}): handler is not callable")
        if cap is not None and (not isinstance(cap, int) or cap < 1):
            raise ValueError(f"register({task_type.__qualname__}): cap must be an int >= 1")
        existing = self._registry.get(kind)
        if existing is not None:
            raise DuplicateKindError(
                f"KIND {kind!r} is already registered by {existing.task_type.__qualname__}; "
                f"cannot register {task_type.__qualname__} under it"
            )
        if self._started:
            raise RuntimeError("register() must be called before run()")
        self._registry[kind] = Registration(task_type, kind, handler, carry_type_of(task_type), cap)

    @property
    def kinds(self) -> list[str]:
        return list(self._registry)

    @property
    def in_flight(self) -> int:
        """Jobs running right now."""
        return len(self._running)

    @property
    def abandoned(self) -> int:
        """Handlers given up on at shutdown because they ignored cancellation (their jobs
        were released). They may still run: a process should exit without awaiting them
        (`asyncio.run` would wait for them forever); `venturi worker` does."""
        return sum(1 for t in self._abandoned if not t.done())

    # -- running ---------------------------------------------------------------------

    async def run(self, shutdown: asyncio.Event | None = None) -> None:
        """Claim and run jobs until `shutdown` is set, then shut down gracefully:
        stop claiming, raise the cooperative cancel, wait up to `shutdown_timeout`, abort
        and release stragglers, flush every settlement. Cancelling `run()` itself does
        the same without the grace period.

        A database that is down when the worker starts, or goes away later, is waited for;
        only a bug in venturi ends `run()` early, by raising it (after draining).
        """
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one")
        if not self._registry:
            raise ValueError("no task registered: call worker.register(TaskType, handler) first")
        self._check_pool()
        await self._check_schema()  # never run against a schema this release does not know
        self._started = True
        identity = str(self.identity)
        self._completer = Completer(
            self.store, worker=identity, outage=self._outage, on_settled=self._on_settled
        )
        self._rescuer = Rescuer(
            self.store,
            self.policy,
            queues=[self.queue],
            worker=identity,
            poll_max=self.poll_max,
            hooks=self.hooks,
            outage=self._outage,
        )
        self.notifier = Notifier(
            self.store,
            self._on_notify,
            on_lease=self._rescuer.lease_announced,
            on_connected=self._outage.ok,
        )
        if self.metrics_port is not None:
            from venturi import metrics

            metrics.serve(self.metrics_port, self.metrics_host)
        logger.info(
            "worker %s starting: kinds=%s concurrency=%d", identity, self.kinds, self.concurrency
        )
        background = [
            asyncio.create_task(self._completer.run(), name="venturi-completer"),
            asyncio.create_task(self.notifier.run(), name="venturi-notifier"),
            asyncio.create_task(self._rescuer.run(), name="venturi-rescuer"),
            asyncio.create_task(self._renew_loop(), name="venturi-renewer"),
        ]
        claim_loop: asyncio.Task[None] | None = None
        stop = asyncio.create_task((shutdown or asyncio.Event()).wait(), name="venturi-shutdown")
        graceful = True
        try:
            # Claim once LISTEN is up, so no notification sent after the first claim is missed.
            connected = asyncio.create_task(self.notifier.connected.wait())
            try:
                await asyncio.wait(
                    {connected, stop, *background}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                connected.cancel()
            if not stop.done() and not any(t.done() for t in background):
                self.ready.set()
                claim_loop = asyncio.create_task(self._claim_loop(), name="venturi-claimer")
                await asyncio.wait(
                    {claim_loop, stop, *background}, return_when=asyncio.FIRST_COMPLETED
                )
            for task in (claim_loop, *background):
                if task is not None and task.done():
                    task.result()  # the loops only end by raising a bug: fail loudly
        except asyncio.CancelledError:
            graceful = False
            raise
        finally:
            self._stopping = True
            stop.cancel()
            if claim_loop is not None:
                claim_loop.cancel()
            await asyncio.gather(*filter(None, [claim_loop, stop]), return_exceptions=True)
            completer_task = background[0]
            if completer_task.done():
                # Nothing can write outcomes any more: the leases will bring the jobs back.
                logger.error("worker %s: the completer stopped; leaving jobs to recovery", identity)
                graceful = False
            await self._drain(graceful)
            if not completer_task.done():
                await self._completer.close()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            logger.info(
                "worker %s stopped: claimed=%d settled=%s",
                identity,
                self._counters.claimed,
                dict(self._counters.settled),
            )

    async def _check_schema(self) -> None:
        """`store.check_schema()`, waiting out a database that is not up yet; an error that
        waiting cannot mend (credentials, a missing database, a schema mismatch) raises."""
        delay = 0.0
        while True:
            try:
                await self.store.check_schema()
                break
            except Exception as exc:
                if not is_database_failure(exc) or is_configuration_error(exc):
                    raise
                self._outage.failed("starting", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
        self._outage.ok()

    def _check_pool(self) -> None:
        """Refuse a pool too small to run on (it would hang, not fail)."""
        size = self.store.pool_max_size
        need = MIN_POOL_SIZE + (0 if self.store.listens_outside_pool else 1)
        if size < need:
            raise ValueError(
                f"the store's pool has max_size={size}; a worker needs at least {need} "
                f"connections (its loops and its handlers' enqueues share them"
                + ("" if self.store.listens_outside_pool else ", and LISTEN holds one")
                + "): PostgresStore.connect(..., max_size=N)"
            )

    async def _drain(self, graceful: bool) -> None:
        assert self._completer is not None
        while self._buffer:
            r = self._buffer.popleft()
            if not r.lost:
                await self._completer.settle(
                    Settlement(r.job.id, r.job.claim_token, r.job.kind, "returned")
                )
        if not self._running:
            return
        logger.info("shutdown: %d jobs running, asking them to wind down", len(self._running))
        for running in self._running.values():
            running.cancelled.set()
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if graceful and self.shutdown_timeout > 0:
            _, pending = await asyncio.wait(tasks, timeout=self.shutdown_timeout)
        else:
            pending = {t for t in tasks if not t.done()}
        stragglers = [r for r in self._running.values() if r.task in pending]
        for r in stragglers:
            r.stop("aborted at shutdown after the grace period")
        if pending:
            logger.warning("shutdown: aborting %d jobs after the grace period", len(pending))
            # Executors turn the abort into a release settlement; a handler that swallows
            # the cancellation is given up on, so shutdown always ends.
            _, stubborn = await asyncio.wait(pending, timeout=ABANDON_AFTER)
            for r in stragglers:
                if r.task in stubborn:
                    self._abandon(r)

    def _abandon(self, r: _Running) -> None:
        """Release the job of a handler that ignores cancellation, and stop waiting for it."""
        assert self._completer is not None
        job = r.job
        logger.error(
            "shutdown: job %s (%s): the handler ignored cancellation for %.0fs; released "
            "without it (the handler may still be running in this process)",
            job.id,
            job.kind,
            ABANDON_AFTER,
            extra={"job_id": str(job.id), "kind": job.kind},
        )
        self._forget(r)
        if r.task is not None:
            self._abandoned.append(r.task)
        # Buffered synchronously: the completer's close() flushes it.
        self._completer.settle_nowait(
            Settlement(
                job.id,
                job.claim_token,
                job.kind,
                "released",
                note="the handler ignored cancellation at shutdown; abandoned",
            )
        )

    def _forget(self, r: _Running) -> None:
        """Stop counting a running job (once, whichever of its exit or abandonment is first)."""
        if self._running.pop(r.job.id, None) is None:
            return
        self._running_by_kind[r.job.kind] -= 1
        self.hooks.running(r.job.kind, -1)

    def _on_notify(self, kind: str) -> None:
        if not kind or kind in self._registry:
            self._wake.set()
        if not kind and self._rescuer is not None:
            # LISTEN (re)connected: leases announced meanwhile were missed; look again now.
            self._rescuer.lease_announced(self.queue, 0.0)

    def _on_settled(self, settlement: Settlement, kept: bool) -> None:
        outcome = settlement.outcome if kept else "lost"
        self._counters.settled[outcome] += 1
        self.hooks.settled(settlement.kind, outcome, settlement.duration_s)

    async def _claim_loop(self) -> None:
        kinds_all = self.kinds
        identity = str(self.identity)
        retry_delay = 0.0
        while not self._stopping:
            # Cleared before looking at capacity, so a slot freed during the awaits below
            # is never missed.
            self._slot_freed.clear()
            want = self._room()
            kinds = [k for k in kinds_all if not self._at_cap(k)]
            timeout = self.poll_max
            if want > 0 and kinds:
                self._wake.clear()
                try:
                    if self._unsure:
                        await self._reconcile(identity)
                    claimed = await self._claim(kinds, want, identity)
                except Exception as exc:
                    if not is_database_failure(exc):
                        raise
                    # The claim may have committed with its reply lost: reconcile first.
                    self._unsure = True
                    self._outage.failed("claiming", exc)
                    retry_delay = next_delay(retry_delay)
                    await self._outage.wait(retry_delay)
                    continue
                self._outage.ok()
                retry_delay = 0.0
                if len(claimed) >= want:
                    continue  # maybe more: claim again once there is room
                due = await self._next_due(kinds)
                if due is not None:
                    timeout = min(timeout, max(due, 0.0))
            if self._slot_freed.is_set() and len(self._running) < self.concurrency:
                continue  # a job finished during this round: its slot may unblock work
            # Wait for a notification, the next due job, or (when capacity is what holds
            # work back: the worker is full or a kind is at its cap) a freed slot.
            waiters = [asyncio.ensure_future(self._wake.wait())]
            full = len(self._running) >= self.concurrency
            if full or any(self._at_cap(k) for k in kinds_all):
                waiters.append(asyncio.ensure_future(self._slot_freed.wait()))
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _prefetch_depth(self) -> int:
        if not self.prefetch or self._handler_samples < self.concurrency:
            return 0  # warm up first: a few runs say little
        return prefetch_depth(self.concurrency, self._handler_ewma, self._claim_ewma)

    def _room(self) -> int:
        """Jobs to claim now: free slots plus prefetch room, or 0 while the buffer still
        covers the next slots (refilled in batches, not one job per freed slot)."""
        free = self.concurrency - len(self._running)
        depth = self._prefetch_depth()
        room = free + depth - len(self._buffer)
        if self._buffer and room < max(1, (self.concurrency + depth) // 4):
            return 0
        return max(room, 0)

    def _at_cap(self, kind: str) -> bool:
        cap = self._registry[kind].cap
        return cap is not None and self._running_by_kind[kind] >= cap

    async def _next_due(self, kinds: list[str]) -> float | None:
        try:
            return await self.store.next_due(kinds)
        except Exception as exc:
            if not is_database_failure(exc):
                raise
            self._outage.failed("reading the next due time", exc)
            return min(1.0, self.poll_max)  # look again soon

    async def _reconcile(self, identity: str) -> None:
        """Release what the database says this worker holds and it does not run: claims
        that committed while their reply was lost. Held means running, prefetched, or
        settled but not yet written."""
        assert self._completer is not None
        held = [*self._running, *(r.job.id for r in self._buffer), *self._completer.unwritten()]
        released = await self.store.release_unheld(
            worker=identity,
            held=held,
            note="claimed while the connection failed; the claim's reply was lost",
        )
        self._unsure = False
        for job_id, kind in released:
            logger.warning(
                "job %s (%s): released a claim whose reply was lost",
                job_id,
                kind,
                extra={"job_id": str(job_id), "kind": kind},
            )

    async def _claim(self, kinds: list[str], limit: int, identity: str) -> list[ClaimedJob]:
        """Claim up to `limit` jobs: capped kinds get their own claims, bounded by free
        slots and caps (never prefetched); the slots are split by tier for anti-starvation."""
        groups: list[tuple[list[str], int]] = []
        uncapped = [k for k in kinds if self._registry[k].cap is None]
        if uncapped:
            groups.append((uncapped, limit))
        for k in kinds:
            cap = self._registry[k].cap
            if cap is not None:
                free = self.concurrency - len(self._running)
                groups.append(([k], min(free, cap - self._running_by_kind[k])))
        claimed_all: list[ClaimedJob] = []
        loop = asyncio.get_running_loop()
        for group_kinds, group_limit in groups:
            room = min(group_limit, limit - len(claimed_all))
            if room <= 0:
                continue
            low, normal = plan_slots(self._slot_counter, room, self.priority_ratio)
            began = loop.time()
            claimed = await self.store.claim(
                queue=self.queue,
                kinds=group_kinds,
                limit=room,
                worker=identity,
                pod=self.identity.pod,
                default_lease_s=self.lease,
                reserved_low=low,
                reserved_normal=normal,
                held_lease_s=self._shortest_held_lease(began),
            )
            self._claim_ewma = _ewma(self._claim_ewma, loop.time() - began)
            self._slot_counter += len(claimed)
            for job in claimed:
                self._accept(job, began)
            claimed_all.extend(claimed)
        return claimed_all

    def _shortest_held_lease(self, now: float) -> float | None:
        """Seconds until the earliest lease this worker holds ends (None: it holds none).
        A claim whose leases end sooner announces them to the other workers' rescuers."""
        ends = [
            r.renewed_at + r.job.lease_s
            for r in (*self._running.values(), *self._buffer)
            if not r.lost
        ]
        return min(ends) - now if ends else None

    def _accept(self, job: ClaimedJob, claimed_at: float) -> None:
        """Start a claimed job now, or hold it in the prefetch buffer."""
        running = _Running(job, self._registry[job.kind], asyncio.Event(), claimed_at)
        self._counters.claimed += 1
        self.hooks.claimed(job.kind, job.waited_s)
        if len(self._running) < self.concurrency and not self._buffer:
            self._start(running)
        else:
            self._buffer.append(running)
            self._running_changed.set()  # its lease needs renewing too

    def _start(self, running: _Running) -> None:
        job = running.job
        self._running[job.id] = running
        self._running_by_kind[job.kind] += 1
        self.hooks.running(job.kind, 1)
        logger.debug(
            "started job %s (%s) run %d",
            job.id,
            job.kind,
            job.run_count,
            extra={"job_id": str(job.id), "kind": job.kind},
        )
        running.task = asyncio.create_task(self._execute(running), name=f"venturi-job-{job.id}")
        self._running_changed.set()

    async def _execute(self, running: _Running) -> None:
        job = running.job
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            settlement = await execute(
                job, running.reg, self.app, self.policy, running.cancelled, running.abort
            )
            self._handler_ewma = _ewma(self._handler_ewma, loop.time() - began)
            self._handler_samples += 1
            assert self._completer is not None
            if job.id in self._running:  # else abandoned at shutdown: already released
                await self._completer.settle(settlement)
        finally:
            self._forget(running)
            while self._buffer and not self._stopping and len(self._running) < self.concurrency:
                nxt = self._buffer.popleft()
                if not nxt.lost:
                    self._start(nxt)
            self._slot_freed.set()

    async def _renew_loop(self) -> None:
        """Keep the leases of running (and prefetched) jobs alive; stop jobs whose lease was
        lost or is about to end unrenewed.

        Each job is renewed a third of its lease after its last renewal (or its claim); a
        newly started job wakes this loop, so a short lease is never overlooked. While the
        database is unreachable, renewal is retried; a job whose lease would end before a
        renewal succeeds is aborted first (`_Running.abort_at`), and a renewal is never
        waited for past that point, so no other worker can recover a job still running here.
        """
        loop = asyncio.get_running_loop()
        failed_at: float | None = None
        delay = 0.0
        while True:
            self._running_changed.clear()
            now = loop.time()
            held = [r for r in (*self._running.values(), *self._buffer) if not r.lost]
            for r in held:
                if now >= r.abort_at:
                    self._lose(r, "its lease could not be renewed in time (database unreachable)")
            held = [r for r in held if not r.lost]
            if not held:
                await self._running_changed.wait()
                continue
            deadline = min(r.abort_at for r in held)
            if failed_at is not None:
                due = failed_at + delay
            else:
                due = min(r.renewed_at + r.job.lease_s * RENEW_FRACTION for r in held)
            if min(due, deadline) > now:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._running_changed.wait(), min(due, deadline) - now)
                continue
            try:
                owned = await asyncio.wait_for(
                    self.store.renew_leases(
                        [r.job.id for r in held],
                        [r.job.claim_token for r in held],
                        [r.job.lease_s for r in held],
                    ),
                    max(deadline - now, 0.05),
                )
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                self._outage.failed("renewing leases", exc)
                failed_at = loop.time()
                delay = min(next_delay(delay), min(r.job.lease_s for r in held) * 0.1)
                continue
            self._outage.ok()
            failed_at = None
            delay = 0.0
            for r in held:
                if r.job.id in owned:
                    r.renewed_at = now
                else:
                    self._lose(r, "its lease was lost (recovered by another worker)")

    def _lose(self, r: _Running, why: str) -> None:
        """This worker no longer (or soon no longer) owns `r`'s job: stop it."""
        r.lost = True
        if r.job.id not in self._running:
            return  # prefetched, never started: dropped when dequeued; recovery takes it
        logger.warning(
            "job %s (%s): aborted: %s",
            r.job.id,
            r.job.kind,
            why,
            extra={"job_id": str(r.job.id), "kind": r.job.kind},
        )
        r.stop(f"aborted: {why}")
