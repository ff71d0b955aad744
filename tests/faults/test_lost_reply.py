"""A claim whose reply is lost: the server committed it, the connection died before the
worker read the reply. After reconnecting, the worker reconciles what the database says it
holds with what it runs and releases the difference at once (journaled `released`, not a
failure), instead of leaving the job claimed by a live worker that never runs it for the
whole lease (15 minutes by default; 60 s here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.runtime.helpers import running, until, until_status
from venturi import (
    Context,
    Hooks,
    JobStatus,
    JournalOutcome,
    Outcome,
    PostgresStore,
    Queue,
    Worker,
)
from venturi.hooks import Settled

from .harness import FIGURES
from .proxy import LossyProxy
from .worker import Work


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[LossyProxy]:
    """A proxy in front of the test server that can lose or hold back one reply."""
    url = urlsplit(pg_dsn)
    lossy = LossyProxy(url.hostname or "127.0.0.1", url.port or 5432)
    await lossy.start()
    try:
        yield lossy
    finally:
        await lossy.close()


@pytest.fixture
def via_proxy(pg_dsn: str, proxy: LossyProxy) -> str:
    """The test server's DSN through `proxy`."""
    return pg_dsn.replace(f":{urlsplit(pg_dsn).port}/", f":{proxy.port}/")


def claim_by(worker: Worker[None]) -> bytes:
    """What only the worker's claims send: its identity, then its pod, NULL outside
    Kubernetes (a Bind message's NULL parameter is the length -1). The identity alone is in
    its heartbeat and its leader election too."""
    assert worker.identity.pod is None
    return str(worker.identity).encode() + b"\xff\xff\xff\xff"


async def test_lost_claim_reply_is_released_after_reconnect(
    proxy: LossyProxy, via_proxy: str, store: PostgresStore, prefix: str
) -> None:
    job_id = await Queue(store).enqueue(Work(0, 1))
    runs: list[int] = []

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        runs.append(ctx.run_count)
        return Outcome.completed()

    async with await PostgresStore.connect(via_proxy, prefix=prefix) as lossy:
        worker = Worker(None, lossy, concurrency=1, lease=60)
        worker.register(Work, handle)
        proxy.arm(claim_by(worker))
        async with running(worker):
            await asyncio.wait_for(proxy.fired.wait(), 30)
            dropped = time.time()
            await until_status(Queue(store), job_id, JobStatus.COMPLETED)

    journal = await Queue(store).job_journal(job_id)
    assert [(e.outcome, e.run) for e in journal] == [
        (JournalOutcome.RELEASED, 1),
        (JournalOutcome.COMPLETED, 2),
    ]
    released = journal[0]
    assert released.note is not None and "reply was lost" in released.note
    assert not released.is_failure
    assert runs == [2]  # the lost claim never ran; the job ran once
    delay = released.at.timestamp() - dropped
    FIGURES.append(f"lost claim reply: released {delay:.2f}s after the connection died")
    assert delay < 5.0


async def test_a_claim_reply_that_arrives_after_the_lease_is_never_run(
    proxy: LossyProxy, via_proxy: str, store: PostgresStore, prefix: str
) -> None:
    """The claim's reply is held back longer than the job's lease (a stalled network):
    meanwhile another worker recovers the job and runs it. When the late reply arrives, the
    first worker must not start the job too."""
    runs: list[tuple[str, int]] = []
    job_id = await Queue(store).enqueue(Work(0, 1))

    def handler(name: str) -> Any:
        async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
            runs.append((name, ctx.run_count))
            return Outcome.completed()

        return handle

    async with await PostgresStore.connect(via_proxy, prefix=prefix) as stalled:
        slow = Worker(None, stalled, concurrency=1, lease=1.0, poll_max=0.2)
        slow.register(Work, handler("slow"))
        proxy.arm(claim_by(slow), hold=3.0)
        async with running(slow):
            await asyncio.wait_for(proxy.fired.wait(), 30)
            other = Worker(None, store, concurrency=1, poll_max=0.2)
            other.register(Work, handler("other"))
            async with running(other):
                await until_status(Queue(store), job_id, JobStatus.COMPLETED)
                await asyncio.sleep(4.0)  # past the held reply: the stall, not a sync
    assert runs == [("other", 2)]
    outcomes = [e.outcome for e in await Queue(store).job_journal(job_id)]
    assert outcomes == [JournalOutcome.STALE_RECOVERED, JournalOutcome.COMPLETED]


async def test_members_whose_claim_reply_arrives_after_their_batch_was_cancelled_never_run(
    proxy: LossyProxy, via_proxy: str, store: PostgresStore, prefix: str
) -> None:
    """A claim commits, then the batch is cancelled (its members are claimed, not pending, so
    the cancellation leaves them to the worker), and the claim's reply reaches the worker
    only after the cancellation's notice: the worker must not start them."""
    queue = Queue(store)
    runs: list[int] = []
    batch_id = await queue.batch("late").add(*(Work(i, 1) for i in range(3))).enqueue()

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        runs.append(task.n)
        return Outcome.completed()

    async def claimed() -> bool:
        n = await store._pool_or_raise().fetchval(
            f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'claimed'"
        )
        return bool(n == 3)

    async with await PostgresStore.connect(via_proxy, prefix=prefix) as late:
        worker = Worker(None, late, concurrency=4, lease=60)
        worker.register(Work, handle)
        proxy.arm(claim_by(worker), hold=2.0)
        async with running(worker):
            await until(claimed)  # committed; its reply is held back
            assert await queue.cancel_batch(batch_id) == 0  # nothing pending to skip
            await asyncio.wait_for(proxy.fired.wait(), 30)  # the reply went through

            async def finished() -> bool:
                status = await queue.batch_status(batch_id)
                return status is not None and status.finished

            await until(finished)
    status = await queue.batch_status(batch_id)
    assert status is not None and (status.done, status.cancelled) == (0, 3)
    assert runs == []


async def test_a_settle_whose_reply_was_lost_is_reported_as_written(
    proxy: LossyProxy, via_proxy: str, store: PostgresStore, prefix: str
) -> None:
    """The settle committed; the connection died before the worker read the reply. The
    retry finds the claim cleared, by the worker's own first attempt: the outcome was
    written, and the `settled` hook, the metrics and the log say so (they said "claim lost
    before settling; another worker recovered it")."""
    settled: list[Settled] = []
    done = asyncio.Event()

    class Seen(Hooks):
        def settled(self, event: Settled) -> None:
            settled.append(event)
            done.set()

    job_id = await Queue(store).enqueue(Work(0, 1))

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        # The settle carries the result: the one message the proxy loses the reply to.
        return Outcome.completed(result={"marker": "lose-this-settle-reply"})

    async with await PostgresStore.connect(via_proxy, prefix=prefix) as lossy:
        worker = Worker(None, lossy, concurrency=1, lease=60, hooks=[Seen()])
        worker.register(Work, handle)
        proxy.arm(b"lose-this-settle-reply")
        async with running(worker):
            await asyncio.wait_for(done.wait(), 30)
        assert proxy.fired.is_set()  # the reply was lost indeed

    assert [(e.outcome, e.kept) for e in settled] == [("completed", True)]
    journal = await Queue(store).job_journal(job_id)
    assert [(e.outcome, e.run) for e in journal] == [(JournalOutcome.COMPLETED, 1)]


async def test_a_claim_in_flight_at_shutdown_is_handed_back_not_left_claimed(
    proxy: LossyProxy, via_proxy: str, store: PostgresStore, prefix: str
) -> None:
    """SIGTERM while a claim's reply is on its way: the claim committed, and its jobs are
    this worker's in the database. The worker lets the claim finish and hands its jobs back
    unrun; it used to cancel the claim, leaving them claimed by a stopped worker for the
    whole lease (then counted as failed executions, dead with one attempt)."""
    runs: list[int] = []
    await Queue(store).enqueue_many(Work(i, 1) for i in range(20))

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        runs.append(task.n)
        return Outcome.completed()

    async with await PostgresStore.connect(via_proxy, prefix=prefix) as lossy:
        worker = Worker(None, lossy, concurrency=2, lease=60)
        worker.register(Work, handle)
        proxy.arm(claim_by(worker), hold=1.0)  # the first claim's reply: a second late
        shutdown = asyncio.Event()
        running_worker = asyncio.create_task(worker.run(shutdown))
        await asyncio.wait_for(proxy.fired.wait(), 30)  # committed, its reply held
        shutdown.set()
        await asyncio.wait_for(running_worker, 30)
    rows = await store._pool_or_raise().fetch(
        f"SELECT status, claimed_by, run_count, failures FROM {prefix}_jobs"
    )
    assert runs == []  # nothing started: the worker was stopping when the jobs came
    assert {(r["status"], r["run_count"], r["failures"]) for r in rows} == {("pending", 0, 0)}
