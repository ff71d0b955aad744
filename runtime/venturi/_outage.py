"""One worker's view of whether its database answers, shared by all of its loops.

When PostgreSQL goes away, every loop (claims, settlements, renewals, recovery, the
next-due timer, LISTEN) fails at once and keeps failing until it is back. This turns that
into one WARNING when the outage starts and one when it ends (not one per statement and
loop), and lets every loop retry the moment any one of them gets through, rather than
each sleeping out its own backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from venturi._db.failures import RETRY_MAX, describe, is_configuration_error
from venturi._db.failures import next_delay as next_delay  # the loops import it from here
from venturi._timeouts import wait_for

logger = logging.getLogger("venturi.worker")

REFUSALS = {
    "57014": (
        "a statement_timeout of the role or database (SHOW statement_timeout) shorter than "
        "venturi's statements take, or someone cancelling them"
    ),
    "25006": (
        "the database is read-only: a hot standby (the DSN reaches a replica, or a failover "
        "is not done yet), or default_transaction_read_only (which some managed services set "
        "when the disk is full); nothing is claimed or settled until it takes writes again"
    ),
    "55P03": (
        "a lock_timeout of the role or database (SHOW lock_timeout) shorter than venturi's "
        "statements wait for a row or table lock"
    ),
    # A prepared statement missing, or there twice, on the server: a transaction pooler
    # (PgBouncer, Supavisor, RDS Proxy) hands the session's statements to other clients.
    "26000": (
        "a transaction pooler between this worker and the database? Say so: "
        "pooler='transaction' (venturi worker --pooler transaction; README: Behind PgBouncer)"
    ),
    "42P05": (
        "a transaction pooler between this worker and the database? Say so: "
        "pooler='transaction' (venturi worker --pooler transaction; README: Behind PgBouncer)"
    ),
}
"""SQLSTATEs of statements the database answered and cut short or refused, by why: not an
outage (other statements succeed meanwhile: "unavailable" then "back" would alternate)."""
REFUSAL_LOG_INTERVAL = 60.0
"""Seconds between two ERRORs for the same refusal of the same loop."""


class Outage:
    def __init__(self, worker: str) -> None:
        self._worker = worker
        self._since: float | None = None
        self.epoch = 0
        """Outages begun so far: read before a call, given to `ok` after it."""
        self._failures = 0
        self._back = asyncio.Event()
        self._refusals: dict[tuple[str, str], float] = {}
        """When each (loop, error) refusal was last logged."""

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        """Record that `what` (a loop's name) failed against the database."""
        if is_configuration_error(exc):
            self._refused(
                what,
                exc,
                "the role's privileges or the schema need mending (README: Migrations, "
                "privileges and upgrades)",
            )
            return
        why = REFUSALS.get(getattr(exc, "sqlstate", None) or "")
        if why is not None:
            self._refused(what, exc, why)
            return
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self.epoch += 1
            self._back.clear()
            logger.warning(
                "worker %s: the database is unavailable (%s: %s); retrying until it is back",
                self._worker,
                what,
                describe(exc),
            )
        else:
            logger.debug("worker %s: %s failed again: %s", self._worker, what, describe(exc))

    def ok(self, epoch: int) -> None:
        """Record a call that succeeded, begun when `epoch` was read (cheap: called on every
        success). A call begun before the outage, answered just after it began, says nothing
        of the database now: "back" then "unavailable" again would be logged within a
        millisecond."""
        if self._since is None or epoch != self.epoch:
            return
        lasted = time.monotonic() - self._since
        logger.warning(
            "worker %s: the database is back after %.1fs (%d failed calls meanwhile)",
            self._worker,
            lasted,
            self._failures,
        )
        self._since = None
        self._failures = 0
        self._back.set()

    def _refused(self, what: str, exc: BaseException, why: str) -> None:
        """The database answered, and refused: a privilege, a table or a login the
        deployment must mend, or a statement cut short. Not an outage (the other loops may
        well succeed meanwhile, and "unavailable" then "back" would alternate): one ERROR per
        loop and error a minute."""
        key = (what, describe(exc))
        now = time.monotonic()
        if now - self._refusals.get(key, -REFUSAL_LOG_INTERVAL) < REFUSAL_LOG_INTERVAL:
            logger.debug("worker %s: %s refused again: %s", self._worker, what, key[1])
            return
        self._refusals[key] = now
        logger.error(
            "worker %s: %s was refused by the database (%s): not an outage; %s; retrying",
            self._worker,
            what,
            key[1],
            why,
        )

    async def wait(self, delay: float) -> None:
        """Sleep about `delay` seconds (jittered down to half, so the loops of one worker,
        and the workers of a fleet, do not retry in lockstep), or less if another loop sees
        the database come back (during an outage; a refusal sleeps it out)."""
        if self._since is None:
            await asyncio.sleep(min(delay, RETRY_MAX) * random.uniform(0.5, 1.0))
            return
        with contextlib.suppress(TimeoutError):
            await wait_for(self._back.wait(), min(delay, RETRY_MAX) * random.uniform(0.5, 1.0))
