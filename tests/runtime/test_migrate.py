"""`migrate()` on a live database: it gives way to the application's open transactions
instead of holding up the queue behind its lock; up to date, it only reads; a name taken by
another prefix is said plainly."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg
import pytest

from venturi import PostgresStore, Queue, SchemaError, Task
from venturi._db import sql

from .helpers import WAIT_TIMEOUT


@dataclass
class Ping(Task):
    KIND = "ping"
    n: int


@pytest.fixture
def one_more_migration(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release with one more migration than `store` was migrated with, which needs a lock
    on the jobs table that an open transaction of the application conflicts with (as
    migrations 20 and 21 did)."""
    real = sql.migrations

    def with_next(prefix: str) -> tuple[sql.Migration, ...]:
        known = real(prefix)
        extra = sql.Migration(
            len(known) + 1, "test_index", f"CREATE INDEX {prefix}_test_idx ON {prefix}_jobs (id)"
        )
        return (*known, extra)

    monkeypatch.setattr(sql, "migrations", with_next)


class Said(logging.Handler):
    """Sets `gave_way` at migrate's first "gave way" warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.gave_way = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if "gave way" in record.getMessage():
            self.gave_way.set()


@pytest.mark.usefixtures("one_more_migration")
async def test_a_migration_gives_way_to_an_open_transaction_and_applies_after_it(
    store: PostgresStore, pg_dsn: str
) -> None:
    said = Said()
    log = logging.getLogger("venturi.postgres")
    log.addHandler(said)
    app = await asyncpg.connect(pg_dsn, server_settings={"application_name": "the-app"})
    try:
        tx = app.transaction()
        await tx.start()
        await Queue(store).enqueue(Ping(1), conn=app)  # holds a lock on the jobs table
        migrating = asyncio.create_task(store.migrate(lock_timeout=0.1, patience=WAIT_TIMEOUT))
        await asyncio.wait_for(said.gave_way.wait(), WAIT_TIMEOUT)
        # The queue runs while the migration waits for its turn (a DDL statement waiting for
        # its lock would hold this enqueue up behind it, until the transaction ended).
        await asyncio.wait_for(Queue(store).enqueue(Ping(2)), WAIT_TIMEOUT)
        assert not migrating.done()
        await tx.commit()
        applied = await asyncio.wait_for(migrating, WAIT_TIMEOUT)
    finally:
        log.removeHandler(said)
        await app.close()
    assert applied == [len(sql.migrations(store.prefix))]
    assert f"pid {app.get_server_pid()} (the-app, idle in transaction" in said.messages[0]
    assert await store.migrate() == []


@pytest.mark.usefixtures("one_more_migration")
async def test_a_migration_that_never_gets_its_lock_gives_up_naming_the_holder(
    store: PostgresStore, pg_dsn: str
) -> None:
    app = await asyncpg.connect(pg_dsn, server_settings={"application_name": "the-app"})
    try:
        async with app.transaction():
            await Queue(store).enqueue(Ping(1), conn=app)
            with pytest.raises(SchemaError, match="gave up") as raised:
                await store.migrate(lock_timeout=0.1, patience=0.5)
            holder = app.get_server_pid()
    finally:
        await app.close()
    assert f"pid {holder} (the-app, idle in transaction" in str(raised.value)
    assert "nothing was applied" in str(raised.value)
    with pytest.raises(SchemaError, match="lacks migrations"):
        await store.check_schema()  # not applied; the next migrate will
    assert await store.migrate() == [len(sql.migrations(store.prefix))]


async def test_an_up_to_date_schema_is_not_written_to(store: PostgresStore, pg_dsn: str) -> None:
    # A role that may not create anything in the schema (as a deploy's app role may not).
    name = f"{store.prefix}_app"
    admin = await asyncpg.connect(pg_dsn)
    public_may_create = await admin.fetchval(
        "SELECT has_schema_privilege('public', 'public', 'CREATE')"
    )
    try:
        await admin.execute(f"CREATE ROLE {name} LOGIN")
        if public_may_create:  # before PostgreSQL 15, everyone may
            await admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        assert not await admin.fetchval("SELECT has_schema_privilege($1, 'public', 'CREATE')", name)
        await admin.execute(f"GRANT SELECT ON {store.prefix}_migrations TO {name}")
        dsn = pg_dsn.replace("postgres@", f"{name}@", 1)
        async with await PostgresStore.connect(dsn, prefix=store.prefix) as app:
            assert await app.migrate() == []
    finally:
        await admin.execute(f"DROP OWNED BY {name}")
        await admin.execute(f"DROP ROLE {name}")
        if public_may_create:
            await admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        await admin.close()


async def test_a_prefix_whose_table_names_another_prefix_uses_is_refused_plainly(
    store: PostgresStore, pg_dsn: str
) -> None:
    # store.prefix has the table <prefix>_hour_counts: the counts table of <prefix>_hour.
    other = f"{store.prefix}_hour"
    async with await PostgresStore.connect(pg_dsn, prefix=other) as clash:
        with pytest.raises(SchemaError) as raised:
            await clash.migrate()
        message = str(raised.value)
        assert f"{store.prefix}_hour_counts" in message
        assert f"table 'hour_counts' of prefix {store.prefix!r}" in message
        assert f"table 'counts' of prefix {other!r}" in message
        assert "nothing was applied" in message
        assert await clash._pool.fetchval("SELECT to_regclass($1)", f"{other}_migrations") is None
