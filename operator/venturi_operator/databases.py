"""Queue databases as the operator sees them: one small pool per distinct DSN, shared by every
JobQueue that uses it, stats with hard timeouts, and LISTEN wake-ups for scale-from-zero.

A slow or dead database only ever costs its own JobQueues their tick: connecting and querying
are bounded by timeouts, and nothing here is awaited while another JobQueue reconciles.
Uses the runtime's public API only (`venturi.PostgresStore`, `venturi.Queue`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from venturi import PostgresStore, Queue, Stats
from venturi_operator.config import OperatorConfig

logger = logging.getLogger(__name__)

RELISTEN_DELAY_MAX = 30.0
"""Seconds; cap on the wait before re-establishing a lost LISTEN connection."""


class DatabaseError(Exception):
    """Stats could not be read; `reason` is a CamelCase word for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


WakeCallback = Callable[[str], None]
"""Called with the job kind of every notification on a watched queue."""


class Databases:
    def __init__(self, config: OperatorConfig) -> None:
        self._config = config
        self._stores: dict[str, PostgresStore] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._watchers: dict[tuple[str, str], dict[object, WakeCallback]] = {}
        """(dsn, prefix) -> owner -> callback."""
        self._listeners: dict[str, asyncio.Task[None]] = {}
        """One LISTEN task per database."""
        self._changed: dict[str, asyncio.Event] = {}

    async def stats(self, dsn: str, prefix: str) -> Stats:
        """One grouped stats query, bounded by the statement timeout."""
        store = await self._store(dsn)
        try:
            return await asyncio.wait_for(
                Queue(store.with_prefix(prefix)).stats(), self._config.statement_timeout + 1
            )
        except TimeoutError:
            raise DatabaseError(
                "QueryTimeout", f"stats took longer than {self._config.statement_timeout}s"
            ) from None
        except Exception as exc:  # asyncpg raises many types; each means "no stats this tick"
            reason = "SchemaMissing" if "does not exist" in str(exc) else "QueryFailed"
            raise DatabaseError(reason, f"reading stats failed: {exc}") from None

    async def claimed_by_pod(self, dsn: str, prefix: str) -> dict[str, int]:
        """Claimed jobs per pod name (one grouped query), bounded like `stats`."""
        store = await self._store(dsn)
        try:
            return await asyncio.wait_for(
                Queue(store.with_prefix(prefix)).claimed_by_pod(),
                self._config.statement_timeout + 1,
            )
        except TimeoutError:
            raise DatabaseError(
                "QueryTimeout", f"claims per pod took longer than {self._config.statement_timeout}s"
            ) from None
        except Exception as exc:  # asyncpg raises many types; each means "no claims this tick"
            raise DatabaseError("QueryFailed", f"reading claims per pod failed: {exc}") from None

    async def _store(self, dsn: str) -> PostgresStore:
        store = self._stores.get(dsn)
        if store is not None:
            return store
        lock = self._connecting.setdefault(dsn, asyncio.Lock())
        async with lock:
            store = self._stores.get(dsn)
            if store is None:
                try:
                    store = await asyncio.wait_for(
                        PostgresStore.connect(
                            dsn,
                            min_size=1,
                            max_size=self._config.pool_size,
                            connect_timeout=self._config.connect_timeout,
                            statement_timeout=self._config.statement_timeout,
                            application_name=self._config.application_name,
                        ),
                        self._config.connect_timeout + 1,
                    )
                except TimeoutError:
                    raise DatabaseError(
                        "ConnectionFailed",
                        f"no connection within {self._config.connect_timeout}s",
                    ) from None
                except Exception as exc:  # bad DSN, refused, auth: all mean "unreachable"
                    raise DatabaseError(
                        "ConnectionFailed", f"connecting failed: {_redact(str(exc), dsn)}"
                    ) from None
                self._stores[dsn] = store
        return store

    def watch(self, dsn: str, prefix: str, owner: object, callback: WakeCallback) -> None:
        """Call `callback(kind)` for every job notification on this queue (until `unwatch`).

        One LISTEN connection per database serves every watched queue in it; it is
        re-established (with the new set of queues) whenever that set changes.
        """
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

    async def unwatch(self, owner: object) -> None:
        for key, owners in list(self._watchers.items()):
            if owners.pop(owner, None) is None or owners:
                continue
            del self._watchers[key]
            dsn = key[0]
            if any(k[0] == dsn for k in self._watchers):
                continue  # its channel stays subscribed until the next re-listen: harmless
            task = self._listeners.pop(dsn, None)
            self._changed.pop(dsn, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

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

            try:
                store = await self._store(dsn)
                async with store.listen_queues(prefixes, notified, lost.set) as listening:
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
                            await asyncio.wait_for(listening.probe(), 10)
                    if changed.is_set():
                        continue  # the set of queues changed: listen again at once
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: wait and listen again
                logger.warning("LISTEN failed: %s", _redact(str(exc), dsn))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RELISTEN_DELAY_MAX)

    async def close(self) -> None:
        for task in self._listeners.values():
            task.cancel()
        await asyncio.gather(*self._listeners.values(), return_exceptions=True)
        self._listeners.clear()
        self._watchers.clear()
        stores = list(self._stores.values())
        self._stores.clear()
        await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)


def _redact(message: str, dsn: str) -> str:
    """Never echo a DSN (it may hold a password) into a status or a log."""
    return message.replace(dsn, "<dsn>")
