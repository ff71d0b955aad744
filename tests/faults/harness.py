"""The fault-injection suite's harness: worker processes to start, kill and restart, the
handlers' own run records, and the checks every scenario makes (nothing lost, no two runs
of one job overlapping, every re-run explained by the journal).

Every process started here is stopped by the harness, also when a check fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from venturi import Context, Outcome

from .worker import Work

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0

FIGURES: list[str] = []
"""One line per scenario, printed at the end of the test run (see conftest)."""


@dataclass
class Run:
    job: str
    run: int
    pid: int
    start: float
    end: float | None = None
    how: str | None = None


@dataclass
class Proc:
    proc: asyncio.subprocess.Process
    log: Path
    identity: str = ""
    killed_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@dataclass
class Fleet:
    """Worker processes of one scenario."""

    dsn: str
    prefix: str
    runs_dir: Path
    args: list[str] = field(default_factory=list)
    wrapper: list[str] = field(default_factory=list)
    """A command to run the worker under (e.g. `ip netns exec NS`)."""
    module: str = "tests.faults.worker"
    """The worker program (`python -m MODULE --dsn ... --prefix ... --runs-dir ...`)."""
    procs: list[Proc] = field(default_factory=list)
    kills: dict[int, float] = field(default_factory=dict)
    """pid -> time.time() of its SIGKILL."""

    async def start(self, *, dsn: str | None = None, extra: Sequence[str] = ()) -> Proc:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "runtime"), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        log = self.runs_dir / f"stderr-{len(self.procs)}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *self.wrapper,
                sys.executable,
                "-m",
                self.module,
                "--dsn",
                dsn or self.dsn,
                "--prefix",
                self.prefix,
                "--runs-dir",
                str(self.runs_dir),
                *self.args,
                *extra,
                cwd=ROOT,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        p = Proc(proc, log)
        self.procs.append(p)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"worker never got ready:\n{p.stderr()}") from None
        if not line.startswith(b"ready "):
            raise AssertionError(f"worker failed to start:\n{p.stderr()}")
        p.identity = line.split(b" ", 1)[1].decode().strip()
        return p

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.alive]

    async def kill(self, p: Proc) -> None:
        self.kills[p.pid] = p.killed_at = time.time()
        p.proc.send_signal(signal.SIGKILL)
        await p.proc.wait()

    def exited(self) -> list[str]:
        """Processes that ended without being killed or stopped by the harness."""
        return [
            f"pid {p.pid} exited {p.proc.returncode}:\n{p.stderr()}"
            for p in self.procs
            if not p.alive and p.killed_at is None
        ]

    async def stop(self, grace: float = 60) -> list[int | None]:
        """SIGTERM every live process and return their exit statuses (killed if stuck)."""
        live = self.live()
        for p in live:
            p.proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for p in live:
            try:
                codes.append(await asyncio.wait_for(p.proc.wait(), grace))
            except TimeoutError:
                await self._report_stuck(p, grace)
                p.proc.kill()
                await p.proc.wait()
                codes.append(None)
        return codes

    async def _report_stuck(self, p: Proc, grace: float) -> None:
        """Ask a worker stuck in its shutdown where its tasks are (the test workers dump
        them on SIGUSR1), and print that with its log: pytest shows it with the failure."""
        p.proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1.0)  # the dump is written by its event loop, if that still runs
        print(f"pid {p.pid} still running {grace:.0f}s after SIGTERM:\n{p.stderr()}")

    async def close(self) -> None:
        for p in self.procs:
            if p.alive:
                p.proc.kill()
                await p.proc.wait()


@asynccontextmanager
async def fleet(
    dsn: str,
    prefix: str,
    runs_dir: Path,
    args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
    module: str = "tests.faults.worker",
) -> AsyncIterator[Fleet]:
    f = Fleet(dsn, prefix, runs_dir, list(args), list(wrapper), module=module)
    try:
        yield f
    finally:
        await f.close()


def read_runs(runs_dir: Path) -> list[Run]:
    """Every handler run recorded by every worker process of a scenario."""
    runs: dict[tuple[str, int, int], Run] = {}
    for path in runs_dir.glob("runs-*.log"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue  # a line cut by SIGKILL mid-write
            key = (parts[1], int(parts[2]), pid)
            if parts[0] == "S":
                runs[key] = Run(parts[1], int(parts[2]), pid, float(parts[3]))
            elif parts[0] == "E" and key in runs:
                runs[key].end = float(parts[3])
                runs[key].how = parts[4] if len(parts) > 4 else None
    return list(runs.values())


def overlaps(runs: list[Run], kills: dict[int, float]) -> list[str]:
    """Pairs of runs of one job that overlapped in time. A run with no end record ended
    when its process was killed; one with neither is taken to run until now."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    found = []
    for job, rs in by_job.items():
        rs.sort(key=lambda r: r.start)
        for a, b in itertools.pairwise(rs):
            end = a.end if a.end is not None else kills.get(a.pid, time.time())
            if b.start < end:
                found.append(
                    f"job {job}: run {a.run} (pid {a.pid}) until {end:.3f} overlaps "
                    f"run {b.run} (pid {b.pid}) from {b.start:.3f}"
                )
    return found


async def journals(pool: asyncpg.Pool, prefix: str) -> dict[str, list[asyncpg.Record]]:
    rows = await pool.fetch(
        f"SELECT job_id, run, outcome, note, worker, extract(epoch FROM at)::float8 AS at "
        f"FROM {prefix}_journal ORDER BY id"
    )
    out: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for r in rows:
        out[str(r["job_id"])].append(r)
    return out


def unexplained_reruns(
    jobs: list[asyncpg.Record], journal: dict[str, list[asyncpg.Record]]
) -> list[str]:
    """Runs before a job's last that the journal does not explain as a recovery or a
    release (no handler here fails or pauses, so nothing else may cause a re-run)."""
    found = []
    for job in jobs:
        entries = journal.get(str(job["id"]), [])
        explained = {e["run"] for e in entries if e["outcome"] in ("stale_recovered", "released")}
        for run in range(1, job["run_count"]):
            if run not in explained:
                outcomes = [(e["run"], e["outcome"]) for e in entries]
                found.append(f"job {job['id']}: run {run} re-run without cause: {outcomes}")
    return found


_HELD_BY = re.compile(r"held by \S*?:(\d+)#")


def recovery_delays(
    journal: dict[str, list[asyncpg.Record]], kills: dict[int, float]
) -> list[float]:
    """For each `stale_recovered` entry, seconds from its holder's SIGKILL to the recovery."""
    delays = []
    for entries in journal.values():
        for e in entries:
            if e["outcome"] != "stale_recovered":
                continue
            m = _HELD_BY.search(e["note"] or "")
            if m and int(m[1]) in kills:
                delays.append(e["at"] - kills[int(m[1])])
    return delays


async def wait_until(check: object, limit: float, what: str) -> None:
    """Poll an async predicate (database state; nothing in-process to await)."""
    assert callable(check)
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit}s")
        await asyncio.sleep(0.05)


class Stalls:
    """Gaps in this process's event loop longer than `threshold` seconds, as (wall-clock
    start, length): a machine that stops every process at once (a VM paused, a host out of
    CPU) stalls the test as it stalls the workers, and a check of when something happened by
    the wall clock must allow for it. A worker stalled on its own is not seen here."""

    TICK = 0.02

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self.gaps: list[tuple[float, float]] = []

    def within(self, start: float, end: float) -> float:
        """Seconds of stall overlapping [start, end] (wall clock)."""
        return sum(max(0.0, min(end, at + gap) - max(start, at)) for at, gap in self.gaps)

    async def _watch(self) -> None:
        last = time.time()
        while True:
            await asyncio.sleep(self.TICK)
            now = time.time()
            if now - last - self.TICK > self.threshold:
                self.gaps.append((last, now - last))
            last = now


@asynccontextmanager
async def stalls(threshold: float = 0.5) -> AsyncIterator[Stalls]:
    """Watch this process's event loop for stalls (see `Stalls`) while the block runs."""
    watch = Stalls(threshold)
    task = asyncio.create_task(watch._watch())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class HeldRuns:
    """A handler whose runs wait for `release`, so that a test acts while `n` of them are
    running: `all_started` is set once they are."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started: list[int] = []
        self.all_started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, task: Work, ctx: Context[None], app: None) -> Outcome:
        self.started.append(task.n)
        if len(self.started) == self.n:
            self.all_started.set()
        await self.release.wait()
        return Outcome.completed()
