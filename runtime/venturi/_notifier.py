"""The notifier: one LISTEN connection per worker, kept alive, re-established when lost.

Every write that makes a job claimable sends NOTIFY in its own transaction; this turns
those into wake-ups of the worker's claim loop. A connection can die loudly (terminated)
or quietly (a half-open socket): the first is seen by asyncpg's termination callback, the
second by a periodic probe with a timeout. After any reconnect the worker is woken once,
since notifications sent while we were away are lost; `poll_max` bounds the rest.

Started by the worker; calls `PostgresStore.listen`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from venturi.postgres import Listening, PostgresStore

logger = logging.getLogger(__name__)

PROBE_INTERVAL = 10.0
"""Seconds between liveness probes of an idle LISTEN connection."""
PROBE_TIMEOUT = 5.0
"""Seconds a probe may take before the connection is declared dead."""
RECONNECT_DELAY_MAX = 5.0
"""Seconds; cap on the wait between reconnection attempts."""


class Notifier:
    def __init__(
        self,
        store: PostgresStore,
        on_notify: Callable[[str], None],
        *,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self._store = store
        self._on_notify = on_notify
        self._probe_interval = probe_interval
        self._lost = asyncio.Event()
        self.connected = asyncio.Event()
        """Set while a LISTEN connection is established (tests await it)."""
        self.reconnects = 0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting with backoff whenever the connection drops."""
        delay = 0.05
        first = True
        while True:
            self._lost.clear()
            try:
                async with self._store.listen(self._on_notify, self._lost.set) as listening:
                    self.connected.set()
                    if not first:
                        self.reconnects += 1
                        logger.info("LISTEN connection re-established on %s", self._store.channel)
                        self._on_notify("")  # wake: anything sent meanwhile was missed
                    first = False
                    delay = 0.05
                    await self._watch(listening)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                logger.warning("LISTEN connection failed: %s; retrying in %.2fs", exc, delay)
            self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

    async def _watch(self, listening: Listening) -> None:
        """Return when the connection is lost or a probe fails."""
        while True:
            try:
                await asyncio.wait_for(self._lost.wait(), self._probe_interval)
                logger.warning("LISTEN connection lost on %s", self._store.channel)
                return
            except TimeoutError:
                pass
            try:
                await asyncio.wait_for(listening.probe(), PROBE_TIMEOUT)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                logger.warning("LISTEN connection probe failed: %s", exc)
                listening.abort()
                return
