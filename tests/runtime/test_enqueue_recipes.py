"""The README's transactional-enqueue examples, run as written against the real database: plain
asyncpg, and SQLAlchemy's async session (its asyncpg connection). A duplicate or unique
collision inside the caller's transaction never aborts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from ulid import ULID

from venturi import DedupKey, Merge, Pending, PostgresStore, Queue, Task


@dataclass
class SendWelcome(Task):
    KIND = "send_welcome"
    user_id: int

    def unique_for(self) -> float:
        return 3600

    def unique_id(self) -> str:
        return str(self.user_id)


@dataclass
class Digest(Task):
    KIND = "digest"
    user_id: int

    def dedup_key(self) -> DedupKey:
        return DedupKey(self.user_id)

    def merge(self, existing: Pending[Any]) -> Merge:
        return Merge.keep()


# The README's recipe (Transactional enqueue, SQLAlchemy), verbatim.
async def asyncpg_connection(session: AsyncSession) -> asyncpg.Connection:
    """The asyncpg connection under the session's transaction, begun (SQLAlchemy begins it at
    the session's first statement; venturi refuses a connection outside a transaction)."""
    connection = await session.connection()
    raw = (await connection.get_raw_connection()).driver_connection
    assert isinstance(raw, asyncpg.Connection)
    if not raw.is_in_transaction():
        await connection.exec_driver_sql("SELECT 1")
    return raw


@pytest.fixture
async def users(store: PostgresStore) -> str:
    """An application table of the test's own, next to the queue's."""
    table = f"{store.prefix}_users"
    await store._pool.execute(
        f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text)"
    )
    return table


@pytest.fixture
async def engine(pg_dsn: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(pg_dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        yield engine
    finally:
        await engine.dispose()


async def jobs_of(store: PostgresStore, kind: str) -> list[ULID]:
    rows = await store._pool.fetch(
        f"SELECT id FROM {store.prefix}_jobs WHERE kind = $1 ORDER BY id", kind
    )
    return [ULID.from_bytes(r["id"].bytes) for r in rows]


async def test_plain_asyncpg(store: PostgresStore, pg_dsn: str, users: str) -> None:
    queue = Queue(store)
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)  # the application's pool
    try:
        async with pool.acquire() as conn, conn.transaction():
            user_id = await conn.fetchval(
                f"INSERT INTO {users} (email) VALUES ($1) RETURNING id", "a@example.com"
            )
            job_id = await queue.enqueue(SendWelcome(user_id=user_id), conn=conn)
            # A duplicate in the same transaction: the same job, and the transaction goes on.
            assert await queue.enqueue(SendWelcome(user_id=user_id), conn=conn) == job_id
            digest = await queue.enqueue(Digest(user_id), conn=conn)
            assert await queue.enqueue(Digest(user_id), conn=conn) == digest
            await conn.execute(f"UPDATE {users} SET email = 'b@example.com'")
        assert await jobs_of(store, "send_welcome") == [job_id]
        assert await jobs_of(store, "digest") == [digest]
        assert await pool.fetchval(f"SELECT email FROM {users}") == "b@example.com"

        class Abandon(Exception):
            pass

        async def sign_up_then_fail() -> None:
            async with pool.acquire() as conn, conn.transaction():
                other = await conn.fetchval(
                    f"INSERT INTO {users} (email) VALUES ('c@example.com') RETURNING id"
                )
                await queue.enqueue(SendWelcome(user_id=other), conn=conn)
                raise Abandon

        with pytest.raises(Abandon):
            await sign_up_then_fail()
        assert await jobs_of(store, "send_welcome") == [job_id]  # rolled back with the user
        assert await pool.fetchval(f"SELECT count(*) FROM {users}") == 1
    finally:
        await pool.close()


async def test_sqlalchemy_async_session(
    store: PostgresStore, engine: AsyncEngine, users: str
) -> None:
    queue = Queue(store)
    async with AsyncSession(engine) as session, session.begin():
        user_id = (
            await session.execute(
                text(f"INSERT INTO {users} (email) VALUES (:email) RETURNING id"),
                {"email": "a@example.com"},
            )
        ).scalar_one()
        conn = await asyncpg_connection(session)
        job_id = await queue.enqueue(SendWelcome(user_id=user_id), conn=conn)
        assert await queue.enqueue(SendWelcome(user_id=user_id), conn=conn) == job_id
        assert await queue.job(job_id) is None  # not committed yet
        await session.execute(text(f"UPDATE {users} SET email = 'b@example.com'"))
    assert await jobs_of(store, "send_welcome") == [job_id]
    async with AsyncSession(engine) as session:
        email = (await session.execute(text(f"SELECT email FROM {users}"))).scalar_one()
        assert email == "b@example.com"

    # The recipe on a session that has run nothing yet, then rolled back: no job.
    async with AsyncSession(engine) as session:
        await session.begin()
        conn = await asyncpg_connection(session)
        await queue.enqueue(SendWelcome(user_id=99), conn=conn)
        await session.rollback()
    assert await jobs_of(store, "send_welcome") == [job_id]
