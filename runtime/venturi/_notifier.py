"""The notifier: one LISTEN connection per worker, kept alive, re-established when lost.

Every write that makes a job claimable sends NOTIFY in its own transaction; this turns
those into wake-ups of the worker's claim loop. A connection can die loudly (terminated)
or quietly (a half-open socket): the first is seen by asyncpg's termination callback, the
second by a periodic probe with a timeout. After any reconnect the worker is woken once,
since notifications sent while we were away are lost; `poll_max` bounds the rest.

A lost connection is retried with a backoff capped at a second, whatever asyncpg raised;
the loss is logged once, and its end once.

A store that cannot LISTEN (a transaction pooler without `listen_dsn`) gets no connection:
the notifier says so once and the worker polls, bounded by `poll_max`.

Started by the worker; calls `PostgresStore.listen`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable

from venturi._db.failures import describe, is_database_failure
from venturi._outage import next_delay
from venturi._timeouts import wait_for
from venturi.postgres import Listening, PostgresStore

logger = logging.getLogger(__name__)

PROBE_INTERVAL = 5.0
"""Seconds between liveness probes of an idle LISTEN connection: a half-open connection
(its server wedged, or the network gone) is found within PROBE_INTERVAL + PROBE_TIMEOUT."""
PROBE_TIMEOUT = 5.0
"""Seconds a probe may take before the connection is declared dead."""
MIN_PROBE_INTERVAL = 0.2
"""Seconds; the shortest interval between probes, whatever the server's idle timeout."""


class Notifier:
    def __init__(
        self,
        store: PostgresStore,
        on_notify: Callable[[str], None],
        *,
        on_lease: Callable[[str, float], None] | None = None,
        on_queue: Callable[[str, bool], None] | None = None,
        on_batch: Callable[[uuid.UUID], None] | None = None,
        on_connected: Callable[[], None] | None = None,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self._store = store
        self._on_notify = on_notify
        self._on_lease = on_lease
        self._on_queue = on_queue
        self._on_batch = on_batch
        self._on_connected = on_connected
        self._probe_interval = probe_interval
        self._lost = asyncio.Event()
        self.connected = asyncio.Event()
        """Set while a LISTEN connection is established (tests await it)."""
        self.reconnects = 0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting with backoff whenever the connection drops."""
        if not self._store.can_listen:
            await self._poll_only()
            return
        delay = 0.0
        first = True
        lost_since: float | None = None
        while True:
            self._lost.clear()
            try:
                async with self._store.listen(
                    self._on_notify, self._lost.set, self._on_lease, self._on_queue, self._on_batch
                ) as listening:
                    self.connected.set()
                    if self._on_connected is not None:
                        self._on_connected()  # the database answers: other loops retry now
                    if not first:
                        self.reconnects += 1
                        logger.warning(
                            "LISTEN connection re-established on %s after %.1fs",
                            self._store.channel,
                            time.monotonic() - (lost_since or time.monotonic()),
                        )
                        self._on_notify("")  # wake: anything sent meanwhile was missed
                    first = False
                    lost_since = None
                    delay = 0.0
                    await self._watch(listening)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                if lost_since is None:
                    logger.warning(
                        "LISTEN connection on %s failed: %s; reconnecting",
                        self._store.channel,
                        describe(exc),
                    )
                else:
                    logger.debug("LISTEN reconnect failed: %s", describe(exc))
            if lost_since is None:
                lost_since = time.monotonic()
            self.connected.clear()
            delay = next_delay(delay)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _poll_only(self) -> None:
        logger.info(
            "no LISTEN on %s: the store connects through a transaction pooler without "
            "listen_dsn, so new jobs are found by polling (at most poll_max apart)",
            self._store.channel,
        )
        self.connected.set()  # nothing to wait for: the worker may claim at once
        if self._on_connected is not None:
            self._on_connected()
        await asyncio.Event().wait()  # until cancelled

    async def _watch(self, listening: Listening) -> None:
        """Return when the connection is lost or a probe fails."""
        interval = self._probe_interval
        if listening.idle_timeout is not None:
            # A probe resets the server's idle_session_timeout: probe well within it, or the
            # server ends the connection each time it is idle that long.
            interval = max(MIN_PROBE_INTERVAL, min(interval, listening.idle_timeout / 2))
        while True:
            try:
                await wait_for(self._lost.wait(), interval)
                logger.warning(
                    "LISTEN connection lost on %s (ended by the server or the network: a "
                    "restart, pg_terminate_backend, a timeout of the server or of a proxy)",
                    self._store.channel,
                )
                return
            except TimeoutError:
                pass
            try:
                await wait_for(listening.probe(), PROBE_TIMEOUT)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                logger.warning("LISTEN connection probe failed: %s", describe(exc))
                listening.abort()
                return
