"""The failure hook runs exactly once across crashes: real worker processes SIGKILLed during a
job's last attempt, and inside the hook before it did anything; the hook then runs in another
process, once, and never in two at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from venturi import JobStatus, PostgresStore, Queue

from .harness import FIGURES, fleet, read_runs, wait_until
from .worker import Doomed

LEASE = 2.0


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


def hook_records(runs_dir: Path, mark: str) -> dict[str, list[tuple[int, str]]]:
    """job -> [(pid, error text)] of the hook records `mark` (F: ran, W: entered, blocked)."""
    found: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for path in runs_dir.glob("runs-*.log"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            parts = line.split(" ", 4)
            if len(parts) >= 4 and parts[0] == mark:
                found[parts[1]].append((pid, parts[4] if len(parts) > 4 else ""))
    return found


async def pending_steps(pool: asyncpg.Pool, prefix: str) -> int:
    n: int = await pool.fetchval(f"SELECT count(*) FROM {prefix}_jobs WHERE hook_token IS NOT NULL")
    return n


@pytest.mark.slow
async def test_a_worker_killed_during_the_last_attempt(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    queue = Queue(store)
    job_id = await queue.enqueue(Doomed(0, hang=True))
    args = ["--lease", str(LEASE), "--poll-max", "0.5", "--backstop", "1"]
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        first = await workers.start()

        async def started() -> bool:
            return len(read_runs(tmp_path)) == 1

        await wait_until(started, 30, "the last attempt started")
        await workers.kill(first)
        second = await workers.start()

        async def hook_ran() -> bool:
            return bool(hook_records(tmp_path, "F")) and await pending_steps(pool, prefix) == 0

        await wait_until(hook_ran, 30, "the failure hook ran")
        assert await workers.stop() == [0]

    job = await queue.job(job_id)
    assert job is not None and job.status is JobStatus.DEAD
    ran = hook_records(tmp_path, "F")
    assert list(ran) == [str(job_id.to_uuid())]
    ((pid, error),) = ran[str(job_id.to_uuid())]  # once, in the worker that recovered it
    assert pid == second.pid
    assert error.startswith("the worker stopped during the last attempt (lease expired while")
    assert error == job.last_error
    FIGURES.append("failure hook, worker SIGKILLed during the last attempt: ran once, elsewhere")


@pytest.mark.slow
async def test_workers_killed_inside_the_hook(
    pg_dsn: str, store: PostgresStore, pool: asyncpg.Pool, prefix: str, tmp_path: Path
) -> None:
    jobs = 12
    queue = Queue(store)
    ids = {str((await queue.enqueue(Doomed(i))).to_uuid()) for i in range(jobs)}
    args = ["--lease", str(LEASE), "--poll-max", "0.5"]
    async with fleet(pg_dsn, prefix, tmp_path, args) as workers:
        blocking = await workers.start(extra=["--hook-blocks", "--concurrency", "16"])

        async def all_entered() -> bool:
            return len(hook_records(tmp_path, "W")) == jobs

        # Every job is dead and its hook entered (and blocked) in the first worker ...
        await wait_until(all_entered, 30, "every hook entered")
        await workers.kill(blocking)
        assert await pending_steps(pool, prefix) == jobs
        # ... which is killed: three workers race for the steps once their leases end.
        others = [await workers.start() for _ in range(3)]

        async def all_ran() -> bool:
            return await pending_steps(pool, prefix) == 0

        await wait_until(all_ran, 60, "every failure hook ran")
        assert await workers.stop() == [0, 0, 0]

    ran = hook_records(tmp_path, "F")
    assert set(ran) == ids
    twice = {job: runs for job, runs in ran.items() if len(runs) != 1}
    assert twice == {}, f"hooks that ran more than once: {twice}"
    assert {pid for runs in ran.values() for pid, _ in runs} <= {p.pid for p in others}
    for runs in ran.values():
        assert runs[0][1].startswith("doomed ")  # the recorded error, the exception is gone
    FIGURES.append(
        f"failure hook, worker SIGKILLed inside {jobs} hooks: each ran once, in "
        f"{len({pid for runs in ran.values() for pid, _ in runs})} of 3 racing workers"
    )
