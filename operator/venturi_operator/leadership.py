"""One operator acts at a time: replicas elect a leader through a Lease.

The Lease (coordination.k8s.io/v1, in the operator's namespace) names its holder. The holder
renews it every :data:`RETRY_SECONDS`; the others look as often and take it over once they have
seen it unchanged for :data:`LEASE_SECONDS` on their own clock (client-go's rule, as
controller-runtime and KEDA use it: the clocks of two nodes are never compared). A leader that
could not renew for :data:`RENEW_DEADLINE` stops leading, before anyone may take over; one that
stops (SIGTERM) gives the lease up, so a follower takes over at its next look instead of a
lease later.

:func:`step` is the rule, pure; :class:`Elector` applies it through the API; :func:`lead`
runs the operator while the lease is held, and :func:`answer_liveness` answers the liveness
probe of a replica that waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal

from aiohttp import web

from venturi_operator.kube import Kube, KubeError, LeaseState

logger = logging.getLogger("venturi_operator.leadership")

LEASE_SECONDS = 15
"""How long a lease holds unrenewed: a dead leader is replaced within this (plus a look)."""
RENEW_DEADLINE = 10.0
"""A leader that could not renew for this long stops leading: before LEASE_SECONDS, so it has
stopped by the time a follower may take over."""
RETRY_SECONDS = 2.0
"""How often the leader renews, and a follower looks."""
SETTLE_SECONDS = 10.0
"""How long a leader that stops waits for its requests still in flight (a JobQueue loop cut
off mid-tick) before it gives the Lease up: a follower must not act while they may land."""
STOP_AFTER_LOSS = 5.0
"""Seconds a replica that lost the lease gives its work to stop before it gives up on it."""

Step = Literal["create", "renew", "take", "wait"]


def step(
    lease: LeaseState | None, me: str, *, unchanged_for: float | None, lease_seconds: float
) -> Step:
    """What `me` does at a look: create the lease (there is none), renew it (it is ours), take
    it (given up, or seen unchanged for `lease_seconds`: its holder stopped renewing), or
    wait (another holds it). `unchanged_for`: seconds since this replica first saw the lease
    as it is now (None: just now)."""
    if lease is None:
        return "create"
    if lease.holder == me:
        return "renew"
    if not lease.holder:
        return "take"
    if unchanged_for is not None and unchanged_for >= lease_seconds:
        return "take"
    return "wait"


class LeadershipLost(Exception):
    """The lease could not be renewed in time, or another replica holds it now."""


class Elector:
    """The Lease `namespace/name`, campaigned for as `identity`."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_seconds: int = LEASE_SECONDS,
        renew_deadline: float = RENEW_DEADLINE,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not renew_deadline < lease_seconds:
            raise ValueError("the renew deadline must be shorter than the lease")
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._lease_seconds = lease_seconds
        self._renew_deadline = renew_deadline
        self._retry = retry_seconds
        self._clock = clock
        self._seen: tuple[str, float] | None = None
        """The lease's resourceVersion as last read, and when it was first read so."""
        self._renewed: float | None = None
        """When this replica last wrote the lease as its holder (None: it does not lead)."""
        self._lost = False
        """Set as `hold` finds leading over (`time_left` is 0 from then on)."""
        self._writing = asyncio.Lock()
        """Held by a renewal and by `release`, so that one never overwrites the other."""
        self.holder: str | None = None
        """The holder as last read."""

    def time_left(self) -> float:
        """Seconds this replica may still act as the leader: until RENEW_DEADLINE after it
        last read the lease it then renewed (before its write, so before any follower saw
        that write and began to count LEASE_SECONDS from it); 0 when it does not lead.
        Read by the reconciler's API client from its threads (`Kube.within_lease`)."""
        renewed = self._renewed
        if renewed is None or self._lost:
            return 0.0
        return max(0.0, renewed + self._renew_deadline - self._clock())

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def look(self) -> bool:
        """One look: create, renew or take the lease if the rule says so; True when this
        replica holds it afterwards. A write another replica won first (409) is False."""
        lease = await self._kube.lease(self.namespace, self.name)
        now = self._clock()
        unchanged_for = None
        if lease is not None:
            if self._seen is None or self._seen[0] != lease.version:
                self._seen = (lease.version, now)
            unchanged_for = now - self._seen[1]
        self.holder = lease.holder if lease is not None else None
        # The duration its holder wrote (client-go's rule), else this replica's own.
        seconds = (lease.seconds if lease is not None else None) or self._lease_seconds
        what = step(lease, self.identity, unchanged_for=unchanged_for, lease_seconds=seconds)
        if what == "wait":
            return False
        try:
            if lease is None:
                await self._kube.create_lease(
                    self.namespace, self.name, self.identity, self._lease_seconds
                )
            else:
                await self._kube.write_lease(
                    self.namespace,
                    self.name,
                    lease,
                    holder=self.identity,
                    seconds=self._lease_seconds,
                )
        except KubeError as exc:
            if exc.reason == "Conflict":  # another replica wrote it first: look again later
                return False
            raise
        if what != "renew":
            logger.info("leading: %s is now held by %s", self.where, self.identity)
        self.holder = self.identity
        self._renewed = now
        self._lost = False
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Look every RETRY_SECONDS until this replica leads (True), or `stop` is set (False).
        An API server that fails a look is retried at the next; each kind of failure is
        logged once."""
        said: str | None = None
        while not stop.is_set():
            try:
                if await self.look():
                    if stop.is_set():  # taken as this replica was told to stop
                        await self.release()
                        return False
                    return True
                news = f"following: {self.where} is held by {self.holder}"
            except KubeError as exc:
                news = f"cannot read or write {self.where} ({exc.message}); trying again"
            if news != said:
                logger.info("%s", news)
                said = news
            await _sleep(stop, self._retry)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew every RETRY_SECONDS until `stop` is set or the lease is given up (`release`).
        Raises `LeadershipLost` when another replica holds the lease, or when no renewal
        succeeded for RENEW_DEADLINE (each try is cut off at that deadline: an API server that
        does not answer is not waited for)."""
        while not await _sleep(stop, self._retry):
            async with self._writing:
                if self._renewed is None:
                    return  # given up (`release`): leading is over
                renewed = self._renewed
                left = renewed + self._renew_deadline - self._clock()
                try:
                    async with asyncio.timeout(max(left, 0.0)):
                        if await self.look():
                            continue
                    if self.holder != self.identity:
                        self._lost = True
                        raise LeadershipLost(f"{self.where} is held by {self.holder} now")
                    # Still ours, written by someone else meanwhile (a label, say): again.
                    failure = f"{self.where} changed as it was renewed"
                except KubeError as exc:
                    failure = f"could not renew {self.where} ({exc})"
                except TimeoutError:
                    # Cut off at the deadline: the API server did not answer in time.
                    failure = f"could not renew {self.where} (no answer within {left:.1f}s)"
                if self._clock() - renewed >= self._renew_deadline:
                    self._lost = True
                    raise LeadershipLost(
                        f"{self.where} not renewed for {self._renew_deadline:g}s ({failure})"
                    )
                logger.warning("%s; trying again", failure)

    async def release(self) -> None:
        """Give the lease up, if this replica holds it: a follower takes over at its next
        look. Best effort (a lease not given up expires)."""
        async with self._writing:
            if self._renewed is None:
                return
            self._renewed = None  # `hold` renews no more
            try:
                lease = await self._kube.lease(self.namespace, self.name)
                if lease is not None and lease.holder == self.identity:
                    await self._kube.write_lease(
                        self.namespace, self.name, lease, holder=None, seconds=1
                    )
                    logger.info("gave up %s", self.where)
            except KubeError as exc:
                logger.warning("could not give up %s (%s): it expires", self.where, exc.message)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds`, or less if `stop` is set; returns whether it is."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass
    return stop.is_set()


async def lead(elector: Elector, operating: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run `operating` (the operator) while renewing the lease; if the lease is lost, set
    `stop` (the operator's stop flag), give it STOP_AFTER_LOSS to end, and raise why
    (`LeadershipLost`)."""
    operator = asyncio.create_task(operating, name="venturi-operator")
    holder = asyncio.create_task(elector.hold(stop), name="venturi-lease")
    try:
        await asyncio.wait({operator, holder}, return_when=asyncio.FIRST_COMPLETED)
        # The lease lost (or its renewal failing in a way no retry mends): stop acting.
        lost = holder.exception() if holder.done() else None
        if lost is not None:
            logger.error("stopped leading: %s", lost)
            stop.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_AFTER_LOSS):
                    await asyncio.shield(operator)
            raise lost
        await operator  # it ended (a signal, or `stop`): its error, if any, surfaces here
    finally:
        stop.set()
        for task in (operator, holder):
            task.cancel()
        await asyncio.gather(operator, holder, return_exceptions=True)


@contextlib.asynccontextmanager
async def answer_liveness(endpoint: str | None) -> AsyncIterator[None]:
    """Answer the liveness endpoint while this replica waits to lead (kopf serves it once it
    runs): a follower is alive, not stuck."""
    if endpoint is None:
        yield
        return
    url = urllib.parse.urlsplit(endpoint)

    async def healthy(_: web.Request) -> web.Response:
        return web.json_response({"following": True})

    app = web.Application()
    app.router.add_get(url.path or "/", healthy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port).start()
    try:
        yield
    finally:
        await runner.cleanup()
