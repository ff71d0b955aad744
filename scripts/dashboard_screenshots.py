"""The README's dashboard screenshots: `.venv/bin/python scripts/dashboard_screenshots.py`
writes docs/dashboard-*.png.

An embedded PostgreSQL (127.0.0.1, stopped at the end) gets a small shop's queue through the
public API and real workers: thumbnails and receipts done, charges that fail for good, chains
of an order's steps (one held at a declined charge), a paused queue, schedules, jobs no live
worker serves. The one thing not made by running jobs: the per-minute counters of the two
hours before (a shaped day's traffic), so the overview's chart has a past to draw. Headless
Chromium (Debian's, driven by Playwright, as the browser tests) takes each page.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import uvicorn
from playwright.async_api import async_playwright

from venturi import (
    Context,
    Outcome,
    PostgresStore,
    Queue,
    Schedule,
    Task,
    TaskError,
    Worker,
    dashboard,
)
from venturi.embedded import EmbeddedPostgres

DOCS = Path(__file__).resolve().parent.parent / "docs"
PREFIX = "shop"


@dataclass
class Thumbnail(Task):
    KIND = "media.thumbnail"
    QUEUE = "media"
    image: int


@dataclass
class Transcode(Task):
    """No worker serves it: listed on the workers page as unserved."""

    KIND = "media.transcode"
    QUEUE = "media"
    video: int


@dataclass
class Receipt(Task):
    KIND = "mail.receipt"
    order: int


@dataclass
class Charge(Task):
    KIND = "billing.charge"
    QUEUE = "billing"
    order: int


@dataclass
class Reserve(Task):
    KIND = "orders.reserve"
    order: int


@dataclass
class Ship(Task):
    KIND = "orders.ship"
    order: int


@dataclass
class Report(Task):
    KIND = "reports.monthly"
    QUEUE = "reports"
    month: int


async def thumbnail(task: Thumbnail, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


async def receipt(task: Receipt, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed(note="sent")


async def charge(task: Charge, ctx: Context[None], app: None) -> Outcome:
    if task.order % 7 == 3:
        raise TaskError.permanent(f"card declined for order {task.order} (insufficient funds)")
    return Outcome.completed(result={"charged": task.order * 3 % 200 + 9.5})


async def reserve(task: Reserve, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed(note="stock held")


async def ship(task: Ship, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed(note="label printed")


def worker(store: PostgresStore, *, queues: list[str], **options: object) -> Worker[None]:
    w: Worker[None] = Worker(None, store, queues=queues, **options)  # type: ignore[arg-type]
    w.register(Thumbnail, thumbnail)
    w.register(Receipt, receipt)
    w.register(Charge, charge)
    w.register(Ship, ship)
    w.register(Reserve, reserve)
    return w


async def drain(store: PostgresStore) -> None:
    w = worker(store, queues=["default", "media", "billing"], concurrency=16)
    await w.run(stop_when_empty=True)


async def seed(store: PostgresStore) -> None:
    queue = Queue(store)
    await queue.enqueue_many(Thumbnail(image=i) for i in range(160))
    await queue.enqueue_many(Receipt(order=i) for i in range(70))
    await queue.enqueue_many(Charge(order=i) for i in range(40, 64))
    for order in (101, 102, 103, 104):  # 101 % 7 == 3: held at its charge
        await queue.chain(Reserve(order=order), Charge(order=order), Ship(order=order))
    statements = queue.batch("november-statements").add(*(Receipt(order=i) for i in range(60)))
    await statements.then(Receipt(order=0)).enqueue()
    cards = queue.batch("card-renewals").add(*(Charge(order=i) for i in range(300, 328)))
    await cards.catch(Receipt(order=1)).finally_(Receipt(order=2)).allow_failures().enqueue()
    await drain(store)
    # A batch under way: a worker of its queue got through 25 of its 45 jobs so far.
    await queue.batch("thumbnails-v2").add(*(Thumbnail(image=900 + i) for i in range(45))).enqueue()
    await worker(store, queues=["media"], concurrency=1).run(max_jobs=25)
    old = (
        await queue.batch("old-export")
        .add(*(Thumbnail(image=950 + i) for i in range(20)))
        .enqueue()
    )
    await queue.cancel_batch(old)
    # Now: what waits. Ready thumbnails and receipts, scheduled ones, transcodes nobody runs,
    # a chain still running (its charge pending), and a paused queue with its reports.
    await queue.enqueue_many(Thumbnail(image=5000 + i) for i in range(37))
    await queue.enqueue_many(Receipt(order=5000 + i) for i in range(12))
    for minutes in range(1, 9):
        await queue.enqueue_in(Receipt(order=6000 + minutes), timedelta(minutes=5 * minutes))
    await queue.enqueue_many(Transcode(video=i) for i in range(6))
    await queue.chain(Reserve(order=205), Charge(order=205), Ship(order=205))
    await queue.enqueue_many(Report(month=m) for m in range(1, 4))
    await queue.pause("reports", reason="month-end close", until=None)
    # The two hours before: a shaped curve of finished jobs per minute (see the docstring).
    pool = store._pool_or_raise()
    await pool.execute(
        f"""
        INSERT INTO {PREFIX}_minute_counts (minute, queue, kind, slot, done, failed)
        SELECT date_trunc('minute', now()) - m * interval '1 minute', q.queue, q.kind, 1,
               greatest(0, round(q.base * (1.0 + sin(m / 9.0) * 0.35 + cos(m / 23.0) * 0.25)
                                 + (m * 37 % 23)))::bigint,
               CASE WHEN q.kind = 'billing.charge' AND m % 13 = 4 THEN 8 + m % 7 ELSE 0 END
        FROM generate_series(1, 119) AS m,
             (VALUES ('media', 'media.thumbnail', 120.0), ('default', 'mail.receipt', 60.0),
                     ('billing', 'billing.charge', 14.0)) AS q(queue, kind, base)
        """
    )


async def shoot(url: str, out: Path, pages: list[tuple[str, str]]) -> None:
    path = os.environ.get("VENTURI_CHROMIUM") or shutil.which("chromium")
    assert path, "needs Debian's chromium (scripts/test installs it)"
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=path, headless=True)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        for name, where in pages:
            await page.goto(url + where)
            # A long list is shown as far as the window goes; the other pages whole.
            whole = name != "jobs"
            await page.screenshot(path=str(out / f"dashboard-{name}.png"), full_page=whole)
            print(f"docs/dashboard-{name}.png")
        await browser.close()


async def main() -> None:
    async with (
        EmbeddedPostgres() as pg,
        await PostgresStore.connect(pg.dsn, prefix=PREFIX) as store,
    ):
        await store.migrate()
        await seed(store)
        queue = Queue(store)
        held = next(j for j in await queue.failed(kind=Charge.KIND) if j.payload["order"] == 101)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(
            uvicorn.Config(
                dashboard.app(store, gate=lambda request: True, refresh=3600),
                log_level="warning",
                lifespan="off",
            )
        )
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        shutdown = asyncio.Event()
        runs: list[asyncio.Task[None]] = []
        try:
            # What waits, before any worker runs it.
            pages = [("overview", "/"), ("jobs", "/jobs"), ("failed", "/failed")]
            pages += [("queues", "/queues"), ("chains", "/chains"), ("job", f"/jobs/{held.id}")]
            pages += [("batches", "/batches")]
            await shoot(url, DOCS, pages)
            # Then live workers (they take the ready jobs), for the registry.
            live = [
                worker(
                    store,
                    queues=["media", "default"],
                    concurrency=8,
                    schedules=[
                        Schedule(
                            "thumbnail-sweep", Thumbnail(image=0), every=timedelta(minutes=15)
                        ),
                        Schedule("nightly-receipts", Receipt(order=0), cron="30 2 * * *"),
                        Schedule("weekly-digest", Receipt(order=1), cron="0 8 * * MON"),
                    ],
                ),
                worker(store, queues=["billing"], concurrency=4),
            ]
            runs = [asyncio.create_task(w.run(shutdown)) for w in live]
            await asyncio.gather(*(w.ready.wait() for w in live))
            for _ in range(100):  # the database is the event source: poll it, briefly
                if len(await queue.schedules()) == 3 and len(await queue.workers()) == 2:
                    break
                await asyncio.sleep(0.1)
            await shoot(url, DOCS, [("workers", "/workers")])
        finally:
            server.should_exit = True
            await serving
            sock.close()
            shutdown.set()
            await asyncio.gather(*runs)


if __name__ == "__main__":
    asyncio.run(main())
