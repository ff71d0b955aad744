"""A batch of 10,000 jobs drained by three worker processes that are SIGKILLed and restarted
during it: every member is settled once, the batch's counters equal the journal, and each
callback is released exactly once, after the last member."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from venturi import PostgresStore, Queue

from .conftest import SOAK
from .harness import FIGURES, fleet, journals, overlaps, read_runs, unexplained_reruns
from .worker import Doomed, Work

LEASE = 2.0
WORKERS = 3
MEMBERS = 20_000 if SOAK else 10_000
KILL_EVERY = (0.5, 1.5)
DEADLINE = 900 if SOAK else 300


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.slow
async def test_a_batch_survives_sigkilled_workers(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(20261202)
    queue = Queue(store)
    batch = queue.batch("kills").add(*(Work(i, rng.randint(1, 20)) for i in range(MEMBERS)))
    batch.then(Work(-1, 0)).catch(Work(-2, 0)).finally_(Work(-3, 0))
    batch_id = await batch.enqueue()

    async def callbacks_settled() -> bool:
        n = await pool.fetchval(
            f"SELECT count(*) FROM {prefix}_jobs WHERE batch_id = $1 "
            "AND batch_callback IS NOT NULL AND status IN ('completed', 'cancelled')",
            batch_id.to_uuid(),
        )
        return bool(n == 3)

    args = ["--concurrency", "8", "--lease", str(LEASE)]
    kills = 0
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        for _ in range(WORKERS):
            await workers.start()
        began = time.monotonic()
        while not await callbacks_settled():
            assert time.monotonic() - began < DEADLINE, f"not done after {DEADLINE}s"
            assert not workers.exited(), workers.exited()
            await asyncio.sleep(rng.uniform(*KILL_EVERY))
            status = await queue.batch_status(batch_id)
            assert status is not None
            if status.finished:
                continue  # the callbacks are left to run: no kills among them
            await workers.kill(rng.choice(workers.live()))
            kills += 1
            await workers.start()
        drained = time.monotonic() - began
        assert await workers.stop() == [0] * WORKERS

    status = await queue.batch_status(batch_id)
    assert status is not None and status.finished_at is not None
    jobs = await pool.fetch(
        f"SELECT id, status, run_count, batch_callback FROM {prefix}_jobs WHERE batch_id = $1",
        batch_id.to_uuid(),
    )
    members = [j for j in jobs if j["batch_callback"] is None]
    callbacks = {j["batch_callback"]: j for j in jobs if j["batch_callback"] is not None}
    journal = await journals(pool, prefix)
    completions = Counter(
        str(j["id"])
        for j in members
        for e in journal.get(str(j["id"]), [])
        if e["outcome"] == "completed"
    )
    runs = read_runs(tmp_path)
    clashes = overlaps(runs, workers.kills)
    unexplained = unexplained_reruns(list(jobs), journal)
    reruns = sum(j["run_count"] - 1 for j in members)
    FIGURES.append(
        f"batch of {MEMBERS} under SIGKILL: {kills} kills in {drained:.0f}s, {reruns} member "
        f"re-runs; counters done {status.done} / failed {status.failed} / cancelled "
        f"{status.cancelled}; journal completions {sum(completions.values())}; callbacks "
        f"{sorted((k, v['status']) for k, v in callbacks.items())}; overlaps {len(clashes)}"
    )
    assert len(members) == status.total == MEMBERS
    assert {j["status"] for j in members} == {"completed"}
    # Counters equal the journal: one completion per member, no more, no fewer.
    assert (status.done, status.failed, status.cancelled, status.pending) == (MEMBERS, 0, 0, 0)
    assert len(completions) == MEMBERS and set(completions.values()) == {1}
    # Each callback decided once: then and finally ran once (a recorded start each, one
    # completion in the journal), catch was dropped; both started after the last member.
    assert {k: v["status"] for k, v in callbacks.items()} == {
        "then": "completed",
        "catch": "cancelled",
        "finally": "completed",
    }
    for which in ("then", "finally"):
        job_id = str(callbacks[which]["id"])
        assert [e["outcome"] for e in journal[job_id]] == ["completed"]
        starts = [r.start for r in runs if r.job == job_id]
        assert len(starts) == 1 and starts[0] >= status.finished_at.timestamp() - 0.5
    assert kills > 0
    assert clashes == []
    assert unexplained == []


@pytest.mark.slow
async def test_failures_in_a_batch_under_sigkill_are_counted_once(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    """allow_failures: 30 of 3,000 members fail for good while workers are killed; the
    batch counts each failure once (as the journal does), `catch` runs once at the first,
    `then` is dropped and `finally` runs once."""
    rng = random.Random(20261203)
    queue = Queue(store)
    doomed = set(rng.sample(range(3000), 30))
    tasks = [Doomed(i) if i in doomed else Work(i, rng.randint(1, 20)) for i in range(3000)]
    batch = queue.batch("failures").add(*tasks).allow_failures()
    batch.then(Work(-1, 0)).catch(Work(-2, 0)).finally_(Work(-3, 0))
    batch_id = await batch.enqueue()
    args = ["--concurrency", "8", "--lease", str(LEASE)]
    kills = 0
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        for _ in range(WORKERS):
            await workers.start()
        began = time.monotonic()
        while True:
            status = await queue.batch_status(batch_id)
            assert status is not None
            if status.finished:
                break
            assert time.monotonic() - began < DEADLINE, f"not done after {DEADLINE}s"
            assert not workers.exited(), workers.exited()
            await asyncio.sleep(rng.uniform(*KILL_EVERY))
            await workers.kill(rng.choice(workers.live()))
            kills += 1
            await workers.start()

        async def callbacks_settled() -> bool:
            n = await pool.fetchval(
                f"SELECT count(*) FROM {prefix}_jobs WHERE batch_id = $1 "
                "AND batch_callback IS NOT NULL AND status IN ('completed', 'cancelled')",
                batch_id.to_uuid(),
            )
            return bool(n == 3)

        while not await callbacks_settled():
            assert time.monotonic() - began < DEADLINE, "callbacks not settled"
            await asyncio.sleep(0.1)
        assert await workers.stop() == [0] * WORKERS

    status = await queue.batch_status(batch_id)
    assert status is not None
    journal = await journals(pool, prefix)
    jobs = await pool.fetch(
        f"SELECT id, status, batch_callback FROM {prefix}_jobs WHERE batch_id = $1",
        batch_id.to_uuid(),
    )
    members = [j for j in jobs if j["batch_callback"] is None]
    outcomes = Counter(
        e["outcome"]
        for j in members
        for e in journal.get(str(j["id"]), [])
        if e["outcome"] in ("completed", "dead")
    )
    callbacks = {j["batch_callback"]: j for j in jobs if j["batch_callback"] is not None}
    FIGURES.append(
        f"batch of 3000 with 30 failing, allow_failures, {kills} kills: done {status.done}, "
        f"failed {status.failed}; journal {dict(outcomes)}; callbacks "
        f"{sorted((k, v['status']) for k, v in callbacks.items())}"
    )
    assert (status.done, status.failed, status.cancelled) == (2970, 30, 0)
    assert outcomes == Counter({"completed": 2970, "dead": 30})
    assert {k: v["status"] for k, v in callbacks.items()} == {
        "then": "cancelled",
        "catch": "completed",
        "finally": "completed",
    }
    for which in ("catch", "finally"):
        assert [e["outcome"] for e in journal[str(callbacks[which]["id"])]] == ["completed"]
    assert kills > 0
