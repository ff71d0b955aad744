"""Priority tiers with weighted-slot anti-starvation, and history and cleanup."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from venturi import (
    CleanupCriteria,
    Context,
    JobFilter,
    JobStatus,
    Outcome,
    Priority,
    Queue,
    Task,
    TaskError,
    Worker,
)
from venturi._claims import plan_slots, spread_order

from .helpers import running, until


@dataclass
class Work(Task):
    KIND = "work"
    tier: int


async def drain_order(queue: Queue, ratio: int | None, high: int, low: int) -> list[int]:
    await queue.enqueue_many([Work(2) for _ in range(high)], priority=Priority.HIGH)
    await queue.enqueue_many([Work(0) for _ in range(low)], priority=Priority.LOW)
    order: list[int] = []

    async def handle(task: Work, ctx: Context[None], app: None) -> Outcome:
        order.append(task.tier)
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, priority_ratio=ratio)
    worker.register(Work, handle)
    async with running(worker):

        async def done() -> bool:
            return len(order) == high + low

        await until(done)
    return order


async def test_anti_starvation_gives_low_its_share_under_a_high_flood(queue: Queue) -> None:
    order = await drain_order(queue, ratio=4, high=120, low=40)
    first = order[:80]
    # While HIGH floods, LOW keeps about 1 claim in 4 (the configured ratio); prefetching
    # may start a claimed LOW job one place later than it was claimed.
    assert 18 <= first.count(0) <= 22
    assert order.count(0) == 40


async def test_strict_priority_starves_low_until_high_is_done(queue: Queue) -> None:
    order = await drain_order(queue, ratio=None, high=120, low=40)
    assert order == [2] * 120 + [0] * 40


def test_slot_plan() -> None:
    assert plan_slots(0, 16, None) == (0, 0)
    assert plan_slots(0, 4, 4) == (0, 1)
    assert plan_slots(0, 16, 4) == (1, 3)  # slot 15 is LOW-only; 3, 7, 11 NORMAL-or-LOW
    total = [sum(plan_slots(i, 1, 4)) for i in range(1600)]
    assert sum(total) == 400  # one slot in four is reserved below HIGH


def test_spread_order_leaves_a_claim_without_reserved_lower_jobs_alone() -> None:
    # Reserved jobs of the top tier, and lower-tier jobs no reservation picked (the claim
    # ran out of higher ones), keep the claim's priority, then FIFO order.
    one_tier = [("default", 1, i % 4 == 3) for i in range(10)]
    assert spread_order(one_tier) == list(range(10))
    overflow = [("default", 2, False)] * 3 + [("default", 0, False)] * 3
    assert spread_order(overflow) == list(range(6))
    assert spread_order([]) == []


def test_spread_order_spreads_reserved_lower_jobs_evenly_per_queue() -> None:
    high = [("a", 2, False)] * 6
    low = [("a", 0, True)] * 2
    # The i-th of n goes at (i + 0.5) / n: HIGH at 1/12, 3/12, ... 11/12; LOW at 3/12, 9/12
    # (after the HIGH job at the same place).
    assert spread_order(high + low) == [0, 1, 6, 2, 3, 4, 7, 5]
    # Each queue is spread on its own, against its own top tier: in "b" the reserved NORMAL
    # job is of the top tier and stays in place; the reserved LOW one goes between the two.
    b = [("b", 1, True), ("b", 1, False), ("b", 0, True)]
    assert spread_order(high + low + b) == [0, 1, 6, 2, 3, 4, 7, 5, 8, 10, 9]


async def test_the_worker_starts_a_claim_in_the_order_the_previous_release_did(
    queue: Queue,
) -> None:
    """claim_v6 spread the reserved lower-tier jobs in SQL; claim_v7 leaves that to
    `spread_order`. The same claim of a mixed backlog, through both, starts the same jobs
    in the same order."""
    await queue.enqueue_many([Work(2) for _ in range(30)], priority=Priority.HIGH)
    await queue.enqueue_many([Work(1) for _ in range(10)], priority=Priority.NORMAL)
    await queue.enqueue_many([Work(0) for _ in range(10)], priority=Priority.LOW)
    prefix = queue.store.prefix
    args = "(ARRAY['default'], ARRAY['work'], ARRAY[]::text[], 40, 3, 7, 'w', NULL, 60, NULL, 'x')"
    async with queue.store._pool_or_raise().acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        before = [r["id"] for r in await conn.fetch(f"SELECT id FROM {prefix}_claim_v6{args}")]
        await tx.rollback()
        rows = await conn.fetch(
            f"SELECT id, queue, priority, reserved FROM {prefix}_claim_v7{args}"
        )
    order = spread_order([(r["queue"], r["priority"], r["reserved"]) for r in rows])
    assert len(before) == 40
    assert sum(r["reserved"] for r in rows) == 10
    assert [rows[i]["id"] for i in order] == before


@dataclass
class Flaky(Task):
    KIND = "flaky"
    fail: bool


async def test_history_listing_and_cleanup(queue: Queue) -> None:
    async def handle(task: Flaky, ctx: Context[None], app: None) -> Outcome:
        if task.fail:
            raise TaskError.permanent("no")
        return Outcome.completed()

    ok = await queue.enqueue_many([Flaky(False) for _ in range(5)])
    bad = await queue.enqueue_many([Flaky(True) for _ in range(3)])
    later = await queue.enqueue_in(Flaky(False), timedelta(hours=1))
    worker = Worker(None, queue.store)
    worker.register(Flaky, handle)
    async with running(worker):

        async def settled() -> bool:
            s = await queue.stats()
            return s.pending == 0 and s.claimed == 0

        await until(settled)

    dead = await queue.jobs(JobFilter(status=JobStatus.DEAD))
    assert {j.id for j in dead} == set(bad)
    assert all(j.last_error == "no" for j in dead)
    page1 = await queue.jobs(JobFilter(kind="flaky", limit=4))
    page2 = await queue.jobs(JobFilter(kind="flaky", limit=10, before_id=page1[-1].id))
    assert [j.id for j in page1 + page2] == sorted([*ok, *bad, later], reverse=True)

    with pytest.raises(ValueError, match="only completed, dead or cancelled"):
        await queue.cleanup(
            CleanupCriteria(finished_before=datetime.now(UTC), status=JobStatus.PENDING)
        )
    past = datetime.now(UTC) - timedelta(hours=1)
    assert await queue.cleanup(CleanupCriteria(finished_before=past)) == 0
    future = datetime.now(UTC) + timedelta(minutes=1)
    removed = await queue.cleanup(CleanupCriteria(finished_before=future, status=JobStatus.DEAD))
    assert removed == 3
    assert await queue.job(bad[0]) is None and await queue.job_journal(bad[0]) == []
    assert await queue.cleanup(CleanupCriteria(finished_before=future)) == 5
    remaining = await queue.jobs()
    assert [j.id for j in remaining] == [later]  # pending jobs are never deleted


@dataclass
class Numbered(Task):
    KIND = "numbered"
    n: int


async def test_one_tier_runs_first_in_first_out_with_reservations(queue: Queue) -> None:
    """The claim spreads the jobs its reservations picked from below its top tier; jobs of
    one tier are picked by reservations too, and must keep their order."""
    await queue.enqueue_many(Numbered(i) for i in range(150))
    ran: list[int] = []

    async def handle(task: Numbered, ctx: Context[None], app: None) -> Outcome:
        ran.append(task.n)
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, priority_ratio=4)
    worker.register(Numbered, handle)
    async with running(worker):

        async def done() -> bool:
            return len(ran) == 150

        await until(done)
    assert ran == list(range(150))
