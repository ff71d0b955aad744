"""pgqueuer, through its public API, with the settings its docs recommend.

* Driver: asyncpg (its docs: ~1.7x psycopg), a single dedicated connection for the worker
  ("Use a dedicated connection for LISTEN", performance-tuning guide).
* Install: ``Queries.install()`` then ``optimize_autovacuum()`` (the guide's ``pgq autovac``);
  durability stays ``durable``, the default, like every other system here.
* Enqueue: ``Queries.enqueue`` with scalars (one job) or lists (one round trip for the batch).
* Event loop: uvloop, in both roles. uvloop is a dependency of pgqueuer itself, and ``pgq run``
  (its CLI) and its benchmark tool (``tools/benchmark.py``) both run on it.
* Worker: ``pgqueuer.run(factory, ...)``, the documented programmatic twin of ``pgq run``.
  Concurrency c maps to ``max_concurrent_tasks=c`` (``--max-concurrent-tasks``, "an upper
  global limit for the current runner") with the largest ``batch_size`` it allows (it
  requires ``max_concurrent_tasks >= 2 * batch_size``), so 16 -> batch 8. For c=1 that rule
  leaves no valid pair, so the entrypoint gets ``concurrency_limit=1``, which its docs give as
  the way "to process jobs strictly one at a time", with ``batch_size=1``: with a larger
  batch the finished job stays 'picked' until the status-log buffer (sized ``batch_size``,
  flushed every 100 ms otherwise) flushes, and the database-enforced limit then admits about
  10 jobs/s.
* ``BENCH_PGQUEUER_MAPPING=defaults`` (the ``pgqueuer-defaults`` system) runs ``pgq run``'s
  defaults instead, ``batch_size=10`` and no ``max_concurrent_tasks``: no concurrency bound at
  all, the jobs of a batch run side by side. That is what pgqueuer's benchmark tool measures
  with ``--dequeue 1`` and what an outside harness reported as pgqueuer at "concurrency 1".
* Stats: ``Queries.queue_size()`` (counts per entrypoint, priority and status).
* Completed jobs are moved out of the ``pgqueuer`` table, so "outstanding" = any row left.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from bench.adapters.base import OnStart, System, kind_name


def _payload(enqueued_at: float) -> bytes:
    return json.dumps({"enqueued_at": enqueued_at}).encode()


class PgqueuerSystem(System):
    name = "pgqueuer"
    jobs_table = "pgqueuer"

    def __init__(self) -> None:
        self._conn: asyncpg.Connection | None = None
        self._queries: Queries | None = None

    def versions(self) -> dict[str, str]:
        return {
            "pgqueuer": version("pgqueuer"),
            "asyncpg": version("asyncpg"),
            "uvloop": version("uvloop"),
        }

    @property
    def queries(self) -> Queries:
        assert self._queries is not None, "open() first"
        return self._queries

    async def open(self, dsn: str) -> None:
        self._conn = await asyncpg.connect(dsn)
        self._queries = Queries(AsyncpgDriver(self._conn))

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def install(self) -> None:
        await self.queries.install()
        await self.queries.optimize_autovacuum()

    async def enqueue(self, kind: int, enqueued_at: float) -> None:
        await self.queries.enqueue(kind_name(kind), _payload(enqueued_at))

    async def enqueue_many(self, kind: int, count: int, enqueued_at: float) -> None:
        payload = _payload(enqueued_at)
        await self.queries.enqueue([kind_name(kind)] * count, [payload] * count, [0] * count)

    async def sql(self, query: str) -> Any:
        assert self._conn is not None
        return await self._conn.fetchval(query)

    def outstanding_sql(self) -> str:
        return "SELECT EXISTS (SELECT 1 FROM pgqueuer)"

    async def stats(self) -> object:
        return await self.queries.queue_size()

    def run_loop(self, main: Coroutine[Any, Any, None]) -> None:
        uvloop.run(main)

    async def run_worker(
        self,
        dsn: str,
        concurrency: int,
        kinds: int,
        on_start: OnStart,
        shutdown: asyncio.Event,
    ) -> None:
        defaults = os.environ.get("BENCH_PGQUEUER_MAPPING") == "defaults"
        serialise = concurrency == 1 and not defaults

        @asynccontextmanager
        async def factory() -> AsyncIterator[PgQueuer]:
            conn = await asyncpg.connect(dsn)
            try:
                pgq = PgQueuer.from_asyncpg_connection(conn)
                for kind in range(kinds):

                    @pgq.entrypoint(kind_name(kind), concurrency_limit=1 if serialise else 0)
                    async def noop(job: Job) -> None:
                        assert job.payload is not None
                        on_start(json.loads(job.payload)["enqueued_at"])

                yield pgq
            finally:
                await conn.close()

        if defaults:
            batch_size, max_tasks = 10, None
        elif serialise:
            batch_size, max_tasks = 1, None
        else:
            batch_size, max_tasks = max(1, concurrency // 2), concurrency
        await pgqueuer.run(
            factory,
            batch_size=batch_size,
            max_concurrent_tasks=max_tasks,
            shutdown=shutdown,
        )


SYSTEM = PgqueuerSystem()
