"""Leader election among operator replicas: the rule as a plain function, and electors
against an API server (the harness's, with its optimistic concurrency), on clocks the test
moves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from unittest.mock import AsyncMock

import kmock
import pytest
from kube_harness import LEASES, KubeHarness, kube_fixture

from venturi_operator.kube import REQUEST_TIMEOUT, Kube, KubeError, LeaseState, request_timeout
from venturi_operator.leadership import Elector, LeadershipLost, lead, step

kube = pytest.fixture(kube_fixture, name="kube")

NS = "venturi-system"


def lease(holder: str | None, version: str = "7") -> LeaseState:
    return LeaseState(holder=holder, version=version, transitions=0, acquired=None)


def test_the_rule() -> None:
    assert step(None, "a", unchanged_for=None, lease_seconds=15) == "create"
    assert step(lease("a"), "a", unchanged_for=99, lease_seconds=15) == "renew"
    assert step(lease(None), "b", unchanged_for=0, lease_seconds=15) == "take"  # given up
    assert step(lease("a"), "b", unchanged_for=None, lease_seconds=15) == "wait"
    assert step(lease("a"), "b", unchanged_for=14.9, lease_seconds=15) == "wait"
    assert step(lease("a"), "b", unchanged_for=15, lease_seconds=15) == "take"  # a stopped


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(kube: KubeHarness) -> Iterator[Kube]:
    kube.namespace(NS)
    with kube.api_client() as client:
        yield Kube(client)


def elector(api: Kube, identity: str, clock: Clock) -> Elector:
    return Elector(api, NS, "venturi-operator", identity, clock=clock, retry_seconds=0.01)


def holder(kube: KubeHarness) -> str | None:
    found = kube.get(LEASES, NS, "venturi-operator")
    name: str | None = found["spec"].get("holderIdentity")
    return name


async def test_one_leads_and_another_takes_over_once_it_stops_renewing(
    kube: KubeHarness, api: Kube
) -> None:
    a_clock, b_clock = Clock(), Clock()
    a, b = elector(api, "a", a_clock), elector(api, "b", b_clock)
    assert await a.look()  # no lease yet: created, held by a
    assert holder(kube) == "a"
    assert not await b.look()
    assert b.holder == "a"
    b_clock.now += 14
    assert await a.look()  # renewed...
    assert not await b.look()  # ...b sees it change, and counts again from now
    b_clock.now += 14
    assert not await b.look()  # 28 s since b first looked, 14 since it saw a change
    b_clock.now += 1
    assert await b.look()  # a has not renewed for 15 s on b's clock: b takes it
    assert holder(kube) == "b"
    assert kube.get(LEASES, NS, "venturi-operator")["spec"]["leaseTransitions"] == 1
    assert not await a.look()  # a sees b hold it: a renews nothing
    with pytest.raises(LeadershipLost, match="held by b"):
        await asyncio.wait_for(a.hold(asyncio.Event()), 5)


async def test_a_leader_that_stops_gives_the_lease_up(kube: KubeHarness, api: Kube) -> None:
    a, b = elector(api, "a", Clock()), elector(api, "b", Clock())
    stop = asyncio.Event()
    assert await a.acquire(stop)
    assert not await b.look()
    await a.release()
    assert holder(kube) is None
    assert await b.look()  # at once, not a lease later


async def test_of_two_that_take_a_lease_at_once_one_wins(
    kube: KubeHarness, api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    b_clock, c_clock = Clock(), Clock()
    with kube.api_client() as c_client:
        c_api = Kube(c_client)
        a, b = elector(api, "a", Clock()), elector(api, "b", b_clock)
        c = elector(c_api, "c", c_clock)
        assert await a.look()
        assert not await b.look()  # b and c both see a's lease...
        assert not await c.look()
        seen = await c_api.lease(NS, "venturi-operator")
        b_clock.now += 15
        c_clock.now += 15
        assert await b.look()  # ...expire; b takes it
        # c read it before b's write, and writes after it: against a replaced version (409).
        stale = AsyncMock(return_value=seen)
        monkeypatch.setattr(c_api, "lease", stale)
        assert not await c.look()
        stale.assert_awaited_once()
        assert holder(kube) == "b"


async def test_a_leader_that_cannot_renew_stops_leading_within_the_deadline(
    kube: KubeHarness, api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    a = elector(api, "a", clock)
    assert await a.acquire(asyncio.Event())
    # Every renewal refused from now on (an API server in trouble): the renewals fail...
    writes = kube.emulator[kmock.method.PUT, kmock.resource(LEASES)]
    writes << kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="later")
    failed, twice = 0, asyncio.Event()
    write = api.write_lease

    async def counted(*args: Any, **kwargs: Any) -> None:
        nonlocal failed
        try:
            await write(*args, **kwargs)
        finally:
            failed += 1
            if failed >= 2:
                twice.set()

    monkeypatch.setattr(api, "write_lease", counted)
    holding = asyncio.create_task(a.hold(asyncio.Event()))
    await asyncio.wait_for(twice.wait(), 10)  # ...tried again, and again
    assert not holding.done()  # within the renew deadline: still leading
    clock.now += 10  # the deadline passes without a renewal
    with pytest.raises(LeadershipLost, match="not renewed for 10s"):
        await asyncio.wait_for(holding, 5)
    assert a.time_left() == 0
    assert holder(kube) == "a"  # unrenewed: another takes it once it expires


async def test_a_renewal_the_api_server_does_not_answer_is_named_as_such(
    kube: KubeHarness, api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut off at the renew deadline, a renewal said why: "could not renew ... ()", the empty
    text of a TimeoutError."""
    clock = Clock()
    a = elector(api, "a", clock)
    assert await a.acquire(asyncio.Event())
    unanswered = asyncio.Event()

    async def hanging(*args: Any, **kwargs: Any) -> None:
        unanswered.set()
        await asyncio.Event().wait()  # an API server that never answers

    monkeypatch.setattr(api, "write_lease", hanging)
    clock.now += 9.9  # 0.1 s of the renew deadline left
    holding = asyncio.create_task(a.hold(asyncio.Event()))
    await asyncio.wait_for(unanswered.wait(), 10)
    clock.now += 0.1  # and then none
    with pytest.raises(LeadershipLost, match=r"could not renew .* \(no answer within 0\.1s\)"):
        await asyncio.wait_for(holding, 10)


async def test_a_leader_that_lost_the_lease_stops_what_it_runs(
    kube: KubeHarness, api: Kube
) -> None:
    a, b_clock = elector(api, "a", Clock()), Clock()
    b = elector(api, "b", b_clock)
    assert await a.look()
    assert not await b.look()
    b_clock.now += 15
    assert await b.look()  # a stalled (here: between two looks) and b took over
    stop, stopped = asyncio.Event(), asyncio.Event()

    async def operating() -> None:  # the operator: runs until its stop flag is set
        await stop.wait()
        stopped.set()

    with pytest.raises(LeadershipLost, match="held by b"):
        await asyncio.wait_for(lead(a, operating(), stop), 10)
    assert stopped.is_set()
    assert a.time_left() == 0  # what it still sends is refused
    assert holder(kube) == "b"


async def test_a_renewal_that_meets_another_write_of_its_own_lease_tries_again(
    kube: KubeHarness, api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A label someone adds to the Lease between the leader's read and its write is a 409 for
    the write: the Lease is still the leader's, and it renews at the next try, leading on."""
    a = elector(api, "a", Clock())
    assert await a.look()
    writes = kube.emulator[kmock.method.PUT, kmock.resource(LEASES)]
    writes[:1] << kmock.KubernetesError(status=409, reason="Conflict", message="modified")
    stop, written = asyncio.Event(), 0
    write = api.write_lease

    async def counted(*args: Any, **kwargs: Any) -> None:
        nonlocal written
        await write(*args, **kwargs)
        written += 1
        stop.set()  # renewed after the conflict: enough

    monkeypatch.setattr(api, "write_lease", counted)
    await asyncio.wait_for(a.hold(stop), 10)  # returns: no LeadershipLost
    assert written == 1 and len(writes) == 2
    assert holder(kube) == "a"


async def test_a_lease_taken_as_the_replica_is_told_to_stop_is_given_back(
    kube: KubeHarness, api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = asyncio.Event()
    create = api.create_lease

    async def signalled_meanwhile(*args: Any, **kwargs: Any) -> None:
        await create(*args, **kwargs)
        stop.set()  # SIGTERM while the look that took the Lease was on its way

    monkeypatch.setattr(api, "create_lease", signalled_meanwhile)
    assert not await elector(api, "a", Clock()).acquire(stop)
    assert holder(kube) is None  # given back: a follower need not wait it out


def test_a_request_bound_by_the_lease_fits_two_connects_and_a_reply_in_what_is_left() -> None:
    assert request_timeout(None) == REQUEST_TIMEOUT
    assert request_timeout(1000.0) == REQUEST_TIMEOUT
    for left in (10.0, 8.0, 0.5):
        connect, read = request_timeout(left)
        assert connect > 0 and read > 0 and 2 * connect + read <= left


async def test_the_reconcilers_client_sends_nothing_past_the_lease_and_gives_up_on_it_then(
    kube: KubeHarness, api: Kube
) -> None:
    """A follower may act LEASE_SECONDS after it saw the last renewal; the leader stops at
    RENEW_DEADLINE after it: whatever its reconciler asked of the API server must have landed
    by then, or never land (a scale written twice by two leaders)."""
    clock = Clock()
    a = elector(api, "a", clock)
    asked, answer = 0, asyncio.Event()

    async def held() -> None:  # an API server that does not answer (until the test ends)
        nonlocal asked
        asked += 1
        await answer.wait()

    kube.emulator[kmock.method.GET, kmock.resource(LEASES), kmock.name("held")] << held
    with kube.api_client() as client:
        acting = Kube(client)
        acting.within_lease(a.time_left)
        with pytest.raises(KubeError, match="not sent: this replica no longer leads") as early:
            await acting.lease(NS, "held")  # not leading yet
        assert early.value.reason == "NotLeading" and asked == 0
        assert await a.acquire(asyncio.Event())
        assert a.time_left() == 10
        assert await acting.lease(NS, "venturi-operator") is not None  # leading: answered
        clock.now += 9.2  # renewals failing: 0.8 s left
        try:
            with pytest.raises(KubeError) as unanswered:
                await asyncio.wait_for(acting.lease(NS, "held"), 10)  # not REQUEST_TIMEOUT's 20 s
        finally:
            answer.set()
        assert unanswered.value.reason == "ApiUnreachable" and asked == 1
        clock.now += 0.8
        with pytest.raises(KubeError, match="no longer leads"):
            await acting.lease(NS, "venturi-operator")
