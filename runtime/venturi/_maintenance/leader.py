"""Leader election among the workers of a prefix: a lease row with terms.

The leader holds the row `{prefix}_leader` named "maintenance" under a lease of `TTL`
seconds and renews it every `TTL / 3`; the other workers read when it ends and try to take
it then, so a leader that dies (SIGKILL, a lost host) is replaced within about `TTL`
seconds, and one that exits cleanly expires its lease at once (`resign`). Every change of
hands starts a new term (a number that only grows, kept in the row).

Why a table and not a session advisory lock (`pg_try_advisory_lock` on a held connection):
- A session lock is session state. Behind PgBouncer in transaction mode every statement
  may run on another server connection, so the lock is taken on one backend and "held" by
  whichever client happens to be given it next, or released under the leader's feet.
  Each statement here is a transaction of its own: it works through any pooler.
- A session lock lives as long as the server's backend, not as long as the leader: when the
  leader's connection is lost (a network partition, a half-open TCP connection) the server
  may keep the backend, and the lock, for minutes, while the leader (which cannot tell the
  lock is still held) must assume it lost it; or the server drops the backend and another
  worker takes the lock while the cut-off leader still believes it leads: two leaders.
  A lease says how long it is valid, in the database's clock, and the leader stops acting
  on its own clock before then.

Fencing by term: the leader acts only while `deadline` (the time it *sent* its last
successful renewal, plus `TTL - MARGIN`) has not passed, and the database's lease ends `TTL`
after the renewal *ran*, which is later still; no one else can take the lease before it
ends, so two leaders' actions never overlap (clocks on both sides run at the same rate over
seconds, and `MARGIN` leaves a cancelled statement time to be aborted on the server).
A renewal must name the term it renews: a leader that lapsed, even one that got the lease
back, gets a new term, and its services are restarted, never continued under a term that
someone else may have held in between.

Started by the maintainer; calls `PostgresStore.leadership`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from venturi._db.failures import is_database_failure
from venturi._outage import Outage, next_delay
from venturi._timeouts import wait_for
from venturi.postgres import PostgresStore

logger = logging.getLogger("venturi.worker")

TTL = 5.0
"""Seconds a lease is valid unrenewed: how long a dead leader's lease outlives it."""
RENEW_EVERY = TTL / 3
"""Seconds between a leader's renewals: two can fail in a row without losing the lease."""
MARGIN = TTL / 5
"""Seconds before its lease could end that a leader stops acting: room for the cancelled
service statements to be aborted on the server before anyone else can lead."""
FOLLOWER_MAX_WAIT = TTL
"""Longest a follower waits between attempts (a lease it read may have been resigned)."""
EXPIRY_SLACK = 0.05
"""Seconds past the lease's end before a follower tries, so it has surely ended."""


class Elector:
    def __init__(
        self,
        store: PostgresStore,
        *,
        worker: str,
        outage: Outage,
        on_elected: Callable[[int], None],
        on_deposed: Callable[[int, str], None],
        ttl: float = TTL,
    ) -> None:
        self._store = store
        self._worker = worker
        self._outage = outage
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._ttl = ttl
        self._margin = ttl * MARGIN / TTL
        self._loop = asyncio.get_running_loop()
        self.term: int | None = None
        """The term this worker leads (None: it does not lead)."""
        self.deadline = 0.0
        """Loop time until which this worker may act as leader."""
        self._retired = False
        """Set by `resign`: a stopping worker stands for no term again."""

    async def run(self) -> None:
        delay = 0.0
        while not self._retired:
            now = self._loop.time()
            if self.term is not None and now >= self.deadline:
                self._depose("its lease could not be renewed in time")
            epoch = self._outage.epoch
            try:
                attempt = await wait_for(
                    self._store.leadership.attempt(
                        worker=self._worker, term=self.term, ttl_s=self._ttl
                    ),
                    self._attempt_timeout(now),
                )
            except Exception as exc:
                if not is_database_failure(exc) and not isinstance(exc, TimeoutError):
                    raise
                self._outage.failed("electing a leader", exc)
                delay = next_delay(delay)
                await self._wait(delay)
                continue
            self._outage.ok(epoch)
            delay = 0.0
            if self._retired:
                if attempt.term is not None and attempt.term != self.term:
                    await self._hand_back(attempt.term)  # won as the worker began to stop
                return
            if attempt.term is None:
                if self.term is not None:
                    self._depose("another worker took the lease")
                left = attempt.expires_in_s
                wait = FOLLOWER_MAX_WAIT if left is None else max(left, 0.0) + EXPIRY_SLACK
                # Spread the followers a little: one of them wins, the rest read its lease.
                await asyncio.sleep(min(wait, FOLLOWER_MAX_WAIT) + random.uniform(0, 0.05))
                continue
            if attempt.term != self.term:
                if self.term is not None:
                    self._depose(f"its lease lapsed (now term {attempt.term})")
                self.term = attempt.term
                self.deadline = now + self._ttl - self._margin
                logger.info("worker %s leads (term %d)", self._worker, attempt.term)
                self._on_elected(attempt.term)
            else:
                self.deadline = now + self._ttl - self._margin
            await self._wait(RENEW_EVERY * self._ttl / TTL)

    def _attempt_timeout(self, now: float) -> float:
        """A leader waits for a renewal at most until its deadline (then it stops acting)."""
        if self.term is None:
            return self._ttl
        return max(self.deadline - now, 0.05)

    async def _wait(self, seconds: float) -> None:
        """Sleep, but wake a leader at its deadline."""
        if self.term is not None:
            seconds = min(seconds, max(self.deadline - self._loop.time(), 0.0))
        if self._outage.ongoing:
            await self._outage.wait(seconds)  # or sooner, once another loop gets through
        else:
            await asyncio.sleep(seconds)

    def _depose(self, why: str) -> None:
        term, self.term = self.term, None
        assert term is not None
        logger.warning("worker %s no longer leads (term %d): %s", self._worker, term, why)
        self._on_deposed(term, why)

    async def resign(self) -> None:
        """Hand the lease back at a clean exit, so the next leader need not wait it out;
        from then on this worker stands for no term (it is stopping)."""
        self._retired = True
        term, self.term = self.term, None
        if term is None:
            return
        self._on_deposed(term, "the worker is stopping")
        await self._hand_back(term)

    async def _hand_back(self, term: int) -> None:
        try:
            await wait_for(self._store.leadership.resign(worker=self._worker, term=term), 2.0)
        except Exception as exc:
            if not is_database_failure(exc) and not isinstance(exc, TimeoutError):
                raise
            logger.warning(
                "worker %s: could not resign; the lease lapses within %.0fs",
                self._worker,
                self._ttl,
            )
