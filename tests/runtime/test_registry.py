"""The worker registry against the real database: a row per running worker, refreshed by
its heartbeat and removed on a clean exit; silent workers swept; pending kinds that no live
worker serves, per queue; `venturi workers`."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, Task, Worker
from venturi.registry import SILENT_AFTER

from .helpers import running, until
from .test_cli import venturi


@dataclass
class Known(Task):
    KIND = "registry.known"
    n: int = 0


@dataclass
class Stranger(Task):
    KIND = "registry.stranger"
    n: int = 0


async def done(task: Task, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


async def silent_row(pool: asyncpg.Pool, prefix: str, worker_id: str, kinds: list[str]) -> None:
    """The row of a worker that was killed: its last heartbeat long ago."""
    await pool.execute(
        f"INSERT INTO {prefix}_workers (id, host, pid, queues, kinds, concurrency, heartbeat_s,"
        f" started_at, last_seen) VALUES ($1, 'gone', $3, '{{default}}', $2, 1, 3,"
        f" now() - interval '1 hour', now() - interval '1 hour')",
        worker_id,
        kinds,
        int(worker_id.split(":")[1].split("#")[0]),
    )


async def test_a_running_worker_is_listed_and_removed_on_a_clean_exit(
    store: PostgresStore, queue: Queue
) -> None:
    worker = Worker(None, store, concurrency=3, queues=["high", "default"])
    worker.register(Known, done)
    assert await queue.workers() == []
    async with running(worker):
        [info] = await queue.workers()
        assert info.id == str(worker.identity)
        assert (info.host, info.pid, info.pod) == (socket.gethostname(), os.getpid(), None)
        assert info.queues == ("high", "default")
        assert info.kinds == ("registry.known",)
        assert info.unknown_kinds == "wait"
        assert info.concurrency == 3
        assert info.live
        assert info.started_at <= info.last_seen
    assert await queue.workers() == []


async def test_the_heartbeat_refreshes_last_seen_and_keeps_started_at(
    store: PostgresStore, queue: Queue
) -> None:
    worker = Worker(None, store)
    worker.register(Known, done)
    async with running(worker):
        [first] = await queue.workers()

        async def beaten() -> bool:
            [now] = await queue.workers()
            return now.last_seen > first.last_seen

        await until(beaten)
        [later] = await queue.workers()
        assert later.started_at == first.started_at
        assert later.heartbeat == first.heartbeat > 0


async def test_the_sweep_removes_silent_workers_only(
    store: PostgresStore, queue: Queue, pool: asyncpg.Pool
) -> None:
    # No worker runs (its leader would sweep): the sweep's statement, called directly.
    await silent_row(pool, store.prefix, "gone:1#dead", ["registry.known"])
    await silent_row(pool, store.prefix, "here:2#live", ["registry.known"])
    await pool.execute(f"UPDATE {store.prefix}_workers SET last_seen = now() WHERE pid = 2")
    assert {w.id: w.live for w in await queue.workers()} == {
        "gone:1#dead": False,
        "here:2#live": True,
    }
    assert await store.registry.sweep() == ["gone:1#dead"]
    assert [w.id for w in await queue.workers()] == ["here:2#live"]


async def test_a_worker_swept_during_an_outage_registers_again(
    store: PostgresStore, queue: Queue, pool: asyncpg.Pool
) -> None:
    worker = Worker(None, store)
    worker.register(Known, done)
    async with running(worker):
        [first] = await queue.workers()
        # As if it had been cut off for longer than SILENT_AFTER heartbeats, then swept.
        await pool.execute(f"DELETE FROM {store.prefix}_workers")

        async def back() -> bool:
            return len(await queue.workers()) == 1

        await until(back)
        [again] = await queue.workers()
        assert again.id == first.id and again.started_at == first.started_at
    assert SILENT_AFTER >= 2  # a missed heartbeat or two never makes a worker look gone


async def test_unserved_kinds_are_the_pending_kinds_no_live_worker_serves_per_queue(
    store: PostgresStore, pool: asyncpg.Pool
) -> None:
    default, other = Queue(store), Queue(store, queue="other")
    assert await default.unserved_kinds() == {}
    await default.enqueue(Known())
    await default.enqueue(Stranger())
    await other.enqueue(Known())
    # No worker at all: nothing pending is served.
    assert await default.unserved_kinds() == {
        "default": ["registry.known", "registry.stranger"],
        "other": ["registry.known"],
    }
    # A silent worker's registrations do not count.
    await silent_row(pool, store.prefix, "gone:1#dead", ["registry.stranger"])
    assert (await default.unserved_kinds())["default"] == ["registry.known", "registry.stranger"]
    worker = Worker(None, store, concurrency=1)
    worker.register(Known, done)
    async with running(worker):

        async def known_done() -> bool:
            return (await default.stats()).pending_by_kind.get("registry.known", 0) == 1

        await until(known_done)  # only the one in "other" is left
        assert await default.unserved_kinds() == {
            "default": ["registry.stranger"],
            "other": ["registry.known"],
        }


async def test_the_workers_command_lists_workers_and_unserved_kinds(
    store: PostgresStore, queue: Queue, pg_dsn: str
) -> None:
    prefix = store.prefix
    assert venturi("workers", dsn=pg_dsn, prefix=prefix).stdout.strip() == ("no workers registered")
    await queue.enqueue(Stranger())
    worker = Worker(None, store, concurrency=2)
    worker.register(Known, done)
    async with running(worker):

        async def leads() -> bool:
            return worker.leads

        await until(leads)
        text = venturi("workers", dsn=pg_dsn, prefix=prefix).stdout
        head, row, unserved = text.strip().splitlines()
        assert head.startswith("WORKER") and head.split()[-1] == "STATE"
        assert row.split()[:5] == [str(worker.identity), "default", "registry.known", "wait", "2"]
        assert row.split()[-1] == "leader"
        assert unserved == "queue default: pending kinds no live worker serves: registry.stranger"
        data = json.loads(venturi("workers", "--json", dsn=pg_dsn, prefix=prefix).stdout)
        [listed] = data["workers"]
        assert listed["id"] == str(worker.identity)
        assert listed["queues"] == ["default"] and listed["kinds"] == ["registry.known"]
        assert listed["live"] is True and listed["leader"] is True
        assert listed["pid"] == os.getpid()
        assert data["unserved_kinds"] == {"default": ["registry.stranger"]}
        assert data["fenced_pods"] == []
        await queue.fence_pods(["workers-abc12"])
        last = venturi("workers", dsn=pg_dsn, prefix=prefix).stdout.strip().splitlines()[-1]
        assert last == "pods fenced for a scale-in (claiming nothing): workers-abc12"
