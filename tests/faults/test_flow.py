"""Flow control across real worker processes (`venturi.flow`): runs of one key never overlap,
a SIGKILLed holder's key frees once its lease is recovered, and a rate limit holds across
workers. The handlers' own run records (see `tests.faults.worker`) are the evidence; each
scenario also runs with `--no-flow` where that shows its check would catch the fault."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from venturi import PostgresStore, Queue

from .flow_worker import Exclusive, Limited
from .harness import FIGURES, Run, fleet, journals, read_runs, wait_until

MODULE = "tests.faults.flow_worker"


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


def key_overlaps(runs: list[Run], key_of: dict[str, str], kills: dict[int, float]) -> list[str]:
    """Pairs of runs of one key that overlapped in time (a run cut by SIGKILL ends then)."""
    by_key: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_key[key_of[r.job]].append(r)
    found = []
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r.start)
        busy_until, holder = float("-inf"), None
        for r in rs:
            if r.start < busy_until:
                found.append(f"key {key}: {holder} runs until {busy_until:.3f}, {r} starts")
            end = r.end if r.end is not None else kills.get(r.pid, time.time())
            if end > busy_until:
                busy_until, holder = end, r
    return found


async def drained(pool: asyncpg.Pool, prefix: str) -> bool:
    left = await pool.fetchval(f"SELECT count(*) FROM {prefix}_jobs WHERE status <> 'completed'")
    return bool(left == 0)


async def overlap_scenario(
    pg_dsn: str,
    store: PostgresStore,
    pool: asyncpg.Pool,
    prefix: str,
    runs_dir: Path,
    *,
    flow: bool,
) -> tuple[list[str], dict[str, list[asyncpg.Record]]]:
    queue = Queue(store)
    keys = ["a", "b", "c"]
    ids = await queue.enqueue_many(Exclusive(i, keys[i % 3], 20 + i % 4 * 10) for i in range(60))
    args = ["--concurrency", "4", "--release-after", "0.05", *([] if flow else ["--no-flow"])]
    async with fleet(pg_dsn, prefix, runs_dir, args, module=MODULE) as workers:
        for _ in range(3):
            await workers.start()
        await wait_until(lambda: drained(pool, prefix), 120, "every job completed")
        assert await workers.stop() == [0, 0, 0]
    key_of = {str(job_id.to_uuid()): keys[i % 3] for i, job_id in enumerate(ids)}
    return key_overlaps(read_runs(runs_dir), key_of, {}), await journals(pool, prefix)


@pytest.mark.slow
async def test_runs_of_one_key_never_overlap(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    clashes, journal = await overlap_scenario(pg_dsn, store, pool, prefix, tmp_path, flow=True)
    assert clashes == []
    waits = [e for entries in journal.values() for e in entries if e["outcome"] == "paused"]
    assert waits, "3 workers x 4 slots on 3 keys: some job must have waited for its key"
    assert all(" on key " in e["note"] and e["note"].startswith("overlaps job ") for e in waits)
    completed = [e for entries in journal.values() for e in entries if e["outcome"] == "completed"]
    assert len(completed) == 60  # each job ran to completion exactly once
    jobs = await pool.fetch(f"SELECT failures FROM {prefix}_jobs")
    assert {j["failures"] for j in jobs} == {0}  # waiting for a key uses no attempt
    FIGURES.append(
        f"without_overlapping: 60 jobs, 3 keys, 3 workers: {len(waits)} waits, 0 overlaps"
    )


@pytest.mark.slow
async def test_the_overlap_check_catches_overlaps(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    """The same scenario without the middleware: the check above would fail."""
    clashes, _ = await overlap_scenario(pg_dsn, store, pool, prefix, tmp_path, flow=False)
    assert clashes


@pytest.mark.slow
async def test_a_killed_holders_key_frees_after_its_lease(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    lease = 2.0
    queue = Queue(store)
    holder = await queue.enqueue(Exclusive(1, "k", 600_000))  # would hold "k" for 10 minutes
    args = ["--concurrency", "2", "--lease", str(lease), "--release-after", "0.2"]
    async with fleet(pg_dsn, prefix, tmp_path, args, module=MODULE) as workers:
        first = await workers.start()

        async def holder_running() -> bool:
            return any(r.job == str(holder.to_uuid()) for r in read_runs(tmp_path))

        await wait_until(holder_running, 30, "the holder started")
        waiter = await queue.enqueue(Exclusive(2, "k", 0))
        await workers.start()

        async def waited() -> bool:
            entries = await store.journal(waiter)
            return any(e.outcome == "paused" for e in entries)

        await wait_until(waited, 30, "the second job waited for the key")
        await workers.kill(first)
        killed_at = workers.kills[first.pid]
        await wait_until(lambda: drained(pool, prefix), 60, "both jobs completed")
        assert await workers.stop() == [0]

    runs = read_runs(tmp_path)
    waiter_runs = [r for r in runs if r.job == str(waiter.to_uuid())]
    assert len(waiter_runs) == 1
    # The key stayed held while the dead holder's lease lasted, and freed once it was
    # recovered: the waiter ran after the kill, within a lease and a few waits of it.
    assert waiter_runs[0].start > killed_at
    assert waiter_runs[0].start - killed_at < lease + 5.0
    notes = [e.note for e in await store.journal(waiter) if e.outcome == "paused"]
    assert notes and all(n == f"overlaps job {holder} on key 'k'" for n in notes)
    holder_journal = [e.outcome for e in await store.journal(holder)]
    assert "stale_recovered" in holder_journal
    key_of = {str(holder.to_uuid()): "k", str(waiter.to_uuid()): "k"}
    assert key_overlaps(runs, key_of, workers.kills) == []


RATE_JOBS = 1000
RATE_MAX = 60
RATE_PER = 1.0


async def rate_scenario(
    pg_dsn: str,
    store: PostgresStore,
    pool: asyncpg.Pool,
    prefix: str,
    runs_dir: Path,
    *,
    flow: bool,
) -> tuple[dict[int, int], list[float], int]:
    """Starts per window, every start time, and the put-backs (journaled pauses)."""
    await Queue(store).enqueue_many(Limited(i) for i in range(RATE_JOBS))
    args = ["--concurrency", "8", "--rate-max", str(RATE_MAX), "--rate-per", str(RATE_PER)]
    async with fleet(
        pg_dsn, prefix, runs_dir, [*args, *([] if flow else ["--no-flow"])], module=MODULE
    ) as workers:
        for _ in range(3):
            await workers.start()
        await wait_until(lambda: drained(pool, prefix), 120, "every job completed")
        assert await workers.stop() == [0, 0, 0]
    # A run's start: the handler's own record (the wall clock, which the database on this
    # host shares), taken as the handler begins, just after its start was counted. The
    # journal cannot place a start to the millisecond: an entry is written by the settle
    # after the run, and a run's duration includes waiting on the window's row lock.
    starts = sorted(r.start for r in read_runs(runs_dir))
    rows = await pool.fetch(f"SELECT outcome FROM {prefix}_journal")
    assert sum(1 for r in rows if r["outcome"] == "completed") == RATE_JOBS
    per_window: dict[int, int] = defaultdict(int)
    if flow:
        # The windows the database counted each start in, as the takes reported them (see
        # flow_worker.TakeRecordingStore); one take per run.
        ends = take_records(runs_dir)
        assert len(ends) == len(starts)
        for end in ends:
            per_window[math.floor(end / RATE_PER) - 1] += 1
    else:
        for t in starts:  # no takes: the handlers' own start records
            per_window[int(t // RATE_PER)] += 1
    return per_window, starts, sum(1 for r in rows if r["outcome"] == "paused")


def take_records(runs_dir: Path) -> list[float]:
    """When the window of each start the rate limit granted ends (plus the reply's delay)."""
    found = []
    for path in runs_dir.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "T":
                found.append(float(parts[1]))
    return found


@pytest.mark.slow
async def test_a_rate_limit_holds_across_workers(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    per_window, starts, put_back = await rate_scenario(
        pg_dsn, store, pool, prefix, tmp_path, flow=True
    )
    assert len(starts) == RATE_JOBS
    busiest = max(per_window.values())
    # Windows strictly between the first and the last are whole: the limit's throughput.
    first, last = min(per_window), max(per_window)
    inner = [per_window.get(w, 0) for w in range(first + 1, last)]
    throughput = sum(inner) / (len(inner) * RATE_PER)
    jobs = await pool.fetch(f"SELECT failures FROM {prefix}_jobs")
    FIGURES.append(
        f"rate_limited('api', {RATE_MAX}, {RATE_PER:g} s): {RATE_JOBS} jobs, 3 workers: busiest "
        f"window {busiest} starts, {throughput:.1f} starts/s over {len(inner)} whole windows "
        f"({throughput / RATE_MAX * 100:.0f}% of the limit), first to last start "
        f"{starts[-1] - starts[0]:.1f}s, {put_back} put-backs"
    )
    assert busiest <= RATE_MAX, sorted(per_window.items())
    assert throughput >= 0.9 * RATE_MAX, sorted(per_window.items())
    assert {j["failures"] for j in jobs} == {0}  # waiting for a window uses no attempt


@pytest.mark.slow
async def test_the_rate_check_catches_an_unlimited_run(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    """Without the middleware the same fleet starts far more than the limit in a window."""
    per_window, _, _ = await rate_scenario(pg_dsn, store, pool, prefix, tmp_path, flow=False)
    assert max(per_window.values()) > RATE_MAX
