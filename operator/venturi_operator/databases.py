"""Queue databases as the operator sees them: one small pool per distinct DSN, shared by every
JobQueue that uses it, stats with hard timeouts, and LISTEN wake-ups for scale-from-zero.

A slow or dead database only ever costs its own JobQueues their tick: connecting and querying
are bounded by timeouts, and nothing here is awaited while another JobQueue reconciles. A pool
lives as long as some JobQueue uses its DSN: when a JobQueue's DSN changes or the JobQueue goes,
a pool (and LISTEN connection) no other JobQueue uses is closed.

Nothing here ever repeats a DSN or a driver's error text (both may hold the password, see
:mod:`venturi_operator.dsn`): messages name the database by `the_database(dsn)`, a failure by
its exception class. Every connection failure is one generic `ConnectionFailed`, so a JobQueue's
author cannot use the status to probe what answers at some host and port.
Uses the runtime's public API only (`venturi.PostgresStore`, `venturi.Queue`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from venturi import PostgresStore, Queue, Stats, WorkerInfo, logs
from venturi_operator.config import OperatorConfig
from venturi_operator.dsn import ENCODING_HINT, the_database

logger = logging.getLogger(__name__)

QUEUE_NOTICE = "!queue "
"""How a pause or resume of a queue is announced on its jobs channel (by `Queue.pause`)."""

RELISTEN_DELAY_MAX = 30.0
"""Seconds; cap on the wait before re-establishing a lost LISTEN connection."""


class DatabaseError(Exception):
    """Stats could not be read; `reason` is a CamelCase word for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


_T = TypeVar("_T")

WakeCallback = Callable[[str], None]
"""Called with the job kind of every notification on a watched queue."""


class Databases:
    def __init__(self, config: OperatorConfig) -> None:
        self._config = config
        self._stores: dict[str, PostgresStore] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._users: dict[object, str] = {}
        """owner (a JobQueue) -> the DSN it uses: what keeps a pool open."""
        self._watchers: dict[tuple[str, str], dict[object, WakeCallback]] = {}
        """(dsn, prefix) -> owner -> callback."""
        self._listeners: dict[str, asyncio.Task[None]] = {}
        """One LISTEN task per database."""
        self._changed: dict[str, asyncio.Event] = {}
        self._stopping: list[asyncio.Task[None]] = []
        """LISTEN tasks cancelled by `watch` (which cannot await), awaited by the next cleanup."""
        self._failing: dict[str, str] = {}
        """dsn -> the last failure logged, so that a dead database is logged once, not per tick."""

    async def stats(self, dsn: str, prefix: str, owner: object) -> Stats:
        """One grouped stats query, bounded by the statement timeout. `owner` (the JobQueue)
        now uses `dsn`: the pool of a DSN it used before is closed if no one else uses it."""
        self._users[owner] = dsn
        await self._close_unused()
        store = await self._store(dsn)
        where = the_database(dsn)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation (CPython gh-86296), and the handler would never stop.
            async with asyncio.timeout(self._config.statement_timeout + 1):
                stats = await Queue(store.with_prefix(prefix)).stats()
        except TimeoutError:
            raise DatabaseError(
                "QueryTimeout",
                f"reading the queue's stats from {where} took longer than "
                f"{self._config.statement_timeout}s",
            ) from None
        except Exception as exc:  # asyncpg raises many types; each means "no stats this tick"
            self._log_failure(dsn, "reading stats from", exc)
            if _connection_lost(exc):  # as when connecting: one generic failure
                raise _connect_error(dsn, exc) from None
            if _schema_missing(exc):
                raise DatabaseError(
                    "SchemaMissing",
                    f"the queue's tables ({prefix}_jobs ...) are not in {where}: run "
                    f"`venturi migrate` with VENTURI_PREFIX={prefix}",
                ) from None
            raise DatabaseError(
                "QueryFailed", f"reading the queue's stats from {where} failed ({_cause(exc)})"
            ) from None
        self._failing.pop(dsn, None)
        return stats

    async def claimed_by_pod(self, dsn: str, prefix: str) -> dict[str, int]:
        """Claimed jobs per pod name (one grouped query), bounded like `stats`."""
        return await self._bounded(
            dsn, lambda queue: queue.claimed_by_pod(), "reading claims per pod", prefix=prefix
        )

    async def fence_pods(self, dsn: str, prefix: str, pods: list[str], ttl: float) -> None:
        """Stop `pods` claiming for `ttl` seconds (`Queue.fence_pods`), bounded like `stats`:
        when this returns, their claims in flight have committed."""
        await self._bounded(
            dsn,
            lambda queue: queue.fence_pods(pods, ttl=ttl),
            f"fencing pods {', '.join(pods)}",
            prefix=prefix,
        )

    async def unfence_pods(self, dsn: str, prefix: str, pods: list[str]) -> None:
        """Let `pods` claim again (`Queue.unfence_pods`), bounded like `stats`."""
        await self._bounded(
            dsn,
            lambda queue: queue.unfence_pods(pods),
            f"unfencing pods {', '.join(pods)}",
            prefix=prefix,
        )

    async def fenced_pods(self, dsn: str, prefix: str) -> list[str]:
        """The pods fenced now (`Queue.fenced_pods`), bounded like `stats`."""
        return await self._bounded(
            dsn, lambda queue: queue.fenced_pods(), "reading fenced pods", prefix=prefix
        )

    async def _bounded(
        self, dsn: str, call: Callable[[Queue], Awaitable[_T]], what: str, *, prefix: str
    ) -> _T:
        """One call on the prefix's queue, bounded like `stats`; its failure a DatabaseError
        (asyncpg raises many types: each means "not done this tick")."""
        store = await self._store(dsn)
        try:
            async with asyncio.timeout(self._config.statement_timeout + 1):
                return await call(Queue(store.with_prefix(prefix)))
        except TimeoutError:
            raise DatabaseError(
                "QueryTimeout", f"{what} took longer than {self._config.statement_timeout}s"
            ) from None
        except Exception as exc:
            if _connection_lost(exc):
                raise _connect_error(dsn, exc) from None
            if _schema_missing(exc):
                raise DatabaseError(
                    "SchemaMissing", f"{what}: a table is missing: run `venturi migrate`"
                ) from None
            raise DatabaseError("QueryFailed", f"{what} failed ({_cause(exc)})") from None

    async def workers(self, dsn: str, prefix: str) -> list[WorkerInfo]:
        """The worker registry's rows (live or not), bounded like `stats`."""
        store = await self._store(dsn)
        try:
            async with asyncio.timeout(self._config.statement_timeout + 1):
                return await Queue(store.with_prefix(prefix)).workers()
        except TimeoutError:
            raise DatabaseError(
                "QueryTimeout",
                f"the worker registry took longer than {self._config.statement_timeout}s",
            ) from None
        except Exception as exc:  # asyncpg raises many types; each means "no registry this tick"
            if _connection_lost(exc):
                raise _connect_error(dsn, exc) from None
            raise DatabaseError(
                "QueryFailed", f"reading the worker registry failed ({_cause(exc)})"
            ) from None

    async def _store(self, dsn: str) -> PostgresStore:
        store = self._stores.get(dsn)
        if store is not None:
            return store
        lock = self._connecting.setdefault(dsn, asyncio.Lock())
        async with lock:
            store = self._stores.get(dsn)
            if store is None:
                try:
                    async with asyncio.timeout(self._config.connect_timeout + 1):
                        store = await PostgresStore.connect(
                            dsn,
                            min_size=1,
                            max_size=self._config.pool_size,
                            connect_timeout=self._config.connect_timeout,
                            statement_timeout=self._config.statement_timeout,
                            application_name=self._config.application_name,
                            pooler=self._config.pooler,
                        )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # bad DSN, refused, timeout, auth: see _connect_error
                    self._log_failure(dsn, "connecting to", exc)
                    raise _connect_error(dsn, exc) from None
                if dsn not in self._users.values():  # its last user went while connecting
                    await store.close()
                    raise DatabaseError("ConnectionFailed", "no JobQueue uses this database")
                self._failing.pop(dsn, None)
                self._stores[dsn] = store
        return store

    def _log_failure(self, dsn: str, doing: str, exc: BaseException) -> None:
        """For the operator's log: the database and the exception's class (never its text)."""
        what = f"{doing} {the_database(dsn)} failed: {_cause(exc)}"
        if self._failing.get(dsn) != what:
            self._failing[dsn] = what
            logger.warning("%s", what)

    def watch(self, dsn: str, prefix: str, owner: object, callback: WakeCallback) -> None:
        """Call `callback(kind)` for every job notification on this queue (until `release`),
        and on no other queue: a queue the owner watched before stops calling it.

        One LISTEN connection per database serves every watched queue in it; it is
        re-established (with the new set of queues) whenever that set changes.
        """
        self._users[owner] = dsn
        for key in [k for k, owners in self._watchers.items() if owner in owners]:
            if key != (dsn, prefix):
                self._unwatch(key, owner)
        watchers = self._watchers.setdefault((dsn, prefix), {})
        new_queue = not watchers
        watchers[owner] = callback
        if dsn not in self._listeners:
            self._changed[dsn] = asyncio.Event()
            self._listeners[dsn] = asyncio.create_task(
                self._listen(dsn), name="venturi-operator-listen"
            )
        elif new_queue:
            self._changed[dsn].set()

    async def release(self, owner: object) -> None:
        """`owner` (a deleted JobQueue) uses no database any more: stop its wake-ups, and
        close the pools and LISTEN connections that no one else uses."""
        self._users.pop(owner, None)
        for key in [k for k, owners in self._watchers.items() if owner in owners]:
            self._unwatch(key, owner)
        await self._close_unused()

    def _unwatch(self, key: tuple[str, str], owner: object) -> None:
        owners = self._watchers[key]
        owners.pop(owner, None)
        if owners:
            return
        del self._watchers[key]
        dsn = key[0]
        if any(k[0] == dsn for k in self._watchers):
            return  # its channel stays subscribed until the next re-listen: harmless
        task = self._listeners.pop(dsn, None)
        self._changed.pop(dsn, None)
        if task is not None:
            task.cancel()
            self._stopping.append(task)

    async def _close_unused(self) -> None:
        """Close every pool whose DSN no owner uses (first the LISTEN tasks on them)."""
        for key, owners in list(self._watchers.items()):
            for owner in [o for o in owners if self._users.get(o) != key[0]]:
                self._unwatch(key, owner)  # (an owner's wake-ups follow the DSN it uses)
        stopping, self._stopping = self._stopping, []
        await asyncio.gather(*stopping, return_exceptions=True)
        used = set(self._users.values())
        for dsn in [d for d in self._stores if d not in used]:
            store = self._stores.pop(dsn)
            self._connecting.pop(dsn, None)
            await store.close()
        for dsn in [d for d in self._failing if d not in used]:
            del self._failing[dsn]

    async def _listen(self, dsn: str) -> None:
        delay = 0.5
        changed = self._changed[dsn]
        while True:
            changed.clear()
            lost = asyncio.Event()
            prefixes = sorted(p for d, p in self._watchers if d == dsn)

            def notified(prefix: str, kind: str) -> None:
                for callback in list(self._watchers.get((dsn, prefix), {}).values()):
                    callback(kind)

            def control(prefix: str, payload: str) -> None:
                # A queue paused or resumed: its held jobs stop or start being demand, for
                # any pool (the notice names the queue, not a kind).
                if payload.startswith(QUEUE_NOTICE):
                    notified(prefix, "")

            try:
                store = await self._store(dsn)
                if not store.can_listen:  # behind a transaction pooler: ticks on interval only
                    logger.info("not listening on %s: pooler=transaction", the_database(dsn))
                    return
                async with store.listen_queues(
                    prefixes, notified, lost.set, on_control=control
                ) as listening:
                    delay = 0.5
                    for prefix in prefixes:
                        notified(prefix, "")  # anything sent while not listening was missed
                    while not lost.is_set() and not changed.is_set():
                        waiters = {
                            asyncio.ensure_future(lost.wait()),
                            asyncio.ensure_future(changed.wait()),
                        }
                        try:
                            await asyncio.wait(
                                waiters, timeout=30, return_when=asyncio.FIRST_COMPLETED
                            )
                        finally:
                            for w in waiters:
                                w.cancel()
                        if not lost.is_set() and not changed.is_set():
                            async with asyncio.timeout(10):
                                await listening.probe()
                    if changed.is_set():
                        continue  # the set of queues changed: listen again at once
            except asyncio.CancelledError:
                raise
            except DatabaseError:
                pass  # connecting failed: logged by _store, and the status says it
            except Exception as exc:  # any failure: wait and listen again
                logger.warning("LISTEN on %s failed: %s", the_database(dsn), _cause(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RELISTEN_DELAY_MAX)

    async def close(self) -> None:
        for task in self._listeners.values():
            task.cancel()
        await asyncio.gather(*self._listeners.values(), return_exceptions=True)
        await asyncio.gather(*self._stopping, return_exceptions=True)
        self._listeners.clear()
        self._stopping.clear()
        self._watchers.clear()
        self._users.clear()
        stores = list(self._stores.values())
        self._stores.clear()
        await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)


def _cause(exc: BaseException) -> str:
    """An exception as its class and code (errno or SQLSTATE): never its message, which may
    quote the DSN, its password, or what some server at an arbitrary address said."""
    return logs.error_class(exc)


def _connection_lost(exc: BaseException) -> bool:
    """The connection failed, not the statement: a socket error, a connection asyncpg closed
    or could not make, or a server that refused it (SQLSTATE classes 08, connection
    exception, and 57, operator intervention: a shutdown, say)."""
    if isinstance(exc, OSError | EOFError) or type(exc).__name__ in _CONNECTION_ERRORS:
        return True
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(("08", "57"))


_CONNECTION_ERRORS = frozenset(
    {"InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"}
)
"""asyncpg's client-side errors of a connection that is gone or unusable (by name: the
operator does not import asyncpg)."""


def _schema_missing(exc: BaseException) -> bool:
    """The queue's tables are absent (asyncpg's undefined_table, or the runtime's own error)."""
    return getattr(exc, "sqlstate", None) == "42P01" or "venturi migrate" in str(exc)


def _connect_error(dsn: str, exc: BaseException) -> DatabaseError:
    """What a JobQueue's status may say about a failed connection: a DSN that does not parse,
    or one generic failure (refused, unreachable, timed out, TLS, credentials alike)."""
    if isinstance(exc, ValueError):
        # asyncpg's ClientConfigurationError is a ValueError, as are urllib's and int()'s.
        return DatabaseError(
            "InvalidDSN",
            f"the DSN does not parse as a PostgreSQL URL or key=value string: {ENCODING_HINT}",
        )
    return DatabaseError(
        "ConnectionFailed",
        f"cannot connect to {the_database(dsn)}: unreachable, refused, timed out or "
        "credentials rejected (the operator's log says which)",
    )
