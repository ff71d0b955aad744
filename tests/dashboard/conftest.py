"""Fixtures of the dashboard's tests: jobs in every state (made by a real worker), the
dashboard served by uvicorn on 127.0.0.1, and headless Chromium (Debian's, driven by
Playwright; never a downloaded browser)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from ulid import ULID

from tests.runtime.helpers import running, until_status
from venturi import Context, JobStatus, Outcome, PostgresStore, Queue, Task, TaskError, Worker


@dataclass
class Resize(Task):
    KIND = "media.resize"
    image: int


@dataclass
class Charge(Task):
    KIND = "billing.charge"
    order: int


async def resize(task: Resize, ctx: Context[None], app: None) -> None:
    return None


async def charge(task: Charge, ctx: Context[None], app: None) -> Outcome:
    raise TaskError.permanent(f"card declined for order {task.order} (insufficient funds)")


@dataclass(frozen=True)
class Seeded:
    ready: list[ULID]
    """Resize jobs, eligible now (never run: no worker serves their kind)."""
    scheduled: list[ULID]
    dead: list[ULID]
    """Charge jobs a worker ran once: each failed for good."""


async def seed(
    store: PostgresStore, *, ready: int = 7, scheduled: int = 3, dead: int = 4
) -> Seeded:
    """Jobs in three states: ready and scheduled Resize jobs, and dead Charge jobs."""
    from datetime import timedelta

    queue = Queue(store)
    ready_ids = await queue.enqueue_many(Resize(image=i) for i in range(ready))
    scheduled_ids = [
        await queue.enqueue_in(Resize(image=100 + i), timedelta(hours=1)) for i in range(scheduled)
    ]
    dead_ids = await queue.enqueue_many(Charge(order=i) for i in range(dead))
    worker = Worker(None, store, concurrency=4)
    worker.register(Charge, charge)
    async with running(worker):
        for job_id in dead_ids:
            await until_status(queue, job_id, JobStatus.DEAD)
    return Seeded(ready=ready_ids, scheduled=scheduled_ids, dead=dead_ids)


async def held_chain(store: PostgresStore) -> list[ULID]:
    """A chain of three (resize, charge, resize) run by a worker: the first link completed,
    the second failed for good, the third waits (the chain is held at link 2)."""
    queue = Queue(store)
    links = await queue.chain(Resize(image=1), Charge(order=2), Resize(image=3))
    worker = Worker(None, store, concurrency=2)
    worker.register(Resize, resize)
    worker.register(Charge, charge)
    async with running(worker):
        await until_status(queue, links[1], JobStatus.DEAD)
    return links


@pytest.fixture
def serve() -> Callable[[Any], Any]:
    """`async with serve(app) as url:` runs `app` under uvicorn on 127.0.0.1 (a free port),
    stopped when the block ends."""

    @asynccontextmanager
    async def serving(app: Any) -> AsyncIterator[str]:
        # Bound and listening before uvicorn starts: the URL works at once (no wait).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        )
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await task
            sock.close()

    return serving


def chromium_path() -> str | None:
    return os.environ.get("VENTURI_CHROMIUM") or shutil.which("chromium")


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Any]:
    """Headless Chromium from the system (scripts/test installs Debian's `chromium`)."""
    path = chromium_path()
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        path = None
    if path is None:
        message = "no chromium or playwright: scripts/test installs both"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=path, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 860})
    page = await context.new_page()
    try:
        yield page
    finally:
        await context.close()


SCREENSHOTS = os.environ.get("VENTURI_SCREENSHOTS")
"""A folder to save the browser tests' screenshots in (docs/ keeps a few)."""


async def screenshot(page: Any, name: str, tmp_path: Any) -> str:
    folder = SCREENSHOTS or str(tmp_path)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.png")
    await page.screenshot(path=path, full_page=True)
    return path
