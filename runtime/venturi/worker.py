"""`Worker`: claims jobs, runs them through their handlers, settles their outcomes.

    worker = Worker(app, store, concurrency=16)
    worker.register(SendEmail, send_email)          # or: worker.register(SendEmail)
    worker.register(Reindex, reindex, cap=2)        # at most 2 at once in this worker
    await worker.run(shutdown_event)                # until the event is set, then drains

The worker holds the settings, the registrations and the lifecycle; the work is done by its
parts, one concern each: the producer (`_producer`: claims from the worker's queues in
order), the runner (`_runner`: the jobs it holds and their runs, through the executor and
its middleware), the completer (batched settlements), the renewer (leases), the notifier
(LISTEN wake-ups), the rescuer (expired leases), the heartbeat (`_registry`: its row in the
worker registry) and the maintainer (`_maintenance`: the leader election, and the leader's
maintenance services).

No part ends because the database went away: each retries (backoff capped at a second,
the outage logged once) and resumes as soon as any of them gets through. Only a bug in
venturi ends `run()`, with its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from venturi import logs
from venturi._completer import Completer
from venturi._db.failures import is_database_failure, waiting_cannot_mend
from venturi._db.registry import WorkerRow
from venturi._executor import Policy, Registration
from venturi._hooks import hook_set
from venturi._maintenance import Maintainer
from venturi._maintenance.analyzer import JobsAnalyzer
from venturi._maintenance.cleaner import RetentionCleaner
from venturi._maintenance.folder import CountFold
from venturi._maintenance.sweeper import WorkerSweep
from venturi._notifier import Notifier
from venturi._outage import Outage, next_delay
from venturi._producer import Producer, RunLimits
from venturi._records import Settlement
from venturi._registry import HEARTBEAT, Heartbeat
from venturi._renewer import Renewer
from venturi._rescuer import Rescuer
from venturi._runner import Runner
from venturi._scheduler import Scheduler
from venturi._settings import DEFAULT_QUEUE, check_queue_name, worker_settings
from venturi._shown import shown
from venturi._undertaker import Reporter, Undertaker, check_hook
from venturi.backoff import DEFAULT_BACKOFF, Backoff, Seconds, to_seconds
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.context import Context
from venturi.errors import DuplicateKindError
from venturi.hooks import Dead, Hooks, Settled
from venturi.identity import WorkerIdentity
from venturi.maintenance import MaintenanceService, Retention
from venturi.middleware import Middleware, check_call, compose
from venturi.outcome import Outcome, PanicPolicy
from venturi.postgres import PostgresStore
from venturi.registry import UnknownKinds
from venturi.schedules import Schedule
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
MIN_POOL_SIZE = 2
"""Fewest pool connections a worker runs on (a `from_pool` store also LISTENs on one)."""


def default_concurrency() -> int:
    """`max(1, min(8, cores // 2))`: conservative; raise it for I/O-bound handlers."""
    return max(1, min(8, (os.cpu_count() or 1) // 2))


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
    - `queues`: the named queues this worker serves, emptied in this order (each queue's
      jobs before any of the next's); `queue` is the one-queue form ("default").
    - `identity`: who the worker is, on every claim and journal entry (`host:pid#tag`, and
      the pod name in Kubernetes); each Worker gets its own, and two must never share one.
    - `hooks`: observers of the job lifecycle (`venturi.hooks.Hooks` instances).
    - `middleware`: wrappers of every run, the first the outermost (`venturi.middleware`).
    - `metrics`: record Prometheus metrics (needs `venturi[metrics]`); `metrics_port`
      also serves them on /metrics from this process, on `metrics_host` (all interfaces
      inside a Kubernetes pod, 127.0.0.1 elsewhere).
    - `schedules`: periodic tasks this worker enqueues (venturi.schedules); any number of
      workers may run the same schedules, each tick is enqueued once.
    - `prefetch`: while handlers run shorter than a claim's round trip, claim up to one
      batch ahead so slots never wait on the database (True); never for capped kinds.
    - `codec`: how payloads and carries decode (JSON); the queue's producers use the same.
    - `reporters`: callables `reporter(error, job)` (sync or async; `job` a `FailedJob`)
      told of every job that fails for good, once, after its task's `failed` hook.
    - `maintenance`: periodic services run once for the whole prefix, by the elected leader
      among the workers (`venturi.maintenance`); the registry's sweep always runs.
    - `retention`: how long finished jobs are kept (`Retention`); None (the default) keeps
      every job. Give every worker of a prefix the same: whichever leads applies its own.
    - `unknown_kinds`: a job of a kind this worker has no task for is left pending for a
      worker that has one ("wait", the default: safe while a deploy rolls out a new task),
      or claimed and failed for good at once with "no task registered for kind X" ("fail").
      Either way `Queue.unserved_kinds()` lists pending kinds no live worker serves.
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
        queue: str | None = None,
        queues: Sequence[str] | None = None,
        identity: WorkerIdentity | None = None,
        hooks: Sequence[Hooks] = (),
        middleware: Sequence[Middleware] = (),
        metrics: bool = False,
        metrics_port: int | None = None,
        metrics_host: str | None = None,  # all interfaces in a pod, else 127.0.0.1
        prefetch: bool = True,
        codec: Codec = DEFAULT_CODEC,
        reporters: Sequence[Reporter] = (),
        maintenance: Sequence[MaintenanceService] = (),
        retention: Retention | None = None,
        unknown_kinds: UnknownKinds = "wait",
        schedules: Sequence[Schedule] = (),
    ) -> None:
        if isinstance(store, PostgresStore) and store.bound:
            raise TypeError(
                "Worker: needs a store of its own (PostgresStore.connect or from_pool), not one "
                "bound to the caller's connection by using(): a worker runs several statements "
                "at once and LISTENs"
            )
        if concurrency is None:
            concurrency = default_concurrency()
        served = _queues(queue, queues)
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
            queue=served[0],
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
        self.schedules = _schedules(schedules)
        for mw in middleware:
            check_call(mw, "middleware", "(task, ctx, call_next)")
        if isinstance(reporters, str | bytes) or not all(callable(r) for r in reporters):
            raise TypeError(
                f"reporters: expected callables reporter(error, job), got {reporters!r}"
            )
        services = _services(maintenance, retention)
        if unknown_kinds not in ("wait", "fail"):
            raise ValueError(f"unknown_kinds: expected 'wait' or 'fail', got {unknown_kinds!r}")
        self.app = app
        self.store = store
        self.concurrency = settings.concurrency
        self.poll_max = settings.poll_max
        self.lease = settings.lease
        self.shutdown_timeout = settings.shutdown_timeout
        self.priority_ratio = settings.priority_ratio
        self.queues = served
        self.identity = identity or WorkerIdentity.current()
        self.policy = Policy(
            backoff=settings.backoff,
            jitter_fraction=settings.jitter_fraction,
            backstop=settings.backstop,
            panic_policy=settings.panic_policy,
            codec=codec,
        )
        self.prefetch = prefetch
        self.hooks = hook_set(hooks, metrics=metrics or metrics_port is not None)
        self.middleware = tuple(middleware)
        self.reporters = tuple(reporters)
        self.metrics_port = settings.metrics_port
        self.metrics_host = settings.metrics_host
        self.maintenance = services
        self.unknown_kinds: UnknownKinds = unknown_kinds
        self._registry: dict[str, Registration] = {}
        self._started = False
        self._outage = Outage(str(self.identity))
        self._settled: Counter[str] = Counter()
        self._runner: Runner | None = None
        self._producer: Producer | None = None
        # Set by `venturi worker`, whose process ends with `run()` (see Runner's
        # `release_abandoned`): the jobs of handlers given up on are then settled at once.
        self._exits_with_run = False
        self._listens = True
        """Whether this worker LISTENs (else it polls, and wakes itself for its own writes)."""
        self._rescuer: Rescuer | None = None
        self._undertaker: Undertaker | None = None
        self._maintainer: Maintainer | None = None
        self.notifier: Notifier | None = None
        self.ready = asyncio.Event()
        """Set once the worker listens and claims (tests and health checks await it)."""
        self._hurried = asyncio.Event()
        """Set by `stop_now()`: shut down without (the rest of) the grace period."""

    @property
    def queue(self) -> str:
        """The first queue this worker serves (the only one, unless `queues` named more)."""
        return self.queues[0]

    # -- registration ----------------------------------------------------------------

    def register(
        self,
        task_type: type[T],
        handler: Callable[[T, Context[Any], AppT], Awaitable[Outcome | None]] | None = None,
        *,
        cap: int | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        """Teach the worker a task type, and add its KIND to what this worker claims.

        `handler(task, ctx, app)` returns an `Outcome` (or None for completed) or raises;
        without one, the task class's own `handle(self, ctx, app)` method is used. `cap`
        bounds how many jobs of this kind run at once in this worker. `middleware` wraps
        this kind's runs only, inside the worker's own (e.g. `venturi.flow`'s limits).
        """
        kind = kind_of(task_type)
        if task_type.ENCRYPTED and not getattr(self.policy.codec, "seals", False):
            raise TypeError(
                f"register({task_type.__qualname__}): an encrypted task (ENCRYPTED = True) "
                f"needs the Worker's codec=SealedCodec(KeyRing...) (see venturi.encryption)"
            )
        if handler is None:
            handler = getattr(task_type, "handle", None)
            if handler is None:
                raise TypeError(
                    f"register({task_type.__qualname__}): pass a handler, or define "
                    f"`async def handle(self, ctx, app)` on the task class"
                )
        where = f"register({task_type.__qualname__})"
        check_call(handler, where, "handler(task, ctx, app)")
        check_hook(task_type, where)
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"register({task_type.__qualname__}): cap must be an int >= 1")
        existing = self._registry.get(kind)
        if existing is not None:
            raise DuplicateKindError(
                f"KIND {kind!r} is already registered by {existing.task_type.__qualname__}; "
                f"cannot register {task_type.__qualname__} under it"
            )
        if self._started:
            raise RuntimeError("register() must be called before run()")
        for mw in middleware:
            check_call(mw, f"{where}, middleware", "(task, ctx, call_next)")
        call = compose((*self.middleware, *middleware), handler)
        self._registry[kind] = Registration(task_type, kind, call, carry_type_of(task_type), cap)

    @property
    def kinds(self) -> list[str]:
        return list(self._registry)

    @property
    def leads(self) -> bool:
        """Whether this worker is the elected leader (it runs the maintenance services)."""
        return self._maintainer is not None and self._maintainer.leads

    @property
    def in_flight(self) -> int:
        """Jobs running right now."""
        return len(self._runner.running) if self._runner is not None else 0

    @property
    def abandoned(self) -> int:
        """Handlers given up on at shutdown because they ignored cancellation. They may
        still run, so their jobs stay claimed until their leases end (never run elsewhere
        beside them); a process should exit without awaiting them (`asyncio.run` would wait
        for them forever). `venturi worker` does, and releases their jobs as it ends."""
        return self._runner.abandoned if self._runner is not None else 0

    def stop_now(self) -> None:
        """Shut down without waiting for the running handlers: as setting `run()`'s shutdown
        event, but the handlers are asked to stop and aborted at once (their jobs released,
        as at the end of the grace period) instead of after `shutdown_timeout`. During a
        graceful shutdown under way, it cuts what is left of the grace period. `venturi
        worker` calls it on a second SIGTERM or Ctrl-C."""
        self._hurried.set()

    # -- running ---------------------------------------------------------------------

    async def run(
        self,
        shutdown: asyncio.Event | None = None,
        *,
        once: bool = False,
        stop_when_empty: bool = False,
        max_jobs: int | None = None,
        max_time: Seconds | None = None,
    ) -> None:
        """Claim and run jobs until `shutdown` is set, then shut down gracefully:
        stop claiming, raise the cooperative cancel, wait up to `shutdown_timeout`, abort
        and release stragglers, flush every settlement. Cancelling `run()` itself does
        the same without the grace period.

        Run modes end the run on their own: `once` after the jobs due now (it stops at the
        first claim that finds fewer than it asked for), `stop_when_empty` when nothing of
        this worker's queues and kinds is pending any more, due now or later, and nothing
        runs; `max_jobs` after claiming that many. Each lets what runs finish normally, then
        returns. `max_time` (seconds) shuts down gracefully after that long, as `shutdown`.

        A database that is down when the worker starts, or goes away later, is waited for
        (a shutdown while it starts ends the wait and `run()`); only a bug in venturi ends
        `run()` early, by raising it (after draining).

        Every log record of the worker's tasks (and its handlers') carries its identity as
        the field `worker` (`venturi.logs.JsonFormatter`).
        """
        with logs.bound({"worker": str(self.identity)}):
            await self._run(
                shutdown,
                once=once,
                stop_when_empty=stop_when_empty,
                max_jobs=max_jobs,
                max_time=max_time,
            )

    async def _run(
        self,
        shutdown: asyncio.Event | None,
        *,
        once: bool,
        stop_when_empty: bool,
        max_jobs: int | None,
        max_time: Seconds | None,
    ) -> None:
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one")
        if not self._registry:
            raise ValueError("no task registered: call worker.register(TaskType, handler) first")
        limits = _limits(once, stop_when_empty, max_jobs)
        deadline = None if max_time is None else to_seconds(max_time, name="max_time", low=1e-3)
        self._check_pool()
        # Never run against a schema this release does not know; a database not up yet is
        # waited for, and a shutdown meanwhile ends the wait (nothing has started).
        if not await self._checked_unless_stopped(shutdown, deadline):
            logger.info("worker %s stopped before it started", self.identity)
            return
        self._started = True
        self._listens = self.store.can_listen
        identity = str(self.identity)
        undertaker = self._undertaker = Undertaker(
            self.store,
            self._registry,
            app=self.app,
            codec=self.policy.codec,
            reporters=self.reporters,
            queues=list(self.queues),
            worker=identity,
            lease_s=self.lease,
            poll_max=self.poll_max,
            concurrency=self.concurrency,
            outage=self._outage,
        )
        completer = Completer(
            self.store,
            worker=identity,
            outage=self._outage,
            on_settled=self._on_settled,
            hook_lease_s=self.lease,
        )
        runner = self._runner = Runner(
            app=self.app,
            concurrency=self.concurrency,
            policy=self.policy,
            completer=completer,
            hooks=self.hooks,
        )
        runner.release_abandoned = self._exits_with_run
        producer = self._producer = Producer(
            self.store,
            runner,
            self._registry,
            queues=list(self.queues),
            worker=identity,
            pod=self.identity.pod,
            lease=self.lease,
            poll_max=self.poll_max,
            priority_ratio=self.priority_ratio,
            prefetch=self.prefetch,
            outage=self._outage,
            limits=limits,
            traced=any(getattr(mw, "reads_trace_context", False) for mw in self.middleware),
            every_kind=self.unknown_kinds == "fail",
        )
        rescuer = self._rescuer = Rescuer(
            self.store,
            self.policy,
            queues=list(self.queues),
            worker=identity,
            poll_max=self.poll_max,
            hooks=self.hooks,
            outage=self._outage,
            hook_lease_s=self.lease,
            held=runner.owned_ids,
            on_dead=lambda r: (
                undertaker.bury(r.id.to_uuid(), r.hook_token, None)
                if r.hook_token is not None
                else None
            ),
        )
        self.notifier = Notifier(
            self.store,
            self._on_notify,
            on_lease=rescuer.lease_announced,
            on_queue=self._on_queue,
            on_batch=runner.batch_cancelled,
            # A connection just made: the database answers now.
            on_connected=lambda: self._outage.ok(self._outage.epoch),
        )
        heartbeat = Heartbeat(self.store, self._registry_row(), outage=self._outage)
        maintainer = self._maintainer = Maintainer(
            self.store, self.maintenance, worker=identity, outage=self._outage
        )
        if self.metrics_port is not None:
            from venturi import metrics

            metrics.serve(self.metrics_port, self.metrics_host)
        logger.info(
            "worker %s starting: queues=%s kinds=%s concurrency=%d pooler=%s",
            identity,
            list(self.queues),
            self.kinds,
            self.concurrency,
            self.store.pooler,
        )
        background = [
            asyncio.create_task(completer.run(), name="venturi-completer"),
            *self._scheduler_tasks(identity),
            asyncio.create_task(self.notifier.run(), name="venturi-notifier"),
            asyncio.create_task(rescuer.run(), name="venturi-rescuer"),
            asyncio.create_task(
                Renewer(self.store, runner, outage=self._outage).run(), name="venturi-renewer"
            ),
            asyncio.create_task(undertaker.run(), name="venturi-undertaker"),
            asyncio.create_task(heartbeat.run(), name="venturi-heartbeat"),
            asyncio.create_task(maintainer.run(), name="venturi-maintainer"),
        ]
        claim_loop: asyncio.Task[None] | None = None
        stop = asyncio.create_task(
            _until(shutdown or asyncio.Event(), deadline, self._hurried), name="venturi-shutdown"
        )
        graceful = True
        try:
            # Claim once LISTEN is up, so no notification sent after the first claim is missed
            # (and once the worker is in the registry, so "ready" means "listed").
            connected = asyncio.create_task(
                _all(self.notifier.connected.wait(), heartbeat.registered.wait())
            )
            try:
                await asyncio.wait(
                    {connected, stop, *background}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                connected.cancel()
            if not stop.done() and not any(t.done() for t in background):
                self.ready.set()
                claim_loop = asyncio.create_task(producer.run(), name="venturi-producer")
                await asyncio.wait(
                    {claim_loop, stop, *background}, return_when=asyncio.FIRST_COMPLETED
                )
                if claim_loop.done() and claim_loop.exception() is None and not stop.done():
                    # A run limit ended the claims: let what runs finish, then stop.
                    idle = asyncio.create_task(runner.idle.wait())
                    try:
                        await asyncio.wait(
                            {idle, stop, *background}, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        idle.cancel()
            for task in (claim_loop, *background):
                if task is not None and task.done():
                    task.result()  # only a bug ends a loop with an exception: fail loudly
        except asyncio.CancelledError:
            graceful = False
            raise
        finally:
            # The whole shutdown's budget: what the handlers do not use, the last
            # settlements may (through an outage, or behind a lock).
            closing_by = asyncio.get_running_loop().time() + (
                self.shutdown_timeout if graceful else 0.0
            )
            runner.stopping = True  # nothing new starts; a last claim's jobs are handed back
            stop.cancel()
            if claim_loop is not None:
                await producer.stop(claim_loop)
            producer.stopping = True
            await asyncio.gather(stop, return_exceptions=True)
            completer_task = background[0]
            if completer_task.done():
                # Nothing can write outcomes any more: the leases will bring the jobs back.
                logger.error("worker %s: the completer stopped; leaving jobs to recovery", identity)
                graceful = False
            # A stopping worker leads nothing: it resigns now (the next leader need not wait
            # out its lease) and stands for no term during its grace period.
            resigning = asyncio.create_task(maintainer.close())
            await runner.drain(
                graceful=graceful and not self._hurried.is_set(),
                shutdown_timeout=self.shutdown_timeout,
                hurry=self._hurried,
            )
            if not completer_task.done():
                await completer.close(until=closing_by)
            # The failure steps of the last deaths, too (what is cut short runs elsewhere).
            await undertaker.close(self.shutdown_timeout if graceful else 0.0)
            await resigning
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await heartbeat.remove()
            logger.info(
                "worker %s stopped: claimed=%d settled=%s",
                identity,
                producer.claimed,
                dict(self._settled),
            )

    def _scheduler_tasks(self, identity: str) -> list[asyncio.Task[None]]:
        if not self.schedules:
            return []
        scheduler = Scheduler(
            self.store,
            self.schedules,
            queue=self.queues[0],
            worker=identity,
            codec=self.policy.codec,
            poll_max=self.poll_max,
            outage=self._outage,
            on_enqueued=None if self._listens else self._woken_here,
        )
        return [asyncio.create_task(scheduler.run(), name="venturi-scheduler")]

    async def _checked_unless_stopped(
        self, shutdown: asyncio.Event | None, deadline: float | None
    ) -> bool:
        """`_check_schema()`, or False if `shutdown` is set, or `deadline` seconds pass,
        first (the check is then cancelled)."""
        check = asyncio.create_task(self._check_schema())
        if shutdown is None and deadline is None:
            await check
            return True
        stopped = asyncio.create_task(_until(shutdown or asyncio.Event(), deadline, self._hurried))
        try:
            await asyncio.wait({check, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (check, stopped):
                task.cancel()  # a no-op for the one that ended; `run()` cancelled: both
            await asyncio.gather(check, stopped, return_exceptions=True)
        if check.cancelled():
            return False
        check.result()  # raises what the check raised
        return True

    async def _check_schema(self) -> None:
        """`store.check_schema()`, waiting out a database that is not up yet; an error that
        waiting cannot mend (credentials, a missing database, a schema mismatch) raises."""
        delay = 0.0
        while True:
            epoch = self._outage.epoch
            try:
                await self.store.check_privileges()  # first: it reads no table of the prefix
                await self.store.check_schema()
                break
            except Exception as exc:
                if not is_database_failure(exc) or waiting_cannot_mend(exc):
                    raise
                self._outage.failed("starting", exc)
                delay = next_delay(delay)
                await self._outage.wait(delay)
        self._outage.ok(epoch)

    def _check_pool(self) -> None:
        """Refuse a pool too small to run on (it would hang, not fail)."""
        size = self.store.pool_max_size
        in_pool = self.store.can_listen and not self.store.listens_outside_pool
        need = MIN_POOL_SIZE + (1 if in_pool else 0)
        if size < need:
            raise ValueError(
                f"the store's pool has max_size={size}; a worker needs at least {need} "
                f"connections (its loops and its handlers' enqueues share them"
                + (", and LISTEN holds one" if in_pool else "")
                + "): PostgresStore.connect(..., max_size=N)"
            )

    def _registry_row(self) -> WorkerRow:
        return WorkerRow(
            id=str(self.identity),
            host=self.identity.host,
            pid=self.identity.pid,
            pod=self.identity.pod,
            queues=list(self.queues),
            kinds=self.kinds,
            unknown_kinds=self.unknown_kinds,
            concurrency=self.concurrency,
            heartbeat_s=HEARTBEAT,
        )

    def _on_notify(self, kind: str) -> None:
        if self._producer is not None:
            self._producer.notified(kind)
        if not kind and self._rescuer is not None:
            # LISTEN (re)connected: leases announced meanwhile were missed; look again now.
            for queue in self.queues:
                self._rescuer.lease_announced(queue, 0.0)
        if not kind and self._runner is not None:
            self._runner.recheck_batches()  # and so were batches cancelled meanwhile

    def _on_queue(self, queue: str, paused: bool) -> None:
        """A queue was paused or resumed (by anyone): if it is one of ours, claim again (a
        resume) and re-read when its pauses end. (Jobs it already holds, prefetched ones
        too, run: a pause stops claims; the claim checks it.)"""
        if queue in self.queues and self._producer is not None:
            self._producer.pauses_changed()

    def _woken_here(self) -> None:
        """This worker wrote what may be work for it (a tick's job; a settlement, which may
        release a chain's next link or a batch's callback, or set a retry's time): without
        LISTEN nothing else would tell it before its next poll, so it looks again now."""
        if self._producer is not None:
            self._producer.wake.set()

    def _on_settled(self, settlement: Settlement, kept: bool) -> None:
        self._settled[settlement.outcome if kept else "lost"] += 1
        if kept and not self._listens:
            self._woken_here()
        if kept and settlement.hook_token is not None and self._undertaker is not None:
            self._undertaker.bury(settlement.id, settlement.hook_token, settlement.error)
        hooks = self.hooks
        if not hooks.active:
            return
        job_id = settlement.ulid
        queue, run = settlement.queue, settlement.run
        hooks.settled(
            Settled(job_id, settlement.kind, queue, run, settlement.outcome, settlement.note, kept)
        )
        if kept and settlement.outcome == "dead":
            hooks.dead(Dead(job_id, settlement.kind, queue, run, settlement.note))


async def _all(*waits: Awaitable[Any]) -> None:
    await asyncio.gather(*waits)


async def _until(shutdown: asyncio.Event, deadline: float | None, hurried: asyncio.Event) -> None:
    """Until `shutdown` or `hurried` is set, or `deadline` seconds have passed."""
    waits = {asyncio.ensure_future(shutdown.wait()), asyncio.ensure_future(hurried.wait())}
    try:
        await asyncio.wait(waits, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _limits(once: bool, stop_when_empty: bool, max_jobs: int | None) -> RunLimits:
    if once and stop_when_empty:
        raise ValueError("pass `once` (the jobs due now) or `stop_when_empty`, not both")
    if max_jobs is not None and (
        not isinstance(max_jobs, int) or isinstance(max_jobs, bool) or max_jobs < 1
    ):
        raise ValueError(f"max_jobs: expected an int >= 1, got {max_jobs!r}")
    return RunLimits(once=once, stop_when_empty=stop_when_empty, max_jobs=max_jobs)


def _services(
    maintenance: Sequence[MaintenanceService], retention: Retention | None
) -> tuple[MaintenanceService, ...]:
    """The leader's services: the sweep, the counters' fold, the jobs table's statistics, the
    cleaner if asked for, then the caller's."""
    if isinstance(maintenance, MaintenanceService) or not isinstance(maintenance, Sequence):
        raise TypeError(f"maintenance: expected a list of services, got {shown(maintenance)}")
    if retention is not None and not isinstance(retention, Retention):
        raise TypeError(f"retention: expected a venturi.Retention, got {shown(retention)}")
    services: list[MaintenanceService] = [WorkerSweep(), CountFold(), JobsAnalyzer()]
    if retention is not None and retention.prunes:
        services.append(RetentionCleaner(retention))
    for service in maintenance:
        if not isinstance(service, MaintenanceService):
            raise TypeError(
                f"maintenance: {shown(service)} is not a service (it needs `name`, "
                f"`interval` and `async run_once(store)`)"
            )
        interval = service.interval
        if (
            not isinstance(interval, int | float)
            or isinstance(interval, bool)
            or not 0 < interval < math.inf
        ):
            raise ValueError(
                f"maintenance: service {service.name!r} has interval {interval!r}; expected "
                f"seconds > 0"
            )
        services.append(service)
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise ValueError(f"maintenance: each service needs a name of its own, got {names}")
    return tuple(services)


def _schedules(schedules: Sequence[Schedule]) -> tuple[Schedule, ...]:
    if isinstance(schedules, Schedule) or not isinstance(schedules, Sequence):
        raise TypeError(f"schedules: expected a list of Schedule, got {shown(schedules)}")
    names: set[str] = set()
    for s in schedules:
        if not isinstance(s, Schedule):
            raise TypeError(f"schedules: expected Schedule objects, got {shown(s)}")
        if s.name in names:
            raise ValueError(f"schedules: the name {s.name!r} is used twice")
        names.add(s.name)
    return tuple(schedules)


def _queues(queue: str | None, queues: Sequence[str] | None) -> tuple[str, ...]:
    """The queues a worker serves, in order, validated like a KIND."""
    if queue is not None and queues is not None:
        raise ValueError("pass `queue` (one queue) or `queues` (several, in order), not both")
    if queues is None:
        return (check_queue_name(DEFAULT_QUEUE if queue is None else queue),)
    if isinstance(queues, str) or not isinstance(queues, Sequence):
        raise TypeError(f"queues: expected a list of queue names, got {shown(queues)}")
    if not queues:
        raise ValueError("queues: expected at least one queue name, got an empty list")
    served = tuple(check_queue_name(q, setting="queues") for q in queues)
    if len(set(served)) != len(served):
        raise ValueError(f"queues: each queue may be named once, got {list(served)}")
    return served
