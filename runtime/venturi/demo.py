"""The demo behind `venturi demo`: enqueue a mix of jobs, run a worker until they are all
done, and print progress and the final stats. Shows the four outcomes and the carry.

With `--dashboard`, the worker then keeps running with a few more jobs (some scheduled, some
that fail for good) and the dashboard serves the demo's queue on 127.0.0.1 until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TextIO

from venturi.backoff import Backoff
from venturi.context import Context
from venturi.embedded import EmbeddedPostgres
from venturi.outcome import Outcome, TaskError
from venturi.postgres import PostgresStore
from venturi.queue import Queue
from venturi.task import Task
from venturi.worker import Worker


@dataclass
class Thumbnail(Task):
    KIND = "demo.thumbnail"
    image_id: int


@dataclass
class Receipt(Task):
    """Fails its first run one time in ten (a flaky mail server), then succeeds."""

    KIND = "demo.receipt"
    order_id: int


@dataclass
class Cursor:
    page: int = 0


@dataclass
class Import(Task[Cursor]):
    """Imports three pages, pausing between them: the carry keeps its place."""

    KIND = "demo.import"
    account_id: int


@dataclass
class Report(Task):
    """Fails for good (shown on the dashboard's Failed page, to retry or forget)."""

    KIND = "demo.report"
    month: int


async def thumbnail(task: Thumbnail, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


async def receipt(task: Receipt, ctx: Context[None], app: None) -> Outcome:
    if task.order_id % 10 == 0 and ctx.run_count == 1:
        raise TaskError.retryable("mail server said 451, try again later")
    return Outcome.completed(note="sent")


async def import_(task: Import, ctx: Context[Cursor], app: None) -> Outcome:
    ctx.carry.page += 1
    ctx.attach({"page": ctx.carry.page})
    if ctx.carry.page < 3:
        return Outcome.pause_in(0)
    return Outcome.completed(note=f"imported {ctx.carry.page} pages")


async def report(task: Report, ctx: Context[None], app: None) -> Outcome:
    raise TaskError.permanent(f"report for month {task.month}: the ledger is closed")


async def run_demo(
    dsn: str | None,
    *,
    jobs: int = 3000,
    concurrency: int = 8,
    prefix: str = "venturi_demo",
    out: TextIO = sys.stdout,
    dashboard_port: int | None = None,
) -> None:
    """Run the demo against `dsn`, or against an embedded server when `dsn` is None; then,
    with `dashboard_port`, serve the dashboard on 127.0.0.1 until SIGINT/SIGTERM."""
    if dsn is None:
        print("no DSN given: starting an embedded PostgreSQL ...", file=out)
        async with EmbeddedPostgres() as pg:
            print(f"embedded PostgreSQL at {pg.dsn}", file=out)
            await _demo(pg.dsn, jobs, concurrency, prefix, out, dashboard_port)
    else:
        await _demo(dsn, jobs, concurrency, prefix, out, dashboard_port)


def _worker(store: PostgresStore, concurrency: int) -> Worker[None]:
    worker = Worker(None, store, concurrency=concurrency, backoff=Backoff(0.05, 1.0))
    worker.register(Thumbnail, thumbnail)
    worker.register(Receipt, receipt)
    worker.register(Import, import_)
    worker.register(Report, report)
    return worker


async def _demo(
    dsn: str, jobs: int, concurrency: int, prefix: str, out: TextIO, dashboard_port: int | None
) -> None:
    async with await PostgresStore.connect(dsn, prefix=prefix) as store:
        await store.migrate()
        queue = Queue(store)
        third = jobs // 3
        started = time.monotonic()
        await queue.enqueue_many(Thumbnail(image_id=i) for i in range(jobs - 2 * third))
        await queue.enqueue_many(Receipt(order_id=i) for i in range(third))
        await queue.enqueue_many(Import(account_id=i) for i in range(third))
        print(f"enqueued {jobs} jobs in {time.monotonic() - started:.2f}s", file=out)

        worker = _worker(store, concurrency)
        shutdown = asyncio.Event()
        run = asyncio.create_task(worker.run(shutdown))
        started = time.monotonic()
        printed = started
        while True:
            await asyncio.sleep(0.05)  # sampling, so the throughput figure is not rounded up
            stats = await queue.stats()
            outstanding = stats.pending + stats.claimed + sum(stats.scheduled_by_kind.values())
            now = time.monotonic()
            if now - printed >= 0.5 or outstanding == 0:
                printed = now
                print(
                    f"  {now - started:5.1f}s  done {jobs - outstanding:>6}/{jobs}  "
                    f"pending {stats.pending:>6}  running {stats.claimed:>3}  dead {stats.dead}",
                    file=out,
                )
            if outstanding == 0 or run.done():
                break
        shutdown.set()
        await run
        elapsed = time.monotonic() - started
        stats = await queue.stats()
        print(f"all {jobs} jobs settled in {elapsed:.2f}s: {jobs / elapsed:,.0f} jobs/s", file=out)
        print(f"  (pauses and retries included: {third} imports ran 3 times each)", file=out)
        print(
            f"final stats: pending={stats.pending} claimed={stats.claimed} dead={stats.dead}",
            file=out,
        )
        if dashboard_port is not None:
            await _serve_dashboard(store, queue, concurrency, dashboard_port, out)


async def _serve_dashboard(
    store: PostgresStore, queue: Queue, concurrency: int, port: int, out: TextIO
) -> None:
    """Keep a worker running, add jobs worth looking at, serve the dashboard until a signal."""
    from venturi.dashboard import _serve, app  # the dashboard extra, only when asked for

    try:
        sock = _serve.listen("127.0.0.1", port)
    except OSError as exc:
        raise ValueError(f"demo: the dashboard cannot listen on 127.0.0.1:{port}: {exc}") from None
    await queue.enqueue_many(Report(month=m) for m in range(1, 6))
    for minutes in range(1, 13):
        await queue.enqueue_in(Thumbnail(image_id=10_000 + minutes), timedelta(minutes=minutes))
    shutdown = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.set)
    print(f"dashboard at {_serve.url_of(sock)} (Ctrl-C to stop)", file=out, flush=True)
    worker = _worker(store, concurrency)
    running = asyncio.create_task(worker.run(shutdown))
    try:
        await _serve.serve(app(store, allow_local=True), sock, shutdown)
    finally:
        shutdown.set()
        await running
