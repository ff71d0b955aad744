"""A claim whose reply is lost: the server committed it, the connection died before the
worker read the reply. After reconnecting, the worker reconciles what the database says it
holds with what it runs and releases the difference at once (journaled `released`, not a
failure), instead of leaving the job claimed by a live worker that never runs it for the
whole lease (15 minutes by default; 60 s here)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from tests.runtime.helpers import running, until_status
from venturi import Context, JobStatus, JournalOutcome, Outcome, PostgresStore, Queue, Worker

from .harness import FIGURES
from .proxy import LossyProxy
from .worker import Work


async def test_lost_claim_reply_is_released_after_reconnect(
    pg_dsn: str, store: PostgresStore, prefix: str
) -> None:
    url = urlsplit(pg_dsn)
    proxy = LossyProxy(url.hostname or "127.0.0.1", url.port or 5432)
    port = await proxy.start()
    try:
        job_id = await Queue(store).enqueue(Work(0, 1))
        runs: list[int] = []

        async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
            runs.append(ctx.run_count)
            return Outcome.completed()

        via_proxy = pg_dsn.replace(f":{url.port}/", f":{port}/")
        async with await PostgresStore.connect(via_proxy, prefix=prefix) as lossy:
            worker = Worker(None, lossy, concurrency=1, lease=60)
            worker.register(Work, handle)
            proxy.arm(str(worker.identity).encode())
            async with running(worker):
                await asyncio.wait_for(proxy.fired.wait(), 30)
                dropped = time.time()
                await until_status(Queue(store), job_id, JobStatus.COMPLETED)
    finally:
        await proxy.close()

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
