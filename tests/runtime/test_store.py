"""The store's construction paths: from an existing pool, and sharing a pool across prefixes."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from venturi import PostgresStore, Queue, Task


@dataclass
class Ping(Task):
    KIND = "ping"


async def test_from_pool_uses_and_leaves_the_callers_pool(pg_dsn: str, prefix: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=3)
    try:
        store = PostgresStore.from_pool(pool, prefix=prefix)
        assert await store.migrate() == [1, 2]
        await Queue(store).enqueue(Ping())
        await store.close()
        assert not pool.is_closing()  # the caller's pool is the caller's to close
        assert await pool.fetchval(f"SELECT count(*) FROM {prefix}_jobs") == 1
    finally:
        await pool.close()


async def test_with_prefix_shares_the_pool(store: PostgresStore, prefix: str) -> None:
    other = store.with_prefix(prefix + "_b")
    assert await other.migrate() == [1, 2]
    await Queue(other).enqueue(Ping())
    assert (await Queue(other).stats()).pending == 1
    assert (await Queue(store).stats()).pending == 0  # separate queues in one database
    await other.close()
    assert (await Queue(store).stats()).pending == 0  # the owner's pool is still open
