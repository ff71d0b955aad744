"""A role without the privileges a worker needs: refused at start, naming the tables; a
privilege revoked while the worker runs is an ERROR, not a database outage, and the worker
carries on once it is granted again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import Context, Outcome, PostgresStore, Queue, SchemaError, Task, Worker

from .helpers import WAIT_TIMEOUT, running


@dataclass
class Ping(Task):
    KIND = "ping"
    n: int


@asynccontextmanager
async def role(pg_dsn: str, store: PostgresStore, *grants: str) -> AsyncIterator[str]:
    """A login role granted `grants` (statements with {role} and {prefix}); yields its
    DSN, and drops it after."""
    name = f"{store.prefix}_app"
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute(f"CREATE ROLE {name} LOGIN")
        for grant in grants:
            await admin.execute(grant.format(role=name, prefix=store.prefix))
        yield pg_dsn.replace("postgres@", f"{name}@", 1)
    finally:
        await admin.execute(f"DROP OWNED BY {name}")
        await admin.execute(f"DROP ROLE {name}")
        await admin.close()


ALL_TABLES = "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
ALL_SEQUENCES = "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"


async def test_a_role_granted_before_a_table_existed_is_refused_at_start(
    store: PostgresStore, pg_dsn: str
) -> None:
    # As after an upgrade whose migration added a table the old GRANT did not cover.
    revoke = "REVOKE ALL ON {prefix}_fences FROM {role}"
    async with (
        role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, revoke) as dsn,
        await PostgresStore.connect(dsn, prefix=store.prefix) as app,
    ):
        worker: Worker[None] = Worker(None, app)
        worker.register(Ping, lambda t, c, a: Outcome.completed())  # type: ignore[arg-type,return-value]
        with pytest.raises(SchemaError) as raised:
            await asyncio.wait_for(worker.run(asyncio.Event()), WAIT_TIMEOUT)
    message = str(raised.value)
    assert f"{store.prefix}_fences (SELECT, INSERT, UPDATE, DELETE)" in message
    assert f"{store.prefix}_jobs" not in message
    assert "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public" in message


async def test_a_role_that_may_not_read_the_migrations_is_told_what_to_grant(
    store: PostgresStore, pg_dsn: str
) -> None:
    revoke = "REVOKE ALL ON {prefix}_migrations FROM {role}"
    async with (
        role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, revoke) as dsn,
        await PostgresStore.connect(dsn, prefix=store.prefix) as app,
    ):
        worker: Worker[None] = Worker(None, app)
        worker.register(Ping, lambda t, c, a: Outcome.completed())  # type: ignore[arg-type,return-value]
        with pytest.raises(SchemaError, match=rf"{store.prefix}_migrations \(SELECT\)"):
            await asyncio.wait_for(worker.run(asyncio.Event()), WAIT_TIMEOUT)


async def test_a_role_without_the_journal_sequence_is_refused_at_start(
    store: PostgresStore, pg_dsn: str
) -> None:
    async with (
        role(pg_dsn, store, ALL_TABLES) as dsn,
        await PostgresStore.connect(dsn, prefix=store.prefix) as app,
    ):
        with pytest.raises(SchemaError, match=rf"{store.prefix}_journal_id_seq \(USAGE\)"):
            await app.check_privileges()
    only_read = "REVOKE INSERT, UPDATE, DELETE ON {prefix}_migrations FROM {role}"
    async with (
        role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, only_read) as dsn,
        await PostgresStore.connect(dsn, prefix=store.prefix) as app,
    ):
        await app.check_privileges()  # all a worker needs: nothing to say


class Told(logging.Handler):
    """Sets `refused` at the first ERROR that a claim was refused."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.refused = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.levelno == logging.ERROR and "claiming was refused" in record.getMessage():
            self.refused.set()


async def test_a_privilege_revoked_while_a_worker_runs_is_an_error_not_an_outage(
    store: PostgresStore, pg_dsn: str
) -> None:
    done: list[int] = []
    all_done = asyncio.Event()

    async def ping(task: Ping, ctx: Context[None], app: None) -> Outcome:
        done.append(task.n)
        if len(done) == 3:
            all_done.set()
        return Outcome.completed()

    told = Told()
    log = logging.getLogger("venturi.worker")
    log.addHandler(told)
    try:
        async with (
            role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES) as dsn,
            await PostgresStore.connect(dsn, prefix=store.prefix) as app,
        ):
            worker: Worker[None] = Worker(None, app)
            worker.register(Ping, ping)
            async with running(worker):
                await store._pool.execute(
                    f"REVOKE UPDATE ON {store.prefix}_jobs FROM {store.prefix}_app"
                )
                await Queue(store).enqueue_many(Ping(i) for i in range(3))
                await asyncio.wait_for(told.refused.wait(), WAIT_TIMEOUT)
                await store._pool.execute(
                    f"GRANT UPDATE ON {store.prefix}_jobs TO {store.prefix}_app"
                )
                await asyncio.wait_for(all_done.wait(), WAIT_TIMEOUT)
    finally:
        log.removeHandler(told)
    assert sorted(done) == [0, 1, 2]
    said = [r.getMessage() for r in told.records if r.levelno >= logging.WARNING]
    assert not [m for m in said if "unavailable" in m or "is back" in m], said
    refused = [m for m in said if "claiming was refused" in m]
    assert len(refused) == 1, said  # once, however often the claim was retried meanwhile
    assert "permission denied" in refused[0] and "README: Migrations, privileges" in refused[0]


async def test_a_statement_timeout_too_short_is_an_error_not_an_outage(
    store: PostgresStore, pg_dsn: str
) -> None:
    """A role's statement_timeout cuts the claim short (here: while it waits for a lock):
    the worker says so, once, instead of "the database is unavailable" and "is back" in
    turn, and claims once the statements have time."""
    done = asyncio.Event()

    async def ping(task: Ping, ctx: Context[None], app: None) -> Outcome:
        done.set()
        return Outcome.completed()

    told = Told()
    log = logging.getLogger("venturi.worker")
    log.addHandler(told)
    timeout = "ALTER ROLE {role} SET statement_timeout = '200ms'"
    locker = await asyncpg.connect(pg_dsn)
    try:
        async with (
            role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, timeout) as dsn,
            await PostgresStore.connect(dsn, prefix=store.prefix) as app,
        ):
            worker: Worker[None] = Worker(None, app)
            worker.register(Ping, ping)
            async with running(worker):
                async with locker.transaction():
                    await locker.execute(f"LOCK TABLE {store.prefix}_jobs IN ACCESS EXCLUSIVE MODE")
                    await store._pool.execute(f"NOTIFY {store.channel}, 'ping'")  # a claim
                    await asyncio.wait_for(told.refused.wait(), WAIT_TIMEOUT)
                await Queue(store).enqueue(Ping(1))
                await asyncio.wait_for(done.wait(), WAIT_TIMEOUT)
    finally:
        log.removeHandler(told)
        await locker.close()
    said = [r.getMessage() for r in told.records if r.levelno >= logging.WARNING]
    assert not [m for m in said if "unavailable" in m or "is back" in m], said
    refused = [m for m in said if "claiming was refused" in m]
    assert len(refused) == 1 and "statement_timeout" in refused[0], said


async def test_a_read_only_database_is_named_and_not_called_an_outage(
    store: PostgresStore, pg_dsn: str
) -> None:
    """default_transaction_read_only (a managed service's full disk) or a hot standby: reads
    succeed and writes are refused, so "unavailable" and "the database is back" alternated
    (each read ended the "outage"). The worker names it once, retries quietly, and works as
    soon as writes are taken."""
    done = asyncio.Event()

    async def ping(task: Ping, ctx: Context[None], app: None) -> Outcome:
        done.set()
        return Outcome.completed()

    records: list[logging.LogRecord] = []
    retried = asyncio.Event()

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            if sum("refused again" in r.getMessage() for r in records) >= 3:
                retried.set()

    handler = Retries(logging.DEBUG)
    log = logging.getLogger("venturi.worker")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.DEBUG)
    read_only = "ALTER ROLE {role} SET default_transaction_read_only = on"
    await Queue(store).enqueue(Ping(1))
    try:
        async with (
            role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, read_only) as dsn,
            await PostgresStore.connect(dsn, prefix=store.prefix) as app,
        ):
            worker: Worker[None] = Worker(None, app)
            worker.register(Ping, ping)
            shutdown = asyncio.Event()
            run = asyncio.create_task(worker.run(shutdown))
            await asyncio.wait_for(retried.wait(), WAIT_TIMEOUT)  # three retries refused
            said = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
            assert not [m for m in said if "unavailable" in m or "is back" in m], said
            refused = [m for m in said if "was refused" in m]
            assert refused, said
            assert all("the database is read-only: a hot standby" in m for m in refused), said
            # Writes are taken again (the role's new sessions): the worker gets to work.
            admin = await asyncpg.connect(pg_dsn)
            try:
                name = f"{store.prefix}_app"
                await admin.execute(f"ALTER ROLE {name} RESET default_transaction_read_only")
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                    name,
                )
            finally:
                await admin.close()
            await asyncio.wait_for(done.wait(), WAIT_TIMEOUT)
            shutdown.set()
            await asyncio.wait_for(run, WAIT_TIMEOUT)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


async def test_the_listen_connection_outlives_an_idle_session_timeout(
    store: PostgresStore, pg_dsn: str
) -> None:
    """A role's idle_session_timeout (PostgreSQL 14+; some managed services set one) ended
    the LISTEN connection each time it was idle that long, probed every 5 s: a reconnect and
    two WARNINGs every few seconds. It is probed within half the timeout now."""
    done = asyncio.Event()

    async def ping(task: Ping, ctx: Context[None], app: None) -> Outcome:
        done.set()
        return Outcome.completed()

    timeout = "ALTER ROLE {role} SET idle_session_timeout = '1s'"
    async with (
        role(pg_dsn, store, ALL_TABLES, ALL_SEQUENCES, timeout) as dsn,
        await PostgresStore.connect(dsn, prefix=store.prefix) as app,
    ):
        worker: Worker[None] = Worker(None, app)
        worker.register(Ping, ping)
        async with running(worker):
            await asyncio.sleep(3.0)  # the scenario: a quiet queue, three timeouts long
            assert worker.notifier is not None and worker.notifier.reconnects == 0
            await Queue(store).enqueue(Ping(1))
            await asyncio.wait_for(done.wait(), WAIT_TIMEOUT)
