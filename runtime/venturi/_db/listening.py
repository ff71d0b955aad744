"""LISTEN for a store: the connection a worker's notifier holds on its queue's channel, the
one an operator's watcher holds on many queues' channels, and the wait for an awaited job on
the results channel (`PostgresStore.listen`, `listen_queues`, `wait_finished` call these).

LISTEN is session state: a store opened by `connect()` listens on a connection of its own,
outside the pool (a long-held pooled one would shrink the pool the worker's loops share); a
`from_pool` store takes one of the pool's; through a transaction pooler, which keeps no
session, only a direct connection to `listen_dsn` can listen.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from venturi._db import sql
from venturi._db.failures import (
    RETRY_FIRST,
    is_configuration_error,
    is_database_failure,
    next_delay,
)
from venturi._db.run import Pooler, Runner, detached, release
from venturi._db.sql import Statement

DirectConnect = tuple[str | None, dict[str, Any]]
"""asyncpg.connect's dsn and options."""

LEASE_NOTICE = "!lease "
"""Payload prefix of a claim's lease announcement: "!lease <seconds> <queue>"."""
QUEUE_NOTICE = "!queue "
"""Payload prefix of a pause or resume: "!queue pause <queue>", "!queue resume <queue>"."""
BATCH_NOTICE = "!batch "
"""Payload prefix of a batch's cancellation (migration 0023): "!batch <id>"."""
_POOL_ONLY = frozenset({"setup", "init", "max_queries", "max_inactive_connection_lifetime"})
"""Pool arguments that a single connection does not take."""


class Listening:
    """A live LISTEN connection, as `PostgresStore.listen` yields it."""

    def __init__(self, conn: Any, probe_sql: str, *, idle_timeout: float | None = None) -> None:
        self._conn = conn
        self._probe_sql = probe_sql
        self.idle_timeout = idle_timeout
        """The server's idle_session_timeout in seconds (None: none): the server ends the
        session after that long without a statement, so it must be probed more often."""

    async def probe(self) -> None:
        """Round-trip a trivial query; raises if the connection is dead."""
        await self._conn.fetchval(self._probe_sql)

    def abort(self) -> None:
        """Drop the connection at once (after a failed probe)."""
        self._conn.terminate()


class Listener:
    """LISTEN for the store of `prefix`, whose pool `pool()` returns."""

    def __init__(
        self,
        pool: Callable[[], asyncpg.Pool],
        queries: Mapping[str, Statement],
        *,
        prefix: str,
        results_channel: str,
        pooler: Pooler,
        connect_args: DirectConnect | None,
        bound: bool,
    ) -> None:
        self._pool = pool
        self._q = queries
        self._prefix = prefix
        self.results_channel = results_channel
        """Where a finished job that is awaited is announced (payload: its uuid)."""
        self._pooler = pooler
        self._connect_args = connect_args
        """How LISTEN connects, on a connection of its own outside the pool (None: it takes
        one of the pool's)."""
        self._bound = bound
        """The store is bound to the caller's connection (`using`)."""

    @property
    def can_listen(self) -> bool:
        """False through a transaction pooler without a direct connection to listen on."""
        return self._pooler == "none" or self._connect_args is not None

    def direct_connect_args(self, purpose: str) -> DirectConnect:
        """asyncpg.connect's arguments for a connection of its own, outside the pool (LISTEN
        goes there), named `venturi <purpose>` in pg_stat_activity."""
        assert self._connect_args is not None
        dsn, options = self._connect_args
        options = {k: v for k, v in options.items() if k not in _POOL_ONLY}
        settings = dict(options.get("server_settings") or {})
        settings["application_name"] = f"{settings.get('application_name', 'venturi')} {purpose}"
        options["server_settings"] = settings
        return dsn, options

    @asynccontextmanager
    async def listen(
        self,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None],
        on_lease: Callable[[str, float], None] | None = None,
        on_queue: Callable[[str, bool], None] | None = None,
        on_batch: Callable[[uuid.UUID], None] | None = None,
    ) -> AsyncIterator[Listening]:
        """See `PostgresStore.listen`."""

        def control(_prefix: str, payload: str) -> None:
            if payload.startswith(LEASE_NOTICE):
                if on_lease is not None:
                    _, seconds, queue = payload.split(" ", 2)
                    on_lease(queue, float(seconds))
            elif payload.startswith(QUEUE_NOTICE) and on_queue is not None:
                _, change, queue = payload.split(" ", 2)
                on_queue(queue, change == "pause")
            elif payload.startswith(BATCH_NOTICE) and on_batch is not None:
                on_batch(uuid.UUID(payload[len(BATCH_NOTICE) :]))

        async with self.listen_queues(
            [self._prefix], lambda _prefix, kind: on_notify(kind), on_lost, on_control=control
        ) as listening:
            yield listening

    @asynccontextmanager
    async def listen_queues(
        self,
        prefixes: Sequence[str],
        on_notify: Callable[[str, str], None],
        on_lost: Callable[[], None],
        *,
        on_control: Callable[[str, str], None] | None = None,
    ) -> AsyncIterator[Listening]:
        """See `PostgresStore.listen_queues`."""
        if self._bound:
            raise TypeError(
                "a store bound to the caller's connection (using) cannot LISTEN: LISTEN needs "
                "a connection of its own; listen on the store it was made from"
            )
        if not self.can_listen:
            raise TypeError(
                "this store connects through a transaction pooler (pooler='transaction'), "
                "which cannot keep a LISTEN: pass listen_dsn= (a direct connection to "
                "PostgreSQL) to listen, or poll"
            )
        channels = {f"{sql.validate_prefix(p)}_jobs": p for p in prefixes}

        def notified(_conn: object, _pid: int, channel: str, payload: object) -> None:
            text = str(payload)
            if text.startswith("!"):
                if on_control is not None:
                    on_control(channels[channel], text)
            else:
                on_notify(channels[channel], text)

        def terminated(_conn: object) -> None:
            on_lost()

        pool = self._pool()
        if self._connect_args is not None:
            dsn, options = self.direct_connect_args("listen")
            conn: Any = await asyncpg.connect(dsn, **options)
        else:
            conn = await pool.acquire()
        try:
            conn.add_termination_listener(terminated)
            # Read first: the LISTENs stay the session's last statements until a probe.
            idle = await conn.fetchval(self._q["idle_session_timeout"].text)
            for channel in channels:
                await conn.add_listener(channel, notified)
            yield Listening(conn, self._q["connection_probe"].text, idle_timeout=idle or None)
        finally:
            # Close rather than UNLISTEN channel by channel: it cannot be interrupted
            # half-way (by a cancellation at shutdown). A pooled connection that died is
            # already back in its pool (detached from this proxy), and has nothing to close.
            if self._connect_args is not None:
                conn.remove_termination_listener(terminated)
                conn.terminate()
            else:
                if not detached(conn):
                    conn.remove_termination_listener(terminated)
                    conn.terminate()
                await release(pool, conn)

    async def until_finished(self, run: Runner, key: uuid.UUID) -> None:
        """Until the job `key` has finished (completed or dead), or is not there: what
        `PostgresStore.wait_finished` waits for before it reads the job (see there)."""
        if not self.can_listen:
            # Through a transaction pooler without a listen_dsn: LISTEN would not hold.
            delay = RETRY_FIRST
            while True:
                try:
                    if await run.fetchval(self._q["job_unfinished"], id=key) is None:
                        return
                except Exception as exc:  # an outage: look again once it answers
                    if not is_database_failure(exc) or is_configuration_error(exc):
                        raise
                await asyncio.sleep(delay)
                delay = next_delay(delay)
        done = asyncio.Event()

        def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            if payload == str(key):
                done.set()

        delay = RETRY_FIRST
        while not done.is_set():
            lost = asyncio.Event()
            try:
                async with self._listening_connection() as conn:

                    def on_lost(_conn: object, lost: asyncio.Event = lost) -> None:
                        lost.set()

                    conn.add_termination_listener(on_lost)
                    await conn.add_listener(self.results_channel, notified)
                    try:
                        stmt = self._q["job_await"]
                        if await conn.fetchval(stmt.text, *stmt.args({"id": key})) is None:
                            return  # finished (or no such job)
                        await _first_of(done, lost)
                    finally:
                        if not detached(conn) and not conn.is_closed():
                            conn.remove_termination_listener(on_lost)
                            await conn.remove_listener(self.results_channel, notified)
            except Exception as exc:
                # Waited out: an outage. Raised: a refusal no wait mends (a missing table,
                # no privilege, a bad password), as any other call would raise it.
                if not is_database_failure(exc) or is_configuration_error(exc):
                    raise
            if not done.is_set():
                # The connection went away (an outage, a restart): listen again, and look
                # again, once the database answers; the caller's timeout bounds it all.
                await asyncio.sleep(delay)
                delay = next_delay(delay)

    @asynccontextmanager
    async def _listening_connection(self) -> AsyncIterator[Any]:
        """A connection that may LISTEN: one of the pool's, or, through a transaction
        pooler, a direct one to `listen_dsn` of its own (closed after)."""
        if self._pooler == "none":
            pool = self._pool()
            pooled = await pool.acquire()
            try:
                yield pooled
            finally:
                await release(pool, pooled)  # one that died meanwhile is dropped
            return
        assert self._connect_args is not None  # can_listen
        dsn, options = self.direct_connect_args("result")
        conn = await asyncpg.connect(dsn, **options)
        try:
            yield conn
        finally:
            conn.terminate()


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until any of `events` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
