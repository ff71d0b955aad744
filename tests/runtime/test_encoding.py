"""A database whose encoding is not UTF8 (LATIN1): text it has no character for is refused
where it is data, and written with backslash escapes where it is for people, so an outcome
stands (a completed job is not run again because its note held a euro sign)."""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import Backoff, Context, JobStatus, Outcome, PostgresStore, Queue, Task, Worker

from .helpers import running, until_status


@dataclass
class Say(Task):
    KIND = "say"
    how: str


runs: dict[str, int] = {}


async def say(task: Say, ctx: Context[None], app: None) -> Outcome:
    runs[task.how] = runs.get(task.how, 0) + 1
    if task.how == "note":
        return Outcome.completed("sent 5 € to café")
    if task.how == "raise":
        raise RuntimeError("no € here")
    return Outcome.completed(result={"price": "5 €"})


@pytest.fixture
async def latin1_dsn(pg_dsn: str) -> AsyncIterator[str]:
    name = f"latin1_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_dsn)
    try:
        try:
            await admin.execute(
                f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            )
        except asyncpg.InsufficientPrivilegeError:
            pytest.skip("the test server's role may not create a database")
        url = urllib.parse.urlsplit(pg_dsn)
        yield urllib.parse.urlunsplit(url._replace(path=f"/{name}"))
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        await admin.close()


async def test_a_latin1_database_refuses_data_and_escapes_notes(
    latin1_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs.clear()
    with caplog.at_level(logging.WARNING, logger="venturi.postgres"):
        store = await PostgresStore.connect(latin1_dsn)
        await store.migrate()
    assert "this database's encoding is LATIN1, not UTF8" in caplog.text
    try:
        queue = Queue(store)
        # Data: refused at enqueue, nothing stored.
        with pytest.raises(asyncpg.UntranslatableCharacterError, match='"LATIN1"'):
            await queue.enqueue(Say("5 €"))
        assert (await queue.stats()).pending == 0
        noted, raised, result = [await queue.enqueue(Say(how)) for how in ("note", "raise", "r")]

        worker = Worker(None, store, backstop=2, backoff=Backoff(base=0.01, cap=0.01))
        worker.register(Say, say)
        async with running(worker):
            await until_status(queue, noted, JobStatus.COMPLETED)
            await until_status(queue, raised, JobStatus.DEAD)
            await until_status(queue, result, JobStatus.DEAD)

        # A note for people: written escaped, and the completed job ran once.
        assert runs["note"] == 1
        [entry] = await queue.job_journal(noted)
        assert entry.note == "sent 5 \\u20ac to caf\\xe9"
        # An exception's message: the same, and the job retried as any failure is.
        journal = await queue.job_journal(raised)
        assert runs["raise"] == 2 and len(journal) == 2
        assert all("RuntimeError: no \\u20ac here" in (e.note or "") for e in journal)
        # A result is data: refused, the run failed with PostgreSQL's reason.
        journal = await queue.job_journal(result)
        job = await queue.job(result)
        assert len(journal) == 2 and job is not None and job.result is None
        assert all('has no equivalent in encoding "LATIN1"' in (e.note or "") for e in journal)
    finally:
        await asyncio.wait_for(store.close(), 30)
