"""A worker in a process of its own, for the multi-process reliability tests.

    python -m tests.runtime.workerproc --dsn DSN --prefix PREFIX --mode stuck|record \
        [--concurrency N] [--lease SECONDS]

It prints `ready` on stdout once the worker listens and claims, and shuts down gracefully
on SIGTERM (the signal sets the worker's shutdown event), exiting 0. Every run of a
handler is recorded in `{prefix}_runs` (created by the test with `RUNS_DDL`), so the
test sees, from the database, which process ran which job and when.

- `stuck`: runs `Stuck` jobs; the handler records its start, then blocks forever.
- `record`: runs `Recorded` jobs; the handler records (job id, pid, start, end).

Importing this module only defines the task types; the tests enqueue them from there.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass

import asyncpg

from venturi import Context, Outcome, PostgresStore, Task, Worker

STUCK_LEASE = 1.0
"""Seconds: the lease of a `Stuck` job, short so a killed worker's job comes back soon."""

RUNS_DDL = """
CREATE TABLE {prefix}_runs (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   uuid             NOT NULL,
    pid      integer          NOT NULL,
    run      integer          NOT NULL,
    started  double precision NOT NULL,
    ended    double precision
)
"""
"""One row per handler run: job, process, the run number, wall-clock start and end."""

RECORD_RUN = (
    "INSERT INTO {prefix}_runs (job_id, pid, run, started, ended) VALUES ($1, $2, $3, $4, $5)"
)


@dataclass
class Stuck(Task):
    """A job whose handler (in the subprocess) never finishes."""

    KIND = "reliability.stuck"
    n: int = 0

    def lease(self) -> float:
        return STUCK_LEASE


@dataclass
class Recorded(Task):
    """A short job whose every run is recorded with its process and timing."""

    KIND = "reliability.recorded"
    n: int = 0


async def record_run(
    pool: asyncpg.Pool,
    prefix: str,
    ctx: Context[None],
    started: float,
    ended: float | None,
) -> None:
    await pool.execute(
        RECORD_RUN.format(prefix=prefix),
        ctx.job_id.to_uuid(),
        os.getpid(),
        ctx.run_count,
        started,
        ended,
    )


@dataclass
class App:
    pool: asyncpg.Pool
    prefix: str


async def handle_stuck(task: Stuck, ctx: Context[None], app: App) -> Outcome:
    await record_run(app.pool, app.prefix, ctx, time.time(), None)
    await asyncio.Event().wait()  # never set: only SIGKILL (or an abort) ends this run
    raise AssertionError("unreachable")


async def handle_recorded(task: Recorded, ctx: Context[None], app: App) -> Outcome:
    started = time.time()
    await asyncio.sleep(0.001)  # a little work, so runs of different jobs interleave
    await record_run(app.pool, app.prefix, ctx, started, time.time())
    return Outcome.completed()


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="workerproc")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--mode", choices=["stuck", "record"], required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=None)
    args = parser.parse_args(argv)

    shutdown = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, shutdown.set)
    store = await PostgresStore.connect(args.dsn, prefix=args.prefix, max_size=args.concurrency + 4)
    pool = await asyncpg.create_pool(args.dsn, min_size=1, max_size=args.concurrency + 1)
    try:
        kwargs = {"lease": args.lease} if args.lease is not None else {}
        worker = Worker(App(pool, args.prefix), store, concurrency=args.concurrency, **kwargs)
        if args.mode == "stuck":
            worker.register(Stuck, handle_stuck)
        else:
            worker.register(Recorded, handle_recorded)
        run = asyncio.create_task(worker.run(shutdown))
        ready = asyncio.create_task(worker.ready.wait())
        done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            ready.cancel()
            run.result()
            return 1
        print("ready", flush=True)
        await run
        print("stopped", flush=True)
        return 0
    finally:
        await pool.close()
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(asyncio.run(main(sys.argv[1:])))
