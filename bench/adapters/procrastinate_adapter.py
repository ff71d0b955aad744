"""procrastinate, through its public API, with the settings its docs recommend.

* Driver: ``PsycopgConnector`` (its documented async connector) over psycopg 3; the bench
  installs ``psycopg[binary]`` beside it, the libpq C implementation, so procrastinate runs on
  its fastest driver rather than psycopg's pure-Python fallback.
* Install: ``app.schema_manager.apply_schema_async()`` (``procrastinate schema --apply``).
* Enqueue: ``task.defer_async(...)`` for one job, ``task.batch_defer_async(...)`` for a batch
  (one INSERT for the whole batch).
* Worker: ``app.run_worker_async(concurrency=c, install_signal_handlers=False)`` as a task,
  cancelled to stop gracefully, as its "inside an application" howto shows. Everything else
  is the default (LISTEN/NOTIFY on, ``delete_jobs="never"``). Its pool defaults to 4
  connections; it is sized to ``concurrency + 2`` (the LISTEN connection and the fetch loop),
  so that the pool is never what limits it.
* Stats: ``app.job_manager.list_tasks_async()`` (job counts per task and status, which is
  what ``procrastinate shell``'s ``list_tasks`` prints).
"""

from __future__ import annotations

import asyncio
import contextlib
from importlib.metadata import version
from typing import Any

from procrastinate import App, PsycopgConnector

from bench.adapters.base import OnStart, System, kind_name

# Tasks are registered up front for every kind a scenario may use.
MAX_KINDS = 20


def _make_app(dsn: str, pool_size: int | None = None) -> App:
    pool: dict[str, Any] = {}
    if pool_size is not None:
        pool = {"min_size": pool_size, "max_size": pool_size}
    return App(connector=PsycopgConnector(conninfo=dsn, **pool))


class ProcrastinateSystem(System):
    name = "procrastinate"
    jobs_table = "procrastinate_jobs"

    def __init__(self) -> None:
        self._app: App | None = None

    def versions(self) -> dict[str, str]:
        return {"procrastinate": version("procrastinate"), "psycopg": version("psycopg")}

    @property
    def app(self) -> App:
        assert self._app is not None, "open() first"
        return self._app

    async def open(self, dsn: str) -> None:
        self._app = _make_app(dsn)
        for kind in range(MAX_KINDS):
            self._app.task(name=kind_name(kind))(_never_run_here)
        await self._app.open_async()

    async def close(self) -> None:
        if self._app is not None:
            await self._app.close_async()

    async def install(self) -> None:
        await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, kind: int, enqueued_at: float) -> None:
        await self.app.tasks[kind_name(kind)].defer_async(enqueued_at=enqueued_at)

    async def enqueue_many(self, kind: int, count: int, enqueued_at: float) -> None:
        args = [{"enqueued_at": enqueued_at}] * count
        await self.app.tasks[kind_name(kind)].batch_defer_async(*args)

    async def sql(self, query: str) -> Any:
        # Straight through the pool without parameters, so '%' in SQL needs no escaping.
        async with self.app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
            cursor = await conn.execute(query)
            row = await cursor.fetchone() if cursor.description else None
            return row[0] if row else None

    def outstanding_sql(self) -> str:
        return "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"

    async def stats(self) -> object:
        return list(await self.app.job_manager.list_tasks_async())

    async def run_worker(
        self,
        dsn: str,
        concurrency: int,
        kinds: int,
        on_start: OnStart,
        shutdown: asyncio.Event,
    ) -> None:
        app = _make_app(dsn, pool_size=concurrency + 2)

        async def noop(enqueued_at: float) -> None:
            on_start(enqueued_at)

        for kind in range(kinds):
            app.task(name=kind_name(kind))(noop)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
            )
            stop = asyncio.create_task(shutdown.wait())
            await asyncio.wait({worker, stop}, return_when=asyncio.FIRST_COMPLETED)
            worker.cancel()  # graceful: procrastinate finishes running jobs, then returns
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            stop.cancel()


async def _never_run_here(enqueued_at: float) -> None:
    raise AssertionError("the producer side never runs jobs")


SYSTEM = ProcrastinateSystem()
