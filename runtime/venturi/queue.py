"""`Queue`: the producer's handle. It needs task classes only, never handlers.

queue = Queue(store)
job_id = await queue.enqueue(SendEmail(to="a@example.com", subject="hi"))
await queue.enqueue_in(Reminder(user=7), timedelta(hours=1))
ids = await queue.enqueue_many(SendEmail(to=a, subject="x") for a in addresses)

async with conn.transaction():                 # the caller's connection and transaction:
    await queue.enqueue(Welcome(user=7), conn=conn)   # the job exists if this commits
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ulid import ULID

from venturi._hooks import hook_set
from venturi._records import ExistingJob, MergePlan, NewJob, NewJobs
from venturi._settings import DEFAULT_QUEUE, check_lease, check_queue_name
from venturi.backoff import MAX_DELAY, Backoff, Seconds, to_seconds
from venturi.codec import DEFAULT_CODEC, Codec
from venturi.encryption import SealedCodec
from venturi.errors import PayloadError
from venturi.hooks import Enqueued, Hooks
from venturi.jobs import CleanupCriteria, Job, JobFilter, JobStatus, JournalEntry, Stats
from venturi.merge import DedupKey, Merge, MergeAction, Pending
from venturi.postgres import Connection, PostgresStore
from venturi.schedules import ScheduleInfo
from venturi.task import Priority, Task, carry_type_of, kind_of

logger = logging.getLogger(__name__)

_KINDS: dict[type[Any], str] = {}
"""Validated KIND per task class (validation is per class, not per job)."""
_NO_POLICY: dict[type[Any], bool] = {}
"""Per task class: True when it overrides none of the enqueue-time policy hooks, so the
bulk path can skip calling them per job."""
_HOOKS = ("priority", "lease", "backoff", "dedup_key")
_NORMAL = int(Priority.NORMAL)


def _kind(task_type: type[Any]) -> str:
    return _KINDS.get(task_type) or _KINDS.setdefault(task_type, kind_of(task_type))


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
    return [ULID.from_int(first + i) for i in range(n)]


class Queue:
    """Enqueue jobs and read their state. Cheap to create; share one per store.

    `codec` encodes payloads and carries (and decodes them in listings); the workers that
    run this queue's jobs must use the same one.

    Every enqueue takes `conn=`: a connection the caller holds (an `asyncpg.Connection` or a
    pool's), in a transaction the caller opened. The job is then written by the caller's
    transaction: it exists, and workers are woken, only if that transaction commits.
    A connection outside a transaction is a `ValueError`, unless `autocommit=True`.
    `Queue(store.using(conn))` runs every call, listings included, on `conn`.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        queue: str = DEFAULT_QUEUE,
        hooks: Sequence[Hooks] = (),
        metrics: bool = False,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        self.store = store
        self.queue = check_queue_name(queue)
        self.hooks = hook_set(hooks, metrics=metrics)
        self.codec = codec

    async def enqueue(
        self,
        task: Task[Any],
        *,
        priority: Priority | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> ULID:
        """Store a job that is eligible now; returns its id.

        When the task has a `dedup_key()` and a pending job of its KIND has the same key,
        `task.merge(existing)` decides, and the id returned is the one holding the work.
        """
        store = self._store_for(conn, autocommit)
        return await self._insert(store, task, self._new_job(task, priority=priority))

    def _store_for(self, conn: Connection | None, autocommit: bool) -> PostgresStore:
        if conn is None:
            if autocommit:
                raise ValueError("autocommit=True applies to a caller's connection (conn=)")
            return self.store
        return self.store.using(conn, autocommit=autocommit)

    async def _insert(self, store: PostgresStore, task: Task[Any], job: NewJob) -> ULID:
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
                codec.encode(task, kind=job.kind, job_id=holder)
                if task_type.ENCRYPTED
                else job.payload
            )
            return MergePlan("replace", payload, True, None, job.priority)
        merged = decision.task
        if type(merged) is not task_type:
            raise TypeError(f"Merge.with_() needs a {task_type.__qualname__}, got {merged!r}")
        carry = None
        if decision.carry is not None:
            carry = codec.encode(decision.carry, role="merged carry", kind=job.kind, job_id=holder)
        return MergePlan(
            "with",
            codec.encode(merged, role="merged payload", kind=job.kind, job_id=holder),
            True,
            carry,
            int(Priority(merged.priority())),
        )

    async def enqueue_at(
        self,
        task: Task[Any],
        when: datetime,
        *,
        priority: Priority | None = None,
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
        return await self._insert(store, task, self._new_job(task, priority=priority, run_at=when))

    async def enqueue_in(
        self,
        task: Task[Any],
        delay: Seconds,
        *,
        priority: Priority | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> ULID:
        """Store a job that becomes eligible `delay` from now (by the database clock)."""
        delay_s = to_seconds(delay, name="enqueue_in(delay)")
        store = self._store_for(conn, autocommit)
        job = self._new_job(task, priority=priority, delay_s=delay_s)
        return await self._insert(store, task, job)

    async def enqueue_many(
        self,
        tasks: Iterable[Task[Any]],
        *,
        priority: Priority | None = None,
        conn: Connection | None = None,
        autocommit: bool = False,
    ) -> list[ULID]:
        """Store many jobs in one round trip; returns their ids in order.

        Every payload is encoded before anything is sent, so one bad task fails the call
        and nothing is stored. Tasks with a dedup key go through the merge path one by one
        (after the batch); the ids returned are then the ids holding their work.
        """
        store = self._store_for(conn, autocommit)
        tasks = list(tasks)
        ids = new_ids(len(tasks))
        if all(_no_policy(type(t)) for t in tasks):
            # The common case, without a record per job: no hooks to call, no dedup keys.
            tier = int(Priority(priority)) if priority is not None else _NORMAL
            kinds = [_kind(type(t)) for t in tasks]
            encode = self.codec.encode
            payloads = [encode(t, kind=k) for t, k in zip(tasks, kinds, strict=True)]
            await store.insert(NewJobs(self.queue, ids, kinds, [tier] * len(ids), payloads))
            if self.hooks.active:
                for job_id, kind in zip(ids, kinds, strict=True):
                    self.hooks.enqueued(Enqueued(job_id, kind, self.queue))
            logger.debug("enqueued %d jobs", len(ids))
            return ids
        jobs = [
            self._new_job(t, priority=priority, job_id=i) for t, i in zip(tasks, ids, strict=True)
        ]
        plain = [j for j in jobs if j.dedup_key is None]
        await store.insert(NewJobs.of(plain))
        if self.hooks.active:
            for j in plain:
                self.hooks.enqueued(Enqueued(j.id, j.kind, j.queue))
        ids = []
        for task, job in zip(tasks, jobs, strict=True):
            if job.dedup_key is None:
                ids.append(job.id)
            else:
                ids.append(await self._insert(store, task, job))
        logger.debug("enqueued %d jobs", len(jobs))
        return ids

    async def chain(
        self,
        *tasks: Task[Any],
        priority: Priority | None = None,
        conn: Connection | None = None,
    ) -> list[ULID]:
        """Store `tasks` as a chain: each starts only after the one before it completes
        (the release happens in the transaction that completes it). Returns their ids in
        order. If a link fails for good, the rest wait (status WAITING); retrying the failed
        link resumes the chain there. `conn=` runs it in the caller's transaction."""
        if not tasks:
            raise ValueError("chain: expected at least one task")
        jobs = [self._new_job(t, priority=priority) for t in tasks]
        for task, job in zip(tasks, jobs, strict=True):
            if job.dedup_key is not None:
                raise ValueError(
                    f"chain: {type(task).__qualname__} has a dedup key; a chain's links cannot "
                    "merge into other jobs"
                )
        await self._store_for(conn, False).insert_chain(NewJobs.of(jobs))
        if self.hooks.active:
            for j in jobs:
                self.hooks.enqueued(Enqueued(j.id, j.kind, j.queue))
        return [j.id for j in jobs]

    async def job(self, job_id: ULID) -> Job | None:
        """The stored job, or None if there is no such job (or it was cleaned up)."""
        return await self.store.get_job(job_id, self.codec)

    async def jobs(self, filter: JobFilter | None = None) -> list[Job]:
        """Jobs matching `filter` (all by default), newest first, at most `filter.limit`."""
        f = filter or JobFilter()
        if not 1 <= f.limit <= 10_000:
            raise ValueError(f"JobFilter.limit: expected 1..10000, got {f.limit}")
        return await self.store.list_jobs(f, self.codec)

    async def cleanup(self, criteria: CleanupCriteria) -> int:
        """Delete finished jobs (and their journal) matching `criteria`; returns how many.

        Works in bounded batches, each its own short transaction, so it never holds long
        locks on a busy queue.
        """
        if criteria.status not in (None, JobStatus.COMPLETED, JobStatus.DEAD):
            raise ValueError(
                f"CleanupCriteria.status: only completed or dead jobs can be deleted, "
                f"got {criteria.status}"
            )
        if criteria.finished_before.tzinfo is None:
            raise ValueError("CleanupCriteria.finished_before must be timezone-aware")
        return await self.store.cleanup(criteria)

    async def rekey(self, *, batch_size: int = 500) -> int:
        """Seal again, with the key ring's current key, every stored payload and carry sealed
        with an older key (all jobs, finished ones too), so the old keys can be retired;
        returns how many jobs were rewritten. Needs `codec=SealedCodec(...)` holding the old
        keys as well. Safe while workers run: a value written in between is kept."""
        codec = self.codec
        if not isinstance(codec, SealedCodec):
            raise TypeError("rekey: the Queue's codec must be a SealedCodec with the key ring")
        after, total = uuid.UUID(int=0), 0
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
                    ulid = ULID.from_bytes(job_id.bytes)
                    raise ValueError(f"rekey: job {ulid} ({kind}): {exc}") from None
                rewrites.append((job_id, r["payload"], payload, r["carry"], carry))
            total += await self.store.rewrite_sealed(rewrites)
            after = rows[-1]["id"]
        return total

    async def job_journal(self, job_id: ULID) -> list[JournalEntry]:
        """Every journal entry of one job, oldest first."""
        return await self.store.journal(job_id)

    async def stats(self) -> Stats:
        """Live counts by kind: pending (eligible), scheduled, claimed, dead, completed, oldest
        age."""
        return await self.store.stats()

    async def schedules(self) -> list[ScheduleInfo]:
        """The periodic schedules workers run (as recorded in the database), with each one's
        last and next tick and how many ticks it enqueued and skipped."""
        return await self.store.schedules()

    async def claimed_by_pod(self) -> dict[str, int]:
        """Claimed jobs per pod name (the worker's `WorkerIdentity.pod`), busy pods only; jobs
        claimed outside Kubernetes are not counted. The operator spares busy pods with it."""
        return await self.store.claimed_by_pod()

    def _new_job(
        self,
        task: Task[Any],
        *,
        priority: Priority | None,
        run_at: datetime | None = None,
        delay_s: float | None = None,
        job_id: ULID | None = None,
    ) -> NewJob:
        kind = _kind(type(task))
        if job_id is None:
            job_id = new_ids(1)[0]
        if task.ENCRYPTED and not getattr(self.codec, "seals", False):
            raise PayloadError(
                f"{kind} is an encrypted task (ENCRYPTED = True): give the Queue "
                f"codec=SealedCodec(KeyRing...) (see venturi.encryption); nothing was stored"
            )
        payload = self.codec.encode(task, kind=kind, job_id=job_id)
        tier = priority if priority is not None else task.priority()
        if type(tier) is not Priority:
            tier = Priority(tier)
        lease = task.lease()
        backoff = task.backoff()
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"{kind}.backoff() must return a Backoff or None, got {backoff!r}")
        dedup = task.dedup_key()
        if dedup is not None and not isinstance(dedup, DedupKey):
            raise TypeError(f"{kind}.dedup_key() must return a DedupKey or None, got {dedup!r}")
        return NewJob(
            id=job_id,
            kind=kind,
            queue=self.queue,
            priority=int(tier),
            payload=payload,
            run_at=run_at,
            delay_s=delay_s,
            lease_s=check_lease(lease, setting=f"{kind}.lease()") if lease is not None else None,
            backoff_base_s=backoff.base if backoff is not None else None,
            backoff_cap_s=backoff.cap if backoff is not None else None,
            dedup_key=dedup.value if dedup is not None else None,
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
