"""The two claim statements claim alike: the plain one-queue statement (`job_claim_queue`, the
usual worker's) and the claim function (`claim_v7`: several queues in order, or a pod's
claim, which looks at its scale-in fence). The plain one repeats the function's per-queue
clauses so a claim costs no function call; these tests hold the two to the same jobs, in the
same order, with the same columns, and to the same lease announcements."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from venturi import PostgresStore, Priority, Queue, Task
from venturi._db.run import Connection
from venturi._records import Settlement


@dataclass
class Ping(Task):
    KIND = "ping"
    n: int


@dataclass
class Pong(Task):
    KIND = "pong"
    n: int


@dataclass
class Timed(Task):
    """A job with its own lease and timeout (the claim's lease is the longer of the lease
    and the timeout plus a minute)."""

    KIND = "pong"
    n: int
    lease_s: float = 20.0

    def lease(self) -> float:
        return self.lease_s

    def timeout(self) -> float:
        return 200.0


@dataclass
class Leased(Task):
    KIND = "ping"
    n: int

    def lease(self) -> float:
        return 20.0


async def backlog(queue: Queue, store: PostgresStore) -> None:
    """Jobs of every shape a claim tells apart: three tiers, two kinds, another queue, jobs
    not due yet, per-job leases and timeouts, retried jobs (they carry a history) and stored
    trace contexts."""
    await queue.enqueue_many([Ping(i) for i in range(12)], priority=Priority.HIGH)
    await queue.enqueue_many([Pong(i) for i in range(8)], priority=Priority.NORMAL)
    await queue.enqueue_many([Ping(i) for i in range(8)], priority=Priority.LOW)
    await queue.enqueue_many([Timed(i) for i in range(3)])
    await queue.enqueue_in(Ping(99), 3600)
    await Queue(store, queue="other").enqueue_many([Ping(i) for i in range(5)])
    for limit in (3, 12):  # three HIGH pings retried twice (two journal entries), nine once
        retried = await store.claim(
            queues=["default"],
            kinds=["ping"],
            limit=limit,
            worker="w",
            pod=None,
            default_lease_s=30,
        )
        await store.settle([Settlement.of(job, "failed") for job in retried], worker="w")
    # Some with a stored trace context (what a traced claim reads).
    await store._pool_or_raise().execute(
        f"UPDATE {store.prefix}_jobs SET trace_context = 'traceparent ' || id WHERE priority = 2"
    )


async def both(
    store: PostgresStore, conn: Connection, values: dict[str, Any]
) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """The rows each statement claims from the same backlog at the same moment: one
    transaction (now() is the same for both), the first claim rolled back to a savepoint."""
    plain = store._q["job_claim_queue"]
    function = store._q["job_claim"]
    common = {"channel": store.channel, "worker": "w", "default_lease_s": 30.0, **values}
    queue = common.pop("queue")
    # What the claim wrote, beside what it returned.
    written = (
        f"SELECT id, status, run_count, claimed_by, claimed_pod, lease_until - now() AS lease, "
        f"claimed_at = now() AS now FROM {store.prefix}_jobs WHERE status = 'claimed' ORDER BY id"
    )
    async with conn.transaction():
        await conn.execute("SAVEPOINT before_claims")
        first = await conn.fetch(plain.text, *plain.args({**common, "queue": queue, "pod": None}))
        first_written = await conn.fetch(written)
        await conn.execute("ROLLBACK TO SAVEPOINT before_claims")
        second = await conn.fetch(
            function.text, *function.args({**common, "queues": [queue], "pod": None})
        )
        second_written = await conn.fetch(written)
        await conn.execute("ROLLBACK TO SAVEPOINT before_claims")
    assert first_written == second_written
    assert len(first_written) == len(first)
    return first, second


CASES = {
    "tiers with reservations": dict(
        kinds=["ping", "pong"], n=20, reserved_low=3, reserved_normal=5, history=True
    ),
    "one kind": dict(kinds=["pong"], n=50, reserved_low=0, reserved_normal=0),
    "every kind but one": dict(
        kinds=None, skip_kinds=["ping"], n=6, reserved_low=1, reserved_normal=1
    ),
    "every kind, more room than jobs": dict(
        kinds=None, n=500, reserved_low=10, reserved_normal=10, history=True
    ),
    "traced": dict(kinds=["ping"], n=4, traced=True, traces=True),
    "another queue": dict(queue="other", kinds=["ping"], n=3),
    "a queue with no jobs": dict(queue="none", kinds=["ping"], n=3),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_both_claim_the_same_jobs_in_the_same_order(
    queue: Queue, store: PostgresStore, case: dict[str, Any]
) -> None:
    await backlog(queue, store)
    case = dict(case)
    history = case.pop("history", False)
    traces = case.pop("traces", False)
    values = {
        "queue": "default",
        "skip_kinds": [],
        "reserved_low": 0,
        "reserved_normal": 0,
        "held_lease_s": None,
        "traced": False,
        **case,
    }
    async with store._pool_or_raise().acquire() as conn:
        plain, function = await both(store, conn, values)
    expected = 0 if values["queue"] == "none" else 1
    assert len(plain) >= expected  # a case that claims nothing would compare nothing
    # Everything but the claim token, which each claim draws afresh.
    assert [{**r, "claim_token": None} for r in plain] == [
        {**r, "claim_token": None} for r in function
    ]
    # One token per claim (a draw per job cost ~1.5 us), drawn afresh by each claim: with
    # the job's id it says "still claimed by this claim".
    for rows in (plain, function):
        assert len({r["claim_token"] for r in rows}) == min(len(rows), 1)
    if plain:
        assert plain[0]["claim_token"] != function[0]["claim_token"]
    if case.get("reserved_low"):
        assert any(r["reserved"] for r in plain)
    if history:
        assert any(r["history"] for r in plain)  # the retried jobs' journal is read
    assert any(r["trace_context"] for r in plain) == traces


@pytest.mark.parametrize("until", ["none", "ahead", "run out"])
async def test_both_skip_a_paused_queue_until_its_pause_runs_out(
    queue: Queue, store: PostgresStore, prefix: str, until: str
) -> None:
    await backlog(queue, store)
    await queue.pause("default")
    if until != "none":
        offset = "interval '1 hour'" if until == "ahead" else "- interval '1 second'"
        await store._pool_or_raise().execute(
            f"UPDATE {prefix}_queues SET paused_until = now() + {offset} WHERE name = 'default'"
        )
    values = {"queue": "default", "kinds": ["ping", "pong"], "skip_kinds": [], "n": 10}
    values |= {"reserved_low": 2, "reserved_normal": 2, "held_lease_s": None, "traced": False}
    async with store._pool_or_raise().acquire() as conn:
        plain, function = await both(store, conn, values)
    assert len(plain) == (10 if until == "run out" else 0)
    assert [r["id"] for r in plain] == [r["id"] for r in function]


@pytest.mark.parametrize("held_lease_s", [None, 60.0, 10.0])
async def test_both_announce_a_lease_that_ends_sooner_than_a_known_one(
    queue: Queue, store: PostgresStore, pg_dsn: str, held_lease_s: float | None
) -> None:
    """A claim announces its shortest lease when none is known or it ends sooner (see
    `Producer._known_lease_end`): the plain statement (no pod) and the function (a pod's
    claim) the same way."""
    heard: list[str] = []
    sentinel = asyncio.Event()

    def listen(_c: object, _pid: int, _channel: str, payload: object) -> None:
        assert isinstance(payload, str)
        if payload.startswith("!lease "):
            heard.append(payload)
        elif payload == "test-sentinel":
            sentinel.set()

    await queue.enqueue_many([Leased(i) for i in range(4)])
    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(store.channel, listen)
    announced = []
    try:
        for pod in (None, "pod-a"):
            claimed = await store.claim(
                queues=["default"],
                kinds=["ping"],
                limit=2,
                worker="w",
                pod=pod,
                default_lease_s=30,
                held_lease_s=held_lease_s,
            )
            assert len(claimed) == 2
            sentinel.clear()
            # Notifications arrive in commit order: once this one is here, the claim's are.
            await listener.execute("SELECT pg_notify($1, 'test-sentinel')", store.channel)
            await asyncio.wait_for(sentinel.wait(), 10)
            announced.append(list(heard))
            heard.clear()
    finally:
        await listener.close()
    expected = [] if held_lease_s == 10.0 else ["!lease 20 default"]
    assert announced == [expected, expected]
