"""Test harness: one private PostgreSQL per test run, a fresh table prefix per test.

Set VENTURI_TEST_DSN to run against an existing server instead.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import sys
import threading
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from venturi import PostgresStore, Queue
from venturi.embedded import EmbeddedPgBouncer, EmbeddedPostgres

_prefixes = itertools.count()

TASKS_DUMPED_BEFORE_TIMEOUT = 30.0
"""Seconds before pytest-timeout fails a hung test at which its asyncio tasks' stacks are
printed: the timeout prints the threads' stacks only, and a hung async test sits in the
event loop's select, which says nothing of the task that waits."""


def _dump_tasks(nodeid: str) -> None:
    out = sys.__stderr__
    if out is None:
        return
    for _ in range(3):  # the set may change under us: this runs beside the event loop
        try:
            tasks = [t for t in list(getattr(asyncio.tasks, "_all_tasks", ())) if not t.done()]
            break
        except RuntimeError:
            continue
    else:
        return
    text = io.StringIO()
    text.write(f"\n=== {nodeid}: still running; its {len(tasks)} pending asyncio tasks ===\n")
    for task in tasks:
        text.write(f"--- {task.get_name()}\n")
        task.print_stack(file=text)
    out.write(text.getvalue())
    out.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    limit = float(item.config.getini("timeout") or 0)
    timer = None
    if limit > TASKS_DUMPED_BEFORE_TIMEOUT:
        timer = threading.Timer(limit - TASKS_DUMPED_BEFORE_TIMEOUT, _dump_tasks, (item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    if dsn := os.environ.get("VENTURI_TEST_DSN"):
        yield dsn
        return
    with EmbeddedPostgres() as pg:
        yield pg.dsn


@pytest.fixture(scope="session")
def pgbouncer_dsn(pg_dsn: str) -> Iterator[str]:
    """The test PostgreSQL behind a private PgBouncer in transaction pooling mode (Debian's
    `pgbouncer`, which scripts/test installs), started on first use."""
    url = urllib.parse.urlsplit(pg_dsn)
    if url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
        pytest.skip("PgBouncer tests need the harness's PostgreSQL on 127.0.0.1")
    with EmbeddedPgBouncer(url.port, users=(url.username or "postgres",)) as bouncer:
        yield bouncer.dsn


@pytest.fixture(scope="session")
def venturi_dsn(pg_dsn: str) -> str:
    """venturi.testing's fixtures (the project's own tests use them too) on the same server."""
    return pg_dsn


@pytest.fixture
def prefix() -> str:
    """A table prefix of its own for each test: tests are isolated and can run in parallel."""
    return f"t{next(_prefixes)}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def store(pg_dsn: str, prefix: str) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=20)
    await store.migrate()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def queue(store: PostgresStore) -> Queue:
    return Queue(store)
