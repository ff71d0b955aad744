"""venturi.testing, as a user's test suite meets it: a pytest run of its own (the plugin loaded
through its entry point, pytest-asyncio in strict mode), against the real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from venturi import Context, KeyRing, PostgresStore, Queue, SealedCodec, Task, Worker
from venturi.encryption import new_key
from venturi.testing import Jobs

pytest_plugins = ["pytester"]

USER_CODE = """
import dataclasses
import pytest

from venturi import Backoff, Outcome, PostgresStore, Task, TaskError, Worker
from venturi.testing import Jobs


@dataclasses.dataclass
class Invoice(Task):
    KIND = "invoice"
    order: int

    async def handle(self, ctx, app):
        app.append(("invoice", self.order))
        if self.order == 7:
            await ctx_queue(ctx).enqueue(Receipt(self.order))


@dataclasses.dataclass
class Receipt(Task):
    KIND = "receipt"
    order: int

    async def handle(self, ctx, app):
        app.append(("receipt", self.order))


@dataclasses.dataclass
class Flaky(Task):
    KIND = "flaky"
    n: int

    async def handle(self, ctx, app):
        app.append(("flaky", ctx.run_count))
        if ctx.run_count < 4:
            raise RuntimeError("not yet")


@dataclasses.dataclass
class Forever(Task):
    KIND = "forever"

    async def handle(self, ctx, app):
        return Outcome.pause_in(3600)


@dataclasses.dataclass
class Yielder(Task):
    KIND = "yielder"

    async def handle(self, ctx, app):
        return Outcome.pause_in(0)  # due again at once


@dataclasses.dataclass
class Boom(Task):
    KIND = "boom"

    async def handle(self, ctx, app):
        raise TaskError.permanent("no such order")


QUEUES = {}
RAN = []


def ctx_queue(ctx):
    return QUEUES["queue"]


def build_worker(store: PostgresStore) -> Worker:
    worker = Worker(RAN, store, concurrency=2, backoff=Backoff(60, 600))
    for task in (Invoice, Receipt, Flaky, Forever, Yielder, Boom):
        worker.register(task)
    return worker


@pytest.fixture
def venturi_worker(venturi_queue):
    QUEUES["queue"] = venturi_queue
    RAN.clear()
    return build_worker
"""

USER_TESTS = """
import pytest
from venturi import JobStatus
from venturi.testing import Jobs

from app import Boom, Flaky, Forever, Invoice, RAN, Yielder


@pytest.mark.asyncio
async def test_run_jobs_runs_what_is_due_and_what_it_enqueues(venturi_queue, venturi_jobs):
    await venturi_queue.enqueue(Invoice(7))
    await venturi_queue.enqueue_in(Invoice(8), 3600)
    await venturi_jobs.assert_enqueued(Invoice, where=lambda t: t.order == 7, count=1)
    runs = await venturi_jobs.run_jobs()
    assert RAN == [("invoice", 7), ("receipt", 7)]
    assert runs == 2
    (later,) = await venturi_jobs.queued_jobs(Invoice)
    assert later.payload == {"order": 8}


@pytest.mark.asyncio
async def test_a_retry_waiting_for_its_backoff_is_not_due(venturi_queue, venturi_jobs):
    # Backoff(60): the first two retries are immediate (due), the third waits 60 s.
    job_id = await venturi_queue.enqueue(Flaky(1))
    await venturi_jobs.run_jobs()
    assert RAN == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert (await venturi_queue.job(job_id)).status is JobStatus.PENDING
    await venturi_jobs.run_all_jobs()
    assert RAN == [("flaky", 1), ("flaky", 2), ("flaky", 3), ("flaky", 4)]
    assert (await venturi_queue.job(job_id)).status is JobStatus.COMPLETED


@pytest.mark.asyncio
async def test_run_all_jobs_gives_up_on_a_job_that_never_ends(venturi_queue, venturi_jobs):
    await venturi_queue.enqueue(Forever())
    with pytest.raises(AssertionError, match="still due after 5 rounds"):
        await venturi_jobs.run_all_jobs(max_rounds=5)


@pytest.mark.asyncio
async def test_a_job_that_keeps_putting_itself_back_fails_the_test(venturi_queue, venturi_jobs):
    job_id = await venturi_queue.enqueue(Yielder())
    with pytest.raises(AssertionError, match=f"job {job_id} .yielder. ran 20 times here"):
        await venturi_jobs.run_jobs()
    assert (await venturi_queue.job(job_id)).run_count < 30  # not a thousand rounds


@pytest.mark.asyncio
async def test_a_failed_job_is_dead(venturi_queue, venturi_jobs):
    job_id = await venturi_queue.enqueue(Boom())
    await venturi_jobs.run_jobs()
    job = await venturi_queue.job(job_id)
    assert job.status is JobStatus.DEAD
    assert job.last_error == "no such order"


@pytest.mark.asyncio
async def test_dispatch_sync_runs_in_the_caller_and_stores_nothing(venturi_queue, venturi_jobs):
    outcome = await venturi_jobs.dispatch_sync(Invoice(3))
    assert outcome.status == "completed"
    assert RAN == [("invoice", 3)]
    assert await venturi_jobs.queued_jobs() == []


@pytest.mark.asyncio
async def test_assert_enqueued_fails_when_nothing_matches(venturi_queue, venturi_jobs):
    await venturi_queue.enqueue(Invoice(1))
    with pytest.raises(AssertionError, match="no pending Invoice job matches"):
        await venturi_jobs.assert_enqueued(Invoice, where=lambda t: t.order == 2)
    with pytest.raises(AssertionError, match="expected 2 pending Invoice"):
        await venturi_jobs.assert_enqueued(Invoice, count=2)


@pytest.mark.asyncio
async def test_the_store_has_a_prefix_of_its_own(venturi_store):
    assert venturi_store.prefix.startswith("vt")
    with open("prefixes.txt", "a") as f:
        f.write(venturi_store.prefix + "\\n")
"""


def test_a_users_suite_runs_its_jobs_through_the_plugin(
    pytester: pytest.Pytester, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(app=textwrap.dedent(USER_CODE))
    pytester.makeconftest("from app import venturi_worker")
    pytester.makepyfile(test_app=textwrap.dedent(USER_TESTS))
    monkeypatch.setenv("VENTURI_TEST_DSN", pg_dsn)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=8)


async def test_the_stores_tables_are_dropped_after_each_test(
    pytester: pytest.Pytester, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(app=textwrap.dedent(USER_CODE))
    pytester.makeconftest("from app import venturi_worker")
    pytester.makepyfile(test_app=textwrap.dedent(USER_TESTS))
    monkeypatch.setenv("VENTURI_TEST_DSN", pg_dsn)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-k", "own")
    result.assert_outcomes(passed=1)
    (prefix,) = (pytester.path / "prefixes.txt").read_text().split()
    conn = await asyncpg.connect(pg_dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_class WHERE starts_with(relname, $1)", prefix + "_"
        )
        functions = await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1)", prefix + "_"
        )
    finally:
        await conn.close()
    assert (left, functions) == (0, 0)


def test_jobs_without_the_applications_worker_says_how_to_give_it(
    pytester: pytest.Pytester, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_bare="""
        import pytest

        @pytest.mark.asyncio
        async def test_bare(venturi_jobs):
            await venturi_jobs.run_jobs()
        """
    )
    monkeypatch.setenv("VENTURI_TEST_DSN", pg_dsn)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*override the `venturi_worker` fixture*"])


def test_without_pytest_asyncio_the_plugin_stays_out_of_the_way(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "def test_plain():\n    assert True\n\ndef test_store(venturi_store):\n    pass\n"
    )
    hidden = tmp_path / "hidden" / "pytest_asyncio"  # as if it were not installed
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('pytest_asyncio is not installed')\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "venturi.testing", "-p", "no:cacheprovider",
         "test_plain.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        # only venturi's plugin: others (pytest-asyncio's own, kmock) would need it
        env={**os.environ, "PYTHONPATH": str(hidden.parent), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert "1 passed" in result.stdout, result.stdout + result.stderr
    assert "venturi_store: venturi's test fixtures need pytest-asyncio" in result.stdout


@dataclass
class SecretCharge(Task):
    KIND = "testing.secret_charge"
    ENCRYPTED = True
    card: str


async def test_jobs_reads_what_the_applications_codec_stored(store: PostgresStore) -> None:
    """`assert_enqueued` and `run_jobs` decode with the application's worker's codec (a
    `SealedCodec` here) unless told another: the default JSON codec cannot open a sealed
    payload."""
    codec = SealedCodec(KeyRing({"k1": new_key()}))
    charged: list[str] = []

    async def charge(task: SecretCharge, ctx: Context[None], app: None) -> None:
        charged.append(task.card)

    def build(store: PostgresStore) -> Worker[None]:
        worker: Worker[None] = Worker(None, store, codec=codec)
        worker.register(SecretCharge, charge)
        return worker

    await Queue(store, codec=codec).enqueue(SecretCharge("4242"))
    jobs = Jobs(store, build)
    [found] = await jobs.assert_enqueued(SecretCharge, where=lambda t: t.card == "4242")
    assert found == SecretCharge("4242")
    assert await jobs.run_jobs() == 1 and charged == ["4242"]
