"""Deduplication and merging, including many producers racing on one key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from venturi import (
    Context,
    DedupKey,
    JobFilter,
    JobStatus,
    JournalOutcome,
    Merge,
    Outcome,
    Pending,
    Priority,
    Queue,
    Task,
    Worker,
)

from .helpers import running, until_status


@dataclass
class Fetch(Task):
    """Replace (the default): the newest payload wins."""

    KIND = "fetch"
    url: str
    version: int = 0

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.url)


@dataclass
class Ping(Task):
    """Keep: the pending one will do."""

    KIND = "ping"
    host: str

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.host)

    def merge(self, existing: Pending[Any]) -> Merge:
        return Merge.keep()


@dataclass
class Seen:
    merges: int = 0


@dataclass
class Digest(Task[Seen]):
    """With: union the payloads, escalate priority, count merges in the carry."""

    KIND = "digest"
    user: int
    items: list[str] = field(default_factory=list)
    urgent: bool = False

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.user)

    def priority(self) -> Priority:
        return Priority.HIGH if self.urgent else Priority.NORMAL

    def merge(self, existing: Pending[Digest]) -> Merge:
        union = sorted(set(existing.task.items) | set(self.items))
        merged = Digest(self.user, union, self.urgent or existing.task.urgent)
        return Merge.with_(merged, Seen(existing.carry.merges + 1))


@dataclass
class Shard(Task):
    """Independent: same key, separate rows."""

    KIND = "shard"
    key: str
    part: int

    def dedup_key(self) -> DedupKey | None:
        return DedupKey(self.key)

    def merge(self, existing: Pending[Any]) -> Merge:
        return Merge.independent()


async def test_replace_updates_the_existing_row(queue: Queue) -> None:
    first = await queue.enqueue(Fetch("https://a", version=1))
    second = await queue.enqueue(Fetch("https://a", version=2))
    other = await queue.enqueue(Fetch("https://b", version=1))
    assert second == first and other != first
    job = await queue.job(first)
    assert job is not None and job.payload == {"url": "https://a", "version": 2}
    journal = await queue.job_journal(first)
    assert [(e.outcome, e.note) for e in journal] == [(JournalOutcome.MERGED, "replace")]
    assert (await queue.stats()).pending_by_kind == {"fetch": 2}


async def test_keep_leaves_the_existing_job_untouched(queue: Queue) -> None:
    first = await queue.enqueue(Ping("db1"))
    assert await queue.enqueue(Ping("db1")) == first
    job = await queue.job(first)
    assert job is not None and job.payload == {"host": "db1"}
    assert [e.note for e in await queue.job_journal(first)] == ["keep"]


async def test_with_computes_payload_carry_and_priority(queue: Queue) -> None:
    first = await queue.enqueue(Digest(1, ["a"]))
    await queue.enqueue(Digest(1, ["b"]))
    await queue.enqueue(Digest(1, ["a", "c"], urgent=True))
    job = await queue.job(first)
    assert job is not None
    assert job.payload == {"user": 1, "items": ["a", "b", "c"], "urgent": True}
    assert job.carry == {"merges": 2}
    assert job.priority == Priority.HIGH
    assert [e.note for e in await queue.job_journal(first)] == ["with", "with"]


async def test_a_merged_job_sees_its_merges_in_its_first_runs_history(queue: Queue) -> None:
    seen: list[list[tuple[JournalOutcome, str | None]]] = []

    async def handle(task: Ping, ctx: Context[None], app: None) -> Outcome:
        seen.append([(e.outcome, e.note) for e in ctx.history])
        return Outcome.completed()

    merged = await queue.enqueue(Ping("h1"))
    await queue.enqueue(Ping("h1"))
    plain = await queue.enqueue(Ping("h2"))
    worker = Worker(None, queue.store)
    worker.register(Ping, handle)
    async with running(worker):
        await until_status(queue, merged, JobStatus.COMPLETED)
        await until_status(queue, plain, JobStatus.COMPLETED)
    assert sorted(seen) == [[], [(JournalOutcome.MERGED, "keep")]]


async def test_independent_stores_siblings(queue: Queue) -> None:
    ids = {await queue.enqueue(Shard("k", part)) for part in range(3)}
    assert len(ids) == 3
    assert (await queue.stats()).pending_by_kind == {"shard": 3}


async def test_only_pending_jobs_are_candidates(queue: Queue) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(task: Ping, ctx: Context[None], app: None) -> Outcome:
        started.set()
        await release.wait()
        return Outcome.completed()

    first = await queue.enqueue(Ping("h"))
    worker = Worker(None, queue.store)
    worker.register(Ping, handle)
    async with running(worker):
        await started.wait()
        second = await queue.enqueue(Ping("h"))  # the first is running: not a duplicate
        assert second != first
        release.set()
        await until_status(queue, second, JobStatus.COMPLETED)
    assert await queue.job_journal(second) != []


async def test_concurrent_producers_end_as_the_policy_says(queue: Queue, pg_dsn: str) -> None:
    """50 producers on separate connections enqueue the same keys at once."""
    from venturi import PostgresStore

    stores = [
        await PostgresStore.connect(pg_dsn, prefix=queue.store.prefix, max_size=2)
        for _ in range(10)
    ]
    try:
        queues = [Queue(s) for s in stores]

        async def produce(i: int) -> None:
            q = queues[i % len(queues)]
            await q.enqueue(Ping("same-host"))
            await q.enqueue(Digest(42, [f"item{i}"]))
            await q.enqueue(Fetch("https://same", version=i))

        await asyncio.gather(*(produce(i) for i in range(50)))
    finally:
        await asyncio.gather(*(s.close() for s in stores))

    stats = await queue.stats()
    assert stats.pending_by_kind == {"ping": 1, "digest": 1, "fetch": 1}
    [digest] = await queue.jobs(JobFilter(kind="digest", status=JobStatus.PENDING))
    digest_items = digest.payload["items"]
    assert sorted(digest_items) == sorted(f"item{i}" for i in range(50))  # no merge lost


async def test_candidacy_is_per_queue(queue: Queue) -> None:
    """A key enqueued to queue `b` never merges into queue `a`'s pending job: no worker of `b`
    would ever run it there."""
    a, b = Queue(queue.store, queue="a"), Queue(queue.store, queue="b")
    in_a = await a.enqueue(Fetch("https://x", 1))
    in_b = await b.enqueue(Fetch("https://x", 2))
    assert in_b != in_a
    assert await b.enqueue(Fetch("https://x", 3)) == in_b  # within `b`, it merges
    job_a, job_b = await queue.job(in_a), await queue.job(in_b)
    assert job_a is not None and (job_a.queue, job_a.payload["version"]) == ("a", 1)
    assert job_b is not None and (job_b.queue, job_b.payload["version"]) == ("b", 3)
    # A worker of `b` runs `b`'s job (and only it).
    ran: list[int] = []

    async def handle(task: Fetch, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.version)
        return Outcome.completed()

    worker = Worker(None, queue.store, queue="b")
    worker.register(Fetch, handle)
    async with running(worker):
        await until_status(queue, in_b, JobStatus.COMPLETED)
    assert ran == [3]
    assert (await queue.job(in_a)).status is JobStatus.PENDING  # type: ignore[union-attr]
