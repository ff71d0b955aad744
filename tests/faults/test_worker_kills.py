"""Workers SIGKILLed and restarted while they drain: every job completes, none runs twice at
once, every re-run is a recorded recovery, and recovery follows the lease at once (rescuers
learn of other workers' leases from the claims themselves, not from polling)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from venturi import PostgresStore, Queue

from .conftest import SOAK
from .harness import (
    FIGURES,
    fleet,
    journals,
    overlaps,
    read_runs,
    recovery_delays,
    unexplained_reruns,
)
from .worker import Work

LEASE = 2.0
WORKERS = 3
JOBS = 20_000 if SOAK else 5_000
KILL_EVERY = (2.0, 4.0)
"""Seconds between kills, drawn uniformly."""
DEADLINE = 900 if SOAK else 240
"""Seconds the drain may take before the scenario fails."""


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


def durations(n: int, rng: random.Random) -> list[int]:
    """Milliseconds: nine in ten jobs 5-50 ms, one in ten about a second."""
    return [rng.randint(900, 1100) if rng.random() < 0.1 else rng.randint(5, 50) for _ in range(n)]


@pytest.mark.slow
async def test_sigkill_loop(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    queue = Queue(store)
    for start in range(0, JOBS, 1000):
        batch = durations(min(1000, JOBS - start), rng)
        await queue.enqueue_many(Work(start + i, ms) for i, ms in enumerate(batch))

    args = ["--concurrency", "8", "--lease", str(LEASE)]
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        for _ in range(WORKERS):
            await workers.start()
        began = time.monotonic()
        kills = 0
        while True:
            left = await pool.fetchval(
                f"SELECT count(*) FROM {prefix}_jobs WHERE status <> 'completed'"
            )
            if left == 0:
                break
            assert time.monotonic() - began < DEADLINE, f"{left} jobs left after {DEADLINE}s"
            assert not workers.exited(), workers.exited()
            await asyncio.sleep(rng.uniform(*KILL_EVERY))
            victim = rng.choice(workers.live())
            await workers.kill(victim)
            kills += 1
            await workers.start()
        drained = time.monotonic() - began
        codes = await workers.stop()
        assert codes == [0] * WORKERS, [p.stderr() for p in workers.procs if p.alive]

    jobs = await pool.fetch(f"SELECT id, status, run_count FROM {prefix}_jobs")
    journal = await journals(pool, prefix)
    runs = read_runs(tmp_path)
    ran = {r.job for r in runs}
    lost = [j["id"] for j in jobs if j["status"] != "completed" or str(j["id"]) not in ran]
    clashes = overlaps(runs, workers.kills)
    unexplained = unexplained_reruns(list(jobs), journal)
    delays = recovery_delays(journal, workers.kills)
    reruns = sum(j["run_count"] - 1 for j in jobs)
    FIGURES.append(
        f"SIGKILL loop: {len(jobs)} jobs, {kills} kills in {drained:.0f}s, {reruns} re-runs, "
        f"{len(delays)} recoveries (kill to recovery: median "
        f"{statistics.median(delays) if delays else 0:.2f}s, max {max(delays, default=0):.2f}s; "
        f"lease {LEASE}s), overlaps {len(clashes)}, lost {len(lost)}, unexplained re-runs "
        f"{len(unexplained)}"
    )
    assert len(jobs) == JOBS
    assert lost == []
    assert clashes == []
    assert unexplained == []
    assert delays, "no job was recovered: the kills should have left some claimed"
    assert max(delays) <= LEASE + 1.0, sorted(delays)[-10:]
