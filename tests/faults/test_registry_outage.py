"""The registry and leadership through a database outage, in one process: the server is
halted for longer than the leader's lease, and the worker neither exits nor stays out of
the registry or leaderless: once the server is back its heartbeat writes its row again and
it leads again, under a new term (its lease lapsed: it stopped acting as leader
meanwhile)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi._maintenance.leader import TTL
from venturi.embedded import EmbeddedPostgres

from .harness import wait_until

_prefixes = itertools.count()


@dataclass
class Nothing(Task):
    KIND = "outage.nothing"


async def nothing(task: Nothing, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


@pytest.mark.slow
async def test_heartbeat_and_leadership_survive_an_outage(
    restartable_pg: EmbeddedPostgres,
) -> None:
    pg = restartable_pg
    prefix = f"o{next(_prefixes)}_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.connect(pg.dsn, prefix=prefix, connect_timeout=2) as store:
        await store.migrate()
        queue = Queue(store)
        worker = Worker(None, store, concurrency=1)
        worker.register(Nothing, nothing)
        shutdown = asyncio.Event()
        run = asyncio.create_task(worker.run(shutdown))
        await asyncio.wait_for(worker.ready.wait(), 30)

        async def leads() -> bool:
            return worker.leads

        await wait_until(leads, 30, "the only worker leads")
        lease = await store.leadership.lease()
        assert lease is not None
        [before] = await queue.workers()

        await asyncio.to_thread(pg.halt, "fast")

        async def deposed() -> bool:
            return not worker.leads

        # Cut off for longer than its lease, the leader stops acting as one.
        await wait_until(deposed, TTL * 3, "the cut-off leader stops leading")
        await asyncio.to_thread(pg.launch)

        async def back() -> bool:
            [now] = await queue.workers()
            return now.last_seen > before.last_seen and now.leader

        await wait_until(back, 30, "heartbeat and leadership back after the outage")
        assert not run.done()
        relet = await store.leadership.lease()
        assert relet is not None and relet.term > lease.term
        shutdown.set()
        await asyncio.wait_for(run, 60)
        assert await queue.workers() == []
