"""Reliability: crashes, lease renewal, shutdown, the ownership guard, many workers,
LISTEN loss, and concurrency limits.

Multi-process tests run real worker processes (`tests/runtime/workerproc.py`) and are
marked `slow`. Everything waits on events or database state, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import asyncpg
import pytest
from ulid import ULID

from venturi import (
    Context,
    JobStatus,
    JournalOutcome,
    Outcome,
    Queue,
    Task,
    Worker,
    WorkerIdentity,
)
from venturi._runner import Runner

from .helpers import WAIT_TIMEOUT, running, until, until_status
from .workerproc import RUNS_DDL, STUCK_LEASE, Recorded, Stuck, record_run

ROOT = Path(__file__).resolve().parents[2]


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of its own for the test's raw SQL (inspection and fault injection)."""
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def runs_table(pool: asyncpg.Pool, prefix: str) -> str:
    await pool.execute(RUNS_DDL.format(prefix=prefix))
    return f"{prefix}_runs"


async def job_row(pool: asyncpg.Pool, prefix: str, job_id: ULID) -> asyncpg.Record:
    row = await pool.fetchrow(
        f"SELECT status, claim_token, claimed_by, claimed_at, lease_until, run_count, failures,"
        f" carry::text AS carry, run_at <= now() AS eligible FROM {prefix}_jobs WHERE id = $1",
        job_id.to_uuid(),
    )
    assert row is not None
    return row


async def outcomes(queue: Queue, job_id: ULID) -> list[str]:
    return [e.outcome.value for e in await queue.job_journal(job_id)]


class WorkerProcess:
    """One `workerproc` subprocess; its stderr goes to a file shown when a check fails."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    async def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"worker process never got ready:\n{self.stderr()}") from None
        assert line == b"ready\n", f"worker process failed to start:\n{self.stderr()}"

    async def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


@asynccontextmanager
async def worker_processes(
    n: int,
    pg_dsn: str,
    prefix: str,
    mode: str,
    tmp_path: Path,
    *,
    concurrency: int = 4,
    lease: float | None = None,
) -> AsyncIterator[list[WorkerProcess]]:
    """Start `n` worker processes, wait until all are ready; kill whatever is left at exit."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "runtime"), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    args = ["--dsn", pg_dsn, "--prefix", prefix, "--mode", mode]
    args += ["--concurrency", str(concurrency)]
    if lease is not None:
        args += ["--lease", str(lease)]
    procs: list[WorkerProcess] = []
    try:
        for _ in range(n):
            log = tmp_path / f"workerproc-{uuid.uuid4().hex[:8]}.log"
            with log.open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "tests.runtime.workerproc",
                    *args,
                    cwd=ROOT,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                )
            procs.append(WorkerProcess(proc, log))
        for p in procs:
            await p.wait_ready()
        yield procs
    finally:
        for p in procs:
            await p.stop()


# -- 1. a worker killed mid-job ----------------------------------------------------------


@pytest.mark.slow
async def test_sigkilled_worker_job_is_recovered_and_completed_by_another(
    pg_dsn: str, prefix: str, queue: Queue, pool: asyncpg.Pool, runs_table: str, tmp_path: Path
) -> None:
    job_id = await queue.enqueue(Stuck(n=1))
    # The process's default lease matches the job's, so renewal runs at lease / 3 from the
    # claim (see test_renewal_covers_a_job_claimed_during_a_long_renewal_sleep).
    async with worker_processes(1, pg_dsn, prefix, "stuck", tmp_path, lease=STUCK_LEASE) as (
        victim,
    ):
        # The handler signals that it started by recording its run, then blocks.
        await until(lambda: pool.fetchval(f"SELECT count(*) = 1 FROM {runs_table}"))
        held = await job_row(pool, prefix, job_id)
        assert held["status"] == "claimed"
        assert f":{victim.pid}#" in held["claimed_by"]
        victim.proc.send_signal(signal.SIGKILL)
        assert await victim.proc.wait() == -signal.SIGKILL

    async def handle(task: Stuck, ctx: Context[None], app: None) -> Outcome:
        now = time.time()
        await record_run(pool, prefix, ctx, now, now)
        return Outcome.completed(note="recovered")

    rescuer = Worker(None, queue.store, concurrency=2)
    rescuer.register(Stuck, handle)
    async with running(rescuer):
        await until_status(queue, job_id, JobStatus.COMPLETED)

    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [
        JournalOutcome.STALE_RECOVERED,
        JournalOutcome.COMPLETED,
    ]
    stale, done = journal
    assert stale.is_failure
    assert stale.run == 1
    assert stale.note is not None
    assert f":{victim.pid}" in stale.note  # names the worker that died holding it
    assert done.run == 2
    assert done.note == "recovered"
    assert done.worker == str(rescuer.identity)
    job = await queue.job(job_id)
    assert job is not None
    assert job.failures == 1
    assert job.run_count == 2
    runs = await pool.fetch(f"SELECT pid, run FROM {runs_table} ORDER BY id")
    assert [(r["pid"], r["run"]) for r in runs] == [(victim.pid, 1), (os.getpid(), 2)]


# -- 2. lease renewal --------------------------------------------------------------------


SHORT_LEASE = 0.6


@dataclass
class ShortLease(Task):
    KIND = "reliability.short_lease"
    n: int = 0

    def lease(self) -> float:
        return SHORT_LEASE


async def test_lease_renewal_keeps_a_job_longer_than_its_lease(
    queue: Queue, pool: asyncpg.Pool, prefix: str
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    holder_runs: list[int] = []
    rival_runs: list[int] = []

    async def hold(task: ShortLease, ctx: Context[None], app: None) -> Outcome:
        holder_runs.append(ctx.run_count)
        started.set()
        await release.wait()
        return Outcome.completed()

    async def steal(task: ShortLease, ctx: Context[None], app: None) -> Outcome:
        rival_runs.append(ctx.run_count)
        return Outcome.completed()

    # The holder's own default lease matches the task's, so its renewal cadence starts at
    # lease / 3 (see test_renewal_covers_a_job_claimed_during_a_long_renewal_sleep).
    holder = Worker(
        None, queue.store, concurrency=1, lease=SHORT_LEASE, identity=WorkerIdentity("holder", 1)
    )
    holder.register(ShortLease, hold)
    # The rival sweeps for expired leases at least every 0.1 s and would claim the job.
    rival = Worker(
        None, queue.store, concurrency=1, poll_max=0.1, identity=WorkerIdentity("rival", 2)
    )
    rival.register(ShortLease, steal)

    job_id = await queue.enqueue(ShortLease())
    async with running(holder):
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
        async with running(rival):
            leases: set[Any] = set()

            async def renewed_for_3s() -> bool:
                row = await job_row(pool, prefix, job_id)
                if row["status"] != "claimed" or row["claimed_by"] != str(holder.identity):
                    raise AssertionError(f"the job left its holder: {dict(row)}")
                leases.add(row["lease_until"])
                # At least two renewals, the last one over 5 leases after the claim.
                return len(leases) >= 3 and (
                    (row["lease_until"] - row["claimed_at"]).total_seconds() >= 3.0
                )

            await until(renewed_for_3s)
            release.set()
            await until_status(queue, job_id, JobStatus.COMPLETED)

    assert await outcomes(queue, job_id) == ["completed"]
    (entry,) = await queue.job_journal(job_id)
    assert entry.worker == str(holder.identity)
    job = await queue.job(job_id)
    assert job is not None
    assert (job.run_count, job.failures) == (1, 0)
    assert holder_runs == [1]
    assert rival_runs == []


@dataclass
class LongLease(Task):
    KIND = "reliability.long_lease"
    n: int = 0

    def lease(self) -> float:
        return 3.0


async def test_renewal_covers_a_job_claimed_during_a_long_renewal_sleep(
    queue: Queue, pool: asyncpg.Pool, prefix: str
) -> None:
    """A 3 s-lease job puts the renewer to sleep for 1 s; a 0.6 s-lease job claimed right
    after must still have its lease renewed before it expires."""
    releases = {LongLease.KIND: asyncio.Event(), ShortLease.KIND: asyncio.Event()}
    started: dict[str, asyncio.Event] = {k: asyncio.Event() for k in releases}

    async def hold(task: Task, ctx: Context[None], app: None) -> Outcome:
        started[ctx.kind].set()
        await releases[ctx.kind].wait()
        return Outcome.completed()

    holder = Worker(None, queue.store, concurrency=2, identity=WorkerIdentity("holder", 1))
    holder.register(LongLease, hold)
    holder.register(ShortLease, hold)
    rival = Worker(
        None, queue.store, concurrency=1, poll_max=0.1, identity=WorkerIdentity("rival", 2)
    )
    rival.register(ShortLease, hold)

    long_id = await queue.enqueue(LongLease())
    async with running(holder), running(rival):
        await asyncio.wait_for(started[LongLease.KIND].wait(), WAIT_TIMEOUT)
        first = (await job_row(pool, prefix, long_id))["lease_until"]

        async def long_renewed() -> bool:
            return bool((await job_row(pool, prefix, long_id))["lease_until"] != first)

        await until(long_renewed)  # the renewer just renewed and sleeps 3.0 / 3 s now
        short_id = await queue.enqueue(ShortLease())
        leases: set[Any] = set()

        async def renewed_twice_or_recovered() -> bool:
            if "stale_recovered" in await outcomes(queue, short_id):
                return True
            row = await job_row(pool, prefix, short_id)
            if row["status"] == "claimed":
                leases.add(row["lease_until"])
            return len(leases) >= 3

        await until(renewed_twice_or_recovered)
        releases[ShortLease.KIND].set()
        releases[LongLease.KIND].set()
        await until_status(queue, short_id, JobStatus.COMPLETED)
        await until_status(queue, long_id, JobStatus.COMPLETED)
    assert await outcomes(queue, short_id) == ["completed"]


@dataclass
class HourLease(Task):
    KIND = "reliability.hour_lease"
    n: int = 0

    def lease(self) -> float:
        return 3600.0


class _WatchedChange(asyncio.Event):
    """The runner's `changed`: counts the wake-ups jobs taken on give the renewer, and says
    once the renewer waits for a renewal (not for a first job)."""

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self._runner = runner
        self.sets = 0
        self.timed = asyncio.Event()

    def set(self) -> None:
        self.sets += 1
        super().set()

    async def wait(self) -> Literal[True]:
        if math.isfinite(self._runner.renewer_looks_at):
            self.timed.set()
        return await super().wait()


async def test_a_job_taken_on_wakes_the_renewer_only_when_its_lease_is_due_sooner(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewer sleeps until the earliest renewal of what the worker holds. A job taken
    on later with the same lease is due later: it wakes nothing (every claim used to wake
    the renewer to walk every held job). A job with a shorter lease is due sooner: it does
    (test_renewal_covers_a_job_claimed_during_a_long_renewal_sleep checks the renewal)."""
    runners: list[Runner] = []
    made = Runner.__init__

    def watched(self: Runner, **options: Any) -> None:
        made(self, **options)
        self.changed = _WatchedChange(self)
        runners.append(self)

    monkeypatch.setattr(Runner, "__init__", watched)
    release = asyncio.Event()
    started: Counter[str] = Counter()
    start = asyncio.Event()

    async def hold(task: Task, ctx: Context[None], app: None) -> Outcome:
        started[ctx.kind] += 1
        start.set()
        await release.wait()
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=3)
    worker.register(HourLease, hold)
    worker.register(ShortLease, hold)

    async def taken_on(task: Task) -> None:
        start.clear()
        await queue.enqueue(task)
        await asyncio.wait_for(start.wait(), WAIT_TIMEOUT)

    async with running(worker):
        await taken_on(HourLease(1))
        (runner,) = runners
        change = runner.changed
        assert isinstance(change, _WatchedChange)
        await asyncio.wait_for(change.timed.wait(), WAIT_TIMEOUT)
        assert change.sets == 1  # the first job: the renewer was waiting for one
        await taken_on(HourLease(2))
        assert change.sets == 1  # due an hour's third after the first: nothing to wake
        await taken_on(ShortLease())
        assert change.sets == 2  # due in 0.2 s, before the renewer's next look
        release.set()
    assert started == {HourLease.KIND: 2, ShortLease.KIND: 1}


# -- 3. graceful shutdown ----------------------------------------------------------------


@dataclass
class Progress:
    step: int = 0


@dataclass
class Resumable(Task[Progress]):
    KIND = "reliability.resumable"


async def test_shutdown_lets_a_cooperative_handler_pause_with_its_carry(
    queue: Queue, pool: asyncpg.Pool, prefix: str
) -> None:
    started = asyncio.Event()

    async def wind_down(task: Resumable, ctx: Context[Progress], app: None) -> Outcome:
        ctx.carry.step = 41
        started.set()
        await ctx.cancelled()
        ctx.carry.step += 1  # progress made while winding down is kept too
        return Outcome.pause_in(0, note="wound down")

    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=WAIT_TIMEOUT)
    worker.register(Resumable, wind_down)
    job_id = await queue.enqueue(Resumable())
    async with running(worker):
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)

    job = await queue.job(job_id)
    assert job is not None
    assert job.status is JobStatus.PENDING
    assert job.carry == {"step": 42}
    assert (job.run_count, job.failures) == (1, 0)
    assert (await job_row(pool, prefix, job_id))["eligible"]
    journal = await queue.job_journal(job_id)
    assert [(e.outcome, e.note) for e in journal] == [(JournalOutcome.PAUSED, "wound down")]
    assert not journal[0].is_failure

    # The next run resumes from the persisted carry.
    resumed_at: list[int] = []

    async def resume(task: Resumable, ctx: Context[Progress], app: None) -> Outcome:
        resumed_at.append(ctx.carry.step)
        return Outcome.completed()

    successor = Worker(None, queue.store, concurrency=1)
    successor.register(Resumable, resume)
    async with running(successor):
        await until_status(queue, job_id, JobStatus.COMPLETED)
    assert resumed_at == [42]


@dataclass
class Stubborn(Task):
    KIND = "reliability.stubborn"


async def test_shutdown_aborts_a_stubborn_handler_and_releases_its_job(
    queue: Queue, pool: asyncpg.Pool, prefix: str
) -> None:
    started = asyncio.Event()
    aborted: list[bool] = []

    async def ignore_cancel(task: Stubborn, ctx: Context[None], app: None) -> Outcome:
        started.set()
        try:
            await asyncio.sleep(3600)  # never looks at ctx.cancelled()
        except asyncio.CancelledError:
            aborted.append(ctx.is_cancelled)
            raise
        return Outcome.completed()

    worker = Worker(None, queue.store, concurrency=1, shutdown_timeout=0.3)
    worker.register(Stubborn, ignore_cancel)
    job_id = await queue.enqueue(Stubborn())
    shutdown = asyncio.Event()
    run = asyncio.create_task(worker.run(shutdown))
    try:
        await asyncio.wait_for(started.wait(), WAIT_TIMEOUT)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        shutdown.set()
        await asyncio.wait_for(asyncio.shield(run), WAIT_TIMEOUT)
        took = loop.time() - begun
    finally:
        shutdown.set()
        await asyncio.wait_for(run, WAIT_TIMEOUT)

    assert took < 5.0  # the 0.3 s grace period bounds the shutdown, not the handler
    assert aborted == [True]  # asked to wind down first, aborted after the grace period
    job = await queue.job(job_id)
    assert job is not None
    assert job.status is JobStatus.PENDING
    assert (job.run_count, job.failures, job.last_error) == (1, 0, None)
    assert (await job_row(pool, prefix, job_id))["eligible"]  # eligible again at once
    journal = await queue.job_journal(job_id)
    assert [e.outcome for e in journal] == [JournalOutcome.RELEASED]
    assert not journal[0].is_failure


# -- 4. the ownership guard --------------------------------------------------------------


@dataclass
class Guarded(Task):
    KIND = "reliability.guarded"


async def test_a_settlement_after_losing_the_claim_is_dropped(
    queue: Queue, pool: asyncpg.Pool, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = {name: asyncio.Event() for name in ("a_started", "a_go", "b_started", "b_go")}

    async def first(task: Guarded, ctx: Context[None], app: None) -> Outcome:
        events["a_started"].set()
        await events["a_go"].wait()
        return Outcome.completed(note="first")

    async def second(task: Guarded, ctx: Context[None], app: None) -> Outcome:
        events["b_started"].set()
        await events["b_go"].wait()
        return Outcome.completed(note="second")

    # Default leases (15 min): the first worker will not renew, or notice, during the test.
    worker_a = Worker(None, queue.store, concurrency=1, identity=WorkerIdentity("first", 1))
    worker_a.register(Guarded, first)
    worker_b = Worker(None, queue.store, concurrency=1, identity=WorkerIdentity("second", 2))
    worker_b.register(Guarded, second)
    job_id = await queue.enqueue(Guarded())

    caplog.set_level(logging.WARNING, logger="venturi")
    async with running(worker_a):
        await asyncio.wait_for(events["a_started"].wait(), WAIT_TIMEOUT)
        token_a = (await job_row(pool, prefix, job_id))["claim_token"]
        # The first worker hangs past its lease (simulated): the lease runs out.
        await pool.execute(
            f"UPDATE {prefix}_jobs SET lease_until = now() - interval '1 second' WHERE id = $1",
            job_id.to_uuid(),
        )
        async with running(worker_b):
            await asyncio.wait_for(events["b_started"].wait(), WAIT_TIMEOUT)
            taken = await job_row(pool, prefix, job_id)
            assert taken["status"] == "claimed"
            assert taken["claimed_by"] == str(worker_b.identity)
            assert taken["claim_token"] != token_a
            assert (taken["run_count"], taken["failures"]) == (2, 1)

            # The first handler finishes now; its claim is gone.
            events["a_go"].set()

            async def first_settled_as_lost() -> bool:
                return worker_a.in_flight == 0 and worker_a._settled["lost"] == 1

            await until(first_settled_as_lost)
            assert worker_a._settled == Counter({"lost": 1})
            lost_logs = [
                r
                for r in caplog.records
                if r.name == "venturi._completer" and "claim lost before settling" in r.message
            ]
            assert len(lost_logs) == 1
            assert str(job_id) in lost_logs[0].getMessage()

            after = await job_row(pool, prefix, job_id)
            assert dict(after) == dict(taken)  # the second claim's state is untouched
            assert await outcomes(queue, job_id) == ["stale_recovered"]

            events["b_go"].set()
            await until_status(queue, job_id, JobStatus.COMPLETED)

    journal = await queue.job_journal(job_id)
    assert [(e.outcome.value, e.run, e.worker) for e in journal] == [
        ("stale_recovered", 1, str(worker_b.identity)),
        ("completed", 2, str(worker_b.identity)),
    ]
    assert journal[1].note == "second"


# -- 5. many worker processes ------------------------------------------------------------


JOBS = 5000


@pytest.mark.slow
async def test_three_worker_processes_run_every_job_exactly_once(
    pg_dsn: str, prefix: str, queue: Queue, pool: asyncpg.Pool, runs_table: str, tmp_path: Path
) -> None:
    async with worker_processes(3, pg_dsn, prefix, "record", tmp_path, concurrency=4) as procs:
        ids = await queue.enqueue_many(Recorded(n=i) for i in range(JOBS))

        async def all_completed() -> bool:
            n = await pool.fetchval(
                f"SELECT count(*) FROM {prefix}_jobs WHERE status = 'completed'"
            )
            for p in procs:
                assert p.proc.returncode is None, f"a worker died:\n{p.stderr()}"
            return bool(n == JOBS)

        await until(all_completed, limit=90)
        for p in procs:
            p.proc.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(p.proc.wait(), WAIT_TIMEOUT) for p in procs]
        assert codes == [0, 0, 0], [p.stderr() for p in procs]
        for p in procs:
            assert p.proc.stdout is not None
            assert await p.proc.stdout.read() == b"stopped\n"

    wanted = {i.to_uuid() for i in ids}
    journal = await pool.fetch(f"SELECT job_id, outcome FROM {prefix}_journal")
    assert Counter(r["outcome"] for r in journal) == {"completed": JOBS}
    assert Counter(r["job_id"] for r in journal) == dict.fromkeys(wanted, 1)

    runs = await pool.fetch(f"SELECT job_id, pid, run, started, ended FROM {runs_table}")
    by_job: dict[uuid.UUID, list[asyncpg.Record]] = defaultdict(list)
    for r in runs:
        by_job[r["job_id"]].append(r)
    assert set(by_job) == wanted  # none lost
    for job_runs in by_job.values():
        spans = sorted((r["started"], r["ended"]) for r in job_runs)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "one job ran twice at the same time"
    assert len(runs) == JOBS  # and none ran twice at all
    assert {r["run"] for r in runs} == {1}
    per_process = Counter(r["pid"] for r in runs)
    assert set(per_process) == {p.pid for p in procs}, per_process  # all three did work


# -- 6. LISTEN loss ----------------------------------------------------------------------


@dataclass
class Ping(Task):
    KIND = "reliability.ping"
    n: int = 0


async def test_listen_connection_is_reestablished_after_termination(
    queue: Queue, pool: asyncpg.Pool, prefix: str
) -> None:
    async def listeners() -> list[int]:
        rows = await pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND query LIKE $1",
            f"%{prefix}_jobs%",
        )
        return [r["pid"] for r in rows]

    async def handle(task: Ping, ctx: Context[None], app: None) -> None:
        return None

    # Two slots: a finished job never leaves the claim loop waiting on a freed slot, so
    # after the first job only a notification (or poll_max) can wake it.
    worker = Worker(None, queue.store, concurrency=2, poll_max=60)
    worker.register(Ping, handle)
    async with running(worker):
        assert worker.notifier is not None
        notifier = worker.notifier
        (old,) = await listeners()
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", old)

        async def reconnected() -> bool:
            return notifier.reconnects >= 1 and len(await listeners()) == 1

        await until(reconnected)
        assert old not in await listeners()

        # Only a NOTIFY can wake the claim loop before poll_max (60 s). The first job may
        # ride on the wake-up sent after reconnecting; the second can only be notified.
        for n in (1, 2):
            job_id = await queue.enqueue(Ping(n=n))
            await asyncio.wait_for(until_status(queue, job_id, JobStatus.COMPLETED), 10)
        assert notifier.reconnects == 1


# -- 7. concurrency limits ---------------------------------------------------------------


@dataclass
class Block(Task):
    KIND = "reliability.block"
    n: int = 0


@dataclass
class Capped(Task):
    KIND = "reliability.capped"
    n: int = 0


class Gate:
    """Handlers that block until the test lets them go one at a time, counted by kind."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(0))
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.peak_total = 0
        self.started: Counter[str] = Counter()

    async def handle(self, task: Task, ctx: Context[None], app: None) -> None:
        self.now[ctx.kind] += 1
        self.started[ctx.kind] += 1
        self.peak[ctx.kind] = max(self.peak[ctx.kind], self.now[ctx.kind])
        self.peak_total = max(self.peak_total, self.now.total())
        try:
            await self.gates[ctx.kind].acquire()
        finally:
            self.now[ctx.kind] -= 1

    def release(self, kind: str) -> None:
        self.gates[kind].release()


@pytest.mark.parametrize("prefetch", [False, True])
async def test_concurrency_bounds_jobs_running_and_claimed(queue: Queue, prefetch: bool) -> None:
    gate = Gate()
    # These handlers end as soon as the test sees them run, often sooner than a claim's round
    # trip on a slow server: then a worker that may prefetch claims ahead, and only the jobs
    # running are bounded; without prefetch, the jobs claimed are too.
    worker = Worker(None, queue.store, concurrency=3, prefetch=prefetch)
    worker.register(Block, gate.handle)
    ids = await queue.enqueue_many(Block(n=i) for i in range(10))
    kind = Block.KIND

    async with running(worker):
        for done in range(10):
            busy = min(3, 10 - done)

            async def settled_state(done: int = done, busy: int = busy) -> bool:
                stats = await queue.stats()
                claimed = stats.claimed_by_kind.get(kind, 0)
                pending = stats.pending_by_kind.get(kind, 0)
                return gate.started[kind] == done + busy and (
                    claimed + pending == 10 - done
                    if prefetch
                    else claimed == busy and pending == 10 - done - busy
                )

            await until(settled_state)
            assert gate.now[kind] == busy
            assert worker.in_flight == busy
            gate.release(kind)
        for job_id in ids:
            await until_status(queue, job_id, JobStatus.COMPLETED)

    assert gate.started[kind] == 10
    assert gate.peak[kind] == 3


async def test_per_kind_cap_leaves_extra_jobs_pending_while_others_run(queue: Queue) -> None:
    gate = Gate()
    # A short poll_max gives the claim loop many more chances to overstep the cap (and
    # sidesteps the slow wake-up of test_capped_kind_resumes_promptly_when_its_slot_frees).
    worker = Worker(None, queue.store, concurrency=4, poll_max=0.2)
    worker.register(Capped, gate.handle, cap=1)
    worker.register(Block, gate.handle)
    capped_ids = await queue.enqueue_many(Capped(n=i) for i in range(3))
    await queue.enqueue_many(Block(n=i) for i in range(2))

    async with running(worker):
        for done in range(3):

            async def capped_state(done: int = done) -> bool:
                stats = await queue.stats()
                return (
                    gate.started[Capped.KIND] == done + 1
                    and gate.started[Block.KIND] == 2
                    and stats.claimed_by_kind == {Capped.KIND: 1, Block.KIND: 2}
                    and stats.pending_by_kind.get(Capped.KIND, 0) == 2 - done
                )

            await until(capped_state)
            # A slot is free (3 of 4 in use), yet the capped kind's extra jobs stay pending.
            assert worker.in_flight == 3
            assert gate.now == {Capped.KIND: 1, Block.KIND: 2}
            gate.release(Capped.KIND)
        for job_id in capped_ids:
            await until_status(queue, job_id, JobStatus.COMPLETED)
        gate.release(Block.KIND)
        gate.release(Block.KIND)

        async def all_done() -> bool:
            return (await queue.stats()).claimed == 0 and worker.in_flight == 0

        await until(all_done)

    assert gate.peak[Capped.KIND] == 1
    assert gate.peak[Block.KIND] == 2
    assert gate.peak_total == 3
    assert gate.started == {Capped.KIND: 3, Block.KIND: 2}


async def test_capped_kind_resumes_promptly_when_its_slot_frees(queue: Queue) -> None:
    gate = Gate()
    worker = Worker(None, queue.store, concurrency=2, poll_max=60)
    worker.register(Capped, gate.handle, cap=1)
    await queue.enqueue_many(Capped(n=i) for i in range(2))

    async def started(n: int) -> bool:
        return gate.started[Capped.KIND] == n

    async with running(worker):
        await until(lambda: started(1))
        gate.release(Capped.KIND)
        try:
            # The freed slot alone must start the next job, long before poll_max (60 s).
            await until(lambda: started(2), limit=5.0)
        finally:
            gate.release(Capped.KIND)


@dataclass
class Brief(Task):
    """A task with the shortest lease a job may have."""

    KIND = "brief"
    n: int

    def lease(self) -> float:
        return 0.5


async def test_a_claim_reply_that_comes_as_its_lease_ends_hands_the_job_back(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim whose reply arrives when its leases are about to end (a stalled connection):
    the job may be recovered and claimed elsewhere already, so the worker never starts it
    from that claim; it hands it back unrun (or the rescuer has recovered it first) and runs
    it from a later claim."""
    store = queue.store
    claim = store.claim
    replies: list[int] = []

    async def stalled_once(**kwargs: Any) -> Any:
        jobs = await claim(**kwargs)
        if jobs and not replies:
            await asyncio.sleep(0.6)  # the stall itself: past the 0.5 s lease's abort point
        if jobs:
            replies.append(len(jobs))
        return jobs

    monkeypatch.setattr(store, "claim", stalled_once)
    caplog.set_level(logging.WARNING, logger="venturi")
    runs: list[int] = []
    done = asyncio.Event()

    async def handle(task: Brief, ctx: Context[None], app: None) -> None:
        runs.append(len(replies))  # which claim's reply started it
        done.set()

    worker = Worker(None, store, concurrency=1)
    worker.register(Brief, handle)
    async with running(worker):
        await queue.enqueue(Brief(1))
        await asyncio.wait_for(done.wait(), WAIT_TIMEOUT)
    assert replies == [1, 1]  # the stalled claim's job came back from the next claim
    assert runs == [2]  # run once, from the second claim
    assert any("arrived as its lease was ending" in r.getMessage() for r in caplog.records)
