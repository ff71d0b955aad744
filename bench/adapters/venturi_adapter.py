"""venturi, through its public API, installed from the repository into its own venv.

* Store: ``PostgresStore.connect(dsn, prefix="venturi")`` with its default pool, ``migrate()``.
* Enqueue: ``Queue.enqueue(task)`` for one job, ``Queue.enqueue_many(tasks)`` for a batch
  (one round trip).
* Worker: ``Worker(None, store, concurrency=c)`` with every other setting at its default,
  one registered no-op handler per kind, ``run(shutdown)`` until the event is set.
* Stats: ``Queue.stats()`` when the installed version has it (skipped otherwise).
* Event loop: asyncio's own; ``BENCH_VENTURI_LOOP=uvloop`` (the ``venturi-uvloop`` system)
  runs both roles on uvloop instead (the ``venturi[uvloop]`` extra, ``venturi worker --loop
  uvloop``), as a user's program does with ``uvloop.run(main())``.
* Job ids are client-made ULIDs (a uuid primary key), so the backlog preload gives cloned
  rows a fresh ``gen_random_uuid()``; claim order does not depend on the id's randomness
  beyond breaking ties between jobs due at the same instant.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Coroutine
from importlib.metadata import version
from typing import Any

import asyncpg

from bench.adapters.base import OnStart, System, Unsupported, kind_name, queue_name
from venturi import Context, Outcome, Queue, Task, Worker
from venturi.postgres import PostgresStore

PREFIX = "venturi"
MAX_KINDS = 20
LOOP = os.environ.get("BENCH_VENTURI_LOOP", "asyncio")


def _task_type(index: int) -> type[Any]:
    """A no-op task class, ``KIND = noop<index>``, whose one field is the producer's clock
    (made at run time: its fields are not known to a type checker)."""
    return dataclasses.make_dataclass(
        f"Noop{index}",
        [("enqueued_at", float)],
        bases=(Task,),
        namespace={"KIND": kind_name(index)},
    )


TASK_TYPES = [_task_type(i) for i in range(MAX_KINDS)]


class VenturiSystem(System):
    name = "venturi"
    jobs_table = f"{PREFIX}_jobs"
    clone_overrides = {"id": "gen_random_uuid()"}

    def __init__(self) -> None:
        self._store: PostgresStore | None = None
        self._queue: Queue | None = None
        self._conn: asyncpg.Connection | None = None

    def versions(self) -> dict[str, str]:
        versions = {"venturi": version("venturi"), "asyncpg": version("asyncpg")}
        if LOOP == "uvloop":
            versions["uvloop"] = version("uvloop")
        return versions

    def run_loop(self, main: Coroutine[Any, Any, None]) -> None:
        if LOOP == "uvloop":
            import uvloop

            uvloop.run(main)
        else:
            asyncio.run(main)

    @property
    def queue(self) -> Queue:
        assert self._queue is not None, "open() first"
        return self._queue

    async def open(self, dsn: str) -> None:
        self._store = await PostgresStore.connect(dsn, prefix=PREFIX)
        self._queue = Queue(self._store)
        # A side connection for the harness's own SQL (drain detection, preload), so the
        # store's pool only ever carries venturi's statements.
        self._conn = await asyncpg.connect(dsn)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._store is not None:
            await self._store.close()

    async def install(self) -> None:
        assert self._store is not None
        await self._store.migrate()

    async def enqueue(self, kind: int, enqueued_at: float) -> None:
        await self.queue.enqueue(TASK_TYPES[kind](enqueued_at=enqueued_at))

    async def enqueue_many(self, kind: int, count: int, enqueued_at: float) -> None:
        task_type = TASK_TYPES[kind]
        await self.queue.enqueue_many([task_type(enqueued_at=enqueued_at) for _ in range(count)])

    async def enqueue_many_in(self, queue: int, kind: int, count: int, enqueued_at: float) -> None:
        assert self._store is not None
        task_type = TASK_TYPES[kind]
        named = Queue(self._store, queue=queue_name(queue))
        await named.enqueue_many([task_type(enqueued_at=enqueued_at) for _ in range(count)])

    async def sql(self, query: str) -> Any:
        assert self._conn is not None
        return await self._conn.fetchval(query)

    def outstanding_sql(self) -> str:
        return (
            f"SELECT EXISTS (SELECT 1 FROM {self.jobs_table} "
            "WHERE status IN ('pending', 'claimed'))"
        )

    async def stats(self) -> object:
        stats = getattr(self.queue, "stats", None)
        if stats is None:
            raise Unsupported("this venturi version has no Queue.stats() yet")
        return await stats()

    async def run_worker(
        self,
        dsn: str,
        concurrency: int,
        kinds: int,
        on_start: OnStart,
        shutdown: asyncio.Event,
    ) -> None:
        async def noop(task: Any, ctx: Context[None], app: None) -> Outcome:
            on_start(task.enqueued_at)
            return Outcome.completed()

        store = await PostgresStore.connect(dsn, prefix=PREFIX)
        try:
            worker = Worker(None, store, concurrency=concurrency)
            for kind in range(kinds):
                worker.register(TASK_TYPES[kind], noop)
            await worker.run(shutdown)
        finally:
            await store.close()


SYSTEM = VenturiSystem()
