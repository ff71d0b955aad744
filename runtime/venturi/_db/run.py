"""Where a statement runs: on a pooled connection taken for it, or on a connection the caller
holds, inside the caller's transaction. The store runs every statement through one of these
runners, so the same statements serve both, with keyword arguments (see `sql.Statement`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import asyncpg

from venturi._db.failures import breaks_connection
from venturi._db.sql import Statement

if TYPE_CHECKING:
    Connection: TypeAlias = asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]
    """A connection of the caller's: asyncpg's own, or one acquired from a pool."""
else:  # asyncpg's classes are generic in its stubs only
    Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy


Pooler = Literal["none", "transaction"]
"""What sits between venturi and PostgreSQL: "none" (a direct connection, or a pooler in
session mode) or "transaction" (PgBouncer, or another pooler, in transaction mode: a server
connection is venturi's only for the length of one transaction)."""


class Runner(Protocol):
    """Runs named statements with keyword arguments."""

    async def fetch(self, stmt: Statement, /, **values: Any) -> list[asyncpg.Record]: ...

    async def fetchrow(self, stmt: Statement, /, **values: Any) -> asyncpg.Record | None: ...

    async def fetchval(self, stmt: Statement, /, **values: Any) -> Any: ...

    async def execute(self, stmt: Statement, /, **values: Any) -> None: ...

    async def script(self, text: str) -> None:
        """Run SQL text without parameters, possibly several statements (a migration)."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Runner]:
        """Statements on one connection that commit, or roll back, together."""
        ...


class OnConnection:
    """Statements on one connection, as they come (no checks): what a transaction yields."""

    def __init__(self, conn: Connection, queries: Mapping[str, Statement]) -> None:
        self.conn = conn
        self._q = queries

    async def fetch(self, stmt: Statement, /, **values: Any) -> list[asyncpg.Record]:
        return await self.conn.fetch(stmt.text, *stmt.args(values))

    async def fetchrow(self, stmt: Statement, /, **values: Any) -> asyncpg.Record | None:
        return await self.conn.fetchrow(stmt.text, *stmt.args(values))

    async def fetchval(self, stmt: Statement, /, **values: Any) -> Any:
        return await self.conn.fetchval(stmt.text, *stmt.args(values))

    async def execute(self, stmt: Statement, /, **values: Any) -> None:
        await self.conn.execute(stmt.text, *stmt.args(values))

    async def script(self, text: str) -> None:
        await self.conn.execute(text)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Runner]:
        """A transaction of its own, or, inside one already open (the caller's), a savepoint:
        a failure then rolls back what the block did and leaves the caller's transaction
        usable. A plain SAVEPOINT rather than asyncpg's nested `transaction()`, which refuses
        a transaction the caller began with a BEGIN statement of its own."""
        conn = self.conn
        if not conn.is_in_transaction():
            async with conn.transaction():
                yield self
            return
        await conn.execute(self._q["savepoint"].text)
        try:
            yield self
        except BaseException:
            # If even this fails, the connection is broken and the caller's commit fails
            # with it: its error surfaces, chained to the first.
            await conn.execute(self._q["savepoint_rollback"].text)
            await conn.execute(self._q["savepoint_release"].text)
            raise
        await conn.execute(self._q["savepoint_release"].text)


class CallersConnection(OnConnection):
    """The caller's connection: each call first checks that it is inside a transaction, so a
    job exists only if the caller commits, unless the caller said autocommit is meant (then
    each statement commits on its own)."""

    def __init__(
        self, conn: Connection, queries: Mapping[str, Statement], *, autocommit: bool
    ) -> None:
        if not isinstance(conn, asyncpg.Connection):  # a pool's proxy passes this check too
            raise TypeError(
                f"expected an asyncpg connection (asyncpg.connect(), or `async with "
                f"pool.acquire() as conn`), got {type(conn).__name__}"
            )
        super().__init__(conn, queries)
        self.autocommit = autocommit

    def _check(self) -> None:
        if not self.autocommit and not self.conn.is_in_transaction():
            raise ValueError(
                "the connection is not in a transaction, so what venturi writes (the job) "
                "would be committed at once, whatever the caller does next: open one first "
                "(`async with conn.transaction():`); if committing at once is meant, pass "
                "autocommit=True to the enqueue call (`enqueue(..., conn=conn, "
                "autocommit=True)`) or to `store.using(conn, autocommit=True)` (a chain or a "
                "batch always needs a transaction)"
            )

    async def fetch(self, stmt: Statement, /, **values: Any) -> list[asyncpg.Record]:
        self._check()
        return await super().fetch(stmt, **values)

    async def fetchrow(self, stmt: Statement, /, **values: Any) -> asyncpg.Record | None:
        self._check()
        return await super().fetchrow(stmt, **values)

    async def fetchval(self, stmt: Statement, /, **values: Any) -> Any:
        self._check()
        return await super().fetchval(stmt, **values)

    async def execute(self, stmt: Statement, /, **values: Any) -> None:
        self._check()
        await super().execute(stmt, **values)

    async def script(self, text: str) -> None:
        self._check()
        await super().script(text)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Runner]:
        self._check()
        async with super().transaction() as tx:
            yield tx


class Pooled:
    """Each statement on a connection acquired from the pool for it.

    Statements run through here rather than the pool's own shortcuts: a connection that
    failed mid-statement (the server went away, a reply was half read, a timeout or
    cancellation struck) is terminated instead of going back to the pool, where the next
    caller would trip over its leftover state ("cannot switch to state 12; another operation
    is in progress"). The pool has no reset query to catch that (the store releases without
    one), so this is where it is caught.

    With `begin` (settings that must not outlive a transaction: through a transaction
    pooler), each statement and each transaction opens with it instead.
    """

    def __init__(
        self,
        pool: Callable[[], asyncpg.Pool],
        queries: Mapping[str, Statement],
        *,
        begin: str | None = None,
    ) -> None:
        self._pool = pool
        """The pool, or an error when the store is closed."""
        self._q = queries
        self._begin = begin
        """SQL that opens a transaction with its settings (`begin_with_timeout`), or None."""

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy[Any]]:
        pool = self._pool()
        conn = await pool.acquire()
        reaped = False
        try:
            if self._begin is None:
                yield conn
            else:
                async with self._opened(conn):
                    yield conn
        except BaseException as exc:
            reaped = discard_if_broken(pool, conn, exc)
            raise
        finally:
            if not reaped:
                await release(pool, conn)

    @asynccontextmanager
    async def _opened(self, conn: asyncpg.pool.PoolConnectionProxy[Any]) -> AsyncIterator[None]:
        """A transaction opened by `begin` (else a plain BEGIN), committed, or rolled back on
        an error that left the connection usable; a broken one (a statement cancelled, timed
        out, or cut off) is discarded by the caller, which ends the transaction on the server.
        Not asyncpg's `transaction()`: its rollback would first wait, in the caller's task and
        without a bound, for the cancel request of a statement given up on."""
        await conn.execute(self._begin or self._q["begin"].text)
        try:
            yield
        except BaseException as exc:
            if not breaks_connection(exc):
                await conn.execute(self._q["rollback"].text)
            raise
        await conn.execute(self._q["commit"].text)

    async def fetch(self, stmt: Statement, /, **values: Any) -> list[asyncpg.Record]:
        args = stmt.args(values)
        async with self._connection() as conn:
            return await conn.fetch(stmt.text, *args)

    async def fetchrow(self, stmt: Statement, /, **values: Any) -> asyncpg.Record | None:
        args = stmt.args(values)
        async with self._connection() as conn:
            return await conn.fetchrow(stmt.text, *args)

    async def fetchval(self, stmt: Statement, /, **values: Any) -> Any:
        args = stmt.args(values)
        async with self._connection() as conn:
            return await conn.fetchval(stmt.text, *args)

    async def execute(self, stmt: Statement, /, **values: Any) -> None:
        args = stmt.args(values)
        async with self._connection() as conn:
            await conn.execute(stmt.text, *args)

    async def script(self, text: str) -> None:
        async with self._connection() as conn:
            await conn.execute(text)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Runner]:
        """A pooled connection inside a transaction, discarded if it breaks."""
        pool = self._pool()
        conn = await pool.acquire()
        reaped = False
        try:
            async with self._opened(conn):
                yield OnConnection(conn, self._q)
        except BaseException as exc:
            reaped = discard_if_broken(pool, conn, exc)
            raise
        finally:
            if not reaped:
                await release(pool, conn)


CANCEL_WAIT = 2.0
"""Seconds a connection whose statement was abandoned mid-way (its task cancelled, or timed
out) is kept out of the pool for the server to confirm the statement is cancelled."""

_reaping: set[asyncio.Task[None]] = set()
"""Connections being cancelled on the server, then terminated (strong references)."""


def discard_if_broken(
    pool: asyncpg.Pool, conn: asyncpg.pool.PoolConnectionProxy[Any], exc: BaseException
) -> bool:
    """Terminate a pooled connection that failed mid-statement (see `Pooled`); True when a
    background task took it over (then it releases the connection, not the caller).

    A statement abandoned by its caller (cancelled, timed out) is cancelled on the server
    first, as asyncpg does on its own: terminated at once, the connection would take
    asyncpg's cancel request with it, and a statement waiting for a lock would run once the
    lock is released, long after its caller gave up (a claim would commit, its jobs claimed by
    a worker gone until their leases end). The caller does not wait for that: a timeout
    bounds its own wait, and some callers act on it (a lease about to end)."""
    if not breaks_connection(exc) or detached(conn):
        return False
    if isinstance(exc, (asyncio.CancelledError, TimeoutError)):
        task = asyncio.get_running_loop().create_task(_reap(pool, conn))
        _reaping.add(task)
        task.add_done_callback(_reaping.discard)
        return True
    conn.terminate()
    return False


async def _reap(pool: asyncpg.Pool, conn: asyncpg.pool.PoolConnectionProxy[Any]) -> None:
    """Wait (at most `CANCEL_WAIT`) for the server to answer asyncpg's cancel request of the
    connection's statement, then terminate the connection and give it back."""
    try:
        await asyncio.sleep(0)  # asyncpg sends its cancel request from a callback of its own
        pending = getattr(getattr(conn, "_con", None), "_cancellations", None) or ()
        if pending:
            await asyncio.wait(set(pending), timeout=CANCEL_WAIT)
    finally:
        if not detached(conn):
            conn.terminate()
        await release(pool, conn)


async def reaped() -> None:
    """Until the statements this event loop gave up on so far are cancelled on the server
    (or their connections closed): at most `CANCEL_WAIT`, and a little for the closing."""
    loop = asyncio.get_running_loop()
    mine = {task for task in _reaping if task.get_loop() is loop}
    if mine:
        await asyncio.wait(mine, timeout=CANCEL_WAIT + 1.0)


def detached(conn: Any) -> bool:
    """True once the pool took the connection back (it died, or was released)."""
    return getattr(conn, "_con", None) is None


async def release(pool: asyncpg.Pool, conn: asyncpg.pool.PoolConnectionProxy[Any]) -> None:
    """Give a connection back to its pool; a dead or detached one is simply dropped (the pool
    opens another when needed), and the release never masks the caller's own error."""
    # When the release's rollback or reset fails, asyncpg has terminated the connection.
    with contextlib.suppress(asyncpg.InterfaceError, asyncpg.PostgresError, OSError, TimeoutError):
        await pool.release(conn)
