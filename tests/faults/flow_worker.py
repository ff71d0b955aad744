"""A worker process running flow-controlled tasks (`python -m tests.faults.flow_worker ...`),
for tests/faults/test_flow.py. Started and read like `tests.faults.worker` (the same `ready`
line and run records), with these tasks:

- `Exclusive(n, key, ms)`: behind `without_overlapping(task.key)`; sleeps `ms` milliseconds
  on its first run (later runs, after a recovery, complete at once), then completes.
- `Limited(n)`: behind `rate_limited("api", --rate-max, --rate-per)`; completes at once.

`--no-flow` registers the same handlers without the middleware: the tests' own proof that
their checks catch what the middleware prevents.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from dataclasses import dataclass

from venturi import Context, Outcome, PostgresStore, Task, Worker
from venturi.flow import rate_limited, without_overlapping

from .worker import Records, dump_tasks_on_sigusr1


@dataclass
class Exclusive(Task):
    KIND = "flow.exclusive"
    n: int
    key: str
    ms: int


@dataclass
class Limited(Task):
    KIND = "flow.limited"
    n: int


async def exclusive(task: Exclusive, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    how = "cancelled"
    try:
        if ctx.run_count == 1:
            await asyncio.sleep(task.ms / 1000)
        how = "done"
    finally:
        app.ended(ctx, how)
    return Outcome.completed()


async def limited(task: Limited, ctx: Context[None], app: Records) -> Outcome:
    app.started(ctx)
    app.ended(ctx, "done")
    return Outcome.completed()


class TakeRecordingStore(PostgresStore):
    """The store, recording each start the rate limit grants with the window the database
    counted it in. The take's reply says how long until that window ends (`reopens_in_s`);
    added to the time the reply came, that is the window's end plus the reply's delay (less
    than a window), and windows end at multiples of their length on the database's clock,
    which this host shares. A handler's own start record cannot place a start at a window's
    edge: it is written a moment after the take, and on a loaded machine that moment can
    fall in the next window."""

    records: Records | None = None

    async def rate_take(self, key: str, max_starts: int, per_s: float) -> tuple[bool, float]:
        taken, reopens_in_s = await super().rate_take(key, max_starts, per_s)
        if taken and self.records is not None:
            self.records.took(time.time() + reopens_in_s)
        return taken, reopens_in_s


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests.faults.flow_worker")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=15 * 60)
    parser.add_argument("--release-after", type=float, default=0.05)
    parser.add_argument("--rate-max", type=int, default=60)
    parser.add_argument("--rate-per", type=float, default=1.0)
    parser.add_argument("--no-flow", action="store_true")
    args = parser.parse_args(argv)

    shutdown = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, shutdown.set)
    dump_tasks_on_sigusr1()
    store = await TakeRecordingStore.connect(
        args.dsn, prefix=args.prefix, max_size=args.concurrency + 4, connect_timeout=3
    )
    assert isinstance(store, TakeRecordingStore)
    records = store.records = Records(args.runs_dir)
    try:
        worker = Worker(records, store, concurrency=args.concurrency, lease=args.lease)
        overlap = [without_overlapping(lambda t: t.key, release_after=args.release_after)]
        rate = [rate_limited("api", args.rate_max, args.rate_per)]
        worker.register(Exclusive, exclusive, middleware=[] if args.no_flow else overlap)
        worker.register(Limited, limited, middleware=[] if args.no_flow else rate)
        run = asyncio.create_task(worker.run(shutdown))
        ready = asyncio.create_task(worker.ready.wait())
        done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            ready.cancel()
            run.result()
            return 1
        print(f"ready {worker.identity}", flush=True)
        await run
        print("stopped", flush=True)
        return 0
    finally:
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    sys.exit(asyncio.run(main(sys.argv[1:])))
