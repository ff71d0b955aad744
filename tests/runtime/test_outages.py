"""What a worker does when the database misbehaves, in one process against the real
server: failures classified, broken connections discarded, leases announced so an idle
rescuer recovers a dead worker's job at once, lost claim replies reconciled (see
tests/faults for the multi-process versions), and the small things a reliable queue must
get right (fractional delays, ids in creation order, one identity per worker, a quiet
LISTEN loss)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from venturi import (
    Backoff,
    Context,
    JobFilter,
    JobStatus,
    JournalOutcome,
    Outcome,
    PanicPolicy,
    PostgresStore,
    Queue,
    Task,
    Worker,
    WorkerIdentity,
)
from venturi._completer import Completer
from venturi._db import sql
from venturi._db.failures import (
    breaks_connection,
    describe,
    is_database_failure,
    is_refused_data,
)
from venturi._executor import Policy, _unrecordable
from venturi._outage import REFUSALS, Outage
from venturi._records import Settlement

from .helpers import claim, running, until, until_status


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of the test's own, for raw SQL (inspection and fault injection)."""
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


@dataclass
class Ping(Task):
    KIND = "outages.ping"
    n: int = 0


@dataclass
class Pong(Task):
    KIND = "outages.pong"
    n: int = 0


DEAD = "dead:1#0000"
"""The worker a test's own claim names: it never renews, so its leases expire."""


async def done(task: Task, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed()


# -- classifying failures ------------------------------------------------------------------


def test_failures_from_inside_asyncpg_count_as_database_failures() -> None:
    assert is_database_failure(asyncpg.InternalClientError("cannot switch to state 12"))
    assert is_database_failure(asyncpg.InterfaceError("connection is closed"))
    assert is_database_failure(ConnectionResetError())
    assert is_database_failure(asyncpg.AdminShutdownError("terminating connection"))
    # An AttributeError raised by asyncpg's own code (as from a connection that vanished).
    with pytest.raises(AttributeError) as raised:
        asyncpg.connection.Connection.is_closed(None)  # type: ignore[arg-type]
    assert is_database_failure(raised.value)
    assert not is_database_failure(KeyError("a bug of ours"))
    assert not is_database_failure(AssertionError())


def test_statements_the_database_answered_and_refused_are_no_outage() -> None:
    """A statement_timeout, a read-only database (25006), a lock_timeout: the server is
    there, so a read succeeding meanwhile must not announce "the database is back"."""
    outage = Outage("w")
    for refused in (
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.LockNotAvailableError("canceling statement due to lock timeout"),
        # A transaction pooler not named (pooler="transaction"): asyncpg's statements go
        # missing, or are found twice, on the server connections it is handed.
        asyncpg.InvalidSQLStatementNameError(
            'prepared statement "__asyncpg_stmt_a__" does not exist'
        ),
        asyncpg.DuplicatePreparedStatementError(
            'prepared statement "__asyncpg_stmt_b__" already exists'
        ),
    ):
        outage.failed("claiming", refused)
        assert not outage.ongoing, refused
    assert "pooler='transaction'" in REFUSALS["26000"] and REFUSALS["42P05"] == REFUSALS["26000"]
    outage.failed("claiming", asyncpg.AdminShutdownError("terminating connection"))
    assert outage.ongoing


def test_a_call_begun_before_the_outage_does_not_end_it(caplog: pytest.LogCaptureFixture) -> None:
    """Loops run concurrently: one call fails (the outage begins), another begun before it
    is answered a moment later. That says nothing of the database now; "back", then
    "unavailable" again, was logged within a millisecond."""
    outage = Outage("w")
    caplog.set_level(logging.WARNING, logger="venturi.worker")
    before = outage.epoch
    outage.failed("running failure hooks", asyncpg.AdminShutdownError("terminating connection"))
    outage.ok(before)  # a call in flight when the outage began
    assert outage.ongoing
    outage.ok(outage.epoch)  # a call begun since: the database answers
    assert not outage.ongoing
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "is unavailable" in said[0] and "is back after" in said[1]


async def test_asyncpg_still_keeps_its_cancel_requests_where_the_store_waits_for_them(
    pg_dsn: str,
) -> None:
    # `_db.run._reap` reads asyncpg's private `_cancellations` (the cancel request of a
    # statement given up on); without it a given-up statement would not be cancelled on the
    # server, and nothing else would notice.
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert isinstance(conn._cancellations, set)  # type: ignore[attr-defined]
    finally:
        await conn.close()


def test_only_statement_errors_leave_a_connection_reusable() -> None:
    assert not breaks_connection(asyncpg.UniqueViolationError("dup"))
    assert not breaks_connection(asyncpg.DataError("bad"))
    assert breaks_connection(asyncpg.AdminShutdownError("shutdown"))
    assert breaks_connection(asyncpg.QueryCanceledError("timeout"))
    assert breaks_connection(asyncpg.InternalClientError("state"))
    assert breaks_connection(asyncio.CancelledError())
    assert is_refused_data(asyncpg.CharacterNotInRepertoireError("0x00"))
    assert not is_refused_data(asyncpg.UndefinedTableError("no table"))
    assert not is_refused_data(asyncpg.AdminShutdownError("shutdown"))


def test_asyncpgs_protocol_state_errors_are_said_to_be_a_lost_connection() -> None:
    # What an outage log showed for a connection that died while idle (audit A).
    said = describe(asyncpg.InternalClientError("cannot switch to state 12"))
    assert said == (
        "InternalClientError: cannot switch to state 12 (the connection was lost mid-exchange)"
    )
    assert describe(asyncpg.DataError("bad\nmore")) == "DataError: bad"
    # Other client errors of asyncpg's say what they are.
    assert describe(asyncpg.OutdatedSchemaCacheError("cached plan")) == (
        "OutdatedSchemaCacheError: cached plan"
    )


async def test_a_connection_that_failed_mid_statement_is_not_reused(pg_dsn: str) -> None:
    """The server cancels the statement (class 57): the connection goes, not back to the
    pool, so a half-read reply can never meet the next caller."""
    store = await PostgresStore.connect(pg_dsn, prefix="unused", min_size=1, max_size=1)

    async def fetchval(text: str) -> Any:
        return await store._run.fetchval(sql.compile_statement("test", text))

    try:
        await fetchval("SELECT set_config('statement_timeout', '50', false)")
        first = await fetchval("SELECT pg_backend_pid()")
        with pytest.raises(asyncpg.QueryCanceledError):
            await fetchval("SELECT pg_sleep(5)")
        assert await fetchval("SELECT pg_backend_pid()") != first
        # An error in the statement itself keeps the connection.
        kept = await fetchval("SELECT pg_backend_pid()")
        with pytest.raises(asyncpg.DivisionByZeroError):
            await fetchval("SELECT 1 / 0")
        assert await fetchval("SELECT pg_backend_pid()") == kept
    finally:
        await store.close()


# -- recovery right after expiry -------------------------------------------------------------


async def recovered_after(store: PostgresStore, pool: asyncpg.Pool, job_id: uuid.UUID) -> float:
    """Wait until the rescuer recovers the job (its journal says so); seconds from its claim
    to the recovery."""

    async def recovered() -> bool:
        entries = await store.journal(job_id)
        return any(e.outcome is JournalOutcome.STALE_RECOVERED for e in entries)

    await until(recovered, limit=10)
    after: float = await pool.fetchval(
        f"SELECT extract(epoch FROM (SELECT at FROM {store.prefix}_journal WHERE job_id = $1) "
        f"- claimed_at)::float8 FROM {store.prefix}_jobs WHERE id = $1",
        job_id,
    )
    return after


async def test_an_idle_worker_recovers_a_dead_workers_job_right_after_its_lease(
    queue: Queue, store: PostgresStore, pool: asyncpg.Pool
) -> None:
    """B is idle (poll_max 30 s: it saw nothing claimed). A claims a job with a 1 s lease and
    dies. The claim announced its lease, so B recovers the job about when it expires."""
    worker = Worker(None, store, concurrency=1, poll_max=30)
    worker.register(Ping, done)
    async with running(worker):
        await asyncio.sleep(0.2)  # let B's rescuer take its first look (nothing claimed)
        await queue.enqueue(Pong())  # a kind B does not run: only the dead worker claims it
        (claimed,) = await claim(store, 1, kinds=[Pong.KIND], worker=DEAD, lease_s=1.0)
        after = await recovered_after(store, pool, claimed.id)
    assert 1.0 <= after < 2.0  # the lease (1 s) plus at most a second


async def test_many_jobs_recovered_at_once_are_summed_up_in_one_warning(
    queue: Queue, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed worker that held many jobs (prefetched, say: a thousand) left a WARNING per
    job in every rescuer's log. Each is still logged, the first ten as warnings and the
    rest at info, under one warning that counts them by kind."""
    caplog.set_level(logging.INFO, logger="venturi")
    worker = Worker(None, store, concurrency=1, poll_max=30)
    worker.register(Ping, done)
    async with running(worker):
        await queue.enqueue_many(Pong(n) for n in range(13))  # a kind this worker does not run
        claimed = await claim(store, 13, kinds=[Pong.KIND], worker=DEAD, lease_s=0.5)
        assert len(claimed) == 13

        async def all_recovered() -> bool:
            stats = await queue.stats()
            return stats.claimed == 0

        await until(all_recovered, limit=10)
    each = [r for r in caplog.records if "recovered after its lease expired: now" in r.message]
    assert [r.levelno for r in each] == [logging.WARNING] * 10 + [logging.INFO] * 3
    (summary,) = [r for r in caplog.records if "jobs recovered after their leases" in r.message]
    assert summary.levelno == logging.WARNING
    assert summary.getMessage().startswith(
        f"13 jobs recovered after their leases expired ({Pong.KIND}: 13)"
    )


async def test_a_worker_taking_one_job_at_a_time_announces_about_once_per_lease(
    queue: Queue, store: PostgresStore, pg_dsn: str
) -> None:
    """An idle worker's claim announces its lease (above), but the next claims, made while
    that announced end is still ahead, need not: every rescuer looks then and reads the
    leases claimed until then. Twenty jobs run one after another announce once."""
    notices: list[str] = []
    sentinel = asyncio.Event()

    def heard(_c: object, _pid: int, _channel: str, payload: object) -> None:
        assert isinstance(payload, str)
        if payload.startswith("!lease "):
            notices.append(payload)
        elif payload == "test-sentinel":
            sentinel.set()

    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(store.channel, heard)
    try:
        worker = Worker(None, store, concurrency=1, lease=30)
        worker.register(Ping, done)
        async with running(worker):
            for n in range(20):
                await until_status(queue, await queue.enqueue(Ping(n)), JobStatus.COMPLETED)
            # Notifications arrive in commit order: once this one is here, all are.
            await listener.execute("SELECT pg_notify($1, 'test-sentinel')", store.channel)
            await asyncio.wait_for(sentinel.wait(), 10)
    finally:
        await listener.close()
    assert len(notices) == 1, notices
    assert notices[0].endswith(" default")


async def test_a_lease_claimed_after_an_announced_one_is_recovered_right_after_it_ends(
    queue: Queue, store: PostgresStore, pool: asyncpg.Pool
) -> None:
    """What the announcement rule above relies on: a dead worker announced a 1 s lease, then
    claimed a job with a 1.5 s lease without announcing it. The idle rescuer's look at the
    announced end reads the second lease too, and recovers that job right after it ends,
    not a `poll_max` (30 s) later."""
    worker = Worker(None, store, concurrency=1, poll_max=30)
    worker.register(Ping, done)
    async with running(worker):
        await asyncio.sleep(0.2)  # let B's rescuer take its first look (nothing claimed)
        await queue.enqueue(Pong(1))
        await queue.enqueue(Pong(2))
        dead_claim = functools.partial(
            store.claim, queues=["default"], kinds=[Pong.KIND], limit=1, worker=DEAD
        )
        (first,) = await dead_claim(pod=None, default_lease_s=1.0)
        (second,) = await dead_claim(pod=None, default_lease_s=1.5, held_lease_s=0.9)
        after = await recovered_after(store, pool, second.id)
    assert first.lease_s == 1.0 and second.lease_s == 1.5
    assert 1.5 <= after < 2.5  # its lease (1.5 s) plus at most a second


# -- small things that must be right ----------------------------------------------------------


async def test_fractional_delays_are_kept(
    queue: Queue, store: PostgresStore, prefix: str, pool: asyncpg.Pool
) -> None:
    for delay in (1.2, 0.5, 2.5):
        job_id = await queue.enqueue_in(Ping(), delay)
        seconds = await pool.fetchval(
            f"SELECT extract(epoch FROM run_at - created_at)::float8 FROM {prefix}_jobs "
            "WHERE id = $1",
            job_id.to_uuid(),
        )
        assert seconds == pytest.approx(delay, abs=1e-6)


async def test_ids_from_one_process_sort_in_creation_order(queue: Queue) -> None:
    ids = [await queue.enqueue(Ping(n)) for n in range(50)]
    listed = await queue.jobs(JobFilter(limit=50))
    assert [j.id for j in listed] == ids[::-1]


async def test_each_worker_has_its_own_identity(queue: Queue, store: PostgresStore) -> None:
    a = Worker(None, store, concurrency=1)
    a.register(Ping, done)
    b = Worker(None, store, concurrency=1)
    b.register(Pong, done)
    assert str(a.identity) != str(b.identity)
    assert WorkerIdentity.current() != WorkerIdentity.current()
    ping, pong = await queue.enqueue(Ping()), await queue.enqueue(Pong())
    async with running(a), running(b):
        await until_status(queue, ping, JobStatus.COMPLETED)
        await until_status(queue, pong, JobStatus.COMPLETED)
    ((by_a,), (by_b,)) = [await queue.job_journal(ping), await queue.job_journal(pong)]
    assert (by_a.worker, by_b.worker) == (str(a.identity), str(b.identity))


async def test_listen_loss_is_quiet_and_uses_no_pool_connection(
    queue: Queue, store: PostgresStore, caplog: pytest.LogCaptureFixture, pool: asyncpg.Pool
) -> None:
    worker = Worker(None, store, concurrency=1)
    worker.register(Ping, done)
    async with running(worker):
        assert worker.notifier is not None
        pid = await pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'venturi listen'"
            " AND query LIKE 'LISTEN%' ORDER BY backend_start DESC LIMIT 1"
        )
        assert pid is not None
        with caplog.at_level(logging.WARNING):
            await pool.fetchval("SELECT pg_terminate_backend($1)", pid)

            async def relistened() -> bool:
                assert worker.notifier is not None
                return worker.notifier.reconnects == 1 and worker.notifier.connected.is_set()

            await until(relistened)
        job_id = await queue.enqueue(Ping())
        await until_status(queue, job_id, JobStatus.COMPLETED)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "released back to the pool" in m], messages
    assert any("LISTEN connection lost" in m for m in messages)


# -- one bad job never harms another ----------------------------------------------------------


async def test_one_poisoned_settlement_leaves_the_rest_of_its_batch_settled(
    queue: Queue, store: PostgresStore
) -> None:
    await queue.enqueue_many(Ping(n) for n in range(100))
    claimed = await store.claim(
        queues=["default"], kinds=[Ping.KIND], limit=100, worker="w", pod=None, default_lease_s=60
    )
    assert len(claimed) == 100
    policy = Policy(Backoff(), 0.5, 25, PanicPolicy.RETRY)
    settlements = [
        Settlement.of(
            j,
            "completed",
            note="a\x00b" if i == 37 else None,  # text PostgreSQL refuses
            unrecordable=functools.partial(_unrecordable, j, policy, 0.0),
        )
        for i, j in enumerate(claimed)
    ]
    completer = Completer(store, worker="w")
    task = asyncio.create_task(completer.run())
    for s in settlements:
        await completer.settle(s)
    await completer.close()
    await task
    statuses = [(await queue.job(j.id)) for j in claimed]  # type: ignore[arg-type]
    assert sum(1 for j in statuses if j is not None and j.status is JobStatus.COMPLETED) == 99
    bad = statuses[37]
    assert bad is not None and bad.status is JobStatus.PENDING and bad.failures == 1
    assert bad.last_error is not None and "could not be recorded" in bad.last_error
    (entry,) = await store.journal(claimed[37].id)
    assert entry.outcome is JournalOutcome.FAILED


# -- handlers that escape the rules -----------------------------------------------------------


async def test_a_handler_raising_cancelled_error_fails_instead_of_looping(queue: Queue) -> None:
    runs: list[int] = []

    async def cancels(task: Ping, ctx: Context[None], app: None) -> Outcome:
        runs.append(ctx.run_count)
        raise asyncio.CancelledError

    worker = Worker(None, queue.store, concurrency=1, backoff=Backoff(0.01, 0.02), backstop=3)
    worker.register(Ping, cancels)
    job_id = await queue.enqueue(Ping())
    async with running(worker):
        await until_status(queue, job_id, JobStatus.DEAD)
    assert runs == [1, 2, 3]
    outcomes = [e.outcome for e in await queue.job_journal(job_id)]
    assert outcomes == [JournalOutcome.FAILED, JournalOutcome.FAILED, JournalOutcome.DEAD]


@pytest.mark.parametrize("escape", [KeyboardInterrupt, SystemExit])
async def test_keyboard_interrupt_or_system_exit_fails_the_run_not_the_worker(
    queue: Queue, escape: type[BaseException]
) -> None:
    async def raises(task: Ping, ctx: Context[None], app: None) -> Outcome:
        raise escape()

    worker = Worker(None, queue.store, concurrency=2, backstop=1)
    worker.register(Ping, raises)
    worker.register(Pong, done)
    bad = await queue.enqueue(Ping())
    async with running(worker):
        await until_status(queue, bad, JobStatus.DEAD)
        later = await queue.enqueue(Pong())
        await until_status(queue, later, JobStatus.COMPLETED)
    job = await queue.job(bad)
    assert job is not None and job.last_error is not None
    assert job.last_error.endswith(f"{escape.__name__}: ")


async def test_a_handler_that_swallows_cancellation_does_not_hang_shutdown(
    queue: Queue,
) -> None:
    """Given up on, the handler may go on running in this process (which runs on after
    `run()`): its job stays claimed until its lease ends, never released to run elsewhere
    beside it (it was released, and a second worker ran it while the first run went on)."""
    started = asyncio.Event()
    give_up = asyncio.Event()  # the test's own way out, so the handler ends with the test

    async def swallow(task: Ping, ctx: Context[None], app: None) -> Outcome:
        started.set()
        while True:
            try:
                await give_up.wait()
                return Outcome.completed()
            except asyncio.CancelledError:
                continue

    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=0.2)
    worker.register(Ping, swallow)
    job_id = await queue.enqueue(Ping())
    shutdown = asyncio.Event()
    run = asyncio.create_task(worker.run(shutdown))
    await asyncio.wait_for(started.wait(), 10)
    shutdown.set()
    await asyncio.wait_for(run, 10)  # returns; the handler lives on, abandoned
    assert worker.abandoned == 1
    assert await queue.job_journal(job_id) == []
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.CLAIMED  # until its lease ends
    give_up.set()

    async def handler_gone() -> bool:
        return worker.abandoned == 0

    await until(handler_gone)
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.CLAIMED  # its late result is not kept
    assert await queue.job_journal(job_id) == []


async def test_a_worker_whose_process_ends_with_it_releases_an_abandoned_handlers_job(
    queue: Queue,
) -> None:
    """`venturi worker` ends its process when `run()` returns, and the handler with it: the
    job is released at once, not left to its lease."""
    started, give_up = asyncio.Event(), asyncio.Event()

    async def swallow(task: Ping, ctx: Context[None], app: None) -> Outcome:
        started.set()
        while not give_up.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await give_up.wait()
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=0.2)
    worker._exits_with_run = True  # as `venturi worker` sets it
    worker.register(Ping, swallow)
    job_id = await queue.enqueue(Ping())
    shutdown = asyncio.Event()
    run = asyncio.create_task(worker.run(shutdown))
    try:
        await asyncio.wait_for(started.wait(), 10)
        shutdown.set()
        await asyncio.wait_for(run, 10)
    finally:
        give_up.set()
    (entry,) = await queue.job_journal(job_id)
    assert entry.outcome is JournalOutcome.RELEASED
    assert entry.note is not None and "ignored cancellation" in entry.note
    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.PENDING


async def test_a_pool_too_small_for_a_worker_is_refused(pg_dsn: str, prefix: str) -> None:
    store = await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=1)
    try:
        worker = Worker(None, store)
        worker.register(Ping, done)
        with pytest.raises(ValueError, match="max_size=1; a worker needs at least 2"):
            await worker.run(asyncio.Event())
    finally:
        await store.close()


async def test_handlers_fanning_out_enqueues_on_a_small_pool_do_not_deadlock(
    pg_dsn: str, prefix: str
) -> None:
    store = await PostgresStore.connect(pg_dsn, prefix=prefix, max_size=2)
    try:
        await store.migrate()
        queue = Queue(store)

        async def fan_out(task: Ping, ctx: Context[None], app: None) -> Outcome:
            await asyncio.gather(*(queue.enqueue(Pong(i)) for i in range(20)))
            return Outcome.completed()

        worker = Worker(None, store, concurrency=4)
        worker.register(Ping, fan_out)
        worker.register(Pong, done)
        ids = await queue.enqueue_many(Ping(i) for i in range(4))
        async with running(worker):
            for job_id in ids:
                await until_status(queue, job_id, JobStatus.COMPLETED)

            async def all_pongs_done() -> bool:
                stats = await queue.stats()
                return stats.pending == 0 and stats.claimed == 0

            await until(all_pongs_done)
        assert len(await queue.jobs(JobFilter(status=JobStatus.COMPLETED, limit=200))) == 84
    finally:
        await store.close()
