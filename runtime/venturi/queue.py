"""`Queue`: the producer's handle. It needs task classes only, never handlers.

queue = Queue(store)
job_id = await queue.enqueue(SendEmail(to="a@example.com", subject="hi"))
await queue.enqueue_in(Reminder(user=7), timedelta(hours=1))
ids = await queue.enqueue_many(SendEmail(to=a, subject="x") for a in addresses)

async with conn.transaction():                 # the caller's connection and transaction:
    await queue.enqueue(Welcome(user=7), conn=conn)   # the job exists if this commits
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ulid import ULID

from venturi._hooks import hook_set
from venturi._records import ExistingJob, MergePlan, NewBatch, NewJob, NewJobs
from venturi._settings import (
    DEFAULT_QUEUE,
    check_kind,
    check_lease,
    check_max_attempts,
    check_queue_name,
    check_timeout,
)
from venturi._shown import shown
from venturi.backoff import MAX_DELAY, Backoff, Seconds, to_seconds
from venturi.batches import Batch
from venturi.codec import DEFAULT_CODEC, Codec, stored_text
from venturi.encryption import SealedCodec
from venturi.errors import JobFailed, JobStateError, PayloadError
from venturi.hooks import Enqueued, EnqueueTracer, Hooks
from venturi.jobs import (
    BatchStatus,
    CleanupCriteria,
    FailedJob,
    Job,
    JobFilter,
    JobStatus,
    JournalEntry,
    MinuteCounts,
    Stats,
)
from venturi.merge import DEDUP_KEY_MAX_BYTES, DedupKey, Merge, MergeAction, Pending
from venturi.pauses import QueueState, check_reason, check_until
from venturi.postgres import Connection, PostgresStore
from venturi.registry import WorkerInfo
from venturi.schedules import ScheduleInfo
from venturi.task import Priority, Task, carry_type_of, kind_of

logger = logging.getLogger(__name__)

_KINDS: dict[type[Any], str] = {}
"""Validated KIND per task class (validation is per class, not per job)."""
_NO_POLICY: dict[type[Any], bool] = {}
"""Per task class: True when it overrides none of the enqueue-time policy hooks, so the
bulk path can skip calling them per job."""
_HOOKS = (
    "priority",
    "lease",
    "backoff",
    "dedup_key",
    "unique_for",
    "unique_id",
    "max_attempts",
    "timeout",
)
_NORMAL = int(Priority.NORMAL)

FENCE_TTL = 30.0
"""Seconds a scale-in fence holds by default: long enough for the ReplicaSet to delete the
pod (and the worker, SIGTERMed, stops claiming by itself); short enough that a pod the
ReplicaSet spared after all is not kept idle for long."""
POD_NAME_MAX = 253
"""A Kubernetes pod name is a DNS subdomain: at most 253 characters."""


def _kind(task_type: type[Any]) -> str:
    return _KINDS.get(task_type) or _KINDS.setdefault(task_type, kind_of(task_type))


def _task_kind(task: object) -> str:
    """The KIND of a task to enqueue, or a TypeError saying what was given instead."""
    kind = _KINDS.get(type(task))
    if kind is not None:
        return kind
    if isinstance(task, type) and issubclass(task, Task):
        name = task.__qualname__
        raise TypeError(f"expected a task, got the class {name}: pass an instance, {name}(...)")
    if not isinstance(task, Task):
        raise TypeError(
            f"expected a task (an instance of a Task subclass), got "
            f"{type(task).__qualname__} {shown(task)}"
        )
    return _kind(type(task))


_TASK_QUEUES: dict[type[Any], str | None] = {}
"""Validated QUEUE per task class (None: the class names none)."""


def _task_queue(task_type: type[Any]) -> str | None:
    try:
        return _TASK_QUEUES[task_type]
    except KeyError:
        value = getattr(task_type, "QUEUE", None)
        if value is not None:
            check_queue_name(value, setting=f"{task_type.__qualname__}.QUEUE")
        return _TASK_QUEUES.setdefault(task_type, value)


def _hook(task: Task[Any], name: str) -> Any:
    """What the task's policy method `name` returns, None when its class defines none. Looked
    up on the class, so a payload field of that name (an HTTP task's `timeout`, say) stays
    payload and sets no policy."""
    method = getattr(type(task), name)
    if method is getattr(Task, name) or not callable(method):
        return None
    return method(task)


def _call_queue(queue: str | None) -> str | None:
    return None if queue is None else check_queue_name(queue, setting="enqueue(queue=)")


def _no_policy(task_type: type[Any]) -> bool:
    found = _NO_POLICY.get(task_type)
    if found is None:
        found = _NO_POLICY[task_type] = not task_type.ENCRYPTED and all(
            getattr(task_type, hook, None) is getattr(Task, hook) for hook in _HOOKS
        )
    return found


_ids_lock = threading.Lock()
_last_id = 0
"""The last id issued in this process, as an int: ids only ever grow."""


def new_ids(n: int) -> list[ULID]:
    """`n` ULIDs, strictly increasing across every call in this process (so listings by id
    are in creation order, also within a millisecond): the current millisecond and 80 random
    bits, or, if that would not exceed the last id issued, the last id plus one. Ten times
    cheaper than `ULID()` per id, which matters for bulk enqueue."""
    global _last_id
    ms = time.time_ns() // 1_000_000
    random_part = int.from_bytes(os.urandom(10), "big") >> 1  # headroom for the increments
    with _ids_lock:
        first = max((ms << 80) | random_part, _last_id + 1)
        _last_id = first + n - 1
    return [ULID((first + i).to_bytes(16, "big")) for i in range(n)]  # from_int, inlined


REKEY_SHOWN = 5
"""Values `rekey` could not open that its error names (it counts the rest)."""


class Queue:
    """Enqueue jobs and read their state. Cheap to create; share one per store.

    `codec` encodes payloads and carries (and decodes them in listings); the workers that
    run this queue's jobs must use the same one.

    A job goes to the named queue of the enqueue call (`queue=`), else of its task class
    (`QUEUE`), else of this `Queue` (its `queue=`, "default" unless given).

    Every enqueue takes `conn=`: a connection the caller holds (an `asyncpg.Connection` or a
    pool's), in a transaction the caller opened. The job is then written by the caller's
    transaction: it exists, and workers are woken, only if that transaction commits.
    A connection outside a transaction is a `ValueError`, unless `autocommit=True`.
    `Queue(store.using(conn))` runs every call, listings included, on `conn`.

    `tracer` traces every enqueue and stores its trace context with each job (see
    `venturi.otel`); without one nothing is traced and nothing extra is stored.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        queue: str = DEFAULT_QUEUE,
        hooks: Sequence[Hooks] = (),
        metrics: bool = False,
        codec: Codec = DEFAULT_CODEC,
        tracer: EnqueueTracer | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer
        self.queue = check_queue_name(queue)
        self.hooks = hook_set(hooks, metrics=metrics)
        self.codec = codec

    async def enqueue(
        self,
        task: Task[Any],
        *,
        priority: Priority | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> ULID:
        """Store a job that is eligible now; returns its id. `queue` names the job's queue
        for this call (over the task's `QUEUE` and this Queue's).

        When the task has a `dedup_key()` and a pending job of its KIND has the same key,
        `task.merge(existing)` decides, and the id returned is the one holding the work.
        """
        store = self._store_for(conn, autocommit)
        job = self._new_job(task, priority=priority, queue=_call_queue(queue))
        return await self._insert(store, task, job)

    def _store_for(self, conn: Connection | None, autocommit: bool) -> PostgresStore:
        if conn is None:
            if autocommit:
                raise ValueError("autocommit=True applies to a caller's connection (conn=)")
            return self.store
        return self.store.using(conn, autocommit=autocommit)

    async def _insert(self, store: PostgresStore, task: Task[Any], job: NewJob) -> ULID:
        if self.tracer is None:
            return await self._insert_untraced(store, task, job)
        with self.tracer.enqueue(job.queue, [(job.id, job.kind)]) as contexts:
            job.trace_context = contexts[0]
            holder = await self._insert_untraced(store, task, job)
            merged = getattr(self.tracer, "merged", None)  # optional: venturi.otel's has it
            if holder != job.id and merged is not None:
                merged(holder)
            return holder

    async def _insert_untraced(self, store: PostgresStore, task: Task[Any], job: NewJob) -> ULID:
        if job.unique_key is not None:
            holder = await store.insert_unique(job)
            self._log(job)
            if self.hooks.active:
                merged = None if holder == job.id else "unique"
                self.hooks.enqueued(Enqueued(holder, job.kind, job.queue, merged))
            return holder
        if job.dedup_key is None:
            await store.insert(NewJobs.of([job]))
            self._log(job)
            if self.hooks.active:
                self.hooks.enqueued(Enqueued(job.id, job.kind, job.queue))
            return job.id
        plans: list[MergePlan] = []

        def decide(existing: ExistingJob) -> MergePlan:
            plans.append(self._merge_plan(task, job, existing))
            return plans[-1]

        holder = await store.insert_deduplicated(job, decide)
        self._log(job)
        if self.hooks.active:
            merged = plans[0].action if plans and plans[0].action != "independent" else None
            self.hooks.enqueued(Enqueued(holder, job.kind, job.queue, merged))
        return holder

    def _merge_plan(self, task: Task[Any], job: NewJob, existing: ExistingJob) -> MergePlan:
        codec = self.codec
        task_type = type(task)
        carry_type = carry_type_of(task_type)
        holder = existing.id
        pending: Pending[Any] = Pending(
            id=ULID.from_bytes(holder.bytes),
            task=codec.decode(task_type, existing.payload, kind=job.kind, job_id=holder),
            carry=(
                None
                if carry_type is None
                else codec.decode(carry_type, existing.carry, kind=job.kind, job_id=holder)
                if existing.carry is not None
                else carry_type()
            ),
            run_count=existing.run_count,
            journal=existing.journal,
        )
        decision = task.merge(pending)
        if not isinstance(decision, Merge):
            raise TypeError(f"{task_type.__qualname__}.merge() returned {decision!r}, not a Merge")
        if decision.action is MergeAction.KEEP:
            return MergePlan("keep")
        if decision.action is MergeAction.INDEPENDENT:
            return MergePlan("independent")
        if decision.action is MergeAction.REPLACE:
            # A sealed payload is bound to its job: seal it again for the holder.
            payload = (
                stored_text(
                    codec,
                    codec.encode(task, role="payload", kind=job.kind, job_id=holder),
                    role="payload",
                    kind=job.kind,
                )
                if task_type.ENCRYPTED
                else job.payload
            )
            return MergePlan("replace", payload, True, None, job.priority)
        merged = decision.task
        if type(merged) is not task_type:
            raise TypeError(f"Merge.with_() needs a {task_type.__qualname__}, got {merged!r}")
        carry = None
        if decision.carry is not None:
            what = "merged carry"
            carry = codec.encode(decision.carry, role=what, kind=job.kind, job_id=holder)
            carry = stored_text(codec, carry, role=what, kind=job.kind)
        what = "merged payload"
        payload = codec.encode(merged, role=what, kind=job.kind, job_id=holder)
        return MergePlan(
            "with",
            stored_text(codec, payload, role=what, kind=job.kind),
            True,
            carry,
            int(_priority(merged.priority(), f"{task_type.__name__}.priority()")),
        )

    async def enqueue_at(
        self,
        task: Task[Any],
        when: datetime,
        *,
        priority: Priority | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> ULID:
        """Store a job that becomes eligible at `when` (a timezone-aware datetime, within ten
        years of now either way)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"enqueue_at: `when` must be a timezone-aware datetime, got {when!r}")
        if abs((when - datetime.now(UTC)).total_seconds()) > MAX_DELAY:
            raise ValueError(f"enqueue_at: `when` must be within 10 years of now, got {when!r}")
        store = self._store_for(conn, autocommit)
        job = self._new_job(task, priority=priority, queue=_call_queue(queue), run_at=when)
        return await self._insert(store, task, job)

    async def enqueue_in(
        self,
        task: Task[Any],
        delay: Seconds,
        *,
        priority: Priority | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> ULID:
        """Store a job that becomes eligible `delay` from now (by the database clock)."""
        delay_s = to_seconds(delay, name="enqueue_in(delay)")
        store = self._store_for(conn, autocommit)
        job = self._new_job(task, priority=priority, queue=_call_queue(queue), delay_s=delay_s)
        return await self._insert(store, task, job)

    async def enqueue_many(
        self,
        tasks: Iterable[Task[Any]],
        *,
        priority: Priority | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> list[ULID]:
        """Store many jobs in one round trip; returns their ids in order.

        Every payload is encoded before anything is sent, so one bad task fails the call
        and nothing is stored. Tasks with a dedup key go through the merge path one by one
        (after the batch); the ids returned are then the ids holding their work. The jobs
        may go to several queues (their tasks' `QUEUE`s), still in one statement.
        """
        store = self._store_for(conn, autocommit)
        called = _call_queue(queue)
        tasks = list(tasks)
        if self.tracer is None or not tasks:
            return await self._insert_many(store, tasks, priority, called, None)
        ids = new_ids(len(tasks))
        kinds = [_task_kind(t) for t in tasks]
        destination = called or _task_queue(type(tasks[0])) or self.queue
        with self.tracer.enqueue(destination, list(zip(ids, kinds, strict=True))) as contexts:
            return await self._insert_many(store, tasks, priority, called, (ids, contexts))

    async def _insert_many(
        self,
        store: PostgresStore,
        tasks: list[Task[Any]],
        priority: Priority | None,
        called: str | None,
        traced: tuple[list[ULID], Sequence[str | None]] | None,
    ) -> list[ULID]:
        """enqueue_many's inserts; `traced`: the ids chosen and their trace contexts."""
        ids, contexts = traced if traced is not None else (new_ids(len(tasks)), None)
        one_of_each = {type(task): task for task in tasks}
        for task in one_of_each.values():
            _task_kind(task)  # a task of each class, checked before anything is sent
        if all(_no_policy(tp) for tp in one_of_each):
            batch = self._plain_jobs(tasks, ids, priority, called, contexts)
            await store.insert(batch)
            self._enqueued(batch)
            logger.debug("enqueued %d jobs", len(ids))
            return ids
        jobs = [
            self._new_job(t, priority=priority, queue=called, job_id=i)
            for t, i in zip(tasks, ids, strict=True)
        ]
        if contexts is not None:
            for job, context in zip(jobs, contexts, strict=True):
                job.trace_context = context
        plain = NewJobs.of([j for j in jobs if j.dedup_key is None and j.unique_key is None])
        await store.insert(plain)
        self._enqueued(plain)
        ids = []
        for task, job in zip(tasks, jobs, strict=True):
            if job.dedup_key is None and job.unique_key is None:
                ids.append(job.id)
            else:
                ids.append(await self._insert_untraced(store, task, job))
        logger.debug("enqueued %d jobs", len(jobs))
        return ids

    def _plain_jobs(
        self,
        tasks: Sequence[Task[Any]],
        ids: list[ULID],
        priority: Priority | None,
        called: str | None,
        contexts: Sequence[str | None] | None = None,
    ) -> NewJobs:
        """The jobs of `tasks` that have no per-job policy (the caller checked: no hooks to
        call, no dedup keys), by column, without a record per job: the common bulk case."""
        tier = int(_priority(priority, "priority=")) if priority is not None else _NORMAL
        # Looked up once per task class, not once per job (a batch is usually of one class).
        classes = {
            tp: (_kind(tp), called or _task_queue(tp) or self.queue) for tp in set(map(type, tasks))
        }
        kinds = [classes[type(t)][0] for t in tasks]
        encode = self.codec.encode
        payloads = [encode(t, kind=k) for t, k in zip(tasks, kinds, strict=True)]
        queues = [classes[type(t)][1] for t in tasks]
        first = queues[0] if queues else self.queue
        by_job = None if queues.count(first) == len(queues) else queues
        traces = None if contexts is None else _optional_column(contexts)
        return NewJobs(
            first, ids, kinds, [tier] * len(ids), payloads, queues=by_job, trace_contexts=traces
        )

    @contextlib.contextmanager
    def _send_span(self, *groups: NewJobs) -> Iterator[None]:
        """The tracer's `send` span around storing `groups` (a chain's links, a batch's
        members and callbacks), each job's trace context set from it; nothing without a
        tracer."""
        if self.tracer is None:
            yield
            return
        jobs = [
            (ULID.from_bytes(i.bytes), kind)
            for group in groups
            for i, kind in zip(group.ids, group.kinds, strict=True)
        ]
        with self.tracer.enqueue(groups[0].queue, jobs) as contexts:
            start = 0
            for group in groups:
                group.trace_contexts = _optional_column(contexts[start : start + len(group.ids)])
                start += len(group.ids)
            yield

    def _enqueued(self, jobs: NewJobs) -> None:
        """Tell the hooks about `jobs`, just stored."""
        if not self.hooks.active:
            return
        queues = jobs.queues if jobs.queues is not None else [jobs.queue] * len(jobs.ids)
        for job_id, kind, q in zip(jobs.ids, jobs.kinds, queues, strict=True):
            assert isinstance(job_id, ULID)
            self.hooks.enqueued(Enqueued(job_id, kind, q))

    async def chain(
        self,
        *tasks: Task[Any],
        priority: Priority | None = None,
        queue: str | None = None,
        conn: Connection | None = None,
    ) -> list[ULID]:
        """Store `tasks` as a chain: each starts only after the one before it completes
        (the release happens in the transaction that completes it). Returns their ids in
        order. If a link fails for good, the rest wait (status WAITING); retrying the failed
        link resumes the chain there. `queue=` as for `enqueue` (each link's own `QUEUE`
        otherwise); `conn=` runs it in the caller's transaction."""
        if not tasks:
            raise ValueError("chain: expected at least one task")
        called = _call_queue(queue)
        jobs = [self._new_job(t, priority=priority, queue=called) for t in tasks]
        for task, job in zip(tasks, jobs, strict=True):
            if job.dedup_key is not None or job.unique_key is not None:
                raise ValueError(
                    f"chain: {type(task).__qualname__} has a dedup key or a unique id; a "
                    "chain's links cannot merge into other jobs"
                )
        links = NewJobs.of(jobs)
        with self._send_span(links):
            await self._store_for(conn, False).insert_chain(links)
        self._enqueued(links)
        return [j.id for j in jobs]

    def batch(
        self, name: str, *, priority: Priority | None = None, queue: str | None = None
    ) -> Batch:
        """A new batch named `name`: add members and callbacks, then `await
        batch.enqueue()` (see `venturi.batches`). `priority=` and `queue=` apply to its
        members and callbacks alike, as for `enqueue`."""
        called = _call_queue(queue)

        async def submit(batch: Batch, conn: Connection | None) -> ULID:
            return await self._insert_batch(batch, priority, called, conn)

        return Batch(name, submit)

    async def _insert_batch(
        self,
        batch: Batch,
        priority: Priority | None,
        queue: str | None,
        conn: Connection | None,
    ) -> ULID:
        tasks = batch.members
        if all(_no_policy(type(t)) for t in tasks):  # the common case: by column, fast
            members = self._plain_jobs(tasks, new_ids(len(tasks)), priority, queue)
        else:
            members = NewJobs.of(self._batch_jobs(batch, tasks, priority, queue))
        roles = list(batch.callbacks)
        callbacks = NewJobs.of(
            self._batch_jobs(batch, list(batch.callbacks.values()), priority, queue)
        )
        batch_id = new_ids(1)[0]
        row = NewBatch(uuid.UUID(bytes=batch_id.bytes), batch.name, batch.failures_allowed)
        store = self._store_for(conn, False)
        with self._send_span(members, callbacks):
            await store.insert_batch(row, members, callbacks, roles)
        self._enqueued(members)
        self._enqueued(callbacks)
        logger.debug("enqueued batch %s: %d jobs", batch_id, len(members))
        return batch_id

    def _batch_jobs(
        self,
        batch: Batch,
        tasks: Sequence[Task[Any]],
        priority: Priority | None,
        queue: str | None,
    ) -> list[NewJob]:
        jobs = [self._new_job(t, priority=priority, queue=queue) for t in tasks]
        for job in jobs:
            if job.dedup_key is not None or job.unique_key is not None:
                raise ValueError(
                    f"batch {batch.name!r}: {job.kind} has a dedup key or a unique id; a "
                    "batch's jobs cannot merge into other jobs"
                )
        return jobs

    async def batch_status(self, batch_id: ULID | str) -> BatchStatus | None:
        """The batch's progress (`BatchStatus`: done, failed, cancelled, pending, percent),
        or None if there is no such batch (or it was pruned)."""
        return await self.store.batch_status(_batch_key(batch_id))

    async def recent_batches(
        self, n: int = 20, *, before: ULID | str | None = None
    ) -> list[BatchStatus]:
        """The newest `n` batches (1..1000), newest first; `before=` the id of the last one
        seen, for the page after it."""
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1000:
            raise ValueError(f"recent_batches(n): expected an int in 1..1000, got {n!r}")
        older_than = None if before is None else _batch_key(before)
        return await self.store.recent_batches(n, older_than)

    async def cancel_batch(self, batch_id: ULID | str) -> int:
        """Cancel the batch: its members not started yet (pending, retries waiting for their
        backoff included) end cancelled; running ones finish. `then` will not run; `finally`
        runs once the running members finish. Returns how many were skipped (0 for a
        finished batch). Raises LookupError if there is no such batch."""
        skipped = await self.store.cancel_batch(_batch_key(batch_id))
        if skipped is None:
            raise LookupError(f"cancel_batch({batch_id}): no such batch")
        return skipped

    async def prune_batches(self, older_than: Seconds, *, batch_size: int = 1000) -> int:
        """Delete batches that finished more than `older_than` (seconds, or a timedelta)
        ago, in bounded batches; returns how many. Their jobs stay (see `cleanup`)."""
        age = to_seconds(older_than, name="prune_batches(older_than)", high=MAX_DELAY)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"prune_batches(batch_size): expected an int >= 1, got {batch_size!r}")
        before = await self.store.database_now() - timedelta(seconds=age)
        return await self.store.prune_batches(before, batch_size)

    async def job(self, job_id: ULID | str) -> Job | None:
        """The stored job, or None if there is no such job (or it was cleaned up)."""
        return await self.store.get_job(_ulid(job_id, "job id"), self.codec)

    async def result(self, job_id: ULID | str, *, timeout: Seconds) -> Any:  # noqa: ASYNC109
        """Wait until the job finishes and return its result (`Outcome.completed(result=...)`,
        None if it returned none), without polling: the settle that finishes an awaited job
        notifies (see `PostgresStore.wait_finished`, which holds one pool connection while
        it waits; behind a transaction pooler without `listen_dsn` it looks at the job).

        Raises `TimeoutError` after `timeout` (seconds, or a timedelta) if it has not
        finished, `JobFailed` if it failed for good (dead), `JobStateError` if it was
        cancelled (a batch member skipped by its batch's cancellation), and `LookupError` if
        there is no such job (or it was cleaned up).
        """
        job_id = _ulid(job_id, "job id")
        wait = to_seconds(timeout, name="result(timeout)")
        try:
            async with asyncio.timeout(wait):
                job = await self.store.wait_finished(job_id, self.codec)
        except TimeoutError:
            raise TimeoutError(
                f"result({job_id}): the job did not finish within {wait:g}s"
            ) from None
        if job is None:
            raise LookupError(f"result({job_id}): no such job")
        if job.status is JobStatus.DEAD:
            raise JobFailed(
                f"job {job.id} ({job.kind}) failed for good: {job.last_error}",
                job_id=str(job.id),
                error=job.last_error,
            )
        if job.status is JobStatus.CANCELLED:
            raise JobStateError(
                f"result({job_id}): the job was cancelled before it ran (its batch was cancelled)",
                status=job.status,
            )
        return job.result

    async def jobs(self, filter: JobFilter | None = None) -> list[Job]:
        """Jobs matching `filter` (all by default), newest first, at most `filter.limit`."""
        f = filter or JobFilter()
        _kind_filter(f.kind)
        if f.queue is not None:
            check_queue_name(f.queue, setting="JobFilter.queue")
        for name, when in (("after", f.created_after), ("before", f.created_before)):
            if when is not None and (not isinstance(when, datetime) or when.tzinfo is None):
                raise ValueError(
                    f"JobFilter.created_{name}: expected a timezone-aware datetime, got "
                    f"{shown(when)}"
                )
        if f.before_id is not None and not isinstance(f.before_id, ULID):
            f = dataclasses.replace(f, before_id=_ulid(f.before_id, "JobFilter.before_id"))
        if isinstance(f.limit, bool) or not isinstance(f.limit, int) or not 1 <= f.limit <= 10_000:
            raise ValueError(f"JobFilter.limit: expected 1..10000, got {shown(f.limit)}")
        return await self.store.list_jobs(f, self.codec)

    async def cleanup(self, criteria: CleanupCriteria) -> int:
        """Delete finished jobs (and their journal) matching `criteria`; returns how many.

        Works in bounded batches, each its own short transaction, so it never holds long
        locks on a busy queue.
        """
        if criteria.status not in (None, JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED):
            raise ValueError(
                f"CleanupCriteria.status: only completed, dead or cancelled jobs can be deleted, "
                f"got {criteria.status}"
            )
        if criteria.finished_before.tzinfo is None:
            raise ValueError("CleanupCriteria.finished_before must be timezone-aware")
        _kind_filter(criteria.kind)
        return await self.store.cleanup(criteria)

    async def rekey(self, *, batch_size: int = 500) -> int:
        """Seal again, with the key ring's current key, every stored payload and carry sealed
        with an older key (all jobs, finished ones too), so the old keys can be retired;
        returns how many jobs were rewritten. Needs `codec=SealedCodec(...)` holding the old
        keys as well. Safe while workers run: a value written in between is kept.

        A value that does not open (its key left the ring, or it was tampered with) is left
        as it is and the rest rewritten; then `ValueError` says how many were rewritten and
        names those left (do not retire their key until they are dealt with)."""
        codec = self.codec
        if not isinstance(codec, SealedCodec):
            raise TypeError("rekey: the Queue's codec must be a SealedCodec with the key ring")
        after, total = uuid.UUID(int=0), 0
        unopened: list[str] = []
        while rows := await self.store.sealed_after(after, codec.ring.current, batch_size):
            rewrites = []
            for r in rows:
                kind, job_id = r["kind"], r["id"]
                try:
                    payload = codec.reseal(r["payload"], kind=kind, job_id=job_id)
                    carry = None
                    if r["carry"] is not None:
                        carry = codec.reseal(r["carry"], kind=kind, job_id=job_id)
                except ValueError as exc:
                    unopened.append(f"job {ULID.from_bytes(job_id.bytes)} ({kind}): {exc}")
                    continue
                rewrites.append((job_id, r["payload"], payload, r["carry"], carry))
            total += await self.store.rewrite_sealed(rewrites)
            after = rows[-1]["id"]
        if unopened:
            shown = "; ".join(unopened[:REKEY_SHOWN])
            more = (
                f"; and {len(unopened) - REKEY_SHOWN:,} more" if len(unopened) > REKEY_SHOWN else ""
            )
            raise ValueError(
                f"rekey: rewrote {total:,} jobs with key {codec.ring.current!r}, but "
                f"{len(unopened):,} did not open and were left as they are: {shown}{more}. "
                "Keep their keys in the ring until they are dealt with (deleted with `venturi "
                "failed forget` or `cleanup`, or their key put back)"
            )
        return total

    async def job_journal(self, job_id: ULID | str) -> list[JournalEntry]:
        """Every journal entry of one job, oldest first."""
        return await self.store.journal(_ulid(job_id, "job id"))

    async def stats(self) -> Stats:
        """Live counts by kind: pending (eligible), scheduled, claimed, dead, completed, oldest
        age, done and failed in the last hour; totals over every queue, and the same per queue
        in `Stats.queues` (not only this `Queue`'s); and the queues paused now."""
        return await self.store.stats()

    async def finished_per_minute(self, queue: str | None = None) -> list[MinuteCounts]:
        """Jobs done and failed for good per minute, per queue and kind, over the last two
        hours (all that is kept), oldest first; minutes without any have no entry. `queue`
        None: every queue."""
        if queue is not None:
            check_queue_name(queue)
        return await self.store.finished_per_minute(queue)

    # -- failed jobs -----------------------------------------------------------------

    async def failed(
        self,
        *,
        queue: str | None = None,
        kind: str | type[Task[Any]] | None = None,
        before_id: ULID | None = None,
        limit: int = 100,
    ) -> list[FailedJob]:
        """Jobs that failed for good (status dead), of `queue` and `kind` (None: any), newest
        first by id (when each was enqueued; `failed_at` says when it failed), at most `limit`
        (1..10000); page with `before_id`, the last id of a page."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise ValueError(f"failed(limit=): expected an int from 1 to 10000, got {limit!r}")
        return await self.store.list_failed(
            queue=_queue_filter(queue),
            kind=_kind_filter(kind),
            before_id=before_id,
            limit=limit,
            codec=self.codec,
        )

    async def retry(self, job_id: ULID | str, *, note: str | None = None) -> None:
        """Put a failed job back in its queue, eligible now, with a fresh failure count (so
        it gets every attempt again); its journal is kept and gains a `retried` entry (its
        note: `note`, say who retried it; "retried by hand" by default), and a worker of its
        queue is woken. A job that is missing or has not failed is a `JobStateError` naming
        its status, and nothing changes."""
        job_id = _ulid(job_id, "job id")
        before = await self.store.retry_failed(job_id, note=_retry_note(note))
        _expect_dead(job_id, before, "retried")

    async def retry_all(
        self,
        *,
        kind: str | type[Task[Any]] | None = None,
        queue: str | None = None,
        note: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Retry every failed job of `kind` and `queue` (None: any), as `retry` does (`note`
        too); returns how many. Works in bounded batches, each its own short transaction,
        oldest first; `limit` stops it after that many (None: all). A queue nothing names
        (no job kept in it, no pause, no worker) is a ValueError, most likely a typo."""
        name, kind_name = _queue_filter(queue), _kind_filter(kind)
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValueError(f"retry_all(limit=): expected an int >= 1 or None, got {limit!r}")
        n = await self.store.retry_all_failed(
            queue=name, kind=kind_name, note=_retry_note(note), limit=limit
        )
        if n == 0 and name is not None and not await self.store.queue_known(name):
            raise ValueError(
                f"retry_all(queue={name!r}): unknown queue (no job, pause or worker names it)"
            )
        return n

    async def forget(self, job_id: ULID | str) -> None:
        """Delete one failed job and its journal. A job that is missing or has not failed is a
        `JobStateError` naming its status, and nothing is deleted."""
        job_id = _ulid(job_id, "job id")
        _expect_dead(job_id, await self.store.forget_failed(job_id), "forgotten")

    async def flush(
        self,
        *,
        kind: str | type[Task[Any]] | None = None,
        queue: str | None = None,
        before: datetime | None = None,
    ) -> int:
        """Delete the failed jobs of `kind` and `queue` (None: any) that failed before
        `before` (timezone-aware; None: all), with their journal; returns how many. A queue
        nothing names is a ValueError, as for `retry_all` (most likely a typo)."""
        if before is not None and (not isinstance(before, datetime) or before.tzinfo is None):
            raise ValueError(f"flush(before=): expected a timezone-aware datetime, got {before!r}")
        name = _queue_filter(queue)
        n = await self.store.flush_failed(queue=name, kind=_kind_filter(kind), before=before)
        if n == 0 and name is not None and not await self.store.queue_known(name):
            raise ValueError(
                f"flush(queue={name!r}): unknown queue (no job, pause or worker names it)"
            )
        return n

    async def pending(self) -> int:
        """Jobs waiting (due now or later) or running, in every queue of this store."""
        return await self.store.outstanding()

    async def pause(
        self, name: str, *, reason: str | None = None, until: datetime | None = None
    ) -> QueueState:
        """Pause the named queue: its jobs stay pending and no worker claims them (jobs
        running now finish) until `resume(name)`, or until `until` (a timezone-aware
        datetime) passes. Stored, so it survives every restart, and announced to every
        worker at once. A queue that has no jobs yet may be paused; pausing a paused queue
        updates its reason and until. Returns the queue's state."""
        name = check_queue_name(name, setting="pause(name)")
        reason = check_reason(reason)
        until = check_until(until)
        return await self.store.pause_queue(name, reason=reason, until=until)

    async def resume(self, name: str) -> bool:
        """Resume the named queue (idle workers serving it are woken at once); returns
        whether it was paused."""
        return await self.store.resume_queue(check_queue_name(name, setting="resume(name)"))

    async def queues(self) -> list[QueueState]:
        """Every queue with pending jobs or a stored pause, by name, paused or not."""
        return await self.store.list_queues()

    async def schedules(self) -> list[ScheduleInfo]:
        """The periodic schedules workers run (as recorded in the database), with each one's
        last and next tick and how many ticks it enqueued and skipped."""
        return await self.store.schedules()

    async def claimed_by_pod(self) -> dict[str, int]:
        """Claimed jobs per pod name (the worker's `WorkerIdentity.pod`), busy pods only; jobs
        claimed outside Kubernetes are not counted. The operator spares busy pods with it."""
        return await self.store.claimed_by_pod()

    async def fence_pods(self, pods: Iterable[str], *, ttl: Seconds = FENCE_TTL) -> None:
        """Stop `pods` claiming, for `ttl` seconds (30 s by default) or until `unfence_pods`:
        when this returns, every claim those pods had in flight has committed (and shows in
        `claimed_by_pod`), and their workers claim nothing more; what they hold runs on. The
        operator fences the pods it is about to scale in. Workers outside Kubernetes have no
        pod, and are never fenced."""
        names = _pod_names(pods)
        if names:
            await self.store.fence_pods(names, to_seconds(ttl, name="ttl", low=1, high=86400))

    async def unfence_pods(self, pods: Iterable[str]) -> None:
        """Let `pods` claim again (fences past their ttl are forgotten too)."""
        await self.store.unfence_pods(_pod_names(pods))

    async def fenced_pods(self) -> list[str]:
        """The pods fenced now, by name."""
        return await self.store.fenced_pods()

    async def workers(self) -> list[WorkerInfo]:
        """The workers of this store's prefix (every queue), oldest first: what each serves,
        and when it was last heard from (`WorkerInfo.live`)."""
        return await self.store.workers()

    async def unserved_kinds(self) -> dict[str, list[str]]:
        """Pending KINDs that no live worker serving their queue registers, by queue (every
        queue of the prefix): such jobs wait until a worker that knows them starts."""
        return await self.store.unserved_kinds()

    def _new_job(
        self,
        task: Task[Any],
        *,
        priority: Priority | None,
        queue: str | None,
        run_at: datetime | None = None,
        delay_s: float | None = None,
        job_id: ULID | None = None,
    ) -> NewJob:
        kind = _task_kind(task)
        owner = type(task).__name__  # what a message about its methods names
        queue = queue or _task_queue(type(task)) or self.queue
        if job_id is None:
            job_id = new_ids(1)[0]
        if task.ENCRYPTED and not getattr(self.codec, "seals", False):
            raise PayloadError(
                f"{kind} is an encrypted task (ENCRYPTED = True): give the Queue "
                f"codec=SealedCodec(KeyRing...) (see venturi.encryption); nothing was stored"
            )
        payload = stored_text(
            self.codec,
            self.codec.encode(task, role="payload", kind=kind, job_id=job_id),
            role="payload",
            kind=kind,
        )
        tier = priority if priority is not None else task.priority()
        if type(tier) is not Priority:
            tier = _priority(tier, "priority=" if priority is not None else f"{owner}.priority()")
        lease = task.lease()
        backoff = task.backoff()
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"{owner}.backoff() must return a Backoff or None, got {backoff!r}")
        dedup = task.dedup_key()
        if dedup is not None and not isinstance(dedup, DedupKey):
            raise TypeError(f"{owner}.dedup_key() must return a DedupKey or None, got {dedup!r}")
        unique_for, unique_key = _unique(task, owner)
        if unique_key is not None and dedup is not None:
            raise ValueError(
                f"{owner}: unique_for()/unique_id() and dedup_key() are alternatives (a unique "
                f"job keeps the first, a deduplicated one merges into it): set one"
            )
        attempts = _hook(task, "max_attempts")
        timeout = _hook(task, "timeout")
        return NewJob(
            id=job_id,
            kind=kind,
            queue=queue,
            priority=int(tier),
            payload=payload,
            run_at=run_at,
            delay_s=delay_s,
            lease_s=check_lease(lease, setting=f"{owner}.lease()") if lease is not None else None,
            backoff_base_s=backoff.base if backoff is not None else None,
            backoff_cap_s=backoff.cap if backoff is not None else None,
            dedup_key=dedup.value if dedup is not None else None,
            unique_key=unique_key,
            unique_for_s=unique_for,
            max_attempts=(
                None
                if attempts is None
                else check_max_attempts(attempts, setting=f"{owner}.max_attempts()")
            ),
            timeout_s=None
            if timeout is None
            else check_timeout(timeout, setting=f"{owner}.timeout()"),
        )

    @staticmethod
    def _log(job: NewJob) -> None:
        if not logger.isEnabledFor(logging.DEBUG):
            return  # the hot path: skip building the record's extras
        logger.debug(
            "enqueued job %s (%s)",
            job.id,
            job.kind,
            extra={"job_id": str(job.id), "kind": job.kind},
        )


RETRY_NOTE = "retried by hand"
"""The note of the `retried` journal entry `Queue.retry` and `retry_all` write."""


def _pod_names(pods: Iterable[str]) -> list[str]:
    if isinstance(pods, str):
        raise TypeError(f"pods: expected pod names (an iterable of str), got the str {shown(pods)}")
    names = list(pods)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"pods: expected pod names (str), got {shown(name)}")
        if not 1 <= len(name) <= POD_NAME_MAX or "\x00" in name:
            raise ValueError(
                f"pods: invalid pod name {shown(name)}: expected 1-{POD_NAME_MAX} characters"
            )
    return names


def _retry_note(note: str | None) -> str:
    if note is None:
        return RETRY_NOTE
    if not isinstance(note, str):
        raise TypeError(f"retry(note=): expected a str, got {shown(note)}")
    if not note.strip() or len(note) > 1000:
        raise ValueError(
            f"retry(note=): expected a non-empty str of at most 1000 characters, got {shown(note)}"
        )
    return note


def _priority(value: int, where: str) -> Priority:
    """A Priority from itself or its value, or a ValueError saying where it came from."""
    try:
        return Priority(value)
    except ValueError:
        names = ", ".join(f"{p.name} ({p.value})" for p in Priority)
        raise ValueError(f"{where}: expected a Priority, {names}; got {shown(value)}") from None


def _queue_filter(queue: str | None) -> str | None:
    return None if queue is None else check_queue_name(queue)


def _kind_filter(kind: str | type[Task[Any]] | None) -> str | None:
    if kind is None:
        return None
    if isinstance(kind, type):
        return _kind(kind)
    return check_kind(kind)


def _expect_dead(job_id: ULID, status: JobStatus | None, done: str) -> None:
    if status is None:
        raise JobStateError(f"no job {job_id}: nothing {done}")
    if status is not JobStatus.DEAD:
        raise JobStateError(
            f"job {job_id} is {status.value}, not failed: only failed (dead) jobs can be {done}",
            status.value,
        )


def _unique(task: Task[Any], owner: str) -> tuple[float | None, str | None]:
    """The task's (unique_for in seconds, unique id), both None for a task that is not
    unique; a ValueError when one is set without the other, or the id cannot be stored."""
    unique_for, unique_id = task.unique_for(), task.unique_id()
    if unique_for is None and unique_id is None:
        return None, None
    if unique_id is None:
        raise ValueError(
            f"{owner}.unique_for() is set but {owner}.unique_id() returned None: a unique job "
            f"needs the id that makes two jobs the same (define unique_id())"
        )
    if unique_for is None:
        raise ValueError(
            f"{owner}.unique_id() is set but {owner}.unique_for() returned None: a unique job "
            f"needs how long it holds its id at most (define unique_for())"
        )
    seconds = to_seconds(unique_for, name=f"{owner}.unique_for()", low=1e-3)
    text = str(unique_id)
    if "\x00" in text:
        raise ValueError(f"{owner}.unique_id(): the id holds a NUL character: {shown(text)}")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{owner}.unique_id(): not valid Unicode: {shown(text)}") from None
    if size > DEDUP_KEY_MAX_BYTES:
        raise ValueError(
            f"{owner}.unique_id(): the id is {size:,} bytes of UTF-8, over the "
            f"{DEDUP_KEY_MAX_BYTES:,}-byte limit (hash a long identity)"
        )
    return seconds, text


def _optional_column(values: Sequence[str | None]) -> list[str | None] | None:
    """None (sent as one NULL) when no job has a value (a tracer without an SDK behind it)."""
    return None if all(v is None for v in values) else list(values)


def _batch_key(batch_id: ULID | str) -> uuid.UUID:
    """A batch id as the store keys it; a string must be a ULID (as `enqueue` returned)."""
    return _ulid(batch_id, "batch id").to_uuid()


def _ulid(value: ULID | str | uuid.UUID, what: str) -> ULID:
    """A job's or batch's id, given as a ULID, its string (as the CLI and logs show it) or
    the UUID the database stores."""
    if isinstance(value, ULID):
        return value
    if isinstance(value, uuid.UUID):
        return ULID.from_uuid(value)
    if isinstance(value, str):
        try:
            return ULID.from_str(value)
        except ValueError:
            raise ValueError(f"{what}: expected a ULID, got {shown(value)}") from None
    raise TypeError(f"{what}: expected a ULID or its string, got {shown(value)}")
