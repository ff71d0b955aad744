"""The registry and leadership through a database outage, in one process: the server is
halted for longer than the leader's lease, and the worker neither exits nor stays out of
the registry or leaderless: once the server is back its heartbeat writes its row again and
it leads again, under a new term (its lease lapsed: it stopped acting as leader
meanwhile)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass

import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi._db.failures import is_database_failure
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

        halted = time.monotonic()
        await asyncio.to_thread(pg.halt, "fast")

        async def deposed() -> bool:
            return not worker.leads

        # Cut off for longer than its lease, the leader stops acting as one (before the lease
        # ends) ...
        await wait_until(deposed, TTL * 3, "the cut-off leader stops leading")
        # ... and the outage outlasts the lease its last renewal wrote (at most TTL after the
        # halt): the fault's length, not a wait for something to happen.
        await asyncio.sleep(max(0.0, halted + TTL + 0.5 - time.monotonic()))
        await asyncio.to_thread(pg.launch)

        async def back() -> bool:
            try:
                found = await queue.workers()
            except Exception as exc:  # the pool's first statements after the restart
                if not is_database_failure(exc):
                    raise
                return False
            return len(found) == 1 and found[0].last_seen > before.last_seen and found[0].leader

        await wait_until(back, 30, "heartbeat and leadership back after the outage")
        assert not run.done()
        relet = await store.leadership.lease()
        assert relet is not None and relet.term > lease.term
        shutdown.set()
        await asyncio.wait_for(run, 60)
        assert await queue.workers() == []
